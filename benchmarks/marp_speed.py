"""MARP speed: one plan estimate, and the full candidate search for one job over 8 GPU types.

    python benchmarks/marp_speed.py [--json OUT]

Goals (issue #2): one estimate under 1 ms; a full search under 100 ms. The `varlen/` cases are a job with variable
lengths (model.yaml `data: {lengths: variable, mean: 3234, sd: 2548}`, seq_len 8192, Hugging Face Trainer): the
replay of its steps through the caching allocator (marp/allocator_steps.py), first with empty memos
(`varlen/estimate-first`: what the first estimate of a shape costs), then memoised per shape as a search reuses it.
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
from frenzy_slurm.marp.allocator_steps import step_at, variable_length_excess  # noqa: E402

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
    spec = JobSpec.model_validate(
        {
            "name": "speed-varlen",
            "model": {"preset": "llama-2-7b"},
            "training": {"seq_len": 8192, "global_batch": 64, "steps": 1000, "precision": "bf16-mixed"},
            "entry": {"trainer": "script", "script": "train.py", "framework": "hf-trainer"},
            "data": {"lengths": "variable", "mean": 3234, "sd": 2548},
        }
    )
    w = workload_from_spec(spec, resolve_model(spec, "."))
    one = ParallelPlan(dp=8, micro_batch=1, grad_accum=8, zero=3)

    def first() -> None:
        variable_length_excess.cache_clear()
        step_at.cache_clear()
        estimate_memory(w, one, "reserved")

    results["varlen/estimate-first"] = timed(first, 5)
    results["varlen/estimate-memoised"] = timed(partial(estimate_memory, w, one, "reserved"), 200)
    opts = [GpuOption(n, catalog()[n], 256) for n in TYPES]

    def search_first() -> None:  # (every shape's replay included: no memo from an earlier search)
        variable_length_excess.cache_clear()
        step_at.cache_clear()
        search(w, opts, global_batch=64, steps=1000)

    results["varlen/search-8-types-first"] = timed(search_first, 3)
    results["varlen/search-8-types"] = timed(partial(search, w, opts, global_batch=64, steps=1000), 3)
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
