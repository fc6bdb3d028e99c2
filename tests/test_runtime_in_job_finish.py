"""in_job.finish: a user script's task ends with its process group taken down and without the interpreter's
teardown, where a finished rank could abort on gloo's threads and make the job FAILED."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap

from .helpers import ROOT

SCRIPT = textwrap.dedent(
    """
    import atexit, sys
    from frenzy_slurm import in_job
    import torch.distributed as td

    td.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    real_destroy = td.destroy_process_group
    def destroy(*args, **kwargs):
        print("group destroyed", flush=True)
        real_destroy(*args, **kwargs)
    td.destroy_process_group = destroy
    atexit.register(lambda: print("atexit ran", flush=True))
    print("trained", end="")  # not flushed by the script: finish flushes it
    {call}
    print("after the end")
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(call: str) -> subprocess.CompletedProcess[str]:
    code = SCRIPT.format(port=_free_port(), call=call)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)


def test_finish_takes_the_group_down_and_exits_with_the_code_skipping_teardown():
    res = _run("in_job.finish(3)")
    assert res.returncode == 3, res.stderr
    assert res.stdout.startswith("trained"), res.stdout  # flushed before the exit
    assert "group destroyed" in res.stdout
    assert "atexit ran" not in res.stdout and "after the end" not in res.stdout


def test_exit_for_requeue_ends_the_same_way_with_zero():
    res = _run("in_job.exit_for_requeue()")  # no stop signal came: nothing to requeue, exit 0
    assert res.returncode == 0, res.stderr
    assert "group destroyed" in res.stdout and "atexit ran" not in res.stdout
