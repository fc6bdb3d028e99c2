"""Average job completion time of HAS against the baselines, in the trace-driven simulator.

    python benchmarks/jct.py [--seeds 1,2,3] [--sizes 64,512,2048] [--jobs 60] [--json OUT] [--plot DIR]

For each cluster size (64: A100-80GB:2x8,V100-32GB:4x8,T4:4x4; 512: the same mix x8; 2048: the
eight-type cluster of benchmarks/has_decision.py) and each seed, samples `philly:SEED:JOBS` (more jobs on
larger clusters, at the same offered load), runs every policy on it with the same ground truth, and
prints mean ± standard deviation over seeds. Then checks the issue's goals:
- `has` average JCT >= 25% below the best `user-fixed` variant, and no worse than `ilp`;
- HAS's median decision >= 30x faster than the ILP's median round, in the same run.
Needs the `sim` extra (scipy for ilp, matplotlib for --plot).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.cli.simulate import trace_path  # noqa: E402
from frenzy_slurm.sim.clusters import LARGE, MEDIUM, SMALL, parse_compact  # noqa: E402
from frenzy_slurm.sim.metrics import aggregate, markdown, plot, summarize  # noqa: E402
from frenzy_slurm.sim.policies import POLICY_NAMES  # noqa: E402
from frenzy_slurm.sim.runner import Runner  # noqa: E402
from frenzy_slurm.sim.truth import ErrorModel  # noqa: E402
from frenzy_slurm.sim.workload import sample_philly  # noqa: E402

CLUSTERS = {64: SMALL, 512: MEDIUM, 2048: LARGE}
JOBS_PER_64_GPUS = 60


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--sizes", default="64,512")
    ap.add_argument("--jobs", type=int, default=JOBS_PER_64_GPUS, help="jobs per 64 GPUs (capped at 400)")
    ap.add_argument("--load", type=float, default=0.8)
    ap.add_argument("--policies", default=",".join(POLICY_NAMES))
    ap.add_argument("--estimates", default="test-only", choices=["test-only", "backfill"])
    ap.add_argument("--max-gpus", type=int, default=None, help="limits.max_gpus of every job")
    ap.add_argument(
        "--max-job-share",
        type=float,
        default=None,
        help="the site's max_job_share (the most of one pool HAS gives one job; default 0.5)",
    )
    ap.add_argument("--exact", action="store_true", help="no prediction error (the truth is MARP's prediction)")
    ap.add_argument("--trace", type=Path, default=None)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    policies = args.policies.split(",")
    rows, results = [], []
    for size in (int(s) for s in args.sizes.split(",")):
        cluster = parse_compact(CLUSTERS[size])
        jobs = min(400, args.jobs * size // 64)
        for seed in seeds:
            wl = sample_philly(trace_path(args.trace), seed, jobs)
            for name in policies:
                t0 = time.perf_counter()
                r = Runner(
                    wl,
                    cluster,
                    name,
                    seed,
                    load=args.load,
                    estimates=args.estimates,
                    max_gpus=args.max_gpus,
                    max_job_share=args.max_job_share,
                    errors=ErrorModel.exact() if args.exact else None,
                ).run()
                s = summarize(r)
                rows.append(s)
                results.append(r)
                print(
                    f"# {size:5d} GPUs seed {seed} {name:20s} avg JCT {s['avg_jct_s'] / 3600:7.2f} h  "
                    f"done {s['completed']}/{s['jobs']}  decision p50 {s['decision_ms_median']:.1f} ms  "
                    f"({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    summary = aggregate(rows)
    print(markdown(summary))
    print()
    print(goals(rows))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "summary": summary}, indent=2, default=str) + "\n")
    if args.plot:
        plot([r for r in results if r.seed == seeds[0]], args.plot)
    return 0


def goals(rows: list[dict]) -> str:
    """The issue's goals, per cluster size, from the per-seed runs."""
    out = []
    for size in sorted({r["gpus"] for r in rows}):
        by = {}
        for r in rows:
            if r["gpus"] == size:
                by.setdefault(r["policy"], []).append(r)
        if "has" not in by:
            continue
        has = statistics.fmean(r["avg_jct_s"] for r in by["has"])
        users = {p: statistics.fmean(r["avg_jct_s"] for r in v) for p, v in by.items() if p.startswith("user-fixed")}
        if users:
            best, jct = min(users.items(), key=lambda kv: kv[1])
            gain = 1 - has / jct
            out.append(
                f"{size} GPUs: has avg JCT {has / 3600:.2f} h vs best user-fixed ({best}) {jct / 3600:.2f} h: "
                f"{gain:+.1%} ({'met' if gain >= 0.25 else 'NOT met'}: goal >= 25% below)"
            )
        if "ilp" in by:
            ilp = statistics.fmean(r["avg_jct_s"] for r in by["ilp"])
            out.append(
                f"{size} GPUs: has vs ilp avg JCT {has / 3600:.2f} h vs {ilp / 3600:.2f} h "
                f"({'met' if has <= ilp else 'NOT met'}: goal has <= ilp)"
            )
            h = statistics.median(r["decision_ms_median"] for r in by["has"])
            i = statistics.median(r["decision_ms_median"] for r in by["ilp"])
            out.append(
                f"{size} GPUs: decision median has {h:.1f} ms vs ilp round {i:.1f} ms: {i / h:.1f}x "
                f"({'met' if i / h >= 30 else 'NOT met'}: goal >= 30x)"
            )
            solve = statistics.median(r.get("ilp_solve_ms_median", float("nan")) for r in by["ilp"])
            out.append(
                f"{size} GPUs: ilp's HiGHS solve alone (no MARP search for new jobs) median {solve:.1f} ms; "
                f"has's decision takes {h / solve:.1f}x that"
            )
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
