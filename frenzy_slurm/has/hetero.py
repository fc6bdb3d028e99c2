"""Heterogeneous plans: a pipeline whose stages run on different GPU types.

Stages get layers in proportion to their GPUs' effective speed (peak TFLOP/s x utilisation), the last
stage counting the output layer as extra work; a stage whose predicted memory exceeds its GPU gives
layers to the stage with the most room. Data parallelism is the same degree in every stage (DeepSpeed's
pipeline grid), ZeRO at most 1 (DeepSpeed refuses ZeRO-2/3 with pipelines).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.memory import MemoryEstimate, Overheads, estimate_memory
from frenzy_slurm.marp.params import count_params
from frenzy_slurm.marp.plan import ParallelPlan, Recompute, Workload
from frenzy_slurm.marp.speed import (
    ADAM_BYTES_PER_PARAM,
    DP_OVERLAP,
    elementwise_bytes_per_token,
    flops_per_token,
    ring_gbs,
    small_batch_penalty,
)

if TYPE_CHECKING:
    from frenzy_slurm.jobspec.arch import Architecture

# A transformer block holds about 12 h^2 weights (4 h^2 in attention, 8 h^2 in an MLP with ffn = 4h, the usual
# approximation of Kaplan et al. 2020 and Megatron-LM's FLOP count) and the output layer vocab x h, so per token
# the output layer does about vocab / (12 h) blocks' worth of matmul work. Used only to weigh the last stage's
# extra work when layers are split (since the first HAS, 5acce1b) and in HAS's bound on a pipeline's best step
# (since bb91799); MARP's step time counts parameters exactly.
BLOCK_WEIGHTS_PER_HIDDEN_SQUARED = 12.0


def head_in_blocks(arch: Architecture) -> float:
    """The output layer's work per token, in transformer blocks (the last pipeline stage carries it)."""
    return arch.vocab / (BLOCK_WEIGHTS_PER_HIDDEN_SQUARED * arch.hidden)


@dataclass(frozen=True)
class StageGroup:
    """Consecutive pipeline stages on one pool."""

    pool: Hashable  # the pool key HAS gave it
    stages: int
    rate: float  # effective FLOP/s per GPU
    usable_bytes: float  # usable memory minus the GPU type's context/NCCL overhead
    overhead_bytes: float
    intra_gbs: float
    inter_gbs: float
    gpus_per_node: int
    step_overhead_s: float = 0.0  # the GPU spec's fixed costs per step and per micro-batch slot (calibration)
    microbatch_overhead_s: float = 0.0
    memory_bytes: float | None = None  # the GPU's whole memory (catalog), which caps the variable-length cache
    mem_bw_gbs: float | None = (
        None  # the GPU's memory bandwidth, which paces the element-wise operations (None: not priced)
    )


@dataclass(frozen=True)
class HeteroPlan:
    plan: ParallelPlan
    groups: tuple[StageGroup, ...]
    memory: MemoryEstimate
    step_time_s: float


def split_layers(layers: int, rates: list[float], head_equiv: float) -> list[int] | None:
    """Integer layers per stage proportional to rate; the last stage's output layer counts as work."""
    n = len(rates)
    if layers < n:
        return None
    total = sum(rates)
    ideal = [(layers + head_equiv) * r / total for r in rates]
    ideal[-1] = max(ideal[-1] - head_equiv, 0.0)
    base = [max(1, int(x)) for x in ideal]
    while sum(base) > layers:  # rounding up of tiny stages overshot
        i = max(range(n), key=lambda k: base[k] - ideal[k] if base[k] > 1 else -1e9)
        base[i] -= 1
    rema = sorted(range(n), key=lambda k: ideal[k] - base[k], reverse=True)
    for i in rema[: layers - sum(base)]:
        base[i] += 1
    return base


def _fits(est: MemoryEstimate, caps: list[float]) -> list[float]:
    """Headroom (bytes) per stage; negative where the stage does not fit."""
    return [caps[i] - s.needed for i, s in enumerate(est.stages)]


