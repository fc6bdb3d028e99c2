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
- `has-homogeneous`: HAS without pipelines across GPU types (the same decision with the plan space's
  `heterogeneous` off): what heterogeneous allocations add is `has` against it.
- `has`: full HAS (`frenzy_slurm.has.decide`), heterogeneous jobs allowed; it reads the simulated
  view and asks the simulated Slurm for start estimates, exactly as fsbatch does on a cluster.
- `has-replan`: `has`, and pending jobs re-decided when the cluster changes; `has-preempt`: that, and the
  opt-in preemptible mode (QOS preemption, checkpoint-and-move), each job marked preemptible.
- `slurm-multi`: what users do today, done well: plain Slurm with a multi-partition request (`sbatch -p
  a,b,c`): every partition whose GPU holds the job by the rule of thumb, the smallest count that does on
  each (at least the user's usual count), Slurm's backfill starting it where it can start first; `--time`
  as users set it: the run time they know from earlier runs x a factor, in whole hours, within MaxTime.
- `ilp`: greedy rounds over free GPUs, non-preemptive, with a speed floor (`frenzy_slurm.sim.ilp`).
- `sia`: Sia's method, re-planning running and pending jobs each round (`frenzy_slurm.sim.sia`).
MARP-based policies learn from an OOM: the next plan assumes the measured excess.
"""

from __future__ import annotations

import math
from dataclasses import replace

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.units import GiB
from frenzy_slurm.has.model import Allocation
from frenzy_slurm.has.moves import (
    MAX_PER_PASS,
    MOVE_GAIN,
    growth_site,
    move_cost_s,
    pending_move,
    resumable,
    running_move,
    with_own_gpus_free,
    without_job,
)
from frenzy_slurm.has.pools import UsablePool, node_layout, usable_pools
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.marp.candidates import SearchSpace, search
from frenzy_slurm.marp.memory import Overheads, estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.marp.speed import plan_costs
from frenzy_slurm.planning import decide_job, decide_preemptible
from frenzy_slurm.sim.base import BasePolicy, Policy
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.ilp import IlpPolicy
from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
from frenzy_slurm.sim.sia import SiaPolicy
from frenzy_slurm.site.config import Preemption, SiteConfig
from frenzy_slurm.slurm.backend import ComponentRequest
from frenzy_slurm.slurm.view import ClusterView

RULE_OF_THUMB_BYTES = {"full": 18.0, "lora": 2.4, "qlora": 0.66}
USER_VARIANTS = ("fastest", "largest", "usual", "biggest")


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
    return Placement(comps, alloc.step_time_s, alloc.label(), alloc.kind, plan=alloc.plan)


def _rate(pool: UsablePool, precision: str) -> float:
    s = pool.option.spec
    return s.peak_tflops(precision) * s.efficiency


class HasPolicy(BasePolicy):
    round_s = None
    replans = False
    requeues_at_time_limit = True  # its jobs run frenzy-slurm's runtime (in_job.exit_for_requeue)
    calibrates = True

    def __init__(self, heterogeneous: bool = True):
        self.heterogeneous = heterogeneous
        self.name = "has" if heterogeneous else "has-homogeneous"

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        # has-homogeneous: the same decision with no pipelines across GPU types in the plan space
        space = a.space if self.heterogeneous else replace(a.space, heterogeneous=False)
        try:
            d = decide_job(
                a.requirements,
                a.workload,
                space,
                ctx.sim.load(),
                ctx.site_for(a, self.calibrates),
                ctx.sim,
                ctx.sim.now,
            )
        except NoFitError:
            return None
        return from_allocation(d.chosen)


def _resumable(a: Attempt, p: Placement) -> tuple[SearchSpace, Requirements] | None:
    """Where an attempt can run next: anywhere before its first step, else on the plans that load its checkpoint
    (the built-in trainer's, converted to DeepSpeed's universal checkpoint where the layout changes)."""
    if a.steps >= a.job.steps or p.plan is None:
        return a.space, a.requirements
    return resumable(a.space, a.requirements, p.plan, universal=True)


def _staying(view: ClusterView, job_id: int, run_s: float, now: float) -> float:
    """When a pending job is predicted to end where it waits, as the watcher reads it (`track.watch._staying`):
    Slurm's expected start (squeue's: the backfill's reservation), at the earliest now, plus its run."""
    start = next((j.start_time for j in view.jobs if j.job_id == job_id and j.start_time is not None), None)
    return max(now, float(start or now)) + run_s


class HasReplan(HasPolicy):
    """`has`, plus the re-planning of its pending jobs by the watcher beside fsbatch (`frenzy-slurm watch`,
    `has.moves.pending_move`): when the cluster changes (a job ended), each pending job is decided again on the
    cluster as it is now (itself left out of the queue); where another allocation finishes sooner by more than
    the tie tolerance, the watcher submits that plan and cancels the job, which joins the queue anew. Running
    jobs are never touched."""

    replans = True
    max_per_change = MAX_PER_PASS  # pending jobs re-decided per change, oldest first (bounds the cost of a change)

    def __init__(self) -> None:
        super().__init__(True)
        self.name = "has-replan"
        self.updates = 0

    def replan(self, ctx: Context, pending: list[tuple[int, Attempt, Placement]]) -> list[tuple[int, Placement]]:
        out: list[tuple[int, Placement]] = []
        full = ctx.sim.load()
        for jid, a, p in pending[: self.max_per_change]:
            where = _resumable(a, p)
            if where is None:
                continue
            space, requirements = where
            chosen = pending_move(
                requirements,
                a.workload,
                space,
                without_job(full, jid),
                ctx.site_for(a, self.calibrates),
                ctx.sim,
                ctx.sim.now,
                p.label,
                staying=_staying(full, jid, p.step_time_s * a.steps, ctx.sim.now),
            )
            if chosen is not None:
                out.append((jid, from_allocation(chosen)))
                self.updates += 1
        return out


class HasPreempt(HasReplan):
    """`has-replan`, and the opt-in preemptible mode, with every job of the policy marked preemptible (`fsbatch
    --preemptible`) on a site with a preemptible QOS (`preemption`, the site file's block):

    - each job is decided as fsbatch decides a preemptible one (`planning.decide_preemptible`): a job predicted
      to run `preemption.min_run_min` or more runs in the preemptible QOS and may take up to
      `preemption.max_job_share` of a pool; the simulated Slurm lets any job outside that QOS preempt it once it
      has run `exempt_s` (PreemptExemptTime), and it is requeued with its request, keeping its place in the
      queue, where the watcher may re-plan it as any pending job;
    - when a job ends, the watcher (`frenzy-slurm watch`, `has.moves.running_move`) decides each running job of
      the policy that has run longer than the restart cost again for the steps it has left, on the cluster
      with its own GPUs free, on the plans that can load its checkpoint; where that finishes sooner than
      staying by more than `gain` of the remaining time (restart cost included: the new job starts with the
      start-up and the checkpoint's restore), the job is checkpointed and stopped and the new plan submitted.
      A moved job stays in the QOS it ran in. While no job waits in the queue, a job in the preemptible QOS is
      decided with up to `preemption.move_share` of a pool: idle GPUs go to it, and any job that arrives later
      preempts it once it has run `exempt_s`.

    `watcher` says how much of that watcher runs: 2 all of it, 1 only the re-planning of pending jobs, 0 none
    (QOS preemption alone: fsbatch without `frenzy-slurm watch`).
    """

    moves_running = True

    def __init__(
        self,
        gain: float = MOVE_GAIN,
        preemption: Preemption | None = None,
        exempt_s: float = 3600.0,
        watcher: int = 2,
    ) -> None:
        super().__init__()
        self.replans = watcher >= 1
        self.moves_running = watcher >= 2
        self.name = "has-preempt"
        self.gain = gain
        self.moves = 0
        # the site's preemptible QOS (None: none); Slurm lets a job outside it preempt a job in it once that has
        # run exempt_s (PreemptExemptTime)
        self.preemption = preemption
        self.preempt_exempt_s = None if preemption is None else exempt_s
        self._verdict: dict[int, tuple[Placement, bool]] = {}  # job id -> its placement, in the preemptible QOS?

    def preemptible(self, a: Attempt, p: Placement) -> bool:
        """Whether the job runs in the preemptible QOS: as decide_preemptible said for a placement of place();
        a move keeps the rule it applies (a predicted run of preemption.min_run_min or more)."""
        kept = self._verdict.get(a.job.id)
        if kept is not None and kept[0] is p:
            return kept[1]
        return self.preemption is not None and p.step_time_s * a.steps >= 60.0 * self.preemption.min_run_min

    def _site(self, a: Attempt, ctx: Context) -> SiteConfig:
        site = ctx.site_for(a, self.calibrates)
        return site if self.preemption is None else site.model_copy(update={"preemption": self.preemption})

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        """Every job is marked preemptible (fsbatch --preemptible): the decision is fsbatch's for such a job."""
        if self.preemption is None:
            return super().place(a, ctx)
        try:
            found = decide_preemptible(
                a.requirements, a.workload, a.space, ctx.sim.load(), self._site(a, ctx), ctx.sim, ctx.sim.now
            )
        except NoFitError:
            return None
        p = from_allocation(found.decision.chosen)
        self._verdict[a.job.id] = (p, found.qos is not None)
        return p

    def _priced(self, ctx: Context) -> Preemption | None:
        """The site's preemption block as its admin would write it for the simulated cluster: the truth's start-up and
        restart cost as `restart_s`, its storage bandwidth as `checkpoint_gbs` (`frenzy-slurm watch` prices a move
        with them: has/moves.move_cost_s)."""
        if self.preemption is None:
            return None
        if ctx.truth is None:
            return self.preemption.model_copy(update={"restart_s": 120.0, "checkpoint_gbs": None})
        m = ctx.truth.model
        return self.preemption.model_copy(
            update={"restart_s": m.startup_s + m.restart_s, "checkpoint_gbs": m.checkpoint_gbs}
        )

    def move(
        self, ctx: Context, running: list[tuple[int, Attempt, Placement, float, int]]
    ) -> list[tuple[int, Placement]]:
        out: list[tuple[int, Placement]] = []
        now = ctx.sim.now
        full = ctx.sim.load()
        priced = self._priced(ctx)
        for jid, a, p, started, left in running[: self.max_per_change]:
            rest = replace(a, steps=left)
            restart = move_cost_s(priced, rest.workload)  # the watcher's price of a move, on the truth's storage
            if now - started < restart:
                continue  # still starting (Sia's rule: no move inside a restart)
            where = _resumable(rest, p)
            if where is None:
                continue
            space, requirements = where
            # the successor's --time also covers what the truth charges a resumed start beyond the start-up: the
            # checkpoint's write and read (a watcher's successor reads it only: has/moves.restore_s)
            requirements = replace(requirements, resume_s=restart - (priced.restart_s if priced else 0.0))
            kept = self._verdict.get(a.job.id)
            in_qos = kept is not None and kept[1]
            view = with_own_gpus_free(full, jid)
            chosen = running_move(
                requirements,
                rest.workload,
                space,
                view,
                growth_site(self._site(a, ctx), view, in_qos),
                ctx.sim,
                now,
                p.label,
                stay_until=now + left * p.step_time_s,
                restart_s=restart,
                gain=self.gain,
            )
            if chosen is None:
                continue
            newp = from_allocation(chosen)
            if in_qos:
                # the user asked for preemptible and the job was admitted to that QOS: a move keeps it
                # there even where the new allocation's predicted run is under min_run_min (otherwise a
                # job grown to a whole pool would hold it beyond any other job's reach)
                self._verdict[a.job.id] = (newp, True)
            out.append((jid, newp))
            self.moves += 1
        return out


class FastestFit(BasePolicy):
    name = "fastest-fit"
    round_s = None
    calibrates = True

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        site = ctx.site_for(a, self.calibrates)
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
                plan=c.plan,
            )
        return None


