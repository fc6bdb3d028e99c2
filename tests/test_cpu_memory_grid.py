"""MARP against the CPU ground truth: real torch/DeepSpeed training on gloo (benchmarks/cpu_memory_grid.py).

The grid's dataset (benchmarks/data/cpu_memory_grid.json) holds, per point, the model.yaml that describes the run
and the measured peak live bytes per rank; this test only predicts, through fsbatch's own functions. Every
pipeline stage's worst rank must be within 3% of MARP's allocated-bytes prediction for that stage (a
multi-process point stores each rank's median of three runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.eval.grid import load_grid, predict, spec_of, workload_of

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "cpu_memory_grid.json"
TOLERANCE = 0.03

POINTS = load_grid(DATA) if DATA.exists() else []


def test_grid_dataset_is_present_and_covers_the_modes():
    assert POINTS, f"{DATA} is missing: run python benchmarks/cpu_memory_grid.py"
    trainers = {p["trainer"] for p in POINTS}
    assert {
        "deepspeed",
        "pipeline",
        "fsdp2",
        "tp",
        "torch",
        "ddp",
        "hf-trainer",
        "lightning",
        "torchtune",
        "litgpt",
        "torchtitan",
    } <= trainers
    derived = {p["name"]: workload_of(p) for p in POINTS}
    plans = {name: plan for name, (_, plan) in derived.items()}
    workloads = {name: w for name, (w, _) in derived.items()}
    by_trainer = {p["name"]: p["trainer"] for p in POINTS}
    assert {pl.zero for n, pl in plans.items() if by_trainer[n] == "deepspeed" and pl.dp > 1} >= {0, 1, 2, 3}
    assert {pl.recompute for pl in plans.values()} >= {"none", "full", "selective"}
    assert {w.attention for w in workloads.values()} >= {"sdpa", "eager"}
    assert any(w.method == "lora" for w in workloads.values())
    # LoRA in the frameworks' own recipes (torchtune's lora_finetune_single_device, litgpt's finetune/lora.py, PEFT)
    # and litgpt's bitsandbytes QLoRA
    methods = {(by_trainer[n], w.method) for n, w in workloads.items()}
    assert {("torchtune", "lora"), ("litgpt", "lora"), ("hf-trainer", "lora"), ("litgpt", "qlora")} <= methods
    assert {pl.pp for pl in plans.values()} >= {2, 4}
    # Transformers' Trainer under accelerate's FSDP2 (full shard over the data-parallel ranks)
    assert any(by_trainer[n] == "hf-trainer" and pl.zero == 3 and pl.dp > 1 for n, pl in plans.items())


def test_every_point_is_a_model_yaml_a_user_could_run():
    """The grid's inputs are model.yaml files (no Workload field set by hand): each validates as a JobSpec, the
    built-in trainer's points name framework frenzy, Transformers' Trainer points hf-trainer (its profile's
    defaults, nothing else said) and the others a plain torch loop, and the plan fsbatch's search gives for it at
    the point's GPU count is the one that ran."""
    for p in POINTS:
        spec = spec_of(p)
        framework = {
            "deepspeed": "frenzy",
            "pipeline": "frenzy",
            "hf-trainer": "hf-trainer",
            "lightning": "lightning",
            "torchtune": "torchtune",
            "litgpt": "litgpt",
            "torchtitan": "torchtitan",
        }.get(p["trainer"], "torch")
        assert spec.entry.runs_with == framework
        _, plan = workload_of(p)
        assert plan.world == len({r["rank"] for r in p["ranks"]})
        assert plan.tp == p["spec"]["parallel"]["tp"] and plan.pp == p["spec"]["parallel"]["pp"]


@pytest.mark.parametrize("point", [pytest.param(p, id=p["name"]) for p in POINTS])
def test_marp_within_3_percent(point):
    for r in predict(point):
        assert abs(r.error) <= TOLERANCE, (
            f"{r.point} stage {r.stage}: measured {r.measured / 2**20:.3f} MiB, MARP {r.predicted / 2**20:.3f} MiB "
            f"({r.error:+.1%})"
        )


def test_frees_on_other_threads_reach_the_running_total():
    """gloo drops the last reference to a collective's buffer on its own threads; the profiler's running total
    must see those frees, or multi-process points seem to grow from step to step."""
    import threading

    import torch
    from torch.profiler import ProfilerActivity, profile

    from frenzy_slurm.runtime.memory import count_all_threads, trace_events

    assert count_all_threads()
    box: list = []
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        box.append(torch.empty(1 << 20, dtype=torch.uint8))
        worker = threading.Thread(target=box.clear)  # the 1 MiB block is freed on another thread
        worker.start()
        worker.join()
        torch.empty(1024, dtype=torch.uint8)  # the next event on this thread reports the total
    mem = sorted((e for e in trace_events(prof) if e.get("name") == "[memory]"), key=lambda e: e["ts"])
    totals = [e["args"]["Total Allocated"] for e in mem]
    assert totals[0] - totals[-1] >= (1 << 20) - 1024  # the other thread's free is in the total
