"""HAS: choose the allocation that finishes the job soonest.

completion = predicted start + predicted run time, over homogeneous candidates (MARP's fastest plan per
GPU count on each pool) and heterogeneous pipelines over pools with free GPUs now. A heterogeneous
allocation is chosen only when it is predicted to finish sooner than every homogeneous one by the site's
`pipeline_margin` of the time to completion. Start: now where enough GPUs
are free on enough nodes; else from running jobs' end times in the view; the leading candidates that
cannot start now are re-estimated with Slurm's own `sbatch --test-only` when a live backend is given.
A job gets at most the site's `max_job_share` of a pool unless it needs more (see `_leave_room`).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.core.units import TFLOPS, GiB
from frenzy_slurm.has import hetero, pricing
from frenzy_slurm.has.kept import PROCESS_KEPT, Kept, SearchKey
from frenzy_slurm.has.model import Allocation, Alternative, Component, Decision
from frenzy_slurm.has.nodes import nodes_for
from frenzy_slurm.has.pools import UsablePool, fits_free_now, node_layout, usable_pools
from frenzy_slurm.has.qos import qos_lines, within_qos
from frenzy_slurm.has.requirements import TIME_MARGIN, TIME_SLACK_S, Requirements
from frenzy_slurm.jobspec.job import SIGNAL_LEAD_S, STARTUP_S
from frenzy_slurm.marp.candidates import Candidate, GpuOption, SearchSpace, search
from frenzy_slurm.marp.memory import Overheads
from frenzy_slurm.marp.plan import Recompute, Workload
from frenzy_slurm.marp.speed import flops_per_token
from frenzy_slurm.site.config import SiteConfig
from frenzy_slurm.slurm.backend import ComponentRequest, SlurmBackend
from frenzy_slurm.slurm.releases import ReleaseIndex
from frenzy_slurm.slurm.run import SlurmCommandError
from frenzy_slurm.slurm.view import ClusterView, PoolKey

# The numbers HAS decides by. None is configurable; the ones marked "site-tunable policy" are choices a site could
# reasonably make differently (they would belong in the site file if one ever needs to), the rest are bounds of
# the search or of what is printed.

# The heterogeneous search: at most this many pipeline stages on each of the two pools, at these data-parallel
# degrees, so at most 8 x 8 = 64 GPUs per pool. A bound on the search's cost (a decision stays in milliseconds,
# docs/has.md "Decision time"), set with the first HAS (5acce1b); wider jobs are left to homogeneous candidates.
MAX_STAGES_PER_POOL = 8
DP_DEGREES = (1, 2, 4, 8)
# At most this many leading candidates that cannot start now are re-estimated with `sbatch --test-only`: each is
# an RPC to slurmctld, which Slurm asks tools not to send in loops. Site-tunable policy (slurmctld load against
# estimate quality); from the first HAS (5acce1b), documented in docs/has.md ("up to three").
REFINE_WITH_TEST_ONLY = 3
# Completions within TIE_SECONDS, or TIE_FRACTION of the time to completion, are a tie, decided for homogeneous,
# then fewer GPUs: closer than that is noise of the predictions, not a reason to take more GPUs or split a job
# over GPU types (docs/has.md, step 5). Site-tunable policy; from the first HAS (5acce1b).
TIE_SECONDS = 60.0
TIE_FRACTION = 0.01
# A wider allocation is taken only if each extra GPU buys at least this much of a GPU's worth of speed-up
# (time to completion, waiting included): the GPUs one job takes for a small gain are what the jobs
# behind it wait for. 0.5 is the usual parallel-efficiency floor of HPC allocation policies; 1.0 while jobs
# wait was measured worse (docs/has.md, step 5). Site-tunable policy; from cf5a83d (the simulator's findings).
MIN_MARGINAL_EFFICIENCY = 0.5
# Where the width rule applies (issue 20): "per-pool" widens within each set of pools (one GPU type, or one
# pair of a pipeline) and then takes the earliest completion of those choices; "all" widens across every
# candidate by GPU count, which judged 16 V100s against 1 A100 as 16x the GPUs, so fp16 jobs queued for A100s
# while V100s idled. Per pool measured 0.459 h against 0.536 h (64 GPUs, load 0.8, seeds 1-5) and 13.0%
# against 28.5% above sia on the held-out runs (docs/simulation.md). Site-tunable policy.
WIDTH_RULE = "per-pool"
# The no-fit message searches every usable pool as if it had this many GPUs, to name the smallest allocation
# that would fit. More GPUs than any cluster the project is run on; it bounds that search (from 5acce1b).
NO_FIT_PROBE_GPUS = 4096
# What a Decision lists: this many allowed alternatives by default (`alternatives=`; the simulator asks for
# more), then this many refused ones (limits, max_job_share) with why; a no-fit message names the first few
# refused candidates. Display choices (since 5acce1b; the no-fit reasons since 7511a6b), not policy.
ALTERNATIVES_SHOWN = 5
REFUSED_ALTERNATIVES_SHOWN = 2
NO_FIT_REASONS_SHOWN = 3
# `--explain` does not mention differences in start, run time or completion under a second: predictions are
# in seconds, and less than that is rounding (cf5a83d).
EXPLAIN_RESOLUTION_S = 1.0
# A run time in a message is given in minutes below this, in hours (with the minutes) from it: a display choice.
MINUTES_SHOWN_BELOW_S = 7200.0
# How a candidate refused by a partition's MaxTime is described: the no-fit message picks those out by it to
# name the fix, a shorter --time (issue 21).
MAX_TIME_REASON = "needs --time"


def forget_kept(searches: bool = True) -> None:
    """Drop what the process keeps between decisions (has/kept.py): the searches (unless `searches` is False) and
    the release index (a benchmark timing decisions from cold, or a watcher's next pass: its process keeps the
    searches, the cluster has changed)."""
    PROCESS_KEPT.forget(searches)


@dataclass
class _Cand:
    alloc: Allocation
    pools: list[UsablePool] = field(default_factory=list)
    layouts: list[tuple[int, int]] = field(default_factory=list)


def _homogeneous(
    w: Workload,
    req: Requirements,
    pools: list[UsablePool],
    releases: ReleaseIndex,
    now: float,
    space: SearchSpace,
    kept: Kept,
) -> list[_Cand]:
    steps = req.steps
    options = [p.option for p in pools]
    key = SearchKey.of(w, options, req.global_batch, req.max_gpus, space)
    memo = kept.memo(w)  # shared with this caller's other searches of `w` (its fallback plans)
    cands = kept.search(key, steps, lambda: search(w, options, req.global_batch, steps, req.max_gpus, space, memo))
    out = []
    a = w.arch
    for pool in pools:
        for c in cands[pool.key]:
            layout = node_layout(c.gpus, pool.site.gpus_per_node)
            if layout is None or c.plan.tp > layout[1]:
                continue
            nodes, per_node = layout
            if fits_free_now(pool, nodes, per_node) and not releases.has_reservations(*pool.key):
                start, source = now, "now"
            else:  # after running jobs end and the pending jobs ahead have had their turn
                t = releases.start(
                    pool.live.partition, pool.live.gpu_type, nodes, per_node, req.time_min(c.run_time_s) * 60.0
                )
                if t is None:
                    continue
                start, source = (now, "now") if t <= now else (t, "view")
            comp = Component(
                partition=pool.live.partition,
                gpu_type=pool.live.gpu_type,
                gpu_model=pool.option.spec.name,
                nodes=nodes,
                gpus_per_node=per_node,
                cpus_per_task=pool.site.cpus_per_gpu,
                stages=list(range(c.plan.pp)),
                peak_gib=c.peak_gib,
                capacity_gib=c.capacity_gib,
                capped_gib=c.memory.released / GiB,
                needed_gib=_needed_gib(c),
            )
            alloc = Allocation(
                kind="homogeneous",
                components=[comp],
                plan=c.plan.resolved(a.layers),
                step_time_s=c.step_time_s,
                run_time_s=c.run_time_s,
                time_min=req.time_min(c.run_time_s),
                start=start,
                start_source=source,
            )
            out.append(_Cand(alloc, [pool], [layout]))
    return out


def exclusive_nodes(cands: list[_Cand]) -> list[_Cand]:
    """With --exclusive the job holds whole nodes, all their GPUs, whatever its plan uses of them: of the
    candidates on the same pools and node counts, the earliest completion stands for them all (a narrower plan
    on the same nodes costs the same GPUs and is not a cheaper choice for the width rule)."""
    best: dict[tuple, _Cand] = {}

    def key(c: _Cand) -> tuple:
        return tuple(p.key for p in c.pools), tuple(n for n, _ in c.layouts)

    for c in cands:
        k = key(c)
        if k not in best or c.alloc.completion < best[k].alloc.completion:
            best[k] = c
    return [c for c in cands if best[key(c)] is c]


def _placeable_now(pool: UsablePool, gpus: int) -> tuple[int, int] | None:
    layout = node_layout(gpus, pool.site.gpus_per_node)
    if layout and fits_free_now(pool, *layout):
        return layout
    return None


def _heterogeneous(
    w: Workload,
    req: Requirements,
    pools: list[UsablePool],
    releases: ReleaseIndex,
    now: float,
    space: SearchSpace,
    beat: float,
    share: float = 1.0,
) -> list[_Cand]:
    """Two-pool pipelines on GPUs that are free now (the case where waiting for one type loses).

    A pair is skipped when even a perfect split (all its free GPUs at full rate, no bubble, no communication)
    could not finish before `beat`, the best homogeneous completion. The first pool is tried with the most stages
    that fit now within `share` of it (the site's max_job_share, which `_leave_room` holds every candidate to) and
    with the most that fit at all (`_first_pool_stages`).
    """
    steps = req.steps
    work = flops_per_token(w, "none") * req.global_batch * w.seq_len * steps
    free = [p for p in pools if p.free_by_node and p.free_by_node[0] > 0]
    free.sort(key=lambda p: p.option.usable_bytes, reverse=True)  # more memory first: stage 0 holds most activations
    gb = req.global_batch
    limit = req.max_gpus
    # In a pipeline a smaller micro-batch only shrinks the bubble, so the smallest is the fastest; recomputation
    # is tried only where the plan does not fit without it.
    mb = space.micro_batch or 1
    recomputes = [r for r in space.recompute if r != "selective"] or ["none"]
    rates = [p.option.spec.peak_tflops(w.precision) * TFLOPS * p.option.spec.efficiency for p in free]
    most = MAX_STAGES_PER_POOL * max(DP_DEGREES)  # GPUs per pool this search can use
    free_gpus = [min(sum(p.free_by_node), most) for p in free]
    # which stage counts fit now on each pool at each data-parallel degree, worked out once per decision by the
    # pool's position in `free`: every pair a pool is in asks the same (it was most of this search at 2,048 GPUs)
    fitting: dict[tuple[int, int], list[int]] = {}

    def stage_counts(i: int, dp: int) -> list[int]:
        if (i, dp) not in fitting:
            fitting[i, dp] = [n for n in range(1, MAX_STAGES_PER_POOL + 1) if _placeable_now(free[i], n * dp)]
        return fitting[i, dp]

    out = []
    for (ia, pa), (ib, pb) in itertools.combinations(enumerate(free), 2):
        if now + work / (free_gpus[ia] * rates[ia] + free_gpus[ib] * rates[ib]) >= beat:
            continue
        for dp in DP_DEGREES:
            if gb % dp or (gb // dp) % mb:
                continue
            firsts = _first_pool_stages(stage_counts(ia, dp), dp, max(share * pa.live.gpus_total, 1))
            for stages_a, nb in itertools.product(firsts, stage_counts(ib, dp)):
                if limit and (stages_a + nb) * dp > limit:
                    continue
                ga = gb // (dp * mb)
                stage_rates = [rates[ia]] * stages_a + [rates[ib]] * nb
                inter = min(p.option.links.inter_node_gbs for p in (pa, pb))
                if now + steps * hetero.step_floor(w, stage_rates, mb, ga, inter) >= beat:
                    continue  # even a perfect split of these GPUs cannot win
                cand = _hetero_candidate(w, req, [(pa, stages_a), (pb, nb)], dp, mb, recomputes, space, releases, now)
                # kept only where it finishes sooner than every homogeneous allocation: the floor above then only
                # saves work, it never decides (the order pipelines are tried in does not matter)
                if cand is not None and cand.alloc.completion < beat:
                    out.append(cand)
    return out


def _first_pool_stages(counts: list[int], dp: int, cap: float) -> list[int]:
    """The first pool's stage counts a pipeline is tried with: the most that fit within `cap` GPUs of it (the
    site's share), and the most that fit at all, where that is more (kept only where nothing within the share
    is: `_leave_room`)."""
    within = [n for n in counts if n * dp <= cap]
    return sorted({max(within, default=0), max(counts, default=0)} - {0})


def _hetero_candidate(
    w: Workload,
    req: Requirements,
    placement: list[tuple[UsablePool, int]],
    dp: int,
    mb: int,
    recomputes: Sequence[Recompute],
    space: SearchSpace,
    releases: ReleaseIndex,
    now: float,
) -> _Cand | None:
    world = sum(n for _, n in placement) * dp
    groups = [
        hetero.StageGroup(
            p.key,
            n,
            p.option.spec.peak_tflops(w.precision) * TFLOPS * p.option.spec.efficiency,
            p.option.usable_bytes - p.option.overhead_bytes(world),
            p.option.overhead_bytes(world),
            p.option.links.intra_node_gbs,
            p.option.links.inter_node_gbs,
            p.site.gpus_per_node,
            p.option.spec.step_overhead_s,
            p.option.spec.microbatch_overhead_s,
            p.option.spec.memory_gib * GiB,
            p.option.spec.mem_bw_gbs,
        )
        for p, n in placement
    ]
    for rc in recomputes:  # the first recomputation setting that fits is the fastest
        hp = hetero.build(w, groups, dp, mb, req.global_batch, rc, Overheads(fragmentation=space.fragmentation))
        if hp is None:
            continue
        peaks = hetero.stage_peaks_gib(hp)
        comps, layouts, first = [], [], 0
        for p, n in placement:
            layout = _placeable_now(p, n * dp)
            assert layout is not None
            comps.append(
                Component(
                    partition=p.live.partition,
                    gpu_type=p.live.gpu_type,
                    gpu_model=p.option.spec.name,
                    nodes=layout[0],
                    gpus_per_node=layout[1],
                    cpus_per_task=p.site.cpus_per_gpu,
                    stages=list(range(first, first + n)),
                    peak_gib=max(peak for peak, _ in peaks[first : first + n]),
                    capacity_gib=p.option.usable_bytes / GiB,
                    capped_gib=max(capped for _, capped in peaks[first : first + n]),
                )
            )
            layouts.append(layout)
            first += n
        minutes = req.time_min(hp.step_time_s * req.steps)
        for p, (nodes, per_node) in zip((p for p, _ in placement), layouts, strict=True):
            if releases.start(p.live.partition, p.live.gpu_type, nodes, per_node, minutes * 60.0) != now:
                return None  # a pending job ahead holds these GPUs before this pipeline would end
        alloc = Allocation(
            kind="heterogeneous",
            components=comps,
            plan=hp.plan.resolved(w.arch.layers),
            step_time_s=hp.step_time_s,
            run_time_s=hp.step_time_s * req.steps,
            time_min=minutes,
            start=now,
            start_source="now",
        )
        return _Cand(alloc, [p for p, _ in placement], layouts)
    return None


def _violations(req: Requirements, c: _Cand) -> str | None:
    a = c.alloc
    if req.max_gpus and a.gpus > req.max_gpus:
        return f"uses {a.gpus} GPUs > limits.max_gpus({req.max_gpus})"
    if req.min_gpus and a.gpus < req.min_gpus:
        return f"uses {a.gpus} GPUs < limits.min_gpus({req.min_gpus})"
    if req.time_limit_s and a.run_time_s > req.time_limit_s:
        return f"runs {a.run_time_s / 3600:.1f} h > limits.time_limit({req.time_limit_s / 3600:.1f} h)"
    if req.deadline and a.completion > req.deadline:
        return "finishes after limits.deadline"
    for pool in c.pools:
        if pool.max_time_min is not None and a.time_min > pool.max_time_min:
            part = pool.live.partition
            return f"{MAX_TIME_REASON} {a.time_min} min > MaxTime {pool.max_time_min} min of partition {part}"
    return None


def _qos(view: ClusterView, c: _Cand) -> str | None:
    """Why the QOS never lets this candidate run (None if it does); one it lets run only once some running
    jobs have ended gets that later start (has/qos.py)."""
    c.alloc, why = within_qos(view, c.alloc)
    return why


def _refine(cands: list[_Cand], backend: SlurmBackend, req: Requirements) -> None:
    """Slurm's own start estimate for the leading candidates that cannot start now (with the job's -C and
    --exclusive, which Slurm checks over all of a component's nodes)."""
    waiting = [c for c in cands if c.alloc.start_source != "now"][:REFINE_WITH_TEST_ONLY]
    for c in waiting:
        reqs = [
            ComponentRequest(
                partition=p.live.partition,
                gpu_type=p.live.gpu_type,
                nodes=n,
                gpus_per_node=g,
                time_min=c.alloc.time_min,
                cpus_per_gpu=p.site.cpus_per_gpu,
                constraint=req.constraint,
                exclusive=req.exclusive,
            )
            for p, (n, g) in zip(c.pools, c.layouts, strict=True)
        ]
        try:
            est = backend.expected_start(reqs)
        except (SlurmCommandError, NotImplementedError):
            continue
        # the later estimate wins: --test-only ignores the pending queue, the view's does not
        if est.start >= c.alloc.start:
            c.alloc = c.alloc.model_copy(update={"start": est.start, "start_source": est.source})


