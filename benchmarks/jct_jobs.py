"""Job by job, where one policy's JCT loses to another's on the same runs (issue 30: where `has` loses to `sia`).

    python benchmarks/jct_jobs.py --case tune [--a has --b sia] [--top 5] [--knobs JSON]
    python benchmarks/jct_jobs.py --shapes std64 --seeds 1 --top 12
    python benchmarks/jct_jobs.py --case tune --a has --b slurm-multi --who plain --top 8
    python benchmarks/jct_jobs.py --case small --a has --b has --calibrate-a 24 --top 8   # calibrated against not

Runs both policies on the runs of benchmarks/jct.py (the same shapes, loads, jobs, truth and plain users as
`--case tune` or `--case judge` give them) and prints, per run, the jobs whose completion time differs most, each
with its GPU type and count, wait, last run and submissions under each policy (a `sia` job submitted more than
once was moved while it ran). Then, over frenzy-slurm's users' jobs of all runs, the summed difference in JCT by
what differed: the same GPU type with fewer GPUs under `a`, with as many or more, another type. `--who plain`
does the same over the users who do not use frenzy-slurm (submitted as `slurm-multi` under every policy), whose
request is the same under both policies: another type, or the same placement reached after a longer or shorter wait.
`--calibrate-a H` / `--calibrate-b H` run that side on a site that calibrates every H hours, as `jct.py
--calibrate-every H` does (an earlier period of the same size calibrates it first), so one policy can be compared
with itself calibrated.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from jct import CASES, JOBS_PER_64_GPUS, PLAIN_SHARE, SHAPES, production_calibration, shape_load  # noqa: E402

from frenzy_slurm.cli.simulate import trace_path  # noqa: E402
from frenzy_slurm.sim.clusters import parse_compact  # noqa: E402
from frenzy_slurm.sim.policies import TUNED_KNOBS  # noqa: E402
from frenzy_slurm.sim.runner import JobRecord, Runner  # noqa: E402
from frenzy_slurm.sim.truth import ErrorModel  # noqa: E402
from frenzy_slurm.sim.workload import WorkloadJob, sample_philly  # noqa: E402


def side(args: argparse.Namespace, which: str) -> str:
    """The name of side `which` ("a" or "b") in the output: the policy, and its calibration where it has one."""
    name, every_h = getattr(args, which), getattr(args, f"calibrate_{which}")
    return name if every_h is None else f"{name} (calibrated every {every_h:g} h)"


def _row(r: JobRecord) -> str:
    if r.jct is None:
        return f"{r.state:>10s}"
    wait = (r.first_start or r.submit) - r.submit
    return (
        f"{r.jct / 3600:6.2f} h wait {wait / 3600:5.2f} run {r.last_run_s / 3600:5.2f} {r.label[:24]:24s} x{r.attempts}"
    )


def _types(r: JobRecord) -> tuple[str, ...]:
    return tuple(sorted({c.gpu_type or "" for c in r.components}))


def _wait(r: JobRecord) -> float:
    return (r.first_start or r.submit) - r.submit


def cause(a: JobRecord, b: JobRecord) -> str:
    """What differed between the two placements of one job (the last attempt's under each policy)."""
    if _types(a) != _types(b):
        return "another GPU type"
    if a.plain and a.gpus == b.gpus:
        # a plain job's request is the same under both policies: only its wait (and the truth's noise) differ
        if _wait(a) > _wait(b) + 60:
            return "same type, waited longer"
        if _wait(a) < _wait(b) - 60:
            return "same type, waited less"
    if a.gpus < b.gpus:
        return "same type, fewer GPUs"
    if a.gpus > b.gpus:
        return "same type, more GPUs"
    return "same type and width"


def one_run(shape: str, load: float, seed: int, args: argparse.Namespace, causes: dict[str, list[float]]) -> None:
    cluster = parse_compact(SHAPES[shape])
    jobs = min(args.max_jobs, JOBS_PER_64_GPUS * cluster.gpus // 64)
    wl = sample_philly(trace_path(None), seed, jobs)
    knobs = {**TUNED_KNOBS, **(json.loads(args.knobs) if args.knobs else {})}
    same = {"load": load, "errors": ErrorModel(truth="published"), "knobs": knobs, "plain_share": PLAIN_SHARE}
    runs = []
    for name, every_h in ((args.a, args.calibrate_a), (args.b, args.calibrate_b)):
        warm = None
        if every_h is not None:  # as jct.py --calibrate-every: an earlier period calibrates the site first
            warm = production_calibration(None, cluster, name, seed, jobs, every_h, **same)
        run = Runner(wl, cluster, name, seed, calibration=warm, **same).run()
        runs.append({r.id: r for r in run.records})
    spec: dict[int, WorkloadJob] = {j.id: j for j in wl.jobs}
    a, b = runs
    print(f"{shape} ({SHAPES[shape]}) load {load} seed {seed}: {side(args, 'a')} against {side(args, 'b')}")
    for who, plain in (("own", False), ("plain", True)):
        both = [i for i in a if a[i].plain == plain and a[i].jct is not None and b[i].jct is not None]
        sa = sum(a[i].jct or 0.0 for i in both) / 3600
        sb = sum(b[i].jct or 0.0 for i in both) / 3600
        print(f"  {who:5s}: {len(both)} jobs done under both, summed JCT {sa:.1f} h against {sb:.1f} h")
        if plain == (args.who == "plain"):
            for i in both:
                d = ((a[i].jct or 0.0) - (b[i].jct or 0.0)) / 3600
                causes.setdefault(cause(a[i], b[i]), []).append(d)
                # submitted again with no failure: moved while it ran (sia's re-planning), or withdrawn waiting
                if b[i].attempts > 1 + b[i].ooms + b[i].timeouts:
                    causes.setdefault(f"(of all: {side(args, 'b')} moved it)", []).append(d)
    ids = [i for i in a if args.who == "all" or a[i].plain == (args.who == "plain")]
    ids.sort(key=lambda i: -((a[i].jct or 0.0) - (b[i].jct or 0.0)))
    print(f"  {'job':>4s} {'who':5s} {'model':14s} {'trace':>10s} | {side(args, 'a'):56s} | {side(args, 'b')}")
    for i in ids[: args.top]:
        j = spec[i]
        trace = f"{j.trace_gpus}x{j.trace_gpu_time_s / j.trace_gpus / 3600:.1f}h"
        who = "plain" if a[i].plain else "own"
        print(f"  {i:4d} {who:5s} {j.model[:14]:14s} {trace:>10s} | {_row(a[i])} | {_row(b[i])}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", choices=sorted(CASES), help="the shapes, loads and seeds of a jct.py case")
    ap.add_argument("--shapes", default=None, help=", ".join(SHAPES))
    ap.add_argument("--seeds", default=None)
    ap.add_argument("--loads", default="auto", help="offered loads; auto: the shape's, as jct.py --loads auto")
    ap.add_argument("--a", default="has")
    ap.add_argument("--b", default="sia")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--knobs", default=None, help="JSON object overriding TUNED_KNOBS (both policies)")
    ap.add_argument("--max-jobs", type=int, default=60)
    for which in ("a", "b"):
        ap.add_argument(
            f"--calibrate-{which}",
            type=float,
            default=None,
            metavar="H",
            help=f"run --{which} on a site that calibrates every H hours (as jct.py --calibrate-every); default: never",
        )
    ap.add_argument(
        "--who",
        choices=("own", "plain", "all"),
        default="own",
        help="whose jobs to list and sum by cause (own: frenzy-slurm's users; plain: the others; all lists both)",
    )
    args = ap.parse_args()
    case = CASES[args.case] if args.case else {}
    shapes = (args.shapes or str(case.get("shapes", "std64"))).split(",")
    seeds = [int(s) for s in (args.seeds or str(case.get("seeds", "1"))).split(",")]
    causes: dict[str, list[float]] = {}
    for shape in shapes:
        for load in shape_load(shape, args.loads):
            for seed in seeds:
                one_run(shape, load, seed, args, causes)
    whose = "the plain users'" if args.who == "plain" else "frenzy-slurm's users'"
    a, b = side(args, "a"), side(args, "b")
    print(f"\n{whose} jobs, {a} against {b}, by what differed (summed JCT difference, + is lost):")
    for c, diffs in sorted(causes.items(), key=lambda kv: -sum(kv[1])):
        lost = sum(d for d in diffs if d > 0)
        won = sum(d for d in diffs if d < 0)
        print(f"  {c:24s}: {len(diffs):4d} jobs, {sum(diffs):+8.1f} h ({lost:+.1f} h lost, {won:+.1f} h won)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
