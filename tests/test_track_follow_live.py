"""Following a real job on the local Slurm cluster: README's `fsqueue JOBID --log --follow` line as written
(JOBID filled in) prints the job's output until it ends and exits 0; `Job.logs()` reads it; `fsbatch --wait`
draws its progress line on a terminal (a pty) and nothing when stderr is a pipe."""

from __future__ import annotations

import json
import os
import pty
import select
import shlex
import subprocess
import sys
import time

import pytest
import yaml

import frenzy_slurm as fs

from .helpers import ROOT, payload_spec_file, run_cli


def readme_line(prefix: str) -> list[str]:
    """The README line that starts with `prefix` (its comment dropped), as argv."""
    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith(prefix)]
    assert len(lines) == 1, f"README.md should have one line starting {prefix!r}"
    return shlex.split(lines[0], comments=True)


def cli(argv: list[str]) -> list[str]:
    """A console script's argv as `python -c` of its main (the checkout's code, as run_cli does)."""
    module = {"fsbatch": "fsbatch", "fsqueue": "fsqueue"}[argv[0]]
    return [sys.executable, "-c", f"import sys; from frenzy_slurm.cli.{module} import main; main()", *argv[1:]]


def test_readme_follow_line_prints_until_the_job_ends(live_jobs_dir, tmp_path):
    sub = run_cli("fsbatch", str(payload_spec_file(tmp_path, "follow")), "--parsable")
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip()
    argv = [job_id if a == "JOBID" else a for a in readme_line("fsqueue JOBID --log --follow")]
    assert argv == ["fsqueue", job_id, "--log", "--follow"]
    res = subprocess.run(cli(argv), capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith(f"job {job_id} follow: ") and "==> batch script and srun <==" in res.stdout
    assert f"frenzy-slurm: job {job_id} restart 0" in res.stdout
    assert f"fsqueue: job {job_id} ended COMPLETED, exit code 0" in res.stderr
    job = fs.job(next(live_jobs_dir.iterdir()))
    assert job.state == "COMPLETED" and f"frenzy-slurm: job {job_id} restart 0" in job.logs()
    assert job.stdout() == job.stderr() and "==>" not in job.stdout()


def _run_on_a_terminal(argv: list[str], timeout: float) -> tuple[int, str]:
    """argv with stdout and stderr on a pty: its exit status and everything it drew."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdout=slave, stderr=slave, stdin=subprocess.DEVNULL, cwd=ROOT)
    os.close(slave)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 0.5)[0]:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the child closed its end
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    return proc.wait(timeout=30), out.decode(errors="replace")


def test_fsbatch_wait_draws_its_progress_line_only_on_a_terminal(live_jobs_dir, tmp_path):
    spec = payload_spec_file(tmp_path, "ontty")
    slow = tmp_path / "slow.py"  # a job that runs past fsbatch's first looks (2 s, 6 s), so they see it RUNNING
    slow.write_text("import time\ntime.sleep(10)\n")
    data = yaml.safe_load(spec.read_text())
    data["entry"]["script"] = str(slow)
    spec.write_text(yaml.safe_dump(data))
    rc, drawn = _run_on_a_terminal(cli(["fsbatch", str(spec), "--wait"]), 300)
    assert rc == 0, drawn
    job_id = drawn.split("Submitted batch job ")[1].split()[0]
    assert f"\n{job_id} ontty RUNNING 00:00:" in drawn.replace("\r\x1b[J", "\n") and "\x1b[K" in drawn, drawn
    assert f"fsbatch: job {job_id} ended COMPLETED, exit code 0" in drawn
    piped = run_cli("fsbatch", str(payload_spec_file(tmp_path, "piped")), "--wait")
    assert piped.returncode == 0 and "\x1b" not in piped.stderr and "\r" not in piped.stderr, piped.stderr


@pytest.mark.slow
def test_readme_sweep_wait_line_shows_step_and_loss_per_job(live_jobs_dir):
    """README's sweep line as written, on a terminal: one progress line per job, with the step and loss the
    built-in trainer records in progress.json while it trains; both jobs end COMPLETED."""
    pytest.importorskip("deepspeed", reason="training needs the train extra (pip install -e '.[dev]')")
    argv = readme_line("fsbatch examples/tiny-cpu.yaml --site site_configs/devcluster-cpu.yaml --set")
    assert argv[-1] == "--wait"
    rc, drawn = _run_on_a_terminal(cli(argv), 900)
    assert rc == 0, drawn[-3000:]
    ids = [part.split()[0] for part in drawn.split("Submitted batch job ")[1:]]
    assert len(ids) == 2
    for job_id in ids:
        assert f"fsbatch: job {job_id} ended COMPLETED, exit code 0" in drawn
    frames = drawn.replace("\r\x1b[J", "\n").replace("\x1b[1A", "").split("\n")
    stepped = [f for f in frames if " RUNNING " in f and " step " in f and " loss " in f]
    assert stepped, drawn[-3000:]
    for d in live_jobs_dir.iterdir():
        record = json.loads((d / "progress.json").read_text())
        assert record["step"] == record["total_steps"] and isinstance(record["loss"], float)
