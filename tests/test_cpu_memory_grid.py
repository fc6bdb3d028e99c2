"""MARP against the CPU ground truth: real torch/DeepSpeed training on gloo (benchmarks/cpu_memory_grid.py).

The grid's dataset (benchmarks/data/cpu_memory_grid.json) holds, per point, what MARP is told (architecture,
workload options, parallel plan) and the measured peak live bytes per rank; this test only predicts. Every
pipeline stage's worst rank must be within 3% of MARP's allocated-bytes prediction for that stage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.eval.grid import load_grid, predict

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "cpu_memory_grid.json"
TOLERANCE = 0.03

# Points MARP does not yet meet, each with the reason (docs/accuracy.md); strict, so a fix must remove them.
_ZERO3 = ("DeepSpeed ZeRO-3 on the CPU accelerator: what a step adds on top of the resting bytes matches MARP (Llama "
          "15.67 measured vs 15.66 MiB, GPT-2 13.31-13.57 vs 13.55), but the resting bytes grow every step (gathered "
          "parameters left over between steps: Llama 9.47 -> 11.15 MiB, GPT-2 11.09 -> 12.54, MARP 8.56 / 9.20)")
KNOWN_GAPS: dict[str, str] = {
    "ds-gpt2-dp2-zero3": _ZERO3,
    "ds-llama-dp2-zero3": _ZERO3,
    "fsdp2-llama-dp2-bf16": "FSDP2 with a bf16 policy on gloo: peaks grow from step to step (rank 1: 14.63, 14.63, 15.32 MiB); rank 0's first steady steps are 4% from MARP, the worst 9.9%",
    "tp-llama-tp2": "DTensor tensor parallelism on gloo: rank 1's peaks grow from step to step (14.62, 14.75, 15.00 MiB); rank 0 is steady at 14.63 MiB, 2.3% from MARP",
}

POINTS = load_grid(DATA) if DATA.exists() else []


def test_grid_dataset_is_present_and_covers_the_modes():
    assert POINTS, f"{DATA} is missing: run python benchmarks/cpu_memory_grid.py"
    trainers = {p["trainer"] for p in POINTS}
    assert {"deepspeed", "pipeline", "fsdp2", "tp", "torch", "ddp"} <= trainers
    assert {p["plan"]["zero"] for p in POINTS if p["trainer"] == "deepspeed"} >= {1, 2, 3}
    assert {p["plan"]["recompute"] for p in POINTS} >= {"none", "full", "selective"}
    assert {p["workload"]["attention"] for p in POINTS} >= {"sdpa", "eager"}
    assert any(p["workload"]["method"] == "lora" for p in POINTS)
    assert {p["plan"]["pp"] for p in POINTS} >= {2, 4}


@pytest.mark.parametrize("point", [
    pytest.param(p, id=p["name"], marks=[pytest.mark.xfail(strict=True, reason=KNOWN_GAPS[p["name"]])]
                 if p["name"] in KNOWN_GAPS else []) for p in POINTS])
def test_marp_within_3_percent(point):
    for r in predict(point):
        assert abs(r.error) <= TOLERANCE, (
            f"{r.point} stage {r.stage}: measured {r.measured / 2**20:.3f} MiB, MARP {r.predicted / 2**20:.3f} MiB "
            f"({r.error:+.1%})")
