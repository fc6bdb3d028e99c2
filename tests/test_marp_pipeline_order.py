"""Pipeline schedules as torch.distributed.pipelining orders them (marp/pipeline_order.py): the op order of each
rank, what is alive at each instant under FSDP2's unsharded gradients (torchtitan), and what that makes of a stage's
peak: interleaved 1F1B holds half a stage's gradients while it holds the most activations, 1F1B all of them."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import ResolvedModel, resolve_model
from frenzy_slurm.marp import pinned_plan, search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.pipeline_order import grad_moments, rank_ops, replay
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import make_spec

ROOT = Path(__file__).resolve().parent.parent
# Llama 3.1 405B, the shapes of torchtitan's Dec 2024 3D benchmark (FSDP 8 x TP 8 x PP 8, local batch 32)
LLAMA405 = {"layers": 126, "hidden": 16384, "heads": 128, "kv_heads": 8, "ffn": 53248, "vocab": 128256}


def _torch_interleaved(pp: int, rank: int, n_mb: int, v: int) -> list[tuple[str, int]]:
    """torch's own order: ScheduleInterleaved1F1B._calculate_single_rank_operations, on the fields it reads."""
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    rounds = max(1, n_mb // pp)
    s = types.SimpleNamespace(n_local_stages=v, pp_group_size=pp, _n_microbatches=n_mb, number_of_rounds=rounds)
    s.microbatches_per_round = n_mb // rounds
    ops = schedules.ScheduleInterleaved1F1B._calculate_single_rank_operations(s, rank)
    forward = schedules._ComputationType.FORWARD
    return [("F" if a.computation_type == forward else "B", a.stage_index // pp) for a in ops if a is not None]


@pytest.mark.parametrize(("pp", "v", "n_mb"), [(2, 2, 2), (4, 2, 4), (4, 2, 8), (8, 2, 8), (4, 3, 12), (8, 2, 24)])
def test_the_interleaved_order_is_torchs(pp, v, n_mb):
    for rank in range(pp):
        assert rank_ops("interleaved", pp, rank, n_mb, v) == _torch_interleaved(pp, rank, n_mb, v)


def test_1f1b_and_gpipe_orders():
    # Schedule1F1B: min(n_mb, pp - rank) warm-up forwards, then backward before forward
    assert rank_ops("1f1b", 4, 1, 5) == [("F", 0)] * 3 + [("B", 0), ("F", 0)] * 2 + [("B", 0)] * 3
    assert rank_ops("gpipe", 4, 1, 3) == [("F", 0)] * 3 + [("B", 0)] * 3
    assert replay(rank_ops("1f1b", 2, 0, 2), 1) == [(1.0, 0.0), (2.0, 0.0), (1.0, 1.0), (0.0, 1.0)]


def _moments(schedule: str, i: int, v: int = 1, pp: int = 8, ga: int = 8) -> set[tuple[float, float]]:
    return set(grad_moments(ParallelPlan(pp=pp, grad_accum=ga, schedule=schedule, virtual_stages=v), i))


def test_the_instants_a_stage_can_peak_at():
    # 1F1B with as many micro-batches as stages (torchtitan's default): the first stage runs every forward, then
    # every backward; the first backward makes the stage's gradients with one micro-batch freed
    assert _moments("1f1b", 0) == {(8.0, 0.0), (7.0, 1.0)}
    # the next stage's first backward is followed by a forward: pp - 1 micro-batches beside every gradient
    assert _moments("1f1b", 1) == {(7.0, 1.0)}
    assert _moments("1f1b", 7) == {(1.0, 1.0)}
    assert _moments("gpipe", 5) == {(8.0, 0.0), (7.0, 1.0)}
    # interleaved, two chunks per rank: all 16 chunk-micro-batches, then the last chunk's gradients beside 15 of
    # them, then every gradient once that chunk's 8 are gone and the first chunk's first backward freed one
    assert _moments("interleaved", 0, v=2) == {(8.0, 0.0), (7.5, 0.5), (3.5, 1.0)}
    assert _moments("interleaved", 7, v=2) == {(4.5, 0.5), (3.5, 1.0)}


def test_torchtitan_runs_interleaved_with_two_chunks_per_rank():
    titan = {"trainer": "script", "script": "train.py", "framework": "torchtitan"}
    interleaved = {"pp": 2, "schedule": "interleaved"}
    assert search_space_from_spec(make_spec(entry=titan, parallel=interleaved)).pinned["virtual_stages"] == 2
    three = search_space_from_spec(make_spec(entry=titan, parallel=interleaved | {"virtual_stages": 3}))
    assert three.pinned["virtual_stages"] == 3
    assert search_space_from_spec(make_spec(entry=titan, parallel={"pp": 2})).pinned["virtual_stages"] == 1


def _titan_405b(schedule: str) -> tuple[int, float, float]:
    """(the peak stage, its allocated peak and activations in GiB) of torchtitan's Dec 2024 405B 3D run."""
    entry = {"trainer": "script", "script": "train.py", "framework": "torchtitan", "framework_version": "2024.12.26"}
    spec = make_spec(
        entry=entry,
        model={"arch": LLAMA405},
        training={
            "seq_len": 8192,
            "global_batch": 256,
            "micro_batch": 4,
            "activation_checkpointing": "full",
            "fp8": True,
            "compile": True,
            "loss_chunks": 1,
            "steps": 1,
        },
        parallel={"sharding": "full-shard", "tp": 8, "pp": 8, "schedule": schedule},
    )
    w = workload_from_spec(spec, ResolvedModel(arch=resolve_model(spec, ".").arch, name="llama"))
    plan = pinned_plan(spec, w, 512)
    # torchtitan's split (generate_split_points): the first and last stage one block fewer
    assert plan.stage_layers(126) == (15, 16, 16, 16, 16, 16, 16, 15)
    top = max(estimate_memory(w, plan, "allocated").stages, key=lambda s: s.peak)
    return top.stage, top.peak / GiB, top.activations / GiB


def test_interleaved_1f1b_holds_less_than_1f1b_under_fsdp2_pipelines():
    one_at, one, one_acts = _titan_405b("1f1b")
    inter_at, inter, inter_acts = _titan_405b("interleaved")
    # the second stage (16 blocks, the first has 15 and the embedding): 7 micro-batches of 16 blocks beside every
    # unsharded gradient (1F1B), 3.5 beside them (interleaved: the second chunk's activations are gone when the
    # first chunk makes its gradients)
    assert one_at == inter_at == 1
    assert one_acts == pytest.approx(17.41, abs=0.01)
    assert inter_acts == pytest.approx(10.41, abs=0.01)
    assert one - inter == pytest.approx(7.0, abs=0.01)  # 3.5 micro-batches of 16 checkpointed blocks


def test_torchs_schedules_on_the_cpu_peak_where_the_replay_says():
    """A real step of torch's interleaved 1F1B and 1F1B (gloo, two ranks): saved activations plus accumulated
    gradients peak at the bytes the replay predicts; 1F1B's first rank at its first backward (one micro-batch
    freed beside the gradients: less than the in-flight count beside them)."""
    pytest.importorskip("torch.distributed.pipelining")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import pipeline_schedule_cpu as bench

    inter = bench.measure("interleaved", pp=2, n_mb=2, v=2, d=64)
    assert {r: m for r, (m, _, _) in inter.items()} == {r: p for r, (_, p, _) in inter.items()}
    one = bench.measure("1f1b", pp=2, n_mb=2, d=8)
    measured, replayed, before = one[0]
    assert measured == replayed == 640 and before == 768


def test_torchtitans_split_puts_the_blocks_left_over_on_the_middle_stages():
    # generate_split_points over pp x v stages: the first `layers // n`, the middle ones one more while the remainder
    # lasts, the last the rest; rank r sums stages r, r + pp, ...
    def split(layers: int, pp: int, v: int = 1) -> tuple[int, ...]:
        schedule = "interleaved" if v > 1 else "1f1b"
        return ParallelPlan(pp=pp, schedule=schedule, virtual_stages=v, layer_balance="middle").stage_layers(layers)

    assert split(126, 8) == (15, 16, 16, 16, 16, 16, 16, 15)
    assert split(126, 8, v=2) == (15, 16, 16, 16, 16, 16, 16, 15)  # 7, 8 x 14, 7 over 16 stages
    assert split(32, 4) == (8, 8, 8, 8)
    assert split(11, 4) == (2, 3, 3, 3)
    assert ParallelPlan(pp=4).stage_layers(11) == (3, 3, 3, 2)  # the front split, the default
    titan = {"trainer": "script", "script": "train.py", "framework": "torchtitan"}
    assert search_space_from_spec(make_spec(entry=titan, parallel={"pp": 2})).pinned["layer_balance"] == "middle"
    assert search_space_from_spec(make_spec(parallel={"pp": 2})).pinned["layer_balance"] == "front"
