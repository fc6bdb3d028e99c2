"""CI runs README's first command exactly as written, where it cannot collide with the test clusters, and the
demo's jobs stay out of git's way."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import shutil
import socket
import subprocess

import pytest

from .helpers import ROOT
from .slurm_fixture import DEVCLUSTER, TEST_PORT, TEST_PORT_BUILT

CI = ROOT / ".ci" / "run"
NODES = 8  # the default layout's slurmd, one port each from port + 100


def _readme_demo_command() -> str:
    """The first command of README's set-up block, without its comment."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("    ./frenzy-dev "):
            return line.split("#", 1)[0].strip()
    raise AssertionError("README.md has no ./frenzy-dev command")


def _ci_commands() -> list[str]:
    return [line.split("#", 1)[0].strip() for line in CI.read_text().splitlines() if not line.startswith("#")]


def test_ci_runs_the_readme_demo_exactly_as_written():
    demo = _readme_demo_command()
    assert demo == "./frenzy-dev demo"
    commands = _ci_commands()
    assert demo in commands, f".ci/run must run README's `{demo}`"
    assert commands.index(demo) > commands.index("./frenzy-dev test -q")  # after the tests, whose clusters are down


def _devcluster():
    loader = importlib.machinery.SourceFileLoader("devcluster_script", str(DEVCLUSTER))
    spec = importlib.util.spec_from_loader("devcluster_script", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _ports(base: int) -> set[int]:
    """Every port a dev cluster at `base` listens on: slurmctld, slurmdbd, each slurmd."""
    return {base, base + 2, *range(base + 100, base + 100 + NODES)}


def test_the_demo_cluster_ports_are_clear_of_the_test_clusters():
    demo = _ports(_devcluster().DEFAULT_PORTS["22.05"])
    test_default = _ports(18817) | _ports(18817 + 300) | _ports(19817)  # 22.05, 25.11, the accounting test's
    assert not demo & test_default
    assert not demo & (_ports(int(TEST_PORT)) | _ports(int(TEST_PORT_BUILT)))  # this session's, if moved


def test_the_demo_writes_its_jobs_where_git_ignores_them():
    text = (ROOT / "frenzy-dev").read_text()
    assert re.search(r'FRENZY_JOBS_DIR="\$\{FRENZY_JOBS_DIR:-\$ROOT/frenzy-jobs\}"', text)
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    res = subprocess.run(["git", "check-ignore", "-q", "frenzy-jobs/tiny-cpu-0/slurm-1.out"], cwd=ROOT)
    assert res.returncode == 0, "frenzy-jobs/ must be in .gitignore"


def _set_up() -> bool:
    """Whether .venv is set up for this pyproject.toml (frenzy-dev would otherwise install first)."""
    import hashlib

    stamp = ROOT / ".venv" / ".frenzy-setup"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
    return stamp.is_file() and stamp.read_text().strip() == want


@pytest.mark.skipif(os.geteuid() != 0, reason="devcluster runs as root only")
def test_the_demo_stops_with_devclusters_message_when_up_refuses(tmp_path):
    """`eval "$(devcluster up)"` went on when up failed, with whatever SLURM_CONF the shell had (another
    cluster's): the demo must stop there, with up's message (here: a port another program holds) and exit 1."""
    if not _set_up():
        pytest.skip(".venv is not set up for this pyproject.toml (./frenzy-dev would install it first)")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        env = dict(
            os.environ,
            FRENZY_DEVCLUSTER_PORT=str(port),
            FRENZY_DEVCLUSTER_DIR=str(tmp_path / "state"),
            FRENZY_JOBS_DIR=str(tmp_path / "jobs"),
            SLURM_CONF=str(tmp_path / "another-cluster" / "slurm.conf"),
        )
        res = subprocess.run([str(ROOT / "frenzy-dev"), "demo"], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 1
    assert f"{port} (slurmctld)" in res.stderr and "already in use" in res.stderr
    assert "== the local Slurm cluster" not in res.stderr and res.stdout == ""
