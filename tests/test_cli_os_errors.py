"""An operating-system error (a full disk, a quota, a read-only file system) ends a command with one message
naming the file and the fix, exit 1, never a traceback."""

from __future__ import annotations

import errno
import os

import click
import pytest
from click.testing import CliRunner

from frenzy_slurm.core.errors import (
    EXIT_FAILURE,
)


@pytest.mark.parametrize(
    "code,fix", [(errno.ENOSPC, "file system is full"), (errno.EDQUOT, "quota"), (errno.EROFS, "read-only")]
)
def test_os_errors_are_one_message_and_exit_1(code, fix):
    from frenzy_slurm.cli.common import reports_errors

    @click.command()
    @reports_errors("fsx")
    def cmd():
        raise OSError(code, os.strerror(code), "/jobs/x/plan.json")

    res = CliRunner().invoke(cmd, [])
    assert res.exit_code == EXIT_FAILURE and isinstance(res.exception, (SystemExit, type(None)))
    assert f"fsx: error: cannot read or write /jobs/x/plan.json: {os.strerror(code)}" in res.output
    assert fix in res.output and "Traceback" not in res.output
