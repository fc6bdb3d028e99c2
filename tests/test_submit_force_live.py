"""Issue 19 on the real local Slurm cluster: concurrent `fsbatch --force` runs each get their own job (item 15),
and a job whose directory was swapped while it waited stops before it reads anything there (item 1)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import DEV_SITE, ROOT, fsbatch_json, payload_spec_file, wait_done
from .slurm_fixture import sh

SITE = DEV_SITE


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


spec_file = payload_spec_file


def _fsbatch(*args: str) -> subprocess.Popen:
    code = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args, "--json"],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_concurrent_force_runs_each_submit_their_own_job(jobs_dir, tmp_path):
    """Both used to plan into NAME.2; the second was then told its directory held a job and to use --force."""
    spec = spec_file(tmp_path, "forced")
    first = fsbatch_json(str(spec))
    procs = [_fsbatch(str(spec), "--force") for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    got = [json.loads(out) for out, _ in outs]
    assert sorted(g["job_dir"] for g in got) == [first["job_dir"] + ".2", first["job_dir"] + ".3"]
    assert len({first["job_id"], *(g["job_id"] for g in got)}) == 3
    for g in got:
        assert json.loads((Path(g["job_dir"]) / "submission.json").read_text())["job_id"] == g["job_id"]


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
