"""On the real local cluster: HAS plans -C/--constraint and --exclusive as Slurm will run them.

Node features are set at run time with `scontrol update NodeName=v100-2 AvailableFeatures=...` (as an admin
may) and cleared after each test; the devcluster's configuration is unchanged."""

from __future__ import annotations

import subprocess
import time

import pytest

from .helpers import fsbatch_json, payload_spec_file, run_cli, wait_done
from .slurm_fixture import sh, wait_for

NODE = "v100-2"

FEATURES = "fsfeat,ib"


def _set_features(value: str) -> None:
    sh("scontrol", "update", f"NodeName={NODE}", f"AvailableFeatures={value}", f"ActiveFeatures={value}")


@pytest.fixture
def featured(live_jobs_dir):
    """The 22.05 session cluster, an empty queue, and v100-2 with features fsfeat and ib."""
    _set_features(FEATURES)
    yield live_jobs_dir
    _set_features("")


def _chosen(out: dict) -> dict:
    return out["decision"]["chosen"]


def test_constraint_plans_and_runs_on_the_nodes_with_the_features(featured, tmp_path):
    spec = payload_spec_file(tmp_path, "feat")
    dry = fsbatch_json(str(spec), "--dry-run", "-C", "fsfeat&ib")
    assert [(c["partition"], c["nodes"]) for c in _chosen(dry)["components"]] == [("v100", 1)]
    assert dry["script"].count("#SBATCH --constraint=fsfeat&ib\n") == 1
    # no node has the features: refused before sbatch, naming the pools and what their nodes have
    none = run_cli("fsbatch", str(spec), "--dry-run", "-C", "fsnone")
    assert none.returncode == 3 and "no node has the features -C fsnone" in none.stderr
    assert "v100/v100: no node has the features -C fsnone asks for (its nodes have: fsfeat, ib)" in none.stderr
    # Slurm runs the planned job on the node with the features
    out = fsbatch_json(str(spec), "-C", "fsfeat&ib")
    done = wait_done(out["job_id"], timeout=180)
    assert done["state"] == "COMPLETED", done
    assert sh("squeue", "-h", "--states=all", "-j", str(out["job_id"]), "-o", "%N") == NODE


def test_exclusive_waits_for_a_node_another_job_uses(featured, tmp_path):
    spec = payload_spec_file(tmp_path, "excl")
    # a CPU-only job on the only node with the features: it holds no GPU, so a shared plan starts now
    holder = sh("sbatch", "--parsable", "-p", "v100", "-w", NODE, "-c", "1", "-t", "5", "-o", "/dev/null",
                "--wrap", "sleep 300")  # fmt: skip
    try:
        wait_for(lambda: sh("squeue", "-h", "-j", holder, "-o", "%T") == "RUNNING", timeout=60, what="the holder")
        shared = _chosen(fsbatch_json(str(spec), "--dry-run", "-C", "fsfeat"))
        assert shared["start_source"] == "now"
        out = fsbatch_json(str(spec), "--dry-run", "-C", "fsfeat", "--exclusive")
        excl = _chosen(out)
        assert [(c["partition"], c["nodes"]) for c in excl["components"]] == [("v100", 1)]
        assert excl["start_source"] != "now" and excl["start"] >= time.time() + 120  # when the holder's 5 min end
        assert "#SBATCH --exclusive\n" in out["script"]
    finally:
        subprocess.run(["scancel", holder], capture_output=True, timeout=30)