def _needed_gib(c: Candidate) -> float | None:
    """What decides the candidate's fit, where its peak also holds a variable-length cache (None: the peak)."""
    needed = c.memory.needed / GiB + c.overhead_gib
    return needed if needed < c.peak_gib - 1e-9 else None


def _leave_room(cands: list[_Cand], share: float) -> tuple[list[_Cand], list[tuple[_Cand, str]]]:
    """Candidates within `share` of each pool they use; of a pool where none is, the fewest GPUs (the job needs
    that many of it); a pipeline over the share only where nothing else is kept.

    HAS sees the jobs queued now, not those that will arrive: a job that scales well would otherwise take a
    whole pool for hours, and every job arriving meanwhile waits for its end (docs/simulation.md, "Room for
    later jobs"). A pipeline over the share is not what the job needs where a share of some pool holds it: kept
    as for one pool, it held whole pools for such jobs and the users who do not plan with frenzy-slurm waited
    (docs/has.md, "Where has loses to sia"). Returns the kept candidates and the dropped ones with the reason.
    """

    def over(c: _Cand) -> str | None:
        for p, (n, g) in zip(c.pools, c.layouts, strict=True):
            if n * g > max(share * p.live.gpus_total, 1):
                return (
                    f"takes {n * g} of the {p.live.gpus_total} GPUs of {p.live.partition}, while fewer GPUs of "
                    f"these pools hold the job: one job gets at most {share:.0%} of a pool (site max_job_share)"
                )
        return None

    def pools_of(c: _Cand) -> tuple:
        return tuple(p.key for p in c.pools)

    why = {id(c): over(c) for c in cands}
    kept = [c for c in cands if why[id(c)] is None]
    covered = {pools_of(c) for c in kept}

    def smallest_over(single: bool) -> list[_Cand]:
        """Of each set of pools (one pool, or several) with no candidate within the share: the fewest GPUs."""
        best: dict[tuple, _Cand] = {}
        for c in cands:
            key = pools_of(c)
            if (len(key) == 1) == single and key not in covered:
                if key not in best or c.alloc.gpus < best[key].alloc.gpus:
                    best[key] = c
        return list(best.values())

    kept += smallest_over(single=True)  # a pool with no candidate within the share: the job needs that many
    if not kept:
        kept = smallest_over(single=False)  # only a pipeline over the share holds the job
    kept_ids = {id(c) for c in kept}
    return kept, [(c, why[id(c)] or "") for c in cands if id(c) not in kept_ids]  # all with a reason: None is kept


