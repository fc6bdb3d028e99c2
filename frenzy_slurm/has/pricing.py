"""GPU-type prices: what an allocation costs the other jobs, from the queue HAS sees (issue 30).

Earliest completion alone lets a long, wide job take the fastest type while jobs queued for that type (and those
that arrive while it runs) wait; another type that serves it nearly as well would have cost them nothing. HAS
therefore ranks the candidates by their completion plus the delay they cause: the marginal increase of the summed
completion times, in a fluid model of each pool. A component holding G of a pool's C GPUs for T seconds pushes the
work behind it back by G*T/C; that delays

- each job waiting for the pool now (a job queued on k pools counts 1/k on each), and
- each job expected to arrive for it while the component runs: by Little's law, the pool's running jobs
  divided by their time limits per second, over T, each delayed by half of G*T/C on average, and only where the
  pool is busy (the share of its GPUs running or asked for by its queue). At most as many as run there now: a
  job longer than those turns the pool over that many times, but the jobs arriving meanwhile do not all queue
  behind it (they go to other pools; without the bound a job of days priced a pool of 3-hour jobs so high that
  waiting 500 h for another one looked cheaper).

The jobs' speed-ups on the types are not in Slurm's view of the queue (a pending job shows the partition and GPU
count it asked for), so every job counts the same. All of it is read from the cluster view `fsbatch` reads;
`price_weight` (the site file) scales the delay against the job's own completion: 1 is the sum of completion
times in this model, 0 earliest completion alone; the default, 2, measured best on the tuning set of
benchmarks/jct.py (`--case tune`; docs/has.md, "GPU-type prices").
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.slurm.view import ClusterView, GpuPool, PoolKey, job_phase


@dataclass(frozen=True)
class PoolDemand:
    """What the jobs other than the one being decided want of one pool."""

    gpus: int  # GPUs of the pool
    waiting: float  # jobs queued for the pool (1/k for a job queued on k pools)
    arrivals_per_s: float  # jobs expected to arrive for it per second (running jobs / their time limits)
    running: int  # jobs running there: the most arrivals one allocation is charged for
    busy: float  # share of its GPUs running jobs or asked for by its queue, at most 1
    free: int = 0  # GPUs free now


def demand(view: ClusterView, live: list[GpuPool] | None = None) -> dict[PoolKey, PoolDemand]:
    """Each pool's demand, from the view's nodes and jobs (the pools as ClusterView.pools counts them; `live`: its
    answer where the caller has it, since it is a pass over the whole view)."""
    pools = {p.key: p for p in (view.pools() if live is None else live) if p.gpus_total}
    waiting = dict.fromkeys(pools, 0.0)
    rate = dict.fromkeys(pools, 0.0)
    running = dict.fromkeys(pools, 0)
    for j in view.jobs:
        if not j.gpus_per_node:
            continue
        phase = job_phase(j.state)
        keys = [k for k in (_key(view, pools, part, j.gpu_type) for part in j.partition.split(",")) if k]
        if not keys:
            continue
        if phase == "pending":
            for k in keys:
                waiting[k] += 1.0 / len(keys)
        elif phase == "running" and j.start_time is not None and j.end_time is not None and j.end_time > j.start_time:
            rate[keys[0]] += 1.0 / (j.end_time - j.start_time)
            running[keys[0]] += 1
    busy = {k: min(1.0, (p.gpus_total - p.gpus_free + p.gpus_pending) / p.gpus_total) for k, p in pools.items()}
    return {
        k: PoolDemand(p.gpus_total, waiting[k], rate[k], running[k], busy[k], p.gpus_free) for k, p in pools.items()
    }


def _key(view: ClusterView, pools: dict, partition: str, gpu_type: str | None) -> PoolKey | None:
    """The pool a job of `partition` asking for `gpu_type` counts in: its type's, or the partition's first."""
    if gpu_type is not None:
        key = PoolKey(partition, gpu_type)
        return key if key in pools else None
    return next((k for k in pools if k.partition == partition), None)


def arrivals(pool: PoolDemand | None, run_time_s: float) -> float:
    """Jobs expected to arrive for the pool over `run_time_s` (Little's law, at most as many as run there now)."""
    if pool is None or run_time_s <= 0:
        return 0.0
    return min(pool.arrivals_per_s * run_time_s, pool.running)


def displaced_s(pool: PoolDemand | None, gpus: int, run_time_s: float) -> float:
    """Summed delay of the jobs expected to arrive while `gpus` of this pool, taken now, run for `run_time_s` and
    find none of its GPUs free: each asking one GPU, the arrivals beyond the GPUs left free. Slurm starts a job
    that lists several partitions on the first with room, so such a job runs on a slower type or waits; either
    costs it a share of its run that Slurm's view does not show, counted as half of a typical run there (the
    harmonic mean of the running jobs' time limits, Little's law's own)."""
    if pool is None or gpus <= 0 or run_time_s <= 0 or pool.arrivals_per_s <= 0:
        return 0.0
    left = max(pool.free - gpus, 0)
    short = max(arrivals(pool, run_time_s) - left, 0.0)
    return short * 0.5 * pool.running / pool.arrivals_per_s


def delay_s(pool: PoolDemand | None, gpus: int, run_time_s: float) -> float:
    """Summed delay, in seconds, that `gpus` of this pool held for `run_time_s` cause the other jobs."""
    if pool is None or gpus <= 0 or run_time_s <= 0:
        return 0.0
    push = gpus * run_time_s / pool.gpus  # how far the work behind it moves back
    arriving = arrivals(pool, run_time_s) * pool.busy
    return push * (pool.waiting + 0.5 * arriving)
