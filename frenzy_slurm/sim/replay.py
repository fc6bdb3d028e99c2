"""Validation: replay a simulated run on a real Slurm cluster and compare each job's start and end.

    jobs = replay_jobs(simulate(workload, SimCluster.from_view(view, site), "has", ...), makespan_s=120)
    sim = simulate_replay(jobs, cluster)          # the simulator's starts and ends for these exact jobs
    live = live_replay(jobs, open_backend("cli"), workdir)   # sbatch through the real backend
    report = compare(sim, live)

The replayed jobs are the policy's placements (partitions, nodes, GPUs per node, time limit) with
arrival and run times scaled down so the whole run takes about `makespan_s` seconds; the payload
sleeps for the job's true run time. Slurm's `--time` is whole minutes, so scaled limits round up to
at least one minute; the simulator gets the very same limits, so both schedule the same jobs.
What differs is what the simulator leaves out: Slurm's scheduling passes run on events and every
`bf_interval` (1 s here) rather than instantly, launch and completion take a moment, and times are
whole seconds.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.sim.clusters import SimCluster
from frenzy_slurm.sim.runner import RunResult
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest, SlurmBackend


@dataclass(frozen=True)
class ReplayJob:
    id: int
    submit_s: float
    components: list[ComponentRequest]
    run_s: float


def replay_jobs(result: RunResult, makespan_s: float = 120.0, min_run_s: float = 3.0) -> list[ReplayJob]:
    """The completed jobs of a simulated run, scaled so the run spans about `makespan_s` seconds."""
    done = [r for r in result.records if r.state == "done" and r.components]
    if not done:
        return []
    first = min(r.submit for r in done)
    span = max(r.end for r in done if r.end is not None) - first  # a done job has ended
    f = makespan_s / span if span > 0 else 1.0
    out = []
    for r in done:
        run = max(min_run_s, r.last_run_s * f)
        comps = []
        for c in r.components:
            limit = max(1, math.ceil(c.time_min * f), math.ceil(run * 1.25 / 60))
            comps.append(
                ComponentRequest(
                    partition=c.partition,
                    gpu_type=c.gpu_type,
                    nodes=c.nodes,
                    gpus_per_node=c.gpus_per_node,
                    time_min=limit,
                    cpus_per_gpu=1,
                    mem_per_gpu_mb=c.mem_per_gpu_mb,
                )
            )
        out.append(ReplayJob(r.id, (r.submit - first) * f, comps, run))
    return sorted(out, key=lambda j: (j.submit_s, j.id))


def simulate_replay(
    jobs: list[ReplayJob], cluster: SimCluster, sched_interval_s: float = 0.0
) -> dict[int, tuple[float, float]]:
    """(start, end) of each replayed job in the simulated Slurm, seconds from the first submission.
    `sched_interval_s`: the cluster's backfill period (the devcluster's bf_interval is 1 s)."""
    runs: dict[int, float] = {}
    by_sim: dict[int, int] = {}
    sim = SimSlurm(
        cluster, now=0.0, outcome=lambda j: (runs[by_sim[j.job_id]], "COMPLETED"), sched_interval_s=sched_interval_s
    )
    for j in jobs:
        sim.advance(j.submit_s)
        by_sim[sim.next_job_id] = j.id
        runs[j.id] = j.run_s
        sim.submit(
            BatchJob(script=Path("replay.sbatch"), workdir=Path("."), components=j.components, name=f"replay-{j.id}")
        )
    while sim.next_end() is not None:
        sim.advance(sim.next_end())  # type: ignore[arg-type]  # not None: the loop checked
    return {
        by_sim[sid]: (sj.start, sj.end)
        for sid, sj in sim.jobs_by_id.items()
        if sj.start is not None and sj.end is not None
    }


def write_script(job: ReplayJob, workdir: Path) -> Path:
    """A batch script that asks for the job's components and sleeps for its run time."""
    lines = ["#!/bin/bash"]
    for k, c in enumerate(job.components):
        if k:
            lines.append("#SBATCH hetjob")
        gres = f"gpu:{c.gpu_type}:{c.gpus_per_node}" if c.gpu_type else f"gpu:{c.gpus_per_node}"
        lines += [
            f"#SBATCH --partition={c.partition}",
            f"#SBATCH --nodes={c.nodes}",
            f"#SBATCH --gres={gres}",
            f"#SBATCH --ntasks-per-node={c.gpus_per_node}",
            f"#SBATCH --cpus-per-task={c.cpus_per_gpu}",
            f"#SBATCH --time={c.time_min}",
        ]
        if k == 0:
            lines += [f"#SBATCH --job-name=replay-{job.id}", f"#SBATCH --output={workdir}/replay-{job.id}-%j.out"]
    lines.append(f"sleep {job.run_s:.2f}")
    path = workdir / f"replay-{job.id}.sbatch"

    write_atomic(path, "\n".join(lines) + "\n", mode=0o700)  # never through a planted link
    return path