def _pricer(
    site: SiteConfig, pools: dict[PoolKey, pricing.PoolDemand], lost: dict[PoolKey, float]
) -> Callable[[_Cand], float]:
    """The delay a candidate causes the other jobs: the queue's and the arrivals' wait weighted by the site's
    price_weight, and the arrivals it leaves no free GPU (the share of their run each loses: `lost`) weighted by
    its arrival_room (0 and 0: none); `pools`: each pool's demand (pricing.demand)."""
    if site.price_weight <= 0 and site.arrival_room <= 0:
        return lambda c: 0.0

    def delay(c: _Cand) -> float:
        run, now = c.alloc.run_time_s, c.alloc.start_source == "now"
        total = 0.0
        for p, (n, g) in zip(c.pools, c.layouts, strict=True):
            demand = pools.get(p.key)
            total += site.price_weight * pricing.delay_s(demand, n * g, run)
            if now and site.arrival_room > 0:  # GPUs free now: what a later start leaves free is not known here
                total += site.arrival_room * lost.get(p.key, 1.0) * pricing.displaced_s(demand, n * g, run)
        return total

    return delay


def _lost_when_full(pools: list[UsablePool], precision: str) -> dict[PoolKey, float]:
    """For each pool, the share of its run a job arriving to find it full loses: Slurm starts it on the fastest
    other pool with a free GPU (1 - that pool's rate over this one's, at least 0); where none has one it waits
    whatever this job does, which the queue's price counts (0). The rates are the catalog's, as the users who list
    partitions fastest first know them."""
    rate = {p.key: p.option.spec.peak_tflops(precision) * p.option.spec.efficiency for p in pools}
    lost = {}
    for p in pools:
        others = [rate[q.key] for q in pools if q.key != p.key and q.live.gpus_free > 0]
        lost[p.key] = max(0.0, 1.0 - max(others) / rate[p.key]) if others and rate[p.key] > 0 else 0.0
    return lost


