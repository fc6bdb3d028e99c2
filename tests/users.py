"""A second local user for the tests that need one (an attacker beside the victim on a shared login node).

The tests run as root (the dev cluster needs it); `other_user` creates, once per machine, an unprivileged account
`fsaudit` with its own home and group, and `as_user` runs a command as that account with setpriv, as a real
second login would (its own uid, gid and supplementary groups, HOME and USER; no root capabilities).
Both skip where the machine cannot make users (not root, or no useradd).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

OTHER_USER = "fsaudit"


@dataclass(frozen=True)
class LocalUser:
    """An account of this machine: name, ids and home directory."""

    name: str
    uid: int
    gid: int
    home: Path


def _ensure_user(name: str) -> LocalUser:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--create-home", "--user-group", "--shell", "/bin/sh", name],
            check=True,
            capture_output=True,
            timeout=30,
        )
        entry = pwd.getpwnam(name)
    return LocalUser(entry.pw_name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))


@pytest.fixture(scope="session")
def other_user() -> LocalUser:
    """An unprivileged second user of this machine (created if missing)."""
    if os.geteuid() != 0:
        pytest.skip("a second local user needs root to create it and to switch to it")
    if shutil.which("useradd") is None or shutil.which("setpriv") is None:
        pytest.skip("useradd or setpriv is missing")
    return _ensure_user(OTHER_USER)


def as_user(
    user: LocalUser,
    argv: list[str],
    *,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run argv as `user` (setpriv: its uid, gid and groups, no capabilities), with HOME/USER/LOGNAME set to it."""
    full_env = dict(os.environ if env is None else env, HOME=str(user.home), USER=user.name, LOGNAME=user.name)
    cmd = ["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--init-groups", "--inh-caps=-all", "--", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=timeout, input=input)
