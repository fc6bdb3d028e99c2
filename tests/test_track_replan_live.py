"""A job marked slurm.replan, changed while it waits, trains as the shape Slurm gave it (real Slurm 22.05).

fsbatch records the shapes in plan.json; the job waits (every GPU held); it is changed in place to another of
its shapes with the backend's `update_pending` (what `frenzy-slurm watch` applies; the choice itself is tested
on the fake Slurm in test_track_watch_replan.py); once GPUs free up it runs, and the built-in trainer runs that
shape's plan with one rank per GPU it got (srun's shape flags, the runtime's pick), under the same job id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.slurm.backend import ComponentRequest

from .helpers import ROOT, fsbatch_json, wait_done
from .slurm_fixture import occupy_gpus, sh, wait_for

pytestmark = [pytest.mark.slow]
pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

TINY = ROOT / "examples" / "tiny-cpu.yaml"


def test_a_job_changed_while_it_waits_trains_as_its_new_shape(live_jobs_dir, tmp_path):
    from frenzy_slurm.jobdir.planfile import read_plan
    from frenzy_slurm.slurm import open_backend

    occupy_gpus({})  # every GPU held: the job waits
    spec = yaml.safe_load(TINY.read_text())
    spec.update(name="reshaped", slurm={"replan": True}, limits={"gpu_types": ["t4"], "max_gpus": 4})
    path = tmp_path / "reshaped.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = fsbatch_json(str(path))
    job, job_dir = int(out["job_id"]), Path(out["job_dir"])
    shapes = read_plan(job_dir / "plan.json").shapes
    assert len(shapes) >= 2, [s.key() for s in shapes]
    first, target = shapes[0], shapes[1]
    submitted = sh("squeue", "-h", "-j", str(job), "-o", "%V")
    wait_for(lambda: sh("squeue", "-h", "-j", str(job), "-o", "%T") == "PENDING", what="the job pending")
    req = ComponentRequest(
        partition=target.partition,
        gpu_type=target.gpu_type,
        nodes=target.nodes,
        gpus_per_node=target.gpus_per_node,
        time_min=1,
        cpus_per_gpu=target.allocation.components[0].cpus_per_task,
    )
    open_backend("cli").update_pending(job, req)
    assert sh("squeue", "-h", "-j", str(job), "-o", "%V") == submitted
    sh("scancel", "-n", "wrap")  # the GPUs free up
    done = wait_done(job, timeout=300)
    log = (job_dir / f"slurm-{job}.out").read_text()
    assert done["state"] == "COMPLETED", log[-3000:]
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["job_id"] == str(job) and metrics["step"] == spec["training"]["steps"]
    assert len(metrics["ranks"]) == target.nodes * target.gpus_per_node != first.nodes * first.gpus_per_node
    assert any("frenzy-slurm: step" in line for line in log.splitlines())  # the trainer's progress, as srun ran it
