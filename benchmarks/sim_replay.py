"""The simulator against real Slurm: replay HAS's placements for a workload on the cluster SLURM_CONF points at.

    eval "$(contrib/devcluster/devcluster up)"
    python benchmarks/sim_replay.py [--workload tests/data/sim/philly-seed2-30.yaml] [--makespan 90] [--json OUT]

Simulates the workload with `has` on a copy of the live cluster (`SimCluster.from_view` + the site file),
scales arrivals and run times so the run takes about --makespan seconds, replays the jobs through the
CLI backend's submit (payloads sleep for the true run time) and prints each job's simulated and real
start, and the median and worst start-time difference (goal: median under 5% of the replay's makespan).
The queue should be empty: other jobs would hold GPUs the simulator does not know about.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.sim import ErrorModel, SimCluster, load_workload, simulate  # noqa: E402
from frenzy_slurm.sim.replay import compare, live_replay, replay_jobs, simulate_replay  # noqa: E402
from frenzy_slurm.site.config import load_site  # noqa: E402
from frenzy_slurm.slurm import open_backend  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", type=Path, default=ROOT / "tests" / "data" / "sim" / "philly-seed2-30.yaml")
    ap.add_argument("--site", type=Path, default=ROOT / "site_configs" / "devcluster.yaml")
    ap.add_argument("--policy", default="has")
    ap.add_argument("--seed", type=int, default=2)
    ap.add_argument("--makespan", type=float, default=90.0)
    ap.add_argument(
        "--bf-interval",
        type=float,
        default=1.0,
        help="the cluster's bf_interval (the devcluster's SchedulerParameters=bf_interval=1)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    backend = open_backend("cli")
    cluster = SimCluster.from_view(backend.load(), load_site(args.site))
    result = simulate(load_workload(args.workload), cluster, args.policy, seed=args.seed, errors=ErrorModel.exact())
    jobs = replay_jobs(result, makespan_s=args.makespan)
    sim = simulate_replay(jobs, cluster, args.bf_interval)
    with tempfile.TemporaryDirectory(prefix="frenzy-replay-") as tmp:
        live = live_replay(jobs, backend, Path(tmp))
    report = compare(sim, live)
    by_id = {j.id: j for j in jobs}
    print(f"{'job':>4} {'request':34} {'run s':>6} {'arrive':>7} {'sim start':>9} {'real start':>10} {'diff':>6}")
    for row in report["per_job"]:
        j = by_id[row["id"]]
        req = " + ".join(f"{c.nodes}x{c.gpus_per_node} {c.partition} {c.time_min}min" for c in j.components)
        print(
            f"{j.id:4d} {req:34} {j.run_s:6.1f} {j.submit_s:7.1f} {row['sim_start']:9.1f} {row['live_start']:10.1f} "
            f"{row['live_start'] - row['sim_start']:+6.1f}"
        )
    print(
        f"{report['jobs']} jobs, real makespan {report['makespan_s']:.0f} s: start difference median "
        f"{report['start_diff_median_s']:.1f} s "
        f"({report['start_diff_median_pct_of_makespan']:.1f}% of the makespan), "
        f"worst {report['start_diff_max_s']:.1f} s, mean {report['start_diff_mean_s']:+.1f} s; "
        f"end difference median {report['end_diff_median_s']:.1f} s"
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
