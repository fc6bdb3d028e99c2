"""On the real local cluster: a rerun after the job ended gets a new job and directory (the old one intact; a
live job still refuses it), also on a rebuilt cluster that never knew the job."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, fsbatch_json, run_cli, wait_done
from .slurm_fixture import sh

TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


def fscancel(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from frenzy_slurm.cli.fscancel import main; sys.argv[0] = 'fscancel'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_rerun_of_the_tiny_example_after_it_ended(jobs_dir, tmp_path):
    first = fsbatch_json(str(TINY))
    done = wait_done(first["job_id"], timeout=300)
    assert done["state"] == "COMPLETED", done
    old = Path(first["job_dir"])
    before = snapshot(old)
    assert "follows" not in first
    again = run_cli("fsbatch", str(TINY), "--json", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    assert out["job_id"] != first["job_id"] and out["job_dir"] == first["job_dir"] + ".2"
    assert out["follows"] == {"job_id": first["job_id"], "job_dir": first["job_dir"], "state": "COMPLETED"}
    assert snapshot(old) == before  # nothing of the earlier job touched
    text = run_cli("fsbatch", str(TINY))  # the rerun is pending or running: refused, naming it
    assert text.returncode == 7, text.stderr
    assert f"job {out['job_id']} was already submitted from {out['job_dir']}" in text.stderr
    cancelled = fscancel(str(out["job_id"]), "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    assert json.loads(cancelled.stdout)["jobs"][0]["outcome"] == "cancelled"
    assert wait_done(out["job_id"])["state"] == "CANCELLED"
    assert (Path(out["job_dir"]) / "plan.json").exists()  # fscancel keeps the job directory
    third = run_cli("fsbatch", str(TINY), "--json")  # once cancelled (ended), a third run follows the second
    assert third.returncode == 0, third.stderr
    assert json.loads(third.stdout)["follows"]["job_id"] == out["job_id"]
    sh("scancel", str(json.loads(third.stdout)["job_id"]))


def test_rerun_on_a_rebuilt_cluster_that_never_knew_the_job(jobs_dir, tmp_path, slurm_cluster_2511, monkeypatch):
    """The job ran on one cluster (22.05), the next fsbatch talks to another (25.11, with accounting) that has
    never heard of it, and whose job ids start again: the job directory's finished.json says it ended, so the
    same fsbatch submits the rerun there at once, into a new directory, naming the job it follows."""
    from .helpers import payload_spec_file
    from .slurm_fixture import _empty_queue

    spec = payload_spec_file(tmp_path, "moved")
    first = fsbatch_json(str(spec))
    assert wait_done(first["job_id"])["state"] == "COMPLETED"
    old = Path(first["job_dir"])
    before = snapshot(old)
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster_2511.conf))
    monkeypatch.setenv("PATH", slurm_cluster_2511.path)
    _empty_queue()
    again = fsbatch_json(str(spec))
    assert again["job_dir"] == first["job_dir"] + ".2"
    assert again["follows"] == {"job_id": first["job_id"], "job_dir": first["job_dir"], "state": "COMPLETED"}
    assert wait_done(again["job_id"])["state"] == "COMPLETED"
    assert snapshot(old) == before
    _empty_queue()