def _marginal_efficiency(narrow: Allocation, wide: Allocation, now: float) -> float:
    """Speed-up per extra GPU of `wide` over `narrow`, in time to completion (waiting included): 1.0 is perfect."""
    # a wide allocation completing at `now` (nothing to run) would divide by zero: count it as a nanosecond
    t_narrow, t_wide = narrow.completion - now, max(wide.completion - now, 1e-9)
    extra = wide.gpus / narrow.gpus - 1
    return (t_narrow / t_wide - 1) / extra if extra > 0 else float("inf")


def _widest_worth_it(
    ordered: list[_Cand], now: float, tol: float, value: Callable[[_Cand], float] | None = None
) -> _Cand:
    """From the fewest GPUs up, widen only while each step is worth its GPUs (MIN_MARGINAL_EFFICIENCY) and
    lowers `value` (default: the completion; decide passes the completion plus the delay the allocation causes
    the other jobs, has/pricing.py: a wider allocation that finishes sooner may hold up more than it gains).

    `ordered` is ranked by that value (ties: homogeneous, then fewer GPUs), so among allocations of one
    size the first seen is the best. A narrower allocation that must wait is compared with its wait:
    a wide one that starts now wins when the wait is long.
    """
    value = value or (lambda c: c.alloc.completion)
    best_of_size: dict[int, _Cand] = {}
    for c in ordered:
        best_of_size.setdefault(c.alloc.gpus, c)
    sizes = sorted(best_of_size)
    cur = best_of_size[sizes[0]]
    for g in sizes[1:]:
        c = best_of_size[g]
        if value(c) < value(cur) - tol and _marginal_efficiency(cur.alloc, c.alloc, now) >= MIN_MARGINAL_EFFICIENCY:
            cur = c
    return cur


