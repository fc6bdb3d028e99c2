"""The restart cost the simulator's `sia` pays, measured on the local Slurm cluster with the real runtime.

`examples/tiny-cpu.yaml` is submitted with fsbatch, trains (DeepSpeed on the CPU), gets SIGUSR2 as at a time
limit or a move (the runtime checkpoints and requeues itself), is released a second after the requeue
(`release_requeued`) and resumes from the checkpoint. Printed: the start-up of the first run (start to its
first step) and the cost of the checkpoint-requeue-resume (signal to the resumed run's first step).
docs/simulation-model.md, "Restart cost".

    FRENZY_TEST_SLURM_PORT=<port> python -m pytest tests/test_sim_restart_live.py -s
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from frenzy_slurm.runtime.checkpoints import latest_step

from .helpers import fsbatch_json, wait_done
from .slurm_fixture import release_requeued, sh, wait_for
from .test_runtime_training_e2e import SITE, jobs_dir, tiny  # noqa: F401  (jobs_dir: a fixture)

pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")
pytestmark = [pytest.mark.live, pytest.mark.slow]


def _first_step_at(metrics: dict) -> float:
    """When the run's first step began: the metrics are written after its last step."""
    return metrics["written_at"] - sum(metrics["step_times_s"])


def test_checkpoint_requeue_resume_cost(jobs_dir, tmp_path):
    spec = tiny(tmp_path, "restart", training__steps=400, training__checkpoint_interval=5)
    out = fsbatch_json(str(spec), "--site", str(SITE))
    job = out["job_id"]
    job_dir = Path(out["job_dir"])
    wait_for(lambda: (latest_step(job_dir / "checkpoints") or 0) >= 10, timeout=240, interval=0.5, what="step 10")
    first_start = sh("squeue", "-h", "-j", str(job), "-o", "%S")  # no accounting on the dev cluster
    signalled = time.time()
    subprocess.run(["scancel", "--signal=USR2", str(job)], check=True)  # to the steps, as the time limit does
    wait_for(lambda: (job_dir / "metrics.json").exists(), timeout=120, interval=0.2, what="first run's metrics")
    first = json.loads((job_dir / "metrics.json").read_text())
    release_requeued(job)
    done = wait_done(job, timeout=600)
    assert done["state"] == "COMPLETED"
    second = json.loads((job_dir / "metrics.json").read_text())
    assert second["restart"] >= 1 and second["resumed_from_step"] >= 10
    started = time.mktime(time.strptime(first_start, "%Y-%m-%dT%H:%M:%S"))
    startup = _first_step_at(first) - started
    restart = _first_step_at(second) - signalled
    print(f"\nstart-up (start to first step): {startup:.1f} s; checkpoint + requeue + resume: {restart:.1f} s")
    assert 0 < startup < 600 and 0 < restart < 900