def _balanced(layers: int, rates: list[float], head_equiv: float, max_layers: list[int]) -> list[int] | None:
    """Min-max stage time under per-stage layer caps: give each next layer to the stage that stays fastest."""
    n = len(rates)
    if sum(max_layers) < layers or min(max_layers) < 1:
        return None
    split = [1] * n
    extra = [0.0] * (n - 1) + [head_equiv]
    for _ in range(layers - n):
        i = min((k for k in range(n) if split[k] < max_layers[k]), key=lambda k: (split[k] + 1 + extra[k]) / rates[k])
        split[i] += 1
    return split


def build(
    w: Workload,
    groups: list[StageGroup],
    dp: int,
    micro_batch: int,
    global_batch: int,
    recompute: Recompute,
    overheads: Overheads = Overheads(),
) -> HeteroPlan | None:
    # estimates are of reserved bytes (fragmentation from `overheads`); each group's usable_bytes already
    # excludes its own context and NCCL overhead
    """A memory-feasible heterogeneous pipeline plan with its predicted step time, or None.

    Each stage's memory grows by a fixed amount per layer, so two estimates (at the speed-proportional
    split and one layer more per stage) give every stage's layer cap; layers then go where they finish
    soonest within the caps, and a final estimate checks the result.
    """
    pp = sum(g.stages for g in groups)
    if global_batch % (dp * micro_batch):
        return None
    ga = global_batch // (dp * micro_batch)
    rates, caps = [], []
    for g in groups:
        rates += [g.rate] * g.stages
        caps += [g.usable_bytes] * g.stages
    a = w.arch
    head_equiv = head_in_blocks(a)
    split = split_layers(a.layers, rates, head_equiv)
    if split is None:
        return None
    plan = ParallelPlan(
        dp=dp,
        pp=pp,
        zero=1 if dp > 1 else 0,
        micro_batch=micro_batch,
        grad_accum=ga,
        recompute=recompute,
        layer_split=tuple(split),
    )
    base = estimate_memory(w, plan, "reserved", overheads)
    more = estimate_memory(
        w, plan.model_copy(update={"layer_split": tuple(x + 1 for x in split)}), "reserved", overheads
    )
    max_layers = []
    for i in range(pp):
        slope = max(more.stages[i].needed - base.stages[i].needed, 1.0)
        max_layers.append(split[i] + int((caps[i] - base.stages[i].needed) // slope))
    balanced = _balanced(a.layers, rates, head_equiv, max_layers)
    if balanced is None:
        return None
    plan = plan.model_copy(update={"layer_split": tuple(balanced)})
    est = estimate_memory(w, plan, "reserved", overheads)
    if min(_fits(est, caps)) < 0:
        return None  # growth per layer was not linear here (another phase peaked): no split we can vouch for
    return HeteroPlan(plan, tuple(groups), est, step_time(w, plan, groups, rates, head_equiv))


def step_time(
    w: Workload, plan: ParallelPlan, groups: list[StageGroup], rates: list[float], head_equiv: float
) -> float:
    """A pipeline's step: every stage's micro-batch time once (1F1B fill and drain) plus grad_accum - 1 times
    the slowest stage's (the steady state), each stage's time its layers' share of the work at its rate
    (`rates`, one per stage; the last stage also carries the output layer, `head_equiv` blocks), plus the
    gradient all-reduce, the activations sent between stages and the groups' fixed costs. Checked against
    real DeepSpeed pipelines on the CPU by tests/test_has_pipeline_step.py (benchmarks/pipeline_step.py)."""
    a = w.arch
    per_token = flops_per_token(w, plan.recompute)
    tokens_mb = plan.micro_batch * w.seq_len
    units = a.layers + head_equiv
    split = plan.stage_layers(a.layers)
    # the element-wise operations at each stage's memory bandwidth, as MARP's step time prices them (marp/speed.py)
    per_layer, loss = elementwise_bytes_per_token(w, plan.recompute)
    bws = [g.mem_bw_gbs for g in groups for _ in range(g.stages)]
    stage_t = []
    for i, layers in enumerate(split):
        work = layers + (head_equiv if i == plan.pp - 1 else 0.0)
        t = per_token * work / units * tokens_mb / rates[i] * small_batch_penalty(tokens_mb)
        bw = bws[i]
        if bw:
            moved = layers * per_layer + (loss if i == plan.pp - 1 else 0.0)
            t += tokens_mb * moved / (bw * 1e9)
        stage_t.append(t)
    # 1F1B: the first micro-batch passes every stage forward and back (fill and drain), each later one adds
    # the slowest stage's time (the steady state). For equal stages this is (grad_accum + pp - 1) x a stage;
    # for unequal ones it is less: (grad_accum + pp - 1) x the slowest overestimated a 6:2 split at
    # grad_accum 1 by 42% (benchmarks/data/pipeline_step.json). _balanced still minimises the slowest stage,
    # the term that dominates once grad_accum exceeds pp
    step = sum(stage_t) + (plan.grad_accum - 1) * max(stage_t)
    # gradient all-reduce inside each stage's data-parallel group, over the pool's own links
    n = w.exact_params or count_params(a).total(a.layers)
    grad_bytes_per_layer = n / a.layers * (4.0 if w.precision == "fp32" else 2.0)
    comm = optimizer = 0.0
    stage_index = 0
    for g in groups:
        layers = max(split[stage_index : stage_index + g.stages])
        if plan.dp > 1:
            bw = ring_gbs(plan.dp, g.intra_gbs, g.inter_gbs, g.gpus_per_node) * 1e9
            comm = max(comm, 2.0 * (plan.dp - 1) / plan.dp * layers * grad_bytes_per_layer / bw)
        if g.mem_bw_gbs and w.method == "full":  # the optimizer step of the slowest stage (ZeRO-1 shards it over dp)
            optimizer = max(optimizer, ADAM_BYTES_PER_PARAM * layers * n / a.layers / plan.dp / (g.mem_bw_gbs * 1e9))
        stage_index += g.stages
    act_bytes = tokens_mb * a.hidden * 2.0
    p2p = 2.0 * (plan.pp - 1) * plan.grad_accum * act_bytes / (min(g.inter_gbs for g in groups) * 1e9)
    # fixed costs: the slowest group's set the pace (every stage waits for it each slot and each step)
    fixed = max(g.step_overhead_s for g in groups) + max(g.microbatch_overhead_s for g in groups) * (
        plan.grad_accum + plan.pp - 1
    )
    return step + optimizer + (1.0 - DP_OVERLAP) * comm + p2p + fixed


def step_floor(w: Workload, stage_rates: list[float], micro_batch: int, grad_accum: int, inter_gbs: float) -> float:
    """A lower bound on `step_time` of any split of the layers over stages of these rates (one per stage, at least
    one layer each), without building the plan: HAS skips a pipeline whose floor cannot beat what it has.

    Per micro-batch (step_time's stage times, at the small-batch penalty of its micro-batch and without
    recomputation, the cheapest setting): the slowest stage takes at least the average share of the work over
    all stages' rates and at least one layer's work at the slowest rate; the stages together take at least the
    whole work at the fastest rate and at least one layer each at its own. Plus step_time's sends between
    stages, which do not depend on the split; the gradient all-reduce and the fixed costs count as nothing."""
    a = w.arch
    tokens_mb = micro_batch * w.seq_len
    work_mb = flops_per_token(w, "none") * tokens_mb * small_batch_penalty(tokens_mb)
    layer_mb = work_mb / (a.layers + head_in_blocks(a))
    slowest = max(work_mb / sum(stage_rates), layer_mb / min(stage_rates))
    each_once = max(work_mb / max(stage_rates), layer_mb * sum(1.0 / r for r in stage_rates), slowest)
    p2p = 2.0 * (len(stage_rates) - 1) * grad_accum * tokens_mb * a.hidden * 2.0 / (inter_gbs * 1e9)
    return each_once + (grad_accum - 1) * slowest + p2p


def stage_peaks_gib(hp: HeteroPlan) -> list[tuple[float, float]]:
    """(device memory, GiB of cache capped) per stage: reserved bytes plus the stage's GPU-type overhead, the
    variable-length cache counted only up to the stage's GPU memory (`MemoryEstimate.within`: the allocator frees
    it before it reports out of memory)."""
    groups = [g for g in hp.groups for _ in range(g.stages)]
    out = []
    for s, g in zip(hp.memory.stages, groups, strict=True):
        peak = s.peak
        if g.memory_bytes is not None:
            peak = max(s.needed, min(s.peak, g.memory_bytes - g.overhead_bytes))
        out.append(((peak + g.overhead_bytes) / GiB, (s.peak - peak) / GiB))
    return out
