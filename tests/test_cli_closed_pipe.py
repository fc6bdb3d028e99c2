"""A command whose reader closes the pipe (`fsbatch ... | head`) ends quietly with exit 0, as `cat` does.

Real pipes throughout: a pipe whose read end is closed before the command starts (the write fails for certain),
the README demo's own shape (`... | head -n 1` under `set -o pipefail`, many times, since whether the reader
leaves before the last write is a race), and an output far larger than the pipe's buffer.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from .helpers import DEV_SITE, EXAMPLES, ROOT

SNAPSHOT = EXAMPLES / "offline" / "cluster.json"
STATIC = ["--backend", "static", "--snapshot", str(SNAPSHOT)]
BIN = Path(sys.executable).parent  # the venv's console scripts: fsbatch, fsqueue, fsinfo, fscancel, frenzy-slurm

# every console command, with arguments that print something without Slurm
LLAMA = str(EXAMPLES / "llama2-7b.yaml")
COMMANDS = {
    "fsbatch": ["fsbatch", LLAMA, "--dry-run", "--explain", *STATIC, "--site", str(DEV_SITE)],
    "fsbatch --help": ["fsbatch", "--help"],
    "fsqueue": ["fsqueue", "--all", *STATIC],
    "fsinfo": ["fsinfo", *STATIC, "--site", str(DEV_SITE)],
    "fscancel": ["fscancel", "--mine", *STATIC],
    "frenzy-slurm spec-reference": ["frenzy-slurm", "spec-reference"],
    "frenzy-slurm memory": ["frenzy-slurm", "memory", LLAMA, "--plan", "dp=8,zero=1,mb=1"],
}


@pytest.fixture(autouse=True)
def _jobs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))


def _env(unbuffered: bool = False) -> dict[str, str]:
    """The commands on PATH; stdout block-buffered into a pipe, as in a user's shell (unless `unbuffered`)."""
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    env.pop("FRENZY_SITE", None)
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


def _into_closed_pipe(argv: list[str], unbuffered: bool = False) -> subprocess.CompletedProcess[bytes]:
    """Run argv with stdout a pipe whose only reader is already gone: its first write fails with EPIPE."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            argv, stdout=write_end, stderr=subprocess.PIPE, env=_env(unbuffered), cwd=ROOT, timeout=120
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_closed_pipe_ends_the_command_quietly_with_0(name):
    prog, *args = COMMANDS[name]
    res = _into_closed_pipe([str(BIN / prog), *args])
    stderr = res.stderr.decode()
    assert res.returncode == 0, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr and "Exception ignored" not in stderr


def test_a_failing_command_keeps_its_exit_code_when_the_pipe_is_closed(tmp_path):
    res = _into_closed_pipe([str(BIN / "fsbatch"), str(tmp_path / "missing.yaml"), "--dry-run"])
    assert res.returncode == 2
    assert "missing.yaml" in res.stderr.decode()


def test_the_readme_demo_pipe_passes_under_pipefail_every_time():
    """`fsbatch ... --explain | head -n 1` under `set -o pipefail`, as frenzy-dev demo runs it, 8 times in a row."""
    argv = shlex.join(COMMANDS["fsbatch"])
    script = f"set -euo pipefail; for i in 1 2 3 4 5 6 7 8; do {argv} 2>/dev/null | head -n 1; done"
    res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    assert res.returncode == 0, res.stderr
    firsts = res.stdout.splitlines()
    assert len(firsts) == 8 and all(line.startswith("llama2-7b-pretrain: ") for line in firsts)


def test_a_large_output_into_head_ends_with_0():
    """A 24-value sweep's plans (`--set`, about 110 KB in many writes, more than a pipe holds) into `head -n 1`."""
    rates = ",".join(f"{i}e-5" for i in range(1, 25))
    script = f"set -o pipefail; {shlex.join(COMMANDS['fsbatch'])} --set training.learning_rate={rates} | head -n 1"
    for _ in range(3):
        res = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=_env(), timeout=300)
        assert res.returncode == 0, res.stderr
        assert res.stdout.startswith("=== llama2-7b-pretrain_1e-5: ")
        assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr


def test_output_buffered_until_exit_is_flushed_inside_the_command(tmp_path):
    """print() output still in stdout's buffer when the command returns: the flush at interpreter exit would
    fail (Python then prints "Exception ignored" and exits 120), so the command class flushes first; a command
    exiting with its own code keeps it. Unbuffered (PYTHONUNBUFFERED=1), print() itself meets the closed pipe."""
    script = tmp_path / "cmd.py"
    script.write_text(
        textwrap.dedent(
            """
            import click
            from frenzy_slurm.cli.common import QuietPipeCommand

            @click.command(cls=QuietPipeCommand)
            @click.option("--fail", is_flag=True)
            def main(fail):
                print("buffered, not yet written")
                if fail:
                    raise SystemExit(3)

            main()
            """
        )
    )
    for extra, unbuffered, code in (([], False, 0), (["--fail"], False, 3), ([], True, 0), (["--fail"], True, 0)):
        res = _into_closed_pipe([sys.executable, str(script), *extra], unbuffered)
        assert res.returncode == code, res.stderr
        assert res.stderr == b""
