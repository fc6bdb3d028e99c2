"""A job `frenzy-slurm watch` moved resumes the moved job's checkpoint on its own plan: real DeepSpeed on the CPU.

The runtime is started as srun would start it (one process per rank, without Slurm), on job directories written
as fsbatch writes them, with the plan each layout needs. What has/moves.py `resumable` allows is checked:
- ZeRO 1 -> ZeRO 2 at another data-parallel width: through DeepSpeed's universal checkpoint (ds_to_universal);
- ZeRO 0 at another width: DeepSpeed loads it as it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.jobdir.planfile import MovedFrom
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.planning import load_job
from frenzy_slurm.render.ds_config import ds_config
from frenzy_slurm.runtime.dist import free_port
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, planned

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

ROOT = Path(__file__).resolve().parent.parent


def _job_dir(path: Path, steps: int, plan: ParallelPlan, moved_from: MovedFrom | None = None) -> Path:
    """A job directory as fsbatch writes it (no digests recorded: the runtime is started by hand), with `plan`."""
    job = load_job(ROOT / "examples" / "tiny-cpu.yaml", {"training.steps": steps, "training.checkpoint_interval": 2})
    req = planned(job.spec, synthetic(LOCAL), job_dir=path, model=job.model)
    pf = req.plan.model_copy(deep=True)
    pf.decision.chosen.plan = plan
    pf.moved_from = moved_from
    path.mkdir(mode=0o700)
    for name, text in (
        ("plan.json", pf.model_dump_json(indent=2)),
        ("ds_config.json", json.dumps(ds_config(job.spec, plan))),
    ):
        fd = os.open(path / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    return path


def _train(job_dir: Path, ranks: int) -> dict:
    port = str(free_port())
    procs = [
        subprocess.Popen(
            [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir)],
            cwd=job_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FRENZY_"))},
                "PYTHONPATH": str(ROOT),
                "DS_ACCELERATOR": "cpu",
                "RANK": str(r),
                "LOCAL_RANK": str(r),
                "WORLD_SIZE": str(ranks),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
        )
        for r in range(ranks)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    metrics = json.loads((job_dir / "metrics.json").read_text())
    metrics["log"] = outs[0]
    return metrics


def test_a_zero1_checkpoint_resumes_as_zero2_at_another_width_through_the_universal_format(tmp_path):
    old = ParallelPlan(dp=2, zero=1, micro_batch=2, grad_accum=2)
    first = _train(_job_dir(tmp_path / "old", 4, old), ranks=2)
    assert first["step"] == 4 and (tmp_path / "old" / "checkpoints" / "step4").is_dir()
    moved = MovedFrom(job_id=41, job_dir=str(tmp_path / "old"), plan=old)
    new = ParallelPlan(dp=1, zero=2, micro_batch=2, grad_accum=4)
    second = _train(_job_dir(tmp_path / "new", 6, new, moved), ranks=1)
    assert second["resumed_from_step"] == 4 and second["step"] == 6
    assert "converted step4 to a universal checkpoint" in second["log"]
    assert (tmp_path / "new" / "checkpoints" / "moved-41-step4-universal-r0").is_dir()
    assert (tmp_path / "new" / "checkpoints" / "step6").is_dir()
    # the model went on from where it was: the loss continues the old run's, not a fresh start's
    fresh = _train(_job_dir(tmp_path / "fresh", 6, new), ranks=1)
    assert second["loss"][-1][1] < fresh["loss"][0][1]
    assert not any(p.name.startswith("moved-") for p in (tmp_path / "old" / "checkpoints").iterdir())


def test_a_zero0_checkpoint_loads_as_it_is_at_another_width(tmp_path):
    old = ParallelPlan(dp=2, zero=0, micro_batch=2, grad_accum=2)
    _train(_job_dir(tmp_path / "old", 2, old), ranks=2)
    moved = MovedFrom(job_id=42, job_dir=str(tmp_path / "old"), plan=old)
    new = ParallelPlan(dp=1, zero=0, micro_batch=2, grad_accum=4)
    second = _train(_job_dir(tmp_path / "new", 4, new, moved), ranks=1)
    assert second["resumed_from_step"] == 2 and second["step"] == 4
    assert "universal" not in second["log"]
