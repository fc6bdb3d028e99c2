"""A greedy, non-preemptive integer program per round (after Sia's, without its re-planning) as a baseline.

Every `round_s` seconds, over the jobs it holds (submitted, not yet placed): one binary variable per
(job, GPU pool, GPU count) among MARP's candidates that fit the GPUs free now; at most one option per
job; per pool, the GPUs and the whole free nodes (for multi-node options) it allots stay within what is
free. Objective: maximise the sum of goodput-weighted utilities,

    u(job, pool, count) = (1 + wait_h) * sqrt(rate / rate_min)

rate = 1 / predicted step time of the fastest plan at that (pool, count), rate_min = the job's rate on
its smallest feasible allocation, so any placement is worth at least 1 (placing more jobs beats
growing one) and extra GPUs bring diminishing returns, as Sia's fairness exponent (p = 0.5) does; the
(1 + hours waited) weight stands in for Sia's restarts of running jobs, which a non-preemptive Slurm
does not have, so that large jobs are not starved by a stream of small ones.
Jobs are then submitted for exactly what was allotted (they start at once). Running jobs keep their
GPUs: Slurm does not resize a running job. Speed floor: an option more than `speed_floor` times slower
than the job's fastest option on an empty cluster is never offered (the job waits instead), so that a
job is not locked for hours onto GPUs far slower than what it could get soon; without it, about half
the jobs of a standard seed ran on GPUs at least 2x slower than their best (one 83x). `sia`
(frenzy_slurm.sim.sia) is the re-planning method itself.

Solver: scipy.optimize.milp (HiGHS). scipy is a well-kept dependency many sites already have; HiGHS
is the open solver Sia's successors use; OR-Tools would add a larger binary dependency for the same
branch-and-bound here. Imported only by this policy (the optional `sim` extra).
"""

from __future__ import annotations

import math
import time

from frenzy_slurm.has.pools import UsablePool, fits_free_now, node_layout, usable_pools
from frenzy_slurm.marp.candidates import Candidate, search
from frenzy_slurm.sim.base import RoundPolicy
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
from frenzy_slurm.slurm.backend import ComponentRequest

# one option of a round: (the held job's index, the pool, MARP's candidate, (nodes, GPUs per node))
_Option = tuple[int, UsablePool, Candidate, tuple[int, int]]


