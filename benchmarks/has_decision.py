"""HAS decision time: the local cluster's shape and a synthetic 2,048-GPU view with 8 GPU types.

    python benchmarks/has_decision.py [--repeat 20] [--queue 300] [--busy-procs 2] [--json OUT]

Times the decision step `planning.decide_job` (pools, MARP candidates per pool, heterogeneous pipelines,
ranking) from a ClusterView to a Decision, without Slurm calls, each from cold as one fsbatch makes it. Wall
time and CPU time (`time.process_time`, this process only) are both given; CPU time is what a loaded login node
does not inflate by making the decision wait for a core. Then:

- deep queue: the 2,048-GPU view, 70% busy, with `--queue` jobs pending ahead (issue 20's deep-queue case
  kept a median of about 265 waiting); CPU time alone and with `--busy-procs` processes spinning beside it
  (started here, on the same cores: the login node's load);
- the watcher's pass (`frenzy-slurm watch`, the simulator's `has-replan`): `has.moves.pending_move` for each
  of up to `MAX_PER_PASS` pending jobs of the user, each decided on the view without itself, at 256 and
  2,048 GPUs with the deep queue's density of pending jobs (`--queue` per 2,048 GPUs, a third of them the
  user's), the CPU time of the whole pass: the first pass of the watcher's process (cold) and a later one
  (MARP's searches kept by the process, the release index built anew for the changed cluster).

Goals (issue #4, #30): a few ms on the local cluster, < 50 ms CPU at 2,048 GPUs with a deep queue under load,
a watcher pass < 200 ms at 256 GPUs.
Reference: Sia (SOSP'23) solves an integer program per round: median 96 ms, p95 426 ms on 64 GPUs.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.has import Requirements  # noqa: E402
from frenzy_slurm.has.decide import forget_kept  # noqa: E402
from frenzy_slurm.has.moves import MAX_PER_PASS, pending_move, without_job  # noqa: E402
from frenzy_slurm.jobspec import load_job_spec, resolve_model  # noqa: E402
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec  # noqa: E402
from frenzy_slurm.marp.candidates import SearchSpace  # noqa: E402
from frenzy_slurm.marp.plan import Workload  # noqa: E402
from frenzy_slurm.planning import decide_job  # noqa: E402
from frenzy_slurm.sim.synthetic import LARGE, synthetic, synthetic_site, with_queue  # noqa: E402
from frenzy_slurm.site.config import SiteConfig  # noqa: E402
from frenzy_slurm.slurm.view import ClusterView, Job  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOCAL = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]
# 256 GPUs in the simulator's three types (its std shapes, scaled): the watcher's case
MEDIUM_256 = [("a100", "A100-80GB", 8, 8), ("v100", "V100-32GB", 16, 8), ("t4", "T4", 16, 4)]
EXAMPLES = ("tiny-cpu", "gpt2-medium", "llama3-8b-lora", "llama2-7b")


def _job(example: str) -> tuple[Requirements, Workload, SearchSpace]:
    spec = load_job_spec(ROOT / "examples" / f"{example}.yaml")
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"gpu_types": None})})
    w = workload_from_spec(spec, resolve_model(spec, ROOT / "examples"))
    return Requirements.from_spec(spec), w, search_space_from_spec(spec)


def _p95(xs: list[float]) -> float:
    return sorted(xs)[int(0.95 * (len(xs) - 1))]


def _timed(fn: Callable[[], object], repeat: int, searches: bool = True) -> tuple[list[float], list[float], object]:
    """Wall and CPU seconds of `repeat` calls, each from cold: no kept release index, and no kept MARP search
    unless `searches` is False (then one untimed call first keeps them, as a long-running watcher does)."""
    wall, cpu, out = [], [], None
    if not searches:
        forget_kept()
        fn()
    for _ in range(repeat):
        forget_kept(searches)
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    return wall, cpu, out


def _spin() -> None:
    while True:
        pass


class BusyProcesses:
    """`n` processes spinning on the CPU while the block runs (a loaded login node), ended on exit."""

    def __init__(self, n: int):
        self.n = n
        self.procs: list[multiprocessing.Process] = []

    def __enter__(self) -> BusyProcesses:
        self.procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(self.n)]
        for p in self.procs:
            p.start()
        time.sleep(0.2)  # let them reach the CPU
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            p.terminate()
            p.join()


def decisions(repeat: int, results: dict) -> None:
    print(f"{'cluster job busy (ms)':46} {'wall p50':>8} {'p95':>8} {'CPU p50':>8} {'p95':>8}  chosen")
    for cname, pools in (("local-40gpu", LOCAL), ("synthetic-2048", LARGE)):
        site = synthetic_site(pools)
        for example in EXAMPLES:
            req, w, space = _job(example)
            for busy in (0.0, 0.7):
                view = synthetic(pools, busy=busy, seed=1)
                wall, cpu, d = _timed(partial(decide_job, req, w, space, view, site, None, view.taken_at), repeat)
                _row(results, f"{cname}/{example}/busy{busy}", wall, cpu, d.chosen.label())  # type: ignore[attr-defined]


def _row(results: dict, key: str, wall: list[float], cpu: list[float], chosen: str) -> None:
    r = {
        "median_ms": statistics.median(wall) * 1e3,
        "p95_ms": _p95(wall) * 1e3,
        "cpu_median_ms": statistics.median(cpu) * 1e3,
        "cpu_p95_ms": _p95(cpu) * 1e3,
        "chosen": chosen,
    }
    results[key] = r
    name = key.replace("/", " ")
    print(
        f"{name:46} {r['median_ms']:8.1f} {r['p95_ms']:8.1f} {r['cpu_median_ms']:8.1f} {r['cpu_p95_ms']:8.1f}  {chosen}"
    )


def deep_queue(repeat: int, queue: int, busy_procs: int, results: dict) -> None:
    site = synthetic_site(LARGE)
    view = with_queue(synthetic(LARGE, busy=0.7, seed=1), LARGE, queue, seed=1)
    print(f"\ndeep queue: 2,048 GPUs, 70% busy, {queue} pending; ms: wall p50, p95, CPU p50, p95")
    for example in EXAMPLES:
        req, w, space = _job(example)
        for procs in (0, busy_procs):
            with BusyProcesses(procs):
                wall, cpu, d = _timed(partial(decide_job, req, w, space, view, site, None, view.taken_at), repeat)
            _row(results, f"deep-queue/{example}/busy-procs{procs}", wall, cpu, d.chosen.label())  # type: ignore[attr-defined]


def _pass(view: ClusterView, site: SiteConfig, mine: list[Job], cases: list) -> int:
    """One watcher pass: each job decided again on the view without itself; how many would move."""
    moved = 0
    for j, (req, w, space) in zip(mine, cases, strict=False):
        label = f"{j.node_count * j.gpus_per_node}x? ({j.partition})"
        view_without = without_job(view, j.job_id)
        moved += pending_move(req, w, space, view_without, site, None, view.taken_at, label) is not None
    return moved


def watcher_pass(repeat: int, queue: int, results: dict) -> None:
    """The decisions of one watcher pass: each of the user's first MAX_PER_PASS pending jobs decided again on the
    view without itself (has.moves.pending_move), as `frenzy-slurm watch` and the simulator's has-replan do."""
    print(f"\nwatcher pass: {MAX_PER_PASS} pending jobs of the user re-decided; ms per pass")
    for cname, pools in (("256", MEDIUM_256), ("2048", LARGE)):
        site = synthetic_site(pools)
        gpus = sum(n * g for _, _, n, g in pools)
        pending = max(MAX_PER_PASS * 3, round(queue * gpus / 2048))  # the deep queue's density; the user's 1 in 3
        view = with_queue(synthetic(pools, busy=0.7, seed=2), pools, pending, seed=2)
        mine = sorted((j for j in view.jobs if j.state == "PENDING" and j.user == "me"), key=lambda j: j.job_id)
        cases = [_job(EXAMPLES[i % len(EXAMPLES)]) for i in range(MAX_PER_PASS)]

        one_pass = partial(_pass, view, site, mine[:MAX_PER_PASS], cases)
        for warm in (False, True):  # the first pass of a watcher's process, and its next ones (searches kept)
            wall, cpu, _ = _timed(one_pass, repeat, searches=not warm)
            what = f"{min(len(mine), MAX_PER_PASS)} jobs, {pending} pending"
            _row(results, f"watcher-pass/{cname}/{'searches-kept' if warm else 'cold'}", wall, cpu, what)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--queue", type=int, default=300, help="pending jobs in the deep-queue and watcher views")
    ap.add_argument("--busy-procs", type=int, default=2, help="spinning processes beside the deep-queue decisions")
    ap.add_argument("--only", choices=["decisions", "deep-queue", "watcher"], help="one part only")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results: dict = {}
    if args.only in (None, "decisions"):
        decisions(args.repeat, results)
    if args.only in (None, "deep-queue"):
        deep_queue(args.repeat, args.queue, args.busy_procs, results)
    if args.only in (None, "watcher"):
        watcher_pass(max(5, args.repeat // 2), args.queue, results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
