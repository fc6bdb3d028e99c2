"""MARP speed: one plan estimate, and the full candidate search for one job over 8 GPU types.

    python benchmarks/marp_speed.py [--json OUT]

Goals (issue #2): one estimate under 1 ms; a full search under 100 ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.gpus import catalog  # noqa: E402
from frenzy_slurm.jobspec import JobSpec, resolve_model  # noqa: E402
from frenzy_slurm.marp import GpuOption, ParallelPlan, estimate_memory, search, workload_from_spec  # noqa: E402

TYPES = ["V100-32GB", "T4", "A10G", "A40", "A100-40GB", "A100-80GB", "L40S", "H100-SXM"]


def timed(fn, repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    plan = ParallelPlan(dp=8, tp=2, pp=2, zero=1, micro_batch=2, grad_accum=8)
    print(f"{'case':40} {'median ms':>10} {'p95 ms':>8}")
    for model in ("llama-2-7b", "llama-3.1-70b"):
        spec = JobSpec.model_validate(
            {
                "name": "speed",
                "model": {"preset": model},
                "training": {"seq_len": 4096, "global_batch": 512, "steps": 1000},
                "entry": {"trainer": "script", "script": "train.py", "framework": "megatron"},
            }
        )
        w = workload_from_spec(spec, resolve_model(spec, "."))  # what fsbatch predicts for that model.yaml
        t = timed(partial(estimate_memory, w, plan), 2000)
        results[f"estimate/{model}"] = t
        opts = [GpuOption(n, catalog()[n], 256) for n in TYPES]
        s = timed(partial(search, w, opts, global_batch=512, steps=1000), 20)
        results[f"search-8-types/{model}"] = s
    summary = {}
    for name, t in results.items():
        med, p95 = statistics.median(t) * 1e3, sorted(t)[int(0.95 * (len(t) - 1))] * 1e3
        summary[name] = {"median_ms": med, "p95_ms": p95, "runs": len(t)}
        print(f"{name:40} {med:10.3f} {p95:8.3f}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
