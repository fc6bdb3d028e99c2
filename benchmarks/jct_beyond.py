"""HAS's average JCT beyond the standard comparison: 21 runs on seeds and clusters no rule was tuned on.

    python benchmarks/jct_beyond.py [--max-job-share S] [--policy has]

Runs `philly:SEED:60` for seeds 1-12 on the 64-GPU cluster of benchmarks/jct.py, and `philly:21..23:70`
on three other clusters; prints each run's average JCT (hours) and their geometric and arithmetic means.
docs/simulation.md ("Where HAS loses to sia") quotes it; the truth is the default (published speeds).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.cli.simulate import trace_path  # noqa: E402
from frenzy_slurm.sim import parse_compact  # noqa: E402
from frenzy_slurm.sim.metrics import summarize  # noqa: E402
from frenzy_slurm.sim.runner import Runner  # noqa: E402
from frenzy_slurm.sim.workload import sample_philly  # noqa: E402

STANDARD = "A100-80GB:2x8,V100-32GB:4x8,T4:4x4"
OTHERS = (
    "H100-80GB:1x8,A100-40GB:3x8,L4:6x4",
    "A100-80GB:4x8,V100-32GB:2x8,T4:2x4",
    "A10G:4x4,A100-40GB:2x8,V100-16GB:2x8",
)


def runs() -> list[tuple[str, int, int]]:
    """(cluster, philly seed, jobs) of every run, in the order printed."""
    return [(STANDARD, s, 60) for s in range(1, 13)] + [(c, s, 70) for c in OTHERS for s in (21, 22, 23)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-job-share", type=float, default=None, help="the site's max_job_share (default 0.5)")
    ap.add_argument("--policy", default="has")
    ap.add_argument("--trace", type=Path, default=None)
    args = ap.parse_args()
    hours = []
    for cluster, seed, jobs in runs():
        wl = sample_philly(trace_path(args.trace), seed, jobs)
        r = Runner(wl, parse_compact(cluster), args.policy, seed, max_job_share=args.max_job_share).run()
        hours.append(summarize(r)["avg_jct_s"] / 3600)
        print(f"# {cluster:40s} philly:{seed}:{jobs}  {hours[-1]:.2f} h", file=sys.stderr, flush=True)
    print(" ".join(f"{h:.2f}" for h in hours))
    geo = math.exp(sum(math.log(h) for h in hours) / len(hours))
    print(f"{len(hours)} runs: geometric mean {geo:.3f} h, arithmetic mean {sum(hours) / len(hours):.3f} h")
    return 0


if __name__ == "__main__":
    sys.exit(main())