def _pow2(n: float) -> int:
    return 1 << max(0, math.ceil(math.log2(max(n, 1.0))))


class UserFixed(BasePolicy):
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


class SlurmMulti(BasePolicy):
    """`sbatch -p a,b,c`: every partition that holds the job by the rule of thumb, Slurm picks the first start.

    On each partition the count is the smallest power of two whose GPUs hold RULE_OF_THUMB_BYTES per
    parameter (doubled after each OOM), at least the user's usual count, that the partition has and the
    global batch divides. The DeepSpeed configuration at that count is the fastest MARP finds, else the
    user's frugal one (ZeRO-3, full checkpointing, micro-batch 1), as for `user-fixed`. `--time`: the run
    time the user knows from earlier runs (the truth on the slowest listed partition, start-up included)
    x `time_factor`, rounded up to whole hours, cut at each partition's MaxTime. Partitions are listed
    fastest first (ties go to the faster GPU); a partition whose GPU's peak rate for the job's precision is
    more than `max_slowdown` times below the fastest listed one's is left out (users know a T4 from an
    A100 by its data sheet)."""

    name = "slurm-multi"

    def __init__(self, time_factor: float = 1.5, max_slowdown: float | None = None):
        self.time_factor = time_factor
        self.max_slowdown = max_slowdown  # None: every partition that holds the job

    def _on_pool(self, a: Attempt, pool: UsablePool, usual_cap: int | None = None) -> tuple[int, float, float] | None:
        """(count, predicted step time, predicted peak GiB) on this pool, or None where the rule says no.
        `usual_cap`: the user's usual count cut to this (see `place`).

        After an OOM the user re-configures for the memory they now know they need (the pools come from the
        site file shrunk by the OOM's excess, as for every policy) and doubles the count while no
        configuration fits; where none fits at any count, the frugal one at the doubled count, unless what the
        OOM taught says that does not fit either (then the pool is left out)."""
        req = a.requirements
        gpn = pool.site.gpus_per_node
        need = RULE_OF_THUMB_BYTES[a.job.method] * a.params_b * 1e9 / (pool.option.spec.memory_gib * GiB)
        usual = _pow2(a.job.trace_gpus)
        base = max(_pow2(need), usual if usual_cap is None else min(usual, usual_cap))
        w, opt = a.workload, pool.option
        counts: list[int] = []
        n = base
        while n <= opt.max_gpus and (not counts or a.ooms):
            if node_layout(n, gpn) is not None and req.global_batch % n == 0:
                counts.append(n)
            n *= 2
        if not counts:
            return None
        for n in counts:
            found = search(w, [opt], req.global_batch, req.steps, n, a.space).get(opt.name, [])
            items = [c for c in found if c.gpus == n]
            if items:
                c = min(items, key=lambda c: c.step_time_s)
                return n, c.step_time_s, c.peak_gib
        n = counts[min(a.ooms, len(counts) - 1)]
        plan = ParallelPlan(
            dp=n, zero=3 if n > 1 else 0, micro_batch=1, grad_accum=max(1, req.global_batch // n), recompute="full"
        )
        est = estimate_memory(w, plan, "reserved", Overheads(fragmentation=a.space.fragmentation))
        peak = est.peak_gib + opt.overhead_bytes(n) / GiB
        if a.ooms and peak * GiB > opt.usable_bytes:
            # after an OOM the user does not send the frugal request again where what the OOM taught says it
            # cannot fit either (at the pool's largest count it would be the same request, out of memory again)
            return None
        step = plan_costs(w, plan, req.global_batch).seconds_on(opt.spec, opt.links)
        return n, step, peak

    def _listed(
        self, a: Attempt, pools: list[UsablePool], usual_cap: int | None = None
    ) -> list[tuple[UsablePool, int, float, float]]:
        """The partitions the user lists, fastest first, each with (count, step time, peak GiB)."""
        chosen: list[tuple[UsablePool, int, float, float]] = []
        for pool in sorted(pools, key=lambda p: -_rate(p, a.workload.precision)):
            rate = _rate(pool, a.workload.precision)
            if (
                chosen
                and self.max_slowdown is not None
                and rate * self.max_slowdown < _rate(chosen[0][0], a.workload.precision)
            ):
                continue
            got = self._on_pool(a, pool, usual_cap)
            if got is not None:
                chosen.append((pool, *got))
        return chosen

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        pools, _ = usable_pools(a.requirements, ctx.sim.load(), ctx.site_for(a, self.calibrates))
        chosen = self._listed(a, pools)
        if not chosen and pools:
            # no partition has the user's usual count: Slurm refuses that request at submission ("Requested node
            # configuration is not available"), and the user asks again for what the largest partition has
            largest = max(p.option.max_gpus for p in pools)
            chosen = self._listed(a, pools, usual_cap=1 << max(0, largest.bit_length() - 1))
        if not chosen:
            return None
        startup = ctx.truth.model.startup_s if ctx.truth else 120.0

        def known_s(pool: UsablePool, n: int, step: float) -> float:
            if ctx.truth is None:
                return startup + step * a.steps
            nodes = (node_layout(n, pool.site.gpus_per_node) or (n, 1))[0]
            true = ctx.truth.step_time(
                a.job.id, step, [pool.option.spec.name], precision=a.job.precision, gpus=n, nodes=nodes
            )
            return startup + true * a.steps

        hours = math.ceil(self.time_factor * max(known_s(p, n, step) for p, n, step, _ in chosen) / 3600)
        alts = []
        for pool, n, step, peak in chosen:
            nodes, per_node = node_layout(n, pool.site.gpus_per_node) or (n, 1)
            limit = 60 * hours if pool.max_time_min is None else min(60 * hours, pool.max_time_min)
            req_c = ComponentRequest(
                partition=pool.live.partition,
                gpu_type=pool.live.gpu_type,
                nodes=nodes,
                gpus_per_node=per_node,
                time_min=limit,
                cpus_per_gpu=pool.site.cpus_per_gpu,
            )
            opt = pool.option
            alts.append(
                Placement(
                    [PlacedComponent(req_c, opt.spec.name, peak, opt.spec.memory_gib)],
                    step,
                    f"{n}x{opt.spec.name}({pool.live.partition})",
                )
            )
        first = alts[0]
        return replace(first, alternatives=tuple(alts)) if len(alts) > 1 else first


POLICY_NAMES = (
    "has",
    "has-homogeneous",
    "has-replan",
    "has-preempt",
    "slurm-multi",
    "sia",
    "ilp",
    "fastest-fit",
) + tuple(f"user-fixed:{v}" for v in USER_VARIANTS)


# The baselines' knobs, tuned as HAS's thresholds were: on the 64-GPU cluster of benchmarks/jct.py, load 0.8,
# seeds 1-5, the value with the lowest mean average JCT (docs/simulation-model.md, "Tuning the baselines").
TUNED_KNOBS: dict[str, float] = {
    "slurm_multi_time_factor": 1.5,
    "slurm_multi_max_slowdown": 3.0,
    "ilp_speed_floor": 4.0,
    "sia_p": 0.25,
    "sia_lambda_n": 1.0,
    "sia_round_s": 60.0,
    # has-preempt's site: a preemptible QOS (the site file's preemption: min_run_min 60, max_job_share the site's
    # 0.5) and PreemptExemptTime 600 s; its watcher moves a preemptible job into up to a whole pool while no
    # job waits (tuned on std64, load 0.8, seeds 1-5 and 11-20: docs/simulation-model.md, "Tuning the baselines")
    "has_preempt_min_run_min": 60.0,
    "has_preempt_exempt_s": 600.0,
    "has_preempt_max_job_share": 0.5,
    "has_preempt_move_share": 1.0,
}


def make_policy(name: str, ilp_round_s: float = 60.0, knobs: dict[str, float] | None = None) -> Policy:
    """The policy called `name`; `knobs` override TUNED_KNOBS (see each class), and "sia_restart_s" the
    restart cost sia plans with (default: the truth's start-up time)."""
    k = {**TUNED_KNOBS, **(knobs or {})}
    if name == "slurm-multi":
        return SlurmMulti(k.get("slurm_multi_time_factor", 1.5), k.get("slurm_multi_max_slowdown"))
    if name == "sia":
        return SiaPolicy(
            k.get("sia_round_s", ilp_round_s),
            p=k.get("sia_p", 0.25),
            lambda_n=k.get("sia_lambda_n", 1.0),
            restart_s=k.get("sia_restart_s"),
            idle_resolve_s=k.get("sia_idle_resolve_s", 300.0),
        )
    if name == "has":
        return HasPolicy(True)
    if name == "has-replan":
        return HasReplan()
    if name == "has-preempt":
        minutes = k.get("has_preempt_min_run_min")
        preemption = (
            None
            if minutes is None
            else Preemption(
                qos="preemptible",
                min_run_min=int(minutes),
                max_job_share=k.get("has_preempt_max_job_share"),
                move_share=k.get("has_preempt_move_share"),
            )
        )
        return HasPreempt(
            k.get("has_preempt_gain", MOVE_GAIN),
            preemption,
            k.get("has_preempt_exempt_s", 3600.0),
            int(k.get("has_preempt_watcher", 2)),
        )
    if name == "has-homogeneous":
        return HasPolicy(False)
    if name == "fastest-fit":
        return FastestFit()
    if name == "ilp":
        return IlpPolicy(ilp_round_s, speed_floor=k.get("ilp_speed_floor", 2.0))
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
