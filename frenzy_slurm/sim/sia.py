"""Sia (Jayaram Subramanya et al., SOSP 2023) as a baseline: every round, an integer program over every job
in the system, running and pending, that may move a running job at a checkpoint-restart cost.

Each round (`round_s`, Sia's 60 s): one binary variable per (job, GPU pool, GPU count) among MARP's
candidates (the fastest plan at that count; Sia's goodput is throughput here, batch sizes are fixed),
at most one per job; per pool, the GPUs and the whole nodes of multi-node options stay within the
pool (running jobs included: they are re-planned too). Objective, as Sia's policy (its public artifact,
`sia` policy of siasosp23/artifacts):

    maximise  sum_j sum_c X_jc * (A_jc ^ p)  +  lambda_n * sum_j sum_c X_jc

A_jc = goodput of config c / the job's lowest goodput over its configs (so every config is worth at
least 1), p = 0.5 (Sia's default fairness exponent), lambda_n = 1 (Sia's -1 penalty per unallocated
job, written as a reward per allocated one). A running job's configs other than its current one are
scaled by Sia's re-allocation factor

    r = max(age - restarts * R, 0) / (age + R),  r = 1 while age < R

(age: seconds since the job arrived, R: the restart cost), and a job still inside its own restart
(started less than R ago) keeps its allocation (Sia's "checkpoint-restore underway" constraint).

A job whose allocation changes is checkpointed and stopped (`SimSlurm.cancel`; the runtime checkpoints
at the signal, so the steps done are kept) and resubmitted on its new GPUs, where it pays the start-up
time again: that, with the steps since the last checkpoint (none here), is the restart cost, so each job's R
defaults to what a move costs it in the truth (`Context.move_cost`: `ErrorModel.startup_s`, 120 s, its
`restart_s`, 0 s, and with `checkpoint_gbs` writing and reading the job's checkpoint; none measured here; see
docs/simulation-model.md). A job allocated nothing is stopped and waits (Sia preempts). The new
allocations are packed onto nodes as the simulated Slurm packs them (the fullest nodes that fit), the
largest first; one that does not pack stays where it was if it can, else waits for the next round.

Solver: scipy.optimize.milp (HiGHS), as `ilp`. This is not HAS's setting: Slurm does not move running
jobs by itself, and users do not expect theirs to be stopped; it is the bar a preemptive, re-planning
scheduler sets on the same cluster and truth.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from frenzy_slurm.has.pools import UsablePool, node_layout, usable_pools
from frenzy_slurm.marp.candidates import Candidate, search
from frenzy_slurm.sim.base import RoundPolicy
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
from frenzy_slurm.sim.slurm import SimJob
from frenzy_slurm.slurm.backend import ComponentRequest

# one allocation a round may give a job: (the job's index, the pool, MARP's candidate, (nodes, GPUs per node))
_Option = tuple[int, UsablePool, Candidate, tuple[int, int]]

Option = tuple[str, int]  # (pool key, GPUs)


@dataclass
class _Job:
    attempt: Attempt
    arrived: float
    option: Option | None = None  # what it runs on (or was submitted for); None: waiting
    sim_id: int | None = None
    started: float | None = None  # when its current run began
    restarts: int = 0


class SiaPolicy(RoundPolicy):
    name = "sia"
    calibrates = True  # plans with MARP's candidates (the real Sia profiles each job's throughput per type)

    def __init__(
        self,
        round_s: float = 60.0,
        p: float = 0.5,
        lambda_n: float = 1.0,
        restart_s: float | None = None,
        idle_resolve_s: float = 300.0,
    ):
        super().__init__(round_s)
        # a round where nothing changed (same jobs, allocations, pinned jobs, other users' running jobs) re-solves
        # only this long after the last solve: only the re-allocation factors moved, slowly. A simulation
        # speed-up (HiGHS is most of a round); idle_resolve_s = round_s is Sia's every-round solve
        self.idle_resolve_s = idle_resolve_s
        self._last_state: tuple | None = None
        self._last_solve = float("-inf")
        self.p = p
        self.lambda_n = lambda_n
        self.restart_s = restart_s  # None: each job's move cost in the truth (Context.move_cost)
        self.jobs: dict[int, _Job] = {}  # workload job id -> state, for every job arrived and not done
        self._arrived: dict[int, float] = {}
        # (job, memory correction, calibration version) -> MARP's candidates, and the options made of them
        self._cands: dict[tuple[int, float, int], dict] = {}
        self._opts: dict[tuple[int, float, int], dict] = {}
        self._stop: list[int] = []
        self.moves = 0  # running jobs given another allocation
        self.preemptions = 0  # running jobs given none

    # ---- the runner's calls ---------------------------------------------------------------------
    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        arrived = self._arrived.setdefault(a.job.id, ctx.sim.now)
        old = self.jobs.get(a.job.id)
        self.jobs[a.job.id] = _Job(a, arrived, restarts=old.restarts if old else 0)
        return None

    def wants_round(self) -> bool:
        return bool(self.jobs)

    def stop_now(self) -> list[int]:
        out, self._stop = self._stop, []
        return out

    def submitted(self, a: Attempt, p: Placement, job_id: int, ctx: Context) -> None:
        j = self.jobs[a.job.id]
        c = p.components[0].request
        j.attempt, j.sim_id, j.started = a, job_id, ctx.sim.now
        j.option = (f"{c.partition}/{c.gpu_type}", p.gpus)

    def stopped(self, old: Attempt, rest: Attempt) -> None:
        j = self.jobs.get(old.job.id)
        if j is not None:
            j.attempt, j.option, j.sim_id, j.started = rest, None, None, None

    def ended(self, a: Attempt) -> None:
        self.jobs.pop(a.job.id, None)  # an OOM or time limit comes back through place()

    # ---- a round --------------------------------------------------------------------------------
    def _candidates(self, a: Attempt, pools: list[UsablePool], key: tuple[int, float, int]) -> dict:
        if key not in self._cands:
            req = a.requirements
            self._cands[key] = search(a.workload, [p.option for p in pools], req.global_batch, req.steps, None, a.space)
        return self._cands[key]

    def _options(self, a: Attempt, ctx: Context) -> dict[Option, tuple[UsablePool, Candidate, tuple[int, int]]]:
        """The fastest plan per (pool, GPU count) that the pool's nodes can hold, per job and memory correction.

        Kept across rounds: the pools, their nodes and MARP's candidates do not change while a job waits or
        runs (the pools' free GPUs, which do, are not read from here)."""
        # a new calibration of the site (Context.calibration) changes MARP's candidates: they are searched again
        key = (a.job.id, a.mem_correction, ctx.calibration.fits if ctx.calibration is not None else 0)
        if key not in self._opts:
            sim = ctx.sim
            usable, _ = usable_pools(a.requirements, sim.load(), ctx.site_for(a, self.calibrates))
            best: dict[Option, tuple[UsablePool, Candidate, tuple[int, int]]] = {}
            for pool in usable:
                nodes_in_pool = len(sim.by_pool.get((pool.live.partition, pool.live.gpu_type or ""), []))
                for c in self._candidates(a, usable, key).get(pool.option.name, []):
                    layout = node_layout(c.gpus, pool.site.gpus_per_node)
                    if layout is None or layout[0] > nodes_in_pool:
                        continue
                    opt_key = (str(pool.key), c.gpus)
                    if opt_key not in best or c.step_time_s < best[opt_key][1].step_time_s:
                        best[opt_key] = (pool, c, layout)
            self._opts[key] = best
        return self._opts[key]

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        if not self.jobs:
            return []
        t0 = time.perf_counter()
        state = self._state(ctx)
        now = ctx.sim.now
        if state == self._last_state and now - self._last_solve < self.idle_resolve_s:
            return []
        self._last_state, self._last_solve = state, now
        jobs = list(self.jobs.values())
        pools, opts, values, lower = self._choices(ctx, jobs)
        gone = {id(a) for a in self.unplaceable}
        for jid in [k for k, j in self.jobs.items() if id(j.attempt) in gone]:
            self.jobs.pop(jid)
        if not opts:
            return []
        chosen, n_jobs = self._solve(ctx, jobs, pools, opts, values, lower)
        placed = self._realise(ctx, jobs, opts, chosen)
        self.round_ms.append((time.perf_counter() - t0) * 1e3)
        self.round_jobs.append(n_jobs)
        return placed

    def _restart(self, ctx: Context, a: Attempt) -> float:
        """Sia's R for the job: `restart_s` where given, else what a move costs it in the truth (its start-up
        and its checkpoint's restart: `Context.move_cost`)."""
        return self.restart_s if self.restart_s is not None else ctx.move_cost(a)

    def _state(self, ctx: Context) -> tuple:
        """What a round's answer depends on: this policy's jobs (their allocations and whether each is pinned
        by its recent start) and the other users' running jobs; a round in an unchanged state re-solves only
        after `idle_resolve_s`."""
        sim, now = ctx.sim, ctx.sim.now
        own_ids = {j.sim_id for j in self.jobs.values() if j.sim_id is not None}
        return (
            tuple(
                sorted(
                    (k, j.option, j.sim_id, j.started is not None and now - j.started < self._restart(ctx, j.attempt))
                    for k, j in self.jobs.items()
                )
            ),
            tuple(sorted(x.job_id for x in sim.jobs_by_id.values() if _foreign(x, own_ids))),
        )

    def _choices(
        self, ctx: Context, jobs: list[_Job]
    ) -> tuple[dict[str, UsablePool], list[_Option], list[float], list[float]]:
        """Every job's allocations this round (a job started within its R keeps its own), each with its
        value (Sia's goodput gain to the power p, a move's gain cut by the restart factor) and its lower bound
        (1 for a pinned job's own); jobs with no allocation at all go to `unplaceable`."""
        now = ctx.sim.now
        pools: dict[str, UsablePool] = {}
        opts: list[_Option] = []
        values: list[float] = []
        lower: list[float] = []
        for i, j in enumerate(jobs):
            a = j.attempt
            best = self._options(a, ctx)
            for pool, _c, _l in best.values():
                pools[str(pool.key)] = pool
            if not best:
                if j.option is None:
                    self.unplaceable.append(a)
                continue
            g_min = min(1.0 / c.step_time_s for _, c, _ in best.values())
            age = now - j.arrived
            restart = self._restart(ctx, a)
            r = restart_factor(age, j.restarts, restart)
            pinned = j.option is not None and j.started is not None and now - j.started < restart
            for opt_key, (pool, c, layout) in best.items():
                current = opt_key == j.option
                if pinned and not current:
                    continue
                gain = (1.0 / c.step_time_s) / g_min
                if j.option is not None and not current:
                    gain *= r
                opts.append((i, pool, c, layout))
                values.append(gain**self.p + self.lambda_n)
                lower.append(1.0 if pinned and current else 0.0)
        return pools, opts, values, lower

    def _solve(
        self,
        ctx: Context,
        jobs: list[_Job],
        pools: dict[str, UsablePool],
        opts: list[_Option],
        values: list[float],
        lower: list[float],
    ) -> tuple[dict[int, int], int]:
        """({job index: its chosen option's index}, jobs with options): the integer program's answer, or where
        it finds none in time every running job where it is."""
        import numpy as np
        from scipy.optimize import Bounds, LinearConstraint, milp

        n = len(opts)
        a_mat, lo, hi, n_jobs = _constraints(ctx, jobs, pools, opts)
        t_solve = time.perf_counter()
        res = milp(
            c=-np.array(values),
            integrality=np.ones(n),
            bounds=Bounds(np.array(lower), np.ones(n)),
            constraints=LinearConstraint(a_mat, lo, hi),
            options={"time_limit": 10.0},
        )
        self.solve_ms.append((time.perf_counter() - t_solve) * 1e3)
        self.round_vars.append(n)
        chosen: dict[int, int] = {}
        if res.x is not None:
            for k in range(n):
                if res.x[k] > 0.5:
                    chosen[opts[k][0]] = k
        else:  # no solution in time: keep every running job where it is, start nothing
            chosen = {}
            for k, (i, pool, c, _l) in enumerate(opts):
                if jobs[i].option == (str(pool.key), c.gpus):
                    chosen[i] = k
        return chosen, n_jobs

    def _realise(
        self,
        ctx: Context,
        jobs: list[_Job],
        opts: list[_Option],
        chosen: dict[int, int],
    ) -> list[tuple[Attempt, Placement]]:
        """Stop what moves or loses its GPUs, pack the new allocations onto nodes, largest first."""
        sim = ctx.sim
        free = {name: n.gpus - n.used if n.up else 0 for name, n in sim.nodes.items()}
        held: dict[int, list[tuple[str, int]]] = {}  # job index -> (node, GPUs) it gives back when stopped
        stopping: set[int] = set()
        wanted: list[tuple[int, int]] = []  # (job index, option index) to submit
        for i, j in enumerate(jobs):
            k = chosen.get(i)
            new = None if k is None else (str(opts[k][1].key), opts[k][2].gpus)
            if j.option is not None and new != j.option and j.sim_id is not None:
                sj = sim.jobs_by_id.get(j.sim_id)
                if sj is not None and sj.state == "RUNNING":
                    held[i] = [(x, c.gpus_per_node) for c, ns in zip(sj.components, sj.nodes, strict=True) for x in ns]
                    for x, g in held[i]:
                        free[x] += g
                stopping.add(i)
            if k is not None and new != j.option:
                wanted.append((i, k))
        placed: list[tuple[Attempt, Placement]] = []
        for i, k in sorted(wanted, key=lambda ik: -opts[ik[1]][2].gpus):
            _, pool, c, (nodes, per_node) = opts[k]
            names = sim.by_pool.get((pool.live.partition, pool.live.gpu_type or ""), [])
            fits = sorted((x for x in names if free[x] >= per_node), key=lambda x: free[x])  # fullest first
            if len(fits) < nodes:
                back = held.get(i)
                if back and all(free[x] >= g for x, g in back):  # it keeps what it had
                    for x, g in back:
                        free[x] -= g
                    stopping.discard(i)
                continue
            for x in fits[:nodes]:
                free[x] -= per_node
            a = jobs[i].attempt
            req = ComponentRequest(
                partition=pool.live.partition,
                gpu_type=pool.live.gpu_type,
                nodes=nodes,
                gpus_per_node=per_node,
                time_min=replace(a.requirements, resume_s=ctx.resume_allowance(a)).time_min(c.run_time_s),
                cpus_per_gpu=pool.site.cpus_per_gpu,
            )
            label = f"{c.gpus}x{pool.option.spec.name}({pool.live.partition})"
            comp = PlacedComponent(req, pool.option.spec.name, c.peak_gib, pool.option.spec.memory_gib)
            placed.append((a, Placement([comp], c.step_time_s, label, plan=c.plan)))
        for i in stopping:
            j = jobs[i]
            if j.sim_id is not None:
                self._stop.append(j.sim_id)
                j.restarts += 1
                if any(a.job.id == j.attempt.job.id for a, _ in placed):
                    self.moves += 1
                else:
                    self.preemptions += 1
        return placed


def _foreign(sj: SimJob, own: set[int]) -> bool:
    """A running job that is not this policy's (another user's)."""
    return sj.state == "RUNNING" and sj.job_id not in own


def restart_factor(age_s: float, restarts: int, restart_s: float) -> float:
    """Sia's re-allocation factor (exposed for the tests)."""
    if age_s < restart_s:
        return 1.0
    return max(age_s - restarts * restart_s, 0.0) / (age_s + restart_s)


def _constraints(
    ctx: Context, jobs: list[_Job], pools: dict[str, UsablePool], opts: list[_Option]
) -> tuple[Any, list[float], list[float], int]:
    """(the constraint matrix, its lower and upper bounds, jobs with options): at most one allocation per job;
    per pool, the GPUs of its up nodes less those other users' running jobs hold, and for multi-node options
    the whole nodes no other user's job is on."""
    from scipy.sparse import coo_matrix

    sim = ctx.sim
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    row = 0
    by_job: dict[int, list[int]] = {}
    for k, (i, *_rest) in enumerate(opts):
        by_job.setdefault(i, []).append(k)
    for ks in by_job.values():  # at most one allocation per job
        rows += [row] * len(ks)
        cols += ks
        vals += [1.0] * len(ks)
        lo.append(0.0)
        hi.append(1.0)
        row += 1
    own = {j.sim_id for j in jobs if j.sim_id is not None}
    foreign_gpus: dict[str, int] = {}  # GPUs and whole nodes held by jobs that are not this policy's
    foreign_nodes: dict[str, set[str]] = {}
    for sj in sim.jobs_by_id.values():
        if sj.state == "RUNNING" and sj.job_id not in own:
            for comp, ns in zip(sj.components, sj.nodes, strict=True):
                key = f"{comp.partition}/{comp.gpu_type}"
                foreign_gpus[key] = foreign_gpus.get(key, 0) + comp.gpus_per_node * len(ns)
                foreign_nodes.setdefault(key, set()).update(ns)
    by_pool: dict[str, list[int]] = {}
    for k, (_, pool, _c, _l) in enumerate(opts):
        by_pool.setdefault(str(pool.key), []).append(k)
    for key, ks in by_pool.items():
        pool = pools[key]
        names = sim.by_pool.get((pool.live.partition, pool.live.gpu_type or ""), [])
        up = [sim.nodes[x] for x in names if sim.nodes[x].up]
        rows += [row] * len(ks)
        cols += ks
        vals += [float(opts[k][2].gpus) for k in ks]
        lo.append(0.0)
        hi.append(float(sum(x.gpus for x in up) - foreign_gpus.get(key, 0)))
        row += 1
        multi = [k for k in ks if opts[k][3][0] > 1]
        if multi:  # a multi-node option takes whole nodes
            rows += [row] * len(multi)
            cols += multi
            vals += [float(opts[k][3][0]) for k in multi]
            lo.append(0.0)
            hi.append(float(len([x for x in up if x.name not in foreign_nodes.get(key, set())])))
            row += 1
    a_mat = coo_matrix((vals, (rows, cols)), shape=(row, len(opts))).tocsr()
    return a_mat, lo, hi, len(by_job)