class IlpPolicy(RoundPolicy):
    name = "ilp"
    calibrates = True

    def __init__(self, round_s: float = 60.0, speed_floor: float | None = 2.0):
        super().__init__(round_s)
        self.speed_floor = speed_floor  # None: any option, however slow (the straw man)
        self._cands: dict[int, tuple[int, dict]] = {}  # id(attempt) -> (calibration version, candidates)

    def _candidates(self, a: Attempt, pools: list[UsablePool], ctx: Context) -> dict:
        key = id(a)
        version = ctx.calibration.fits if ctx.calibration is not None else 0  # a new calibration: search again
        if key not in self._cands or self._cands[key][0] != version:
            req = a.requirements
            found = search(a.workload, [p.option for p in pools], req.global_batch, req.steps, None, a.space)
            self._cands[key] = (version, found)
        return self._cands[key][1]

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        if not self.held:
            return []
        t0 = time.perf_counter()
        options, values = self._options(ctx)
        placed: list[tuple[Attempt, Placement]] = []
        if options:
            chosen = self._solve(options, values)
            placed = self._place(options, values, chosen)
            self.round_vars.append(len(options))
        gone = {id(a) for a in self.unplaceable} | {id(a) for a, _ in placed}
        self.held = [h for h in self.held if id(h[0]) not in gone]
        for a, _ in placed:
            self._cands.pop(id(a), None)
        if options:  # a round with nothing to decide (no free GPUs fit any held job) is not a decision
            self.round_ms.append((time.perf_counter() - t0) * 1e3)
            self.round_jobs.append(len({o[0] for o in options}))
        return placed

    def _options(self, ctx: Context) -> tuple[list[_Option], list[float]]:
        """Every held job's candidates that fit the free GPUs now (within the speed floor), each valued by its
        waiting-weighted square-root speed-up over the job's smallest candidate; jobs with no candidate at all go
        to `unplaceable`."""
        view = ctx.sim.load()
        now = ctx.sim.now
        options: list[_Option] = []
        values: list[float] = []
        for i, (a, since) in enumerate(self.held):
            pools, _ = usable_pools(a.requirements, view, ctx.site_for(a, self.calibrates))
            cands = self._candidates(a, pools, ctx)
            every = [c for items in cands.values() for c in items]
            if not every:
                self.unplaceable.append(a)
                continue
            smallest = min(every, key=lambda c: (c.gpus, c.step_time_s))
            rate_min = 1.0 / smallest.step_time_s
            fastest = min(c.step_time_s for c in every)
            weight = 1.0 + (now - since) / 3600.0
            for pool in pools:
                free_gpus = sum(pool.free_by_node)
                for c in cands.get(pool.option.name, []):
                    layout = node_layout(c.gpus, pool.site.gpus_per_node)
                    if c.gpus > free_gpus or layout is None or not fits_free_now(pool, *layout):
                        continue
                    if self.speed_floor is not None and c.step_time_s > self.speed_floor * fastest:
                        continue
                    options.append((i, pool, c, layout))
                    values.append(weight * math.sqrt((1.0 / c.step_time_s) / rate_min))
        return options, values

    def _solve(self, options: list[_Option], values: list[float]) -> list[int]:
        """The options the integer program chooses: one per job, within each pool's free GPUs and whole nodes."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        n = len(options)
        rows, lo, hi = [], [], []
        for i in range(len(self.held)):  # one option per job
            row = np.zeros(n)
            for k, (j, *_rest) in enumerate(options):
                if j == i:
                    row[k] = 1
            if row.any():
                rows.append(row)
                lo.append(0)
                hi.append(1)
        by_pool: dict = {}
        for k, (_, pool, c, layout) in enumerate(options):
            by_pool.setdefault(pool.key, (pool, []))[1].append((k, c, layout))
        for pool, items in by_pool.values():
            gpus = np.zeros(n)
            whole = np.zeros(n)
            for k, c, (nodes, _per_node) in items:
                gpus[k] = c.gpus
                if nodes > 1:
                    whole[k] = nodes
            rows.append(gpus)
            lo.append(0)
            hi.append(sum(pool.free_by_node))
            full_free = sum(1 for f in pool.free_by_node if f == pool.site.gpus_per_node)
            if whole.any():
                rows.append(whole)
                lo.append(0)
                hi.append(full_free)
        t_solve = time.perf_counter()
        res = milp(
            c=-np.array(values),
            integrality=np.ones(n),
            bounds=Bounds(0, 1),
            constraints=LinearConstraint(np.array(rows), lo, hi),
            options={"time_limit": 10.0},
        )
        self.solve_ms.append((time.perf_counter() - t_solve) * 1e3)
        return [k for k in range(n) if res.x is not None and res.x[k] > 0.5]

    def _place(self, options: list[_Option], values: list[float], chosen: list[int]) -> list[tuple[Attempt, Placement]]:
        """The chosen options, most valuable first, packed onto the pools' free nodes (the program counts GPU
        totals; packing can still refuse one)."""
        placed: list[tuple[Attempt, Placement]] = []
        free_now = {p.key: list(p.free_by_node) for p in {id(o[1]): o[1] for o in options}.values()}
        for k in sorted(chosen, key=lambda k: -values[k]):
            i, pool, c, (nodes, per_node) = options[k]
            free = sorted(free_now[pool.key], reverse=True)
            if len(free) < nodes or free[nodes - 1] < per_node:
                continue  # the pool constraints are GPU totals; node packing can still say no
            for x in range(nodes):
                free[x] -= per_node
            free_now[pool.key] = free
            a = self.held[i][0]
            req = ComponentRequest(
                partition=pool.live.partition,
                gpu_type=pool.live.gpu_type,
                nodes=nodes,
                gpus_per_node=per_node,
                time_min=a.requirements.time_min(c.run_time_s),
                cpus_per_gpu=pool.site.cpus_per_gpu,
            )
            placed.append(
                (
                    a,
                    Placement(
                        [PlacedComponent(req, pool.option.spec.name, c.peak_gib, pool.option.spec.memory_gib)],
                        c.step_time_s,
                        f"{c.gpus}x{pool.option.spec.name}({pool.live.partition})",
                        plan=c.plan,
                    ),
                )
            )
        return placed
