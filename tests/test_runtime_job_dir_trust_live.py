"""On the real local Slurm cluster: a job whose directory was swapped while it waited stops before it reads
anything there."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .helpers import fsbatch_json, payload_spec_file, wait_done
from .slurm_fixture import sh


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


spec_file = payload_spec_file


def test_job_whose_directory_was_swapped_while_pending_stops(jobs_dir, tmp_path):
    """The audit's attack, end to end: the held job's directory renamed away and a copy with a planted plan.json
    put in its place; once released, the job stops before it runs anything from it."""
    spec = spec_file(tmp_path, "swapped")
    out = fsbatch_json(str(spec), "--sbatch=--hold")
    job_dir = Path(out["job_dir"])
    moved = job_dir.with_name("moved-away")
    job_dir.rename(moved)
    shutil.copytree(moved, job_dir)
    job_dir.chmod(0o700)
    plan = json.loads((job_dir / "plan.json").read_text())
    plan["command"] = ["/bin/sh", "-c", "touch PWNED"]
    (job_dir / "plan.json").write_text(json.dumps(plan))
    sh("scontrol", "release", str(out["job_id"]))
    done = wait_done(out["job_id"], timeout=180)
    assert done["state"] == "FAILED"
    log = "".join(p.read_text() for p in job_dir.glob("slurm-*.out"))
    assert "is not the one fsbatch wrote (inode" in log and "Traceback" not in log, log
    assert not (job_dir / "PWNED").exists() and not list(job_dir.glob("rank-*.json"))
