"""Candidate generation: for each GPU type, the plans that fit its memory, at each GPU count, fastest first.

Memory does not depend on the GPU type (apart from the fixed device overhead), so a plan is estimated
at most once and compared against each type's usable memory; only step time is per type. Step time is
cheap and memory is not, so the search prices plans first and estimates only those that could win
(`search`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field, replace
from functools import cached_property

from frenzy_slurm.core.gpus import GpuSpec
from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.memory import MemoryEstimate, Overheads, estimate_memory
from frenzy_slurm.marp.memory_memo import TermMemo
from frenzy_slurm.marp.plan import ParallelPlan, Recompute, Workload
from frenzy_slurm.marp.speed import Links, PlanCosts, PlanPricer, PlanShape, seconds_floor

FLOOR_MARGIN = 1e-9  # relative: a group is skipped only when its step-time floor is this much above the best


@dataclass(frozen=True)
class GpuOption:
    """A GPU type the job may use, and how many of it (cluster total within the user's limits)."""

    name: Hashable  # the caller's key for it (HAS: the pool's PoolKey; `memory --gpu`: the catalog name)
    spec: GpuSpec
    max_gpus: int
    gpus_per_node: int = 8
    usable_fraction: float = 0.95  # headroom kept free on every GPU
    inter_node_gbs: float = 25.0
    intra_node_gbs: float | None = None  # default: the catalog's link bandwidth
    overheads: Overheads = field(default_factory=Overheads)  # CUDA context / NCCL of this GPU type

    def overhead_bytes(self, world: int) -> float:
        """Device memory beyond the allocator's reserved bytes: context, and NCCL buffers when world > 1."""
        return self.overheads.device_bytes(world)

    @property
    def usable_bytes(self) -> float:
        return self.spec.memory_gib * self.usable_fraction * GiB

    @cached_property
    def links(self) -> Links:
        return Links(self.intra_node_gbs or self.spec.link_gbs, self.inter_node_gbs, self.gpus_per_node)


@dataclass(frozen=True)
class Candidate:
    gpu: Hashable  # the GpuOption name it was found for
    gpus: int
    plan: ParallelPlan
    memory: MemoryEstimate  # reserved bytes (allocator view); the GPU type's overhead is added separately
    capacity_gib: float  # usable memory per GPU
    step_time_s: float
    steps: int
    overhead_gib: float = 0.0

    @property
    def peak_gib(self) -> float:
        """Device memory used per GPU (nvidia-smi view)."""
        return self.memory.peak_gib + self.overhead_gib

    @property
    def run_time_s(self) -> float:
        return self.step_time_s * self.steps


@dataclass
class SearchSpace:
    """What the search may vary (search_space_from_spec: what the job's framework can run, within what
    model.yaml pins); the defaults cover what DeepSpeed supports."""

    micro_batch: int | None = None  # fixed by the user, else searched
    recompute: tuple[Recompute, ...] = ("none", "selective", "full")
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    tp_degrees: tuple[int, ...] = (1, 2, 4, 8)
    pp_degrees: tuple[int, ...] = (1, 2, 4, 8, 16)
    max_micro_batch: int = 64
    fragmentation: float = Overheads().fragmentation
    recompute_every: int | None = None  # with full recomputation: every k-th block only
    max_zero_with_pp: int = 1  # the highest ZeRO/FSDP stage the framework combines with pipeline stages
    heterogeneous: bool = True  # pipeline stages across GPU types (HAS's heterogeneous plans)
    shard_per_node: bool = False  # HSDP: ZeRO-3 states sharded over one node's GPUs, replicated across nodes
    # FSDP over the context-parallel ranks too (torchtitan): with cp > 1 the states are sharded even at dp 1, and
    # never replicated (marp/frameworks.py Capabilities.fsdp_over_cp)
    shards_over_cp: bool = False
    # ParallelPlan fields every plan carries as model.yaml pins them (cp, offload, schedule, shard_group, ...)
    pinned: dict[str, object] = field(default_factory=dict)

    @property
    def cp(self) -> int:
        return int(self.pinned.get("cp", 1))  # type: ignore[call-overload]  # validated by the spec


def _counts(opt: GpuOption, limit: int) -> list[int]:
    """GPU counts tried for one type."""
    top = min(opt.max_gpus, limit)
    counts = {c for c in (1 << i for i in range(16)) if c <= top}  # powers of two divide batch sizes best
    if top % opt.gpus_per_node == 0:
        counts.add(top)  # and every GPU there is, in whole nodes
    return sorted(counts)


@dataclass(frozen=True)
class PlanGroup:
    """Valid plans for one GPU count that differ only in micro-batch (ascending); memory grows with it."""

    dp: int
    tp: int
    pp: int
    zero: int
    recompute: Recompute
    micro_batches: tuple[int, ...]
    global_batch: int
    pinned: tuple[tuple[str, object], ...] = ()  # SearchSpace.pinned, with recompute_layers where it applies

    def plan(self, mb: int) -> ParallelPlan:
        return ParallelPlan(
            **{
                "dp": self.dp,
                "tp": self.tp,
                "pp": self.pp,
                "zero": self.zero,
                "micro_batch": mb,
                "grad_accum": self.global_batch // (self.dp * mb),
                "recompute": self.recompute,
                "sequence_parallel": self.tp > 1,
                **dict(self.pinned),
            }  # type: ignore[arg-type]  # the pinned values come validated from the spec
        )

    def shape(self, mb: int) -> PlanShape:
        """What `PlanPricer.costs` reads of `plan(mb)`, without validating a ParallelPlan."""
        schedule = str(dict(self.pinned).get("schedule", "1f1b"))
        ga = self.global_batch // (self.dp * mb)
        return PlanShape(self.dp, self.tp, self.pp, self.zero, mb, ga, self.recompute, schedule=schedule)


def plan_groups(
    w: Workload, world: int, global_batch: int, space: SearchSpace, gpus_per_node: int
) -> Iterator[PlanGroup]:
    """The groups of valid plans for `world` GPUs, without building the plans."""
    a = w.arch
    cp = space.cp
    pinned_group = space.pinned.get("shard_group")
    for tp in space.tp_degrees:
        if tp > world or tp > gpus_per_node or a.heads % tp or a.kv % tp or world % tp:
            continue
        for pp in space.pp_degrees:
            if pp > a.layers or world % (tp * pp * cp) or (pp > 1 and a.encoder_decoder):
                continue  # (an encoder-decoder model's stages are not modelled: its plans have pp 1)
            if space.pinned.get("schedule") == "sequential" and (pp > gpus_per_node or gpus_per_node % pp):
                continue  # naive model parallelism: one process, on one node, drives all its stages' GPUs
            dp = world // (tp * pp * cp)
            if dp > global_batch or global_batch % dp:
                continue
            group = min(dp, gpus_per_node) if space.shard_per_node else pinned_group
            if isinstance(group, int) and dp % group:
                continue  # a shard group must divide the data-parallel ranks
            over_cp = space.shards_over_cp and cp > 1
            for zero in space.zero_stages:
                if (zero > 0 and dp * (cp if over_cp else 1) == 1) or (zero > space.max_zero_with_pp and pp > 1):
                    continue  # ZeRO needs data parallelism; DeepSpeed refuses ZeRO-2/3 with pipelines
                if over_cp and zero == 0 and any(z > 0 for z in space.zero_stages):
                    continue  # FSDP over the cp ranks shards the states whatever dp is
                if dp > 1 and zero < (1 if pp > 1 else 2) and (1 if pp > 1 else 2) in space.zero_stages:
                    continue  # dominated: ZeRO-1/2 move the same bytes as plain data parallelism, in less memory
                if zero == 0 and (space.pinned.get("offload_optimizer") or space.pinned.get("offload_params")):
                    continue  # offload needs sharded states
                if zero != 3 and space.pinned.get("offload_params"):
                    continue
                for rc in space.recompute:
                    if rc == "selective" and w.activations.attention != "eager" and len(space.recompute) > 1:
                        continue  # searched: flash/sdpa already skip the score matrix, same as none
                    pinned = tuple(space.pinned.items())
                    if space.shard_per_node:
                        pinned += (("shard_group", group),)
                    if rc == "full" and space.recompute_every:
                        pinned += (
                            ("recompute_layers", -(-a.layers // pp) // space.recompute_every),
                        )  # of the largest stage
                    sizes = (
                        [space.micro_batch]
                        if space.micro_batch
                        else [
                            m
                            for m in (1 << i for i in range(8))
                            if m <= space.max_micro_batch and (global_batch // dp) % m == 0
                        ]
                    )
                    mbs = tuple(mb for mb in sizes if not (global_batch // dp) % mb)
                    if mbs:
                        yield PlanGroup(dp, tp, pp, zero, rc, mbs, global_batch, pinned)


def _estimate(w: Workload, g: PlanGroup, mb: int, frag: Overheads, memo: TermMemo, shared: bool) -> MemoryEstimate:
    """The reserved bytes of group `g`'s plan at micro-batch `mb` (first and last stages), with the search's memo
    of shared terms (marp/memory_memo.py). A `shared` memo (the caller's, for several searches of `w`: HAS's
    fallback plans search again over less usable memory, mostly the same plans) also keeps the whole estimate, by
    all it is made of; a search's own memo does not, as no plan comes twice in one search."""
    # (without the variable-length cache, which decides no fit: `search` adds it to the plans it keeps)
    if not shared:
        return estimate_memory(w, g.plan(mb), "reserved", frag, True, memo, cache=False)
    return memo.get(
        "estimates", (g, mb, frag), lambda: estimate_memory(w, g.plan(mb), "reserved", frag, True, memo, cache=False)
    )


def search(
    w: Workload,
    options: list[GpuOption],
    global_batch: int,
    steps: int,
    max_gpus: int | None = None,
    space: SearchSpace | None = None,
    memo: TermMemo | None = None,
) -> dict[Hashable, list[Candidate]]:
    """Per GPU type: the fastest fitting plan at each GPU count, ordered by step time (fastest first).

    Within a group (plans that differ only in micro-batch, memory growing with it) the plans are taken in
    order and the group ends at the first plan that fits on no GPU type. The result is that of estimating
    every plan in that order, with less work: a plan's memory is estimated only when its step time beats
    the best found so far on some type it could run on (the plans skipped before it are estimated then, in
    order, so the group still ends where it would), and a group whose step-time floor (`seconds_floor`)
    beats no type's best is skipped whole. Neither shortcut depends on the memory model; test_has_search_speed.py
    compares the result with the plain loop. Estimates share a `memo` (`_estimate`), the caller's if it passes one.
    """
    space = space or SearchSpace()
    limit = max_gpus or max((o.max_gpus for o in options), default=0)
    largest = max((o.usable_bytes - o.overhead_bytes(1) for o in options), default=0.0)
    frag = Overheads(fragmentation=space.fragmentation)
    out: dict[Hashable, list[Candidate]] = {o.name: [] for o in options}
    counts = {o.name: set(_counts(o, limit)) for o in options}
    worlds = sorted(set().union(*counts.values())) if counts else []
    price = PlanPricer(w, global_batch)
    shared, memo = memo is not None, memo or TermMemo(w)

    def too_big(g: PlanGroup, mb: int, estimates: dict[int, MemoryEstimate]) -> bool:
        """Builds and estimates the group's plan at micro-batch `mb` into `estimates`; True if it fits on no
        GPU type, which ends its group."""
        est = estimates[mb] = _estimate(w, g, mb, frag, memo, shared)
        return est.needed > largest

    for world in worlds:
        # (option, device overhead, usable bytes) of each type searched at this count, computed once
        users = [(o, o.overhead_bytes(world), o.usable_bytes) for o in options if world in counts[o.name]]
        gpn = max(o.gpus_per_node for o, _, _ in users)
        best: dict[Hashable, Candidate] = {}
        for g in plan_groups(w, world, global_batch, space, gpn):
            runs = [(o, extra, usable) for o, extra, usable in users if g.tp <= o.gpus_per_node]
            known: dict[int, PlanCosts] = {}  # costs already priced, by micro-batch
            if all(o.name in best for o, _, _ in runs):
                # no plan of the group can be faster than its floor: skip it when that is no faster than the
                # best found on every type (the margin covers rounding between the floor and seconds_on)
                lo = known[g.micro_batches[0]] = price.costs(g.shape(g.micro_batches[0]))
                hi = known[g.micro_batches[-1]] = price.costs(g.shape(g.micro_batches[-1]))
                if all(
                    seconds_floor(lo, hi, o.spec, o.links) * (1.0 - FLOOR_MARGIN) >= best[o.name].step_time_s
                    for o, _, _ in runs
                ):
                    continue
            # plans are priced from their shape and built (pydantic) only when their memory is estimated
            estimates: dict[int, MemoryEstimate] = {}
            skipped: list[int] = []  # micro-batches not estimated yet: no type could have taken them for speed
            for mb in g.micro_batches:
                costs = known.get(mb) or price.costs(g.shape(mb))
                faster = []
                for o, extra, usable in runs:
                    t = costs.seconds_on(o.spec, o.links)
                    cur = best.get(o.name)
                    if cur is None or t < cur.step_time_s:
                        faster.append((o, extra, usable, t))
                if not faster:
                    skipped.append(mb)
                    continue
                if any(too_big(g, m, estimates) for m in skipped) or too_big(g, mb, estimates):
                    break  # memory grows with micro-batch: stop at the first that fits nowhere
                skipped.clear()
                est = estimates[mb]
                for o, extra, usable, t in faster:
                    if est.needed + extra > usable:
                        continue
                    best[o.name] = Candidate(o.name, world, est.plan, est, usable / GiB, t, steps, extra / GiB)
        for name, cand in best.items():
            out[name].append(cand)
    for name in out:
        out[name].sort(key=lambda c: c.step_time_s)
    return _with_cache(w, out, frag, memo, {o.name: o for o in options})


def _with_cache(
    w: Workload,
    out: dict[Hashable, list[Candidate]],
    frag: Overheads,
    memo: TermMemo,
    options: dict[Hashable, GpuOption],
) -> dict[Hashable, list[Candidate]]:
    """The kept plans' estimates with what variable lengths keep cached (left out while the search decided fits on
    `needed`, which it is not part of), at most what the GPU type's memory leaves beside its device terms
    (`MemoryEstimate.on_gpu`: the allocator frees its cache before it fails); fixed lengths keep none."""
    if w.median_seq_len is None:
        return out
    return {
        name: [
            replace(
                c,
                memory=estimate_memory(w, c.plan, "reserved", frag, True, memo).on_gpu(
                    options[name].spec.memory_gib * GiB, options[name].overheads
                ),
            )
            for c in cands
        ]
        for name, cands in out.items()
    }