def _why_lost(best: Allocation, other: Allocation, now: float, extra_delay_s: float = 0.0) -> str:
    """Why `other` lost to `best`; `extra_delay_s`: how much more `other` delays the other jobs (pricing.py)."""
    dt = other.completion - best.completion
    width_lost = other.gpus > best.gpus and _marginal_efficiency(best, other, now) < MIN_MARGINAL_EFFICIENCY
    if dt < -EXPLAIN_RESOLUTION_S and extra_delay_s > -dt and not width_lost:
        return (
            f"finishes {-dt / 60:.0f} min sooner but delays the jobs queued for and arriving at its GPUs by "
            f"{extra_delay_s / 60:.0f} min more in all (the GPU-type price, site price_weight and arrival_room)"
        )
    if dt < -EXPLAIN_RESOLUTION_S and other.gpus > best.gpus:
        eff = _marginal_efficiency(best, other, now)
        if eff < MIN_MARGINAL_EFFICIENCY:
            return (
                f"finishes {-dt / 60:.1f} min sooner with {other.gpus} GPUs instead of {best.gpus}: each extra GPU "
                f"adds {eff:.0%} of a GPU's speed, under the {MIN_MARGINAL_EFFICIENCY:.0%} a wider allocation needs"
            )
        return f"finishes only {-dt:.0f} s sooner with {other.gpus} GPUs instead of {best.gpus} (a tie: fewer GPUs win)"
    if dt > EXPLAIN_RESOLUTION_S:
        parts = []
        if other.start > best.start + EXPLAIN_RESOLUTION_S:
            parts.append(f"starts {(other.start - best.start) / 60:.0f} min later")
        if other.run_time_s > best.run_time_s + EXPLAIN_RESOLUTION_S:
            parts.append(f"runs {(other.run_time_s - best.run_time_s) / 60:.0f} min longer")
        return f"finishes {dt / 60:.0f} min later (" + ", ".join(parts or ["same"]) + ")"
    if other.gpus > best.gpus:
        return f"same completion with more GPUs ({other.gpus} vs {best.gpus})"
    return "equal; the homogeneous/smaller allocation is preferred"