def live_replay(
    jobs: list[ReplayJob], backend: SlurmBackend, workdir: Path, poll_s: float = 0.5, timeout_s: float = 600.0
) -> dict[int, tuple[float, float]]:
    """Submit each job at its scaled arrival through `backend.submit`; (start, end) from the queue, in seconds
    from the first submission. One batched `squeue` per poll."""
    workdir.mkdir(parents=True, exist_ok=True)
    scripts = {j.id: write_script(j, workdir) for j in jobs}
    todo = sorted(jobs, key=lambda j: j.submit_s)
    slurm_ids: dict[int, int] = {}
    times: dict[int, tuple[float, float]] = {}
    t0 = time.time()
    deadline = t0 + timeout_s
    try:
        while len(times) < len(jobs):
            if time.time() > deadline:
                raise TimeoutError(f"replay: {len(jobs) - len(times)} jobs not finished after {timeout_s:.0f} s")
            while todo and time.time() - t0 >= todo[0].submit_s:
                j = todo.pop(0)
                slurm_ids[j.id] = backend.submit(
                    BatchJob(script=scripts[j.id], workdir=workdir, components=j.components, name=f"replay-{j.id}")
                ).job_id
            live = [sid for jid, sid in slurm_ids.items() if jid not in times]
            if live:
                by_leader: dict[int, list] = {}
                # the whole queue in one query, filtered here: Slurm 22.05's `squeue --json --jobs=` fails for
                # some id lists ("Failed while looking for jobs") where the unfiltered query does not
                for q in backend.jobs():
                    by_leader.setdefault(q.het_job_id or q.job_id, []).append(q)
                for jid, sid in slurm_ids.items():
                    comps = by_leader.get(sid)
                    if jid in times or not comps:
                        continue
                    if all(c.phase in ("completed", "failed", "cancelled", "timeout") for c in comps):
                        start = min(c.start_time or 0 for c in comps)
                        end = max(c.end_time or 0 for c in comps)
                        times[jid] = (start - t0, end - t0)
            nxt = todo[0].submit_s + t0 - time.time() if todo else poll_s
            time.sleep(max(0.05, min(poll_s, nxt)))
    finally:
        for jid, sid in slurm_ids.items():
            if jid not in times:
                try:
                    backend.cancel(sid)
                except Exception:  # noqa: BLE001 - best effort clean-up of what this replay submitted
                    pass
    return times


def compare(sim: dict[int, tuple[float, float]], live: dict[int, tuple[float, float]]) -> dict[str, Any]:
    """Start and end differences (live - simulated), and the median start difference as a share of the
    replay's makespan (the issue's goal: under 5%)."""
    ids = sorted(set(sim) & set(live))
    starts = [live[i][0] - sim[i][0] for i in ids]
    ends = [live[i][1] - sim[i][1] for i in ids]
    makespan = max(e for _, e in live.values()) - min(s for s, _ in live.values()) if live else 0.0
    med = statistics.median(abs(d) for d in starts) if starts else float("nan")
    return {
        "jobs": len(ids),
        "makespan_s": makespan,
        "start_diff_median_s": med,
        "start_diff_max_s": max((abs(d) for d in starts), default=float("nan")),
        "start_diff_mean_s": statistics.fmean(starts) if starts else float("nan"),
        "end_diff_median_s": statistics.median(abs(d) for d in ends) if ends else float("nan"),
        "start_diff_median_pct_of_makespan": 100.0 * med / makespan if makespan else float("nan"),
        "per_job": [
            {"id": i, "sim_start": sim[i][0], "live_start": live[i][0], "sim_end": sim[i][1], "live_end": live[i][1]}
            for i in ids
        ],
    }
