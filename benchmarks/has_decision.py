"""HAS decision time: the local cluster's shape and a synthetic 2,048-GPU view with 8 GPU types.

    python benchmarks/has_decision.py [--repeat 20] [--json OUT]

Times the decision step `planning.decide_job` (pools, MARP candidates per pool, heterogeneous pipelines,
ranking) from a ClusterView to a Decision, without Slurm calls. Goals (issue #4): a few ms on the local cluster,
< 50 ms at 2,048 GPUs.
Reference: Sia (SOSP'23) solves an integer program per round: median 96 ms, p95 426 ms on 64 GPUs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.has import Requirements  # noqa: E402
from frenzy_slurm.has.decide import forget_kept  # noqa: E402
from frenzy_slurm.jobspec import load_job_spec, resolve_model  # noqa: E402
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec  # noqa: E402
from frenzy_slurm.planning import decide_job  # noqa: E402
from frenzy_slurm.sim.synthetic import LARGE, synthetic, synthetic_site  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
LOCAL = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    print(f"{'cluster':14} {'job':22} {'busy':>5} {'median ms':>10} {'p95 ms':>8}  chosen")
    for cname, pools in (("local-40gpu", LOCAL), ("synthetic-2048", LARGE)):
        site = synthetic_site(pools)
        for example in ("tiny-cpu", "gpt2-medium", "llama3-8b-lora", "llama2-7b"):
            spec = load_job_spec(ROOT / "examples" / f"{example}.yaml")
            spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"gpu_types": None})})
            model = resolve_model(spec, ROOT / "examples")
            w = workload_from_spec(spec, model)
            space = search_space_from_spec(spec)
            req = Requirements.from_spec(spec)
            for busy in (0.0, 0.7):
                view = synthetic(pools, busy=busy, seed=1)
                times, d = [], None
                for _ in range(args.repeat):
                    forget_kept()  # each decision from cold, as one fsbatch makes it (no kept search or index)
                    t0 = time.perf_counter()
                    d = decide_job(req, w, space, view, site, None, view.taken_at)
                    times.append(time.perf_counter() - t0)
                med = statistics.median(times) * 1e3
                p95 = sorted(times)[int(0.95 * (len(times) - 1))] * 1e3
                results[f"{cname}/{example}/busy{busy}"] = {"median_ms": med, "p95_ms": p95, "chosen": d.chosen.label()}
                print(f"{cname:14} {example:22} {busy:5.1f} {med:10.2f} {p95:8.2f}  {d.chosen.label()}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