def _no_fit_message(
    w: Workload, req: Requirements, pools: list[UsablePool], space: SearchSpace, reasons: list[str]
) -> str:
    wide = [
        GpuOption(
            p.key,
            p.option.spec,
            NO_FIT_PROBE_GPUS,
            p.option.gpus_per_node,
            p.option.usable_fraction,
            overheads=p.option.overheads,
        )
        for p in pools
    ]
    cands = search(w, wide, req.global_batch, req.steps, NO_FIT_PROBE_GPUS, space)
    smallest = sorted((c for items in cands.values() for c in items), key=lambda c: (c.gpus, c.step_time_s))
    msg = f"{req.name} fits nowhere within its limits on this cluster."
    if smallest:
        s = smallest[0]
        by_key: dict[Hashable, UsablePool] = {p.key: p for p in pools}
        pool = by_key[s.gpu]
        msg += (
            f" The smallest allocation that would fit: {s.gpus} x {pool.option.spec.name} ({s.gpu}, plan "
            f"{s.plan.short()}, {s.peak_gib:.1f} GiB per GPU); the pool has {pool.live.gpus_total} GPUs"
            + (f" and limits.max_gpus is {req.max_gpus}." if req.max_gpus else ".")
        )
    elif pools:
        msg += f" No plan fits even {NO_FIT_PROBE_GPUS} GPUs of any type."
    if reasons:
        msg += " Left out: " + "; ".join(reasons) + "."
    msg += " To fix: raise limits.max_gpus, allow more gpu_types, use LoRA/QLoRA or a shorter seq_len."
    return msg


