"""Joint re-planning of waiting jobs (frenzy_slurm/has/replan.py): the ILP against the queue-order greedy pass.

    python benchmarks/replan_solver.py [--trials 200] [--seed 7]

Random constructed queues, not a cluster trace: per trial, n jobs each waiting as one shape (2-20 h to
completion) with two more shapes (1x2, 1x4 or 1x8 GPUs in one of three partitions; 60% of them start now, the
others wait 1-25 h), and 0, 4, 8 or 16 GPUs free per partition. Reports the share by which each solver cuts the
summed predicted completion against every job staying (the site's default margin applied), how often the ILP
does worse than the greedy pass (it should never), and the solve times.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from frenzy_slurm.has import replan
from frenzy_slurm.has.replan import Margin, Option, PendingJob, assign
from frenzy_slurm.slurm.view import PoolKey

H = 3600.0
POOLS = ("p0", "p1", "p2")


def instance(rng: random.Random, n: int) -> tuple[list[PendingJob], dict[PoolKey, int]]:
    free = {PoolKey(p, "a100"): rng.choice([0, 4, 8, 16]) for p in POOLS}
    jobs = []
    for j in range(n):
        stay_h = rng.uniform(2, 20)
        opts = [Option(rng.choice(POOLS), "a100", 1, 4, stay_h * H, False)]
        for _ in range(2):
            now = rng.random() < 0.6
            end = rng.uniform(0.5, stay_h) if now else rng.uniform(1, 25)
            opts.append(Option(rng.choice(POOLS), "a100", 1, rng.choice([2, 4, 8]), end * H, now))
        jobs.append(PendingJob(j, tuple(opts)))
    return jobs, free


def total(jobs: list[PendingJob], chosen: dict[int, int]) -> float:
    return sum(j.options[chosen.get(j.job_id, 0)].completion for j in jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    rng, margin = random.Random(args.seed), Margin()
    assign(*instance(rng, 2), 0.0, margin)  # scipy's import, outside the timings
    for n in (5, 20):
        cut_g, cut_i, t_i, t_g, worse = [], [], [], [], 0
        for _ in range(args.trials):
            jobs, free = instance(rng, n)
            t0 = time.perf_counter()
            ilp = assign(jobs, free, 0.0, margin)
            t_i.append(time.perf_counter() - t0)
            cands = {j.job_id: replan._candidates(j, margin, 0.0) for j in jobs}
            t0 = time.perf_counter()
            greedy = replan._greedy(jobs, cands, free)
            t_g.append(time.perf_counter() - t0)
            base = total(jobs, {})
            cut_g.append((base - total(jobs, greedy)) / base)
            cut_i.append((base - total(jobs, ilp)) / base)
            worse += cut_i[-1] < cut_g[-1] - 1e-9
        print(
            f"{n} jobs: summed completion cut vs staying: greedy {statistics.mean(cut_g):.1%}, "
            f"ILP {statistics.mean(cut_i):.1%}; ILP worse than greedy in {worse}/{args.trials}; solve median "
            f"ILP {statistics.median(t_i) * 1e3:.1f} ms (max {max(t_i) * 1e3:.1f}), greedy "
            f"{statistics.median(t_g) * 1e3:.2f} ms"
        )


if __name__ == "__main__":
    main()
