"""Tracking: a requeued job does not show its killed run's finished.json, fsqueue shows restarts
and the last checkpoint, and `fsqueue JOBID` with slurmctld down shows what the job directory knows."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import frenzy_jobs

from .helpers import LOCAL, make_spec, planned

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def submitted(tmp_path, monkeypatch):
    """A job submitted to FakeSlurm, whose directory holds a requeued run's records."""
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    view = synthetic(LOCAL)
    spec = make_spec()
    req = planned(spec, view, tmp_path / "jobs" / "t-1")
    slurm = FakeSlurm(view, user=getpass.getuser())
    done = submit(req, slurm)
    d = req.job_dir
    (d / "finished.json").write_text(json.dumps({"job_id": str(done.job_id), "exit_code": 1, "restart": 0}))
    (d / "started.json").write_text(json.dumps({"job_id": str(done.job_id), "restart": 1}))
    (d / "metrics.json").write_text(json.dumps({"step": 40, "total_steps": 100, "restart": 1}))
    (d / "checkpoints" / "step40").mkdir(parents=True)
    (d / "checkpoints" / "latest").write_text("step40")
    return slurm, done, d


def test_running_job_ignores_an_earlier_runs_finished_json(submitted):
    slurm, done, d = submitted
    slurm.advance(1)  # the requeued job runs again
    (d / "started.json").unlink()  # even without started.json: the queue says it is not finished
    t = frenzy_jobs(slurm.jobs(job_ids=[done.job_id]))[0]
    assert t.state == "RUNNING" and t.finished is None
    assert any("earlier run" in n for n in t.notes)


def test_requeued_run_record_makes_finished_json_stale(submitted):
    from frenzy_slurm.track.jobs import from_job_dirs

    _, _, d = submitted
    t = from_job_dirs([d], None)[0]
    assert t.finished is None and t.restarts == 1 and t.last_checkpoint_step == 40


@pytest.fixture
def slurm_down(tmp_path):
    """squeue/sinfo/sacct that answer as they do with slurmctld down."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("squeue", "sinfo", "sacct", "scontrol"):
        p = bin_dir / tool
        p.write_text('#!/bin/sh\necho "$0: error: Unable to contact slurm controller (connect failure)" >&2\nexit 1\n')
        p.chmod(0o755)
    return bin_dir


def test_fsqueue_jobid_with_slurm_down_shows_the_job_directory(submitted, slurm_down):
    _, done, d = submitted
    env = {
        **os.environ,
        "PATH": f"{slurm_down}:{os.environ['PATH']}",
        "FRENZY_JOBS_DIR": str(d.parent),
        "XDG_CACHE_HOME": str(d.parent.parent / "cache"),
    }
    code = "import sys; from frenzy_slurm.cli.fsqueue import main; sys.argv[0] = 'fsqueue'; main()"
    res = subprocess.run(
        [sys.executable, "-c", code, str(done.job_id), "--backend", "cli"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert f"job {done.job_id}" in out and "Slurm did not answer" in out
    assert "step 40/100" in out and "last checkpoint at step 40" in out and "restarts 1" in out
    assert "exit code" not in out  # the killed run's finished.json is stale
    res = subprocess.run(
        [sys.executable, "-c", code, str(done.job_id), "--backend", "cli", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    data = json.loads(res.stdout)
    assert data["last_checkpoint_step"] == 40 and data["restarts"] == 1 and data["finished"] is None


def test_fsqueue_unknown_jobid_with_slurm_down_is_exit_4(tmp_path, slurm_down):
    env = {
        **os.environ,
        "PATH": f"{slurm_down}:{os.environ['PATH']}",
        "FRENZY_JOBS_DIR": str(tmp_path),
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
    }
    code = "import sys; from frenzy_slurm.cli.fsqueue import main; sys.argv[0] = 'fsqueue'; main()"
    res = subprocess.run(
        [sys.executable, "-c", code, "999999", "--backend", "cli"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 4 and "Traceback" not in res.stderr and "unreachable" in res.stderr.lower()


def test_unreadable_job_directory_of_another_user_is_a_note(tmp_path, monkeypatch):
    """`fsqueue --all` lists other users' jobs; their job directories are private (0700) and must not crash it."""
    import frenzy_slurm.track.jobs as track
    from frenzy_slurm.slurm.view import Job

    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    monkeypatch.setattr(track.os, "access", lambda path, mode: Path(path) != d)
    job = Job(job_id=7, state="RUNNING", comment="frenzy:abc", user="other", workdir=str(d), name="x")
    t = frenzy_jobs([job])[0]
    assert t.plan is None and any("not readable" in n for n in t.notes)