def _max_time_message(req: Requirements, too_long: list[_Cand]) -> str:
    """The no-fit message when the job fits but its --time is above the MaxTime of every partition it could use.

    More GPUs or LoRA is not the fix there: a --time within MaxTime is; a run longer than that runs in pieces
    (it checkpoints at the limit and requeues, docs/runtime.md)."""
    a = min(too_long, key=lambda c: c.alloc.run_time_s).alloc
    longest, part = max((p.max_time_min, p.live.partition) for c in too_long for p in c.pools if p.max_time_min)
    asked = (
        f"-t/slurm.time asks for {a.time_min} min"
        if req.requested_time_min is not None
        else f"the --time it needs is {a.time_min} min (the prediction x {TIME_MARGIN} + {TIME_SLACK_S / 60:.0f} min)"
    )
    msg = (
        f"{req.name} fits nowhere within its limits on this cluster: its fastest allocation, {a.label()}, is "
        f"predicted to run {_duration(a.run_time_s)} and {asked}, above MaxTime {longest} min of partition {part}, "
        f"the longest of the partitions it fits. To fix: give a shorter time, `fsbatch -t {longest}` or less "
        "(or slurm.time)"
    )
    if a.run_time_s <= longest * 60.0:
        return msg + "."
    return msg + (
        f", and let the job run in pieces ({_duration(a.run_time_s)} > {longest} min, about "
        f"{_pieces(a.run_time_s, longest)} runs): Slurm sends USR2 {SIGNAL_LEAD_S} s before the limit, the built-in "
        "trainer checkpoints, requeues itself and resumes from that checkpoint (a `trainer: script` must handle "
        "USR2 itself, docs/runtime.md)."
    )


def _duration(seconds: float) -> str:
    """A predicted run time for a message: minutes under MINUTES_SHOWN_BELOW_S (two hours), else hours."""
    if seconds < MINUTES_SHOWN_BELOW_S:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h ({seconds / 60:.0f} min)"


def _pieces(run_time_s: float, time_min: int) -> int:
    """How many runs of `time_min` a run of `run_time_s` takes when each loses start-up and the checkpoint lead."""
    useful = max(time_min * 60.0 - SIGNAL_LEAD_S - STARTUP_S, 60.0)
    return max(1, math.ceil(run_time_s / useful))


def short_time_note(req: Requirements, chosen: Allocation) -> str | None:
    """A note when the user's -t/slurm.time is shorter than the chosen allocation's predicted run time (else None):
    the job will reach its time limit and, with the built-in trainer, continue from its checkpoint after requeue."""
    if req.requested_time_min is None or req.requested_time_min * 60.0 >= chosen.run_time_s:
        return None
    t = req.requested_time_min
    return (
        f"--time {t} min (-t/slurm.time) is shorter than the predicted run time {_duration(chosen.run_time_s)}: the "
        f"job will reach its time limit. Slurm sends USR2 {SIGNAL_LEAD_S} s before it; the built-in trainer then "
        f"checkpoints and requeues itself and resumes from that checkpoint (a `trainer: script` must handle USR2 "
        f"itself, docs/runtime.md), about {_pieces(chosen.run_time_s, t)} runs in all, each queued again"
    )


