"""frenzy_slurm.in_job, the helper a user's script imports: a signal delivered to a script started by the runtime
makes it checkpoint and exit 0, requeueing after USR2 and after the TERM of a preemption (not after a scancel's);
the next run finds the checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """\
import json, sys, time
from frenzy_slurm import in_job
resume = in_job.latest_checkpoint()
start = int(resume.name.removeprefix("step")) + 1 if resume else 0
print("ready", start, "torch" in sys.modules, flush=True)
for step in range(start, 100000):
    time.sleep(0.01)
    if in_job.stop_requested():
        tag = in_job.checkpoint_dir() / f"step{step}"
        tag.mkdir()
        (tag / "state.json").write_text(json.dumps({"step": step, "signal": in_job.stop_signal()}))
        in_job.exit_for_requeue()
sys.exit(3)
"""


@pytest.fixture
def job(tmp_path):
    """A job directory, the script, and a `scontrol` on PATH that records what it was asked (and answers `show
    job` with $SCONTROL_SHOW)."""
    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    (tmp_path / "train.py").write_text(SCRIPT)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol.calls"
    fake = bin_dir / "scontrol"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n[ "$1" = show ] && echo "$SCONTROL_SHOW"\nexit 0\n')
    fake.chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "SLURM_JOB_ID": "4242",
        "FRENZY_NVML_SAMPLER": "0",
        "SCONTROL_SHOW": "JobId=4242 JobName=t PreemptEligibleTime=2026-12-04T18:27:49 PreemptTime=None",
    }
    return job_dir, tmp_path / "train.py", calls, env


def run_until(job, sig: signal.Signals) -> tuple[subprocess.CompletedProcess, int]:
    job_dir, script, _, env = job
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir), "--script", str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=job_dir,
    )
    assert proc.stdout is not None
    ready = proc.stdout.readline().split()
    assert ready[:1] == ["ready"], proc.stderr.read() if proc.stderr else ""
    assert ready[2] == "False", "the helper imported torch"
    time.sleep(0.05)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), int(ready[1])


def test_usr2_checkpoints_requeues_and_exits_0(job):
    job_dir, _, calls, _ = job
    res, start = run_until(job, signal.SIGUSR2)
    assert res.returncode == 0, res.stderr
    assert start == 0
    (tag,) = (job_dir / "checkpoints").iterdir()
    state = json.loads((tag / "state.json").read_text())
    assert state["signal"] == "SIGUSR2" and tag.name == f"step{state['step']}"
    assert calls.read_text().split() == ["requeue", "4242"]
    assert "job 4242 requeued after SIGUSR2" in res.stdout
    assert oct((job_dir / "checkpoints").stat().st_mode & 0o777) == "0o700"

    # the requeued run resumes after that step; the TERM of a scancel (no PreemptTime) saves but does not requeue
    res, start = run_until(job, signal.SIGTERM)
    assert res.returncode == 0, res.stderr
    assert start == state["step"] + 1
    assert calls.read_text().split() == ["requeue", "4242", "show", "job", "-o", "4242"], "no requeue after scancel"
    assert len(list((job_dir / "checkpoints").iterdir())) == 2


def test_the_term_of_a_preemption_checkpoints_and_requeues(job):
    """Slurm requeues a preempted job itself only while it still runs at the end of GraceTime; one that saved and
    exited 0 would end COMPLETED, so the helper requeues it when scontrol shows a PreemptTime."""
    job_dir, _, calls, env = job
    env["SCONTROL_SHOW"] = "JobId=4242 PreemptEligibleTime=2026-12-04T18:27:49 PreemptTime=2026-12-04T18:27:52"
    res, _ = run_until(job, signal.SIGTERM)
    assert res.returncode == 0, res.stderr
    assert calls.read_text().split() == ["show", "job", "-o", "4242", "requeue", "4242"]
    assert "job 4242 requeued after SIGTERM" in res.stdout
    (tag,) = (job_dir / "checkpoints").iterdir()
    assert json.loads((tag / "state.json").read_text())["signal"] == "SIGTERM"


def test_only_rank_0_requeues(job):
    job_dir, _, calls, env = job
    env["SLURM_PROCID"], env["SLURM_NTASKS"] = "1", "2"
    res, _ = run_until(job, signal.SIGUSR2)
    assert res.returncode == 0, res.stderr
    assert not calls.exists()


@pytest.fixture
def in_job():
    """The helper module, imported here without keeping its handlers: pytest's own SIGTERM must still stop it."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGUSR2, signal.SIGTERM)}
    from frenzy_slurm import in_job as module

    for sig, handler in saved.items():
        signal.signal(sig, handler)
    return module


def test_latest_checkpoint_prefers_deepspeeds_latest(tmp_path, monkeypatch, in_job):

    monkeypatch.setenv("FRENZY_CHECKPOINT_DIR", str(tmp_path / "ck"))
    assert in_job.latest_checkpoint() is None
    for name in ("checkpoint-9", "checkpoint-10", "step2", "notes"):
        (tmp_path / "ck" / name).mkdir()
    assert in_job.latest_checkpoint() == tmp_path / "ck" / "checkpoint-10"
    (tmp_path / "ck" / "latest").write_text("step2\n")
    assert in_job.latest_checkpoint() == tmp_path / "ck" / "step2"
    (tmp_path / "ck" / "latest").write_text("../elsewhere\n")  # not a tag of this directory: ignored
    assert in_job.latest_checkpoint() == tmp_path / "ck" / "checkpoint-10"


def test_stop_before_the_script_started_is_seen(monkeypatch):
    code = "from frenzy_slurm import in_job; print(in_job.stop_requested(), in_job.stop_signal())"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRENZY_STOP_SIGNAL": "SIGUSR2"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert res.stdout.split() == ["True", "SIGUSR2"], res.stderr
