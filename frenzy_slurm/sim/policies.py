"""Allocation policies compared by the simulator, all through the same simulated Slurm.

- `user-fixed:VARIANT`: what users do today. They name one GPU type and a count: the count from the
  rule of thumb "~18 bytes per parameter" for full training (2.4 for LoRA, 0.66 for QLoRA: 16-bit or
  4-bit weights plus 20%), at least what they are used to (the trace's GPU count), in powers of two.
  Their DeepSpeed configuration is the fastest one MARP finds for that count, or, where none fits,
  ZeRO-3 with full checkpointing and micro-batch 1 (so some jobs OOM, as in real life). After an OOM
  they double the GPUs (then move to the largest-memory type). They ask for `--time` twice the run
  time they expect, in whole hours. Variants: `fastest` (the fastest type for the job's precision),
  `largest` (most memory per GPU), `usual` (each team's usual partition), `biggest` (the partition
  with most GPUs). The best of them is "best homogeneous".
- `fastest-fit`: MARP picks the fastest GPU type on which the job fits, at the user's usual count (or
  the smallest that fits), with no regard to the queue.
- `has-homogeneous`: HAS restricted to one GPU type (planning.decide_job per pool, earliest completion wins).
- `has`: full HAS (`frenzy_slurm.has.decide`), heterogeneous jobs allowed; it reads the simulated
  view and asks the simulated Slurm for start estimates, exactly as fsbatch does on a cluster.
- `ilp`: Sia-style rounds (`frenzy_slurm.sim.ilp`).
MARP-based policies learn from an OOM: the next plan assumes the measured excess.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Protocol

from frenzy_slurm.errors import NoFitError
from frenzy_slurm.gpus import catalog
from frenzy_slurm.has.model import Allocation
from frenzy_slurm.has.pools import UsablePool, node_layout, usable_pools
from frenzy_slurm.marp.candidates import search
from frenzy_slurm.marp.memory import Overheads, estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.marp.speed import plan_costs
from frenzy_slurm.planning import decide_job
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
from frenzy_slurm.slurm.backend import ComponentRequest
from frenzy_slurm.units import GiB

RULE_OF_THUMB_BYTES = {"full": 18.0, "lora": 2.4, "qlora": 0.66}
USER_VARIANTS = ("fastest", "largest", "usual", "biggest")


class Policy(Protocol):
    name: str

    @property
    def round_s(self) -> float | None:
        """Seconds between rounds of a round-based policy; None: it places each job when it arrives."""
        ...

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        """A placement to submit now, or None to hold the job (round-based policies) or give up (no fit)."""
        ...

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        """Round-based policies: what to submit this round."""
        ...


def memory_gib(gpu_model: str) -> float:
    return catalog()[gpu_model].memory_gib


def from_allocation(alloc: Allocation) -> Placement:
    comps = [
        PlacedComponent(
            ComponentRequest(
                partition=c.partition,
                gpu_type=c.gpu_type,
                nodes=c.nodes,
                gpus_per_node=c.gpus_per_node,
                time_min=alloc.time_min,
                cpus_per_gpu=c.cpus_per_task,
            ),
            c.gpu_model,
            c.peak_gib,
            memory_gib(c.gpu_model),
        )
        for c in alloc.components
    ]
    return Placement(comps, alloc.step_time_s, alloc.label(), alloc.kind)


def _rate(pool: UsablePool, precision: str) -> float:
    s = pool.option.spec
    return s.peak_tflops(precision) * s.efficiency


class HasPolicy:
    round_s = None

    def __init__(self, heterogeneous: bool = True):
        self.heterogeneous = heterogeneous
        self.name = "has" if heterogeneous else "has-homogeneous"

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        site = ctx.site_for(a)
        view = ctx.sim.load()
        req = a.requirements
        if self.heterogeneous:
            try:
                d = decide_job(req, a.workload, a.space, view, site, ctx.sim, ctx.sim.now)
            except NoFitError:
                return None
            return from_allocation(d.chosen)
        best: Allocation | None = None
        for pool in view.pools():
            one = replace(req, gpu_types=((pool.gpu_type or pool.partition).lower(),))  # untyped: by partition
            try:
                d = decide_job(one, a.workload, a.space, view, site, ctx.sim, ctx.sim.now, alternatives=0)
            except NoFitError:
                continue
            c = d.chosen
            if best is None or (c.completion, c.gpus) < (best.completion, best.gpus):
                best = c
        return from_allocation(best) if best else None

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        return []


class FastestFit:
    name = "fastest-fit"
    round_s = None

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        site = ctx.site_for(a)
        req = a.requirements
        pools, _ = usable_pools(req, ctx.sim.load(), site)
        cands = search(a.workload, [p.option for p in pools], req.global_batch, req.steps, None, a.space)
        for pool in sorted(pools, key=lambda p: -_rate(p, a.workload.precision)):
            items = cands.get(pool.option.name) or []
            if not items:
                continue
            want = max(a.job.trace_gpus, min(c.gpus for c in items))
            within = [c for c in items if c.gpus <= want] or items
            c = min(within, key=lambda c: (c.step_time_s, c.gpus))
            layout = node_layout(c.gpus, pool.site.gpus_per_node)
            if layout is None:
                continue
            req_c = ComponentRequest(
                partition=pool.live.partition,
                gpu_type=pool.live.gpu_type,
                nodes=layout[0],
                gpus_per_node=layout[1],
                time_min=req.time_min(c.run_time_s),
                cpus_per_gpu=pool.site.cpus_per_gpu,
            )
            return Placement(
                [PlacedComponent(req_c, pool.option.spec.name, c.peak_gib, pool.option.spec.memory_gib)],
                c.step_time_s,
                f"{c.gpus}x{pool.option.spec.name}({pool.live.partition})",
            )
        return None

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        return []


def _pow2(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1.0))))


class UserFixed:
    round_s = None

    def __init__(self, variant: str):
        if variant not in USER_VARIANTS:
            raise ValueError(f"user-fixed variant '{variant}': choose one of {', '.join(USER_VARIANTS)}")
        self.variant = variant
        self.name = f"user-fixed:{variant}"

    def _choose_pool(self, a: Attempt, pools: list[UsablePool]) -> UsablePool:
        if a.ooms and a.last_pool is not None:
            last = next((p for p in pools if str(p.key) == a.last_pool), None)
            if last is not None and (a.last_gpus or 0) < last.option.max_gpus:
                return last  # double the count on the same type first
            bigger = [p for p in pools if str(p.key) not in a.tried_pools]
            if bigger:
                return max(bigger, key=lambda p: (p.option.spec.memory_gib, p.option.max_gpus))
        if self.variant == "fastest":
            return max(pools, key=lambda p: (_rate(p, a.workload.precision), p.option.max_gpus))
        if self.variant == "largest":
            return max(pools, key=lambda p: (p.option.spec.memory_gib, _rate(p, a.workload.precision)))
        if self.variant == "biggest":
            return max(pools, key=lambda p: (p.option.max_gpus, _rate(p, a.workload.precision)))
        ordered = sorted(pools, key=lambda p: str(p.key))
        return ordered[sum(a.job.group.encode()) % len(ordered)] if a.job.group else ordered[0]

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        req = a.requirements
        pools, _ = usable_pools(req, ctx.sim.load(), ctx.site)
        if not pools:
            return None
        pool = self._choose_pool(a, pools)
        gpn = pool.site.gpus_per_node
        need = RULE_OF_THUMB_BYTES[a.job.method] * a.params_b * 1e9 / (pool.option.spec.memory_gib * GiB)
        n = max(_pow2(need), _pow2(a.job.trace_gpus))
        if a.ooms and a.last_pool == str(pool.key) and a.last_gpus:
            n = max(n, 2 * a.last_gpus)
        n = min(n, pool.option.max_gpus)
        while n > 1 and (node_layout(n, gpn) is None or req.global_batch % n):
            n //= 2
        w = a.workload
        opt = pool.option
        items = [c for c in search(w, [opt], req.global_batch, req.steps, n, a.space).get(opt.name, []) if c.gpus == n]
        if items:
            c = min(items, key=lambda c: c.step_time_s)
            step, peak = c.step_time_s, c.peak_gib
        else:  # nothing fits by MARP's estimate: the user's most frugal DeepSpeed config, which may OOM
            plan = ParallelPlan(
                dp=n, zero=3 if n > 1 else 0, micro_batch=1, grad_accum=max(1, req.global_batch // n), recompute="full"
            )
            est = estimate_memory(w, plan, "reserved", Overheads(fragmentation=a.space.fragmentation))
            peak = est.peak_gib + opt.overhead_bytes(n) / GiB
            step = plan_costs(w, plan, req.global_batch).seconds_on(opt.spec, opt.links)
        nodes, per_node = node_layout(n, gpn) or (n, 1)
        hours = math.ceil(2.0 * (step * req.steps + 600) / 3600)
        req_c = ComponentRequest(
            partition=pool.live.partition,
            gpu_type=pool.live.gpu_type,
            nodes=nodes,
            gpus_per_node=per_node,
            time_min=60 * hours,
            cpus_per_gpu=pool.site.cpus_per_gpu,
        )
        a.tried_pools.append(str(pool.key))
        return Placement(
            [PlacedComponent(req_c, opt.spec.name, peak, opt.spec.memory_gib)],
            step,
            f"{n}x{opt.spec.name}({pool.live.partition})",
        )

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        return []


POLICY_NAMES = ("has", "has-homogeneous", "fastest-fit", "ilp") + tuple(f"user-fixed:{v}" for v in USER_VARIANTS)


def make_policy(name: str, ilp_round_s: float = 60.0) -> Policy:
    if name == "has":
        return HasPolicy(True)
    if name == "has-homogeneous":
        return HasPolicy(False)
    if name == "fastest-fit":
        return FastestFit()
    if name == "ilp":
        from frenzy_slurm.sim.ilp import IlpPolicy

        return IlpPolicy(ilp_round_s)
    if name.startswith("user-fixed:"):
        return UserFixed(name.split(":", 1)[1])
    raise ValueError(f"unknown policy '{name}'; choose from {', '.join(POLICY_NAMES)} or user-fixed (all variants)")


def expand_policies(text: str) -> list[str]:
    """`has,user-fixed` -> has plus every user-fixed variant; `all` -> every policy."""
    out: list[str] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        names = (
            POLICY_NAMES
            if item == "all"
            else ([f"user-fixed:{v}" for v in USER_VARIANTS] if item == "user-fixed" else [item])
        )
        for n in names:
            if n not in POLICY_NAMES:
                raise ValueError(f"unknown policy '{n}'; choose from {', '.join(POLICY_NAMES)}, user-fixed or all")
            if n not in out:
                out.append(n)
    return out
