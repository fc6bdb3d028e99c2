"""MARP against the CPU ground truth: real torch/DeepSpeed training on gloo (benchmarks/cpu_memory_grid.py).

The grid's dataset (benchmarks/data/cpu_memory_grid.json) holds, per point, what MARP is told (architecture,
workload options, parallel plan) and the measured peak live bytes per rank; this test only predicts. Every
pipeline stage's worst rank must be within 3% of MARP's allocated-bytes prediction for that stage (a
multi-process point stores each rank's median of three runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.eval.grid import load_grid, predict

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "cpu_memory_grid.json"
TOLERANCE = 0.03

POINTS = load_grid(DATA) if DATA.exists() else []


def test_grid_dataset_is_present_and_covers_the_modes():
    assert POINTS, f"{DATA} is missing: run python benchmarks/cpu_memory_grid.py"
    trainers = {p["trainer"] for p in POINTS}
    assert {"deepspeed", "pipeline", "fsdp2", "tp", "torch", "ddp"} <= trainers
    assert {p["plan"]["zero"] for p in POINTS if p["trainer"] == "deepspeed" and p["plan"]["dp"] > 1} >= {0, 1, 2, 3}
    assert {p["plan"]["recompute"] for p in POINTS} >= {"none", "full", "selective"}
    assert {p["workload"]["attention"] for p in POINTS} >= {"sdpa", "eager"}
    assert any(p["workload"]["method"] == "lora" for p in POINTS)
    assert {p["plan"]["pp"] for p in POINTS} >= {2, 4}


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
