"""Joint re-planning of waiting jobs: which of its pre-planned shapes each pending frenzy job should wait as.

A pending job can change partition, GPU count per node and node count in place (`SlurmBackend.update_pending`,
`scontrol update`) and keep its priority and age, its place in the queue, unlike the watcher's hold, resubmit
and cancel (has/moves.py). Each job brings a few options, each a shape fsbatch planned for it with HAS's
predicted completion (its start, from Slurm's or HAS's estimate, plus the plan's run time); option 0 is the
shape it waits as now. This module chooses one option per job for all of them together, as Sia's ILP does over
all jobs: minimise the summed predicted completion, subject to the GPUs free now. An option that starts now
takes GPUs of its pool (partition, GPU type), and the options chosen to start now may together take no more
than the pool has free; one that waits takes nothing now (Slurm orders the waiting ones). Each option must
also fit the free nodes on its own (`Option.starts_now` says that HAS found it so).

A change is offered only where it shortens that job's predicted completion by more than the site's margin
(`replan.margin_s`, `replan.margin_fraction` of the job's remaining time, in the site file): predictions err,
and an update is not free (the job's script picks its plan anew). So a job whose options are all within the
margin stays, whatever the others do, and the joint solution never makes a job slower than it is predicted now.

Solver: scipy.optimize.milp (HiGHS), where scipy is installed (the `sim` and `calibrate` extras); else a greedy
pass in queue order (oldest job first, each taking its best option that still fits), what Slurm's own FIFO
would give. Both are pure: the watcher (track/replan_pass.py) reads the cluster and applies the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from frenzy_slurm.slurm.view import ClusterView, PoolKey

# Defaults of the site file's `replan` section: a change must gain 10 minutes and 10% of the remaining time.
MARGIN_S = 600.0
MARGIN_FRACTION = 0.1


@dataclass(frozen=True)
class Option:
    """One shape a pending job may wait as, with HAS's predicted completion (epoch seconds)."""

    partition: str
    gpu_type: str | None
    nodes: int
    gpus_per_node: int
    completion: float
    starts_now: bool  # fits the GPUs free now on its own: it takes them if chosen

    @property
    def pool(self) -> PoolKey:
        return PoolKey(self.partition, self.gpu_type)

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class PendingJob:
    """A waiting job and its options; `options[0]` is the shape it waits as now."""

    job_id: int
    options: tuple[Option, ...]


@dataclass(frozen=True)
class Margin:
    seconds: float = MARGIN_S
    fraction: float = MARGIN_FRACTION

    def pays(self, stay: Option, go: Option, now: float) -> bool:
        """Whether `go` ends sooner than `stay` by more than the margin of the time `stay` has left."""
        return go.completion < stay.completion - max(self.seconds, self.fraction * max(0.0, stay.completion - now))


def free_gpus(view: ClusterView) -> dict[PoolKey, int]:
    """The GPUs free now per pool (partition, GPU type); a node in several partitions counts in each, and
    `assign` charges an option to its own pool only (a node shared by two partitions is rare for GPU pools)."""
    out: dict[PoolKey, int] = {}
    for n in view.nodes:
        for p in n.partitions:
            key = PoolKey(p, n.gpu_type)
            out[key] = out.get(key, 0) + n.gpus_free
    return out


def _candidates(job: PendingJob, margin: Margin, now: float) -> list[int]:
    """The option indices the job may take: staying, and every option that pays."""
    stay = job.options[0]
    return [0] + [i for i, o in enumerate(job.options) if i and margin.pays(stay, o, now)]


def assign(
    jobs: Sequence[PendingJob], free: dict[PoolKey, int], now: float, margin: Margin | None = None
) -> dict[int, int]:
    """Per job id, the option index it should change to; jobs that stay are left out. `jobs` in queue order."""
    margin = margin or Margin()
    cands = {j.job_id: _candidates(j, margin, now) for j in jobs}
    if all(len(c) == 1 for c in cands.values()):
        return {}
    try:
        chosen = _milp(jobs, cands, free)
    except ImportError:
        chosen = _greedy(jobs, cands, free)
    return {jid: i for jid, i in chosen.items() if i != 0}


def _taken(o: Option) -> int:
    return o.gpus if o.starts_now else 0


def _greedy(jobs: Sequence[PendingJob], cands: dict[int, list[int]], free: dict[PoolKey, int]) -> dict[int, int]:
    """Queue order, each job its soonest option that still fits; its current shape is always possible (Slurm
    decides whether it starts), and where it would start now it takes those GPUs from the jobs after it."""
    left = dict(free)
    out: dict[int, int] = {}
    for j in jobs:
        for i in sorted(cands[j.job_id], key=lambda k: j.options[k].completion):
            o = j.options[i]
            if i == 0 or _taken(o) <= left.get(o.pool, 0):
                out[j.job_id] = i
                left[o.pool] = left.get(o.pool, 0) - _taken(o)
                break
    return out


def _milp(jobs: Sequence[PendingJob], cands: dict[int, list[int]], free: dict[PoolKey, int]) -> dict[int, int]:
    """One binary per (job, candidate option): exactly one per job; per pool, the GPUs of the options chosen to
    start now within its free GPUs (or within what the jobs staying there would take, where that is more: all
    staying is always feasible); minimise the summed completion."""
    import numpy as np
    from scipy.optimize import Bounds, LinearConstraint, milp

    cols = [(j, i) for j in jobs for i in cands[j.job_id]]
    t0 = min(j.options[i].completion for j, i in cols)
    cost = np.array([(j.options[i].completion - t0) / 3600.0 for j, i in cols])  # hours: a well-scaled objective
    one = np.zeros((len(jobs), len(cols)))
    for r, job in enumerate(jobs):
        for c, (j, _) in enumerate(cols):
            one[r, c] = 1.0 if j.job_id == job.job_id else 0.0
    constraints = [LinearConstraint(one, 1, 1)]
    pools = sorted({j.options[i].pool for j, i in cols if j.options[i].starts_now}, key=str)
    if pools:
        cap = np.zeros((len(pools), len(cols)))
        staying = dict.fromkeys(pools, 0)
        for c, (j, i) in enumerate(cols):
            o = j.options[i]
            if o.pool in staying:
                cap[pools.index(o.pool), c] = _taken(o)
                staying[o.pool] += _taken(o) if i == 0 else 0
        upper = np.array([max(free.get(p, 0), staying[p]) for p in pools], dtype=float)
        constraints.append(LinearConstraint(cap, 0, upper))
    res = milp(cost, constraints=constraints, integrality=np.ones(len(cols)), bounds=Bounds(0, 1))
    if res.x is None:
        return _greedy(jobs, cands, free)
    return {j.job_id: i for (j, i), x in zip(cols, res.x, strict=True) if x > 0.5}