def decide(
    req: Requirements,
    w: Workload,
    view: ClusterView,
    site: SiteConfig,
    space: SearchSpace,
    backend: SlurmBackend | None = None,
    now: float | None = None,
    alternatives: int = ALTERNATIVES_SHOWN,
    kept: Kept = PROCESS_KEPT,
) -> Decision:
    """The allocation predicted to finish the job soonest (the module docstring), with the alternatives
    considered; `kept`: the searches and release index kept between this caller's decisions (has/kept.py)."""
    t0 = time.perf_counter()
    now = now if now is not None else view.taken_at
    # the nodes -C and --exclusive let the job use (has/nodes.py); the QOS below counts the whole view's jobs
    usable, node_notes = nodes_for(req, view)
    live = usable.pools()  # one pass over the view's nodes and jobs, for the pools and their prices
    pools, skipped = usable_pools(req, usable, site, live)
    skipped += node_notes
    if not pools:
        raise NoFitError(
            f"{req.name}: no GPU pool can be used: "
            + "; ".join((skipped or ["the cluster has no GPUs"]) + qos_lines(view.qos))
        )
    releases = kept.release_index(usable, now)
    homogeneous = _homogeneous(w, req, pools, releases, now, space, kept)
    if req.exclusive:
        homogeneous = exclusive_nodes(homogeneous)
    best = min((c.alloc.completion for c in homogeneous), default=float("inf"))
    # a tie goes to the homogeneous allocation, and a pipeline across types must win by the site's margin; where
    # no pool alone holds the job, any pipeline that does is a candidate
    lead = best - now
    beat = best - max(TIE_SECONDS, TIE_FRACTION * lead, site.pipeline_margin * lead) if best < math.inf else best
    # pipeline stages across GPU types only where the job's framework lays out such stages (space.heterogeneous)
    cands = homogeneous + (
        _heterogeneous(w, req, pools, releases, now, space, beat, site.max_job_share)
        if space.heterogeneous and not w.arch.encoder_decoder  # (pipelines of encoder-decoder models: not modelled)
        else []
    )
    demand = pricing.demand(usable, live) if site.price_weight > 0 or site.arrival_room > 0 else {}
    # what each candidate costs the jobs queued for and arriving at its GPUs
    delay = _pricer(site, demand, _lost_when_full(pools, w.precision))
    verdicts = [(c, _violations(req, c) or _qos(view, c)) for c in cands]
    allowed, too_wide = _leave_room([c for c, why in verdicts if not why], site.max_job_share)
    ok = _rank(allowed, now, delay)
    rejected = [(c, why) for c, why in verdicts if why] + too_wide
    if backend is not None and ok and ok[0].alloc.start_source != "now":
        _refine(ok, backend, req)
        ok = _rank(ok, now, delay)
    too_long = [c for c, why in verdicts if why and why.startswith(MAX_TIME_REASON)]
    if not ok and too_long:  # MaxTime is checked last: these broke no other limit
        raise NoFitError(_max_time_message(req, too_long))
    if not ok:
        raise NoFitError(
            _no_fit_message(
                w,
                req,
                pools,
                space,
                skipped
                + qos_lines(view.qos)
                + [f"{c.alloc.label()}: {why}" for c, why in rejected[:NO_FIT_REASONS_SHOWN]],
            )
        )
    chosen = ok[0].alloc
    alts = _alternatives(ok, rejected, skipped, now, alternatives, delay)
    return Decision(chosen=chosen, alternatives=alts, decided_at=now, decision_ms=(time.perf_counter() - t0) * 1e3)


def _rank(items: list[_Cand], now: float, delay: Callable[[_Cand], float]) -> list[_Cand]:
    """Earliest completion plus the delay caused to other jobs (`delay`, pricing.py); within a tolerance,
    homogeneous first, then fewer GPUs (ties are noise)."""
    if not items:
        return items
    value = {id(c): c.alloc.completion + delay(c) for c in items}
    first = min(value.values())
    tol = max(TIE_SECONDS, TIE_FRACTION * (first - now))

    def key(c: _Cand) -> tuple[bool, bool, int, float]:
        tied = value[id(c)] <= first + tol
        return (
            not tied,
            c.alloc.kind == "heterogeneous" if tied else False,
            c.alloc.gpus if tied else 0,
            value[id(c)],
        )

    ordered = sorted(items, key=key)
    if WIDTH_RULE == "per-pool":
        groups: dict[tuple, list[_Cand]] = {}
        for c in ordered:
            groups.setdefault(tuple(p.key for p in c.pools), []).append(c)
        picks = [_widest_worth_it(g, now, tol, lambda c: value[id(c)]) for g in groups.values()]
        choice = min(picks, key=lambda c: (key(c), ordered.index(c)))  # the earliest, ties as ranked
    else:
        choice = _widest_worth_it(ordered, now, tol, lambda c: value[id(c)])
    return [choice] + [c for c in ordered if c is not choice]


def _alternatives(
    ok: list[_Cand],
    rejected: list[tuple[_Cand, str]],
    skipped: list[str],
    now: float,
    alternatives: int,
    delay: Callable[[_Cand], float],
) -> list[Alternative]:
    """What a Decision lists beside its choice: up to `alternatives` allowed candidates (one per label) and why
    each lost, the first refused ones and why, and the pools skipped."""
    chosen = ok[0].alloc
    alts: list[Alternative] = []
    for c in ok[1:]:
        label = c.alloc.label()
        if label in {a.description for a in alts} or len(alts) >= alternatives:
            continue
        extra = delay(c) - delay(ok[0])
        alts.append(
            Alternative(allocation=c.alloc, description=label, lost_because=_why_lost(chosen, c.alloc, now, extra))
        )
    for c, why in sorted(rejected, key=lambda cw: cw[0].alloc.completion)[:REFUSED_ALTERNATIVES_SHOWN]:
        alts.append(Alternative(allocation=c.alloc, description=c.alloc.label(), lost_because=why or ""))
    for line in skipped:
        alts.append(Alternative(description=line.split(":")[0], lost_because=line.split(":", 1)[1].strip()))
    return alts
