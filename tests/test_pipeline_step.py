"""HAS's pipeline step-time model (`has.hetero.step_time`) against real DeepSpeed pipelines on the CPU.

The measurements are benchmarks/data/pipeline_step.json (benchmarks/pipeline_step.py trains; this test only
predicts). Two numbers about the CPU come from the single-stage points, as a GPU type's efficiency and
fixed costs come from its spec: the effective FLOP/s (the per-micro-batch slope over grad_accum) and the
fixed cost of a step (the intercept). Every two-stage point is then predicted through `step_time`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_slurm.has.hetero import StageGroup, head_in_blocks, step_time
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.speed import flops_per_token, small_batch_penalty

DATA = Path(__file__).resolve().parent.parent / "benchmarks" / "data" / "pipeline_step.json"
# Within this of the measured step, every point: what the 1F1B model leaves out on the CPU (gloo's send and
# receive, DeepSpeed's per-instruction Python, the optimizer step run on each stage's own parameters).
TOLERANCE = 0.15


def _data() -> dict:
    return json.loads(DATA.read_text())


def _workload(d: dict) -> Workload:
    return Workload.of(arch=Architecture(**d["arch"]), seq_len=d["seq_len"], precision=d["precision"])


def _calibrated(d: dict) -> tuple[float, float]:
    """The CPU's effective FLOP/s and its fixed cost per step, from the single-stage points."""
    single = {p["grad_accum"]: p["step_s"] for p in d["points"] if len(p["split"]) == 1}
    (lo, t_lo), (hi, t_hi) = sorted(single.items())[0], sorted(single.items())[-1]
    per_micro = (t_hi - t_lo) / (hi - lo)
    fixed = t_lo - lo * per_micro
    tokens = d["micro_batch"] * d["seq_len"]
    rate = flops_per_token(_workload(d)) * tokens * small_batch_penalty(tokens) / per_micro
    return rate, fixed


def _predict(d: dict, p: dict) -> float:
    rate, fixed = _calibrated(d)
    w = _workload(d)
    split = tuple(p["split"])
    plan = ParallelPlan(pp=len(split), micro_batch=d["micro_batch"], grad_accum=p["grad_accum"], layer_split=split)
    group = StageGroup(
        pool="cpu",
        stages=len(split),
        rate=rate,
        usable_bytes=1e12,
        overhead_bytes=0.0,
        intra_gbs=10.0,
        inter_gbs=10.0,  # gloo over loopback: the activations are a few hundred kB, so this barely counts
        gpus_per_node=len(split),
        step_overhead_s=fixed,
    )
    return step_time(w, plan, [group], [rate] * len(split), head_in_blocks(w.arch))


def test_the_dataset_has_balanced_and_unbalanced_pipelines_over_a_range_of_bubbles():
    d = _data()
    pipes = [p for p in d["points"] if len(p["split"]) == 2]
    assert {tuple(p["split"]) for p in pipes} == {(4, 4), (6, 2), (2, 6)}
    assert {p["grad_accum"] for p in pipes} == {1, 2, 4, 8}
    assert all(p["step_s"] > 0 for p in d["points"])


@pytest.mark.parametrize(
    "split, grad_accum", [(s, ga) for s in ((4, 4), (6, 2), (2, 6)) for ga in (1, 2, 4, 8)], ids=str
)
def test_step_time_predicts_each_measured_pipeline(split, grad_accum):
    d = _data()
    (p,) = [x for x in d["points"] if tuple(x["split"]) == split and x["grad_accum"] == grad_accum]
    predicted = _predict(d, p)
    assert abs(predicted / p["step_s"] - 1) <= TOLERANCE, (predicted, p["step_s"])


def test_the_slowest_stage_sets_the_pace_only_in_the_steady_state():
    # 6:2 against 4:4: at grad_accum 8 the slowest stage sets the pace (about 1.5x); at grad_accum 1 each
    # micro-batch passes every stage once, so the split does not matter. The model says both.
    d = _data()
    by = {(tuple(p["split"]), p["grad_accum"]): p for p in d["points"]}
    for ga, lo, hi in ((8, 1.3, 2.0), (1, 0.9, 1.1)):
        measured = by[((6, 2), ga)]["step_s"] / by[((4, 4), ga)]["step_s"]
        predicted = _predict(d, by[((6, 2), ga)]) / _predict(d, by[((4, 4), ga)])
        assert lo < measured < hi and lo < predicted < hi
