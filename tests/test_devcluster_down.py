"""`devcluster down` stops the whole cluster even where a pid file is gone (a daemon started twice, a pid file
removed under it): after the daemons it knows by their pid files, it stops this user's processes working inside
the cluster's state directory or naming it on their command line, never itself or the shell that ran it; and a
daemon that exits while being stopped does not end the stopping of the others."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import time
from types import ModuleType

from .slurm_fixture import DEVCLUSTER


def _devcluster() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("devcluster_script", str(DEVCLUSTER))
    spec = importlib.util.spec_from_loader("devcluster_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_daemon_without_its_pid_file_is_found_and_stopped(tmp_path):
    dc = _devcluster()
    state = tmp_path / "state"
    (state / "log").mkdir(parents=True)
    stray = subprocess.Popen(["sleep", "60"], cwd=state / "log")  # like slurmdbd: its cwd is the log directory
    # like munged: elsewhere, but its command line names a file in the state directory
    named = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", f"{state}/run/x.sock"], cwd=tmp_path)
    outside = subprocess.Popen(["sleep", "62"], cwd=tmp_path)
    try:
        found = dc.strays(state)
        assert stray.pid in found and named.pid in found
        assert outside.pid not in found and os.getpid() not in found
        dc.stop_process(stray.pid, timeout=1.0)  # (our child: a zombie until reaped)
        assert stray.wait(timeout=5) != 0  # ended by the signal
        dc.stop_process(stray.pid, timeout=5.0)  # already gone: nothing to do, no error
        dc.stop_process(named.pid, timeout=1.0)
        assert named.wait(timeout=5) != 0 and dc.strays(state) == []
    finally:
        for p in (stray, named, outside):
            p.kill()
            p.wait()


def test_this_command_and_its_shell_are_never_strays(tmp_path):
    dc = _devcluster()
    assert os.getpid() in dc.ancestors() and os.getppid() in dc.ancestors()
    # a shell whose working directory is the state directory runs down there: it is left alone
    os.chdir(tmp_path)
    try:
        assert os.getpid() not in dc.strays(tmp_path)
    finally:
        os.chdir(os.path.dirname(os.path.dirname(__file__)))
    start = time.time()
    dc.stop_process(2**22 + 12345, timeout=1.0)  # no such process
    assert time.time() - start < 1.0
