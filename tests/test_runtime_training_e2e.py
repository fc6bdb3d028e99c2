"""Real training end to end: fsbatch on the local Slurm cluster, DeepSpeed on the CPU (gloo), metrics.json.

- the tiny example as a 2-stage pipeline across two partitions (a heterogeneous job) while a100 is busy;
- the same model with ZeRO-2 data parallelism in one partition;
- a job requeued mid-run resumes from its checkpoint.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.runtime.checkpoints import latest_step

from .helpers import EXAMPLES, ROOT, fsbatch_json, run_cli, wait_done
from .slurm_fixture import occupy_gpus, release_requeued, wait_for

pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
SITE = ROOT / "site_configs" / "devcluster.yaml"


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch, clean_queue):
    d = tmp_path / "jobs"
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(d))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    return d


def tiny(tmp_path: Path, name: str, **changes) -> Path:
    data = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
    data["name"] = name
    for key, value in changes.items():
        section, field = key.split("__")
        data.setdefault(section, {})[field] = value
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def metrics_of(out: dict) -> dict:
    return json.loads((Path(out["job_dir"]) / "metrics.json").read_text())


def test_heterogeneous_pipeline_training(jobs_dir):
    occupy_gpus({"v100-2": 1, "t4-4": 1})  # a100 busy; one free GPU in v100 and one in t4
    out = fsbatch_json(str(EXAMPLES / "tiny-cpu.yaml"), "--site", str(CPU_SITE))
    chosen = out["decision"]["chosen"]
    assert chosen["kind"] == "heterogeneous" and len(chosen["components"]) == 2
    assert {c["partition"] for c in chosen["components"]} == {"v100", "t4"}
    assert chosen["plan"]["pp"] == 2 and sum(chosen["plan"]["layer_split"]) == 4
    done = wait_done(out["job_id"], timeout=300)
    assert done["state"] == "COMPLETED", (Path(out["job_dir"]) / f"slurm-{out['job_id']}.out").read_text()[-3000:]
    m = metrics_of(out)
    assert m["step"] == m["total_steps"] == 6
    assert [r["rank"] for r in m["ranks"]] == [0, 1] and [r["stage"] for r in m["ranks"]] == [0, 1]
    parts = [c["partition"] for c in chosen["components"]]
    assert [r["partition"] for r in m["ranks"]] == parts  # stage order = component order
    assert {r["host"].split("-")[0] for r in m["ranks"]} == {"v100", "t4"}
    losses = [loss for _, loss in m["loss"]]
    assert losses[-1] < losses[0] - 0.1, losses
    assert all(r["peak_gib"] > 0 and r["predicted_allocated_gib"] > 0 for r in m["ranks"])
    detail = run_cli("fsqueue", str(out["job_id"]))
    assert detail.returncode == 0 and "COMPLETED" in detail.stdout and "predicted vs measured" in detail.stdout
    acc = json.loads(run_cli("frenzy-slurm", "accuracy", out["job_dir"], "--json").stdout)
    assert acc["summary"]["ranks"] == 2 and acc["summary"]["mean_accuracy"] is not None


def test_zero2_data_parallel_training(jobs_dir, tmp_path):
    spec = tiny(tmp_path, "zero2", limits__min_gpus=2)
    out = fsbatch_json(str(spec), "--site", str(SITE))
    plan = out["decision"]["chosen"]["plan"]
    assert (plan["dp"], plan["pp"], plan["zero"]) == (2, 1, 2)
    ds = json.loads((Path(out["job_dir"]) / "ds_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2
    done = wait_done(out["job_id"], timeout=300)
    assert done["state"] == "COMPLETED"
    m = metrics_of(out)
    assert len(m["ranks"]) == 2 and m["step"] == 6
    assert m["loss"][-1][1] < m["loss"][0][1]


def test_eager_attention_with_selective_recomputation_trains(jobs_dir, tmp_path):
    """model.yaml's attention kernel and the plan's selective recomputation are what the built-in model runs (the
    runtime used to run SDPA whatever it said, and no recomputation for selective)."""
    spec = tiny(tmp_path, "eagersel", training__attention="eager", training__activation_checkpointing="selective")
    out = fsbatch_json(str(spec), "--site", str(SITE))
    assert out["decision"]["chosen"]["plan"]["recompute"] == "selective"
    done = wait_done(out["job_id"], timeout=300)
    assert done["state"] == "COMPLETED", (Path(out["job_dir"]) / f"slurm-{out['job_id']}.out").read_text()[-3000:]
    m = metrics_of(out)
    assert m["step"] == 6 and m["loss"][-1][1] < m["loss"][0][1]
    assert all(r["peak_gib"] > 0 and r["predicted_allocated_gib"] > 0 for r in m["ranks"])


def test_requeued_job_resumes_from_checkpoint(jobs_dir, tmp_path):
    spec = tiny(tmp_path, "resume", training__steps=80, training__checkpoint_interval=5)
    out = fsbatch_json(str(spec), "--site", str(SITE))
    job = out["job_id"]
    ckpt = Path(out["job_dir"]) / "checkpoints"
    # older checkpoints are pruned (keep_checkpoints), so wait for the latest, not for one tag
    wait_for(lambda: (latest_step(ckpt) or 0) >= 10, timeout=240, interval=0.5, what="checkpoint step10")
    subprocess.run(["scontrol", "requeue", str(job)], check=True)
    release_requeued(job)  # Slurm holds requeued jobs for a while (BeginTime)
    done = wait_done(job, timeout=300)
    assert done["state"] == "COMPLETED"
    m = metrics_of(out)
    assert m["restart"] >= 1 and m["resumed_from_step"] >= 10 and m["step"] == 80
    steps = [s for s, _ in m["loss"]]
    assert steps == list(range(1, 81)), "the step counter continues across the restart"
    kept = sorted(int(p.name[4:]) for p in ckpt.glob("step*"))
    assert kept == [70, 75, 80] and latest_step(ckpt) == 80, "the newest keep_checkpoints (3) are kept"
