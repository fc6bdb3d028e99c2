"""Variable-length steps through the caching-allocator replayer: how many replayed steps the reserved peak needs
(marp/allocator_steps.STEPS), how the van der Corput order compares with shuffled orders of the same draws, and
what a prediction then costs.

    python benchmarks/varlen_steps.py

Each case is a stated dataset (mean +- sd tokens before truncation) truncated at a longest length, micro-batch 1,
on Qwen-7B's shape (vocabulary 151936) with full recomputation and on Llama-2-7B's without: the reserved peak of
the replayed layers and loss after 8 ... 256 steps, and after 48 steps in 5 shuffled orders (random.Random(seed)).
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.jobspec import JobSpec, resolve_model  # noqa: E402
from frenzy_slurm.marp import ParallelPlan, estimate_memory, workload_from_spec  # noqa: E402
from frenzy_slurm.marp import allocator_steps as steps  # noqa: E402
from frenzy_slurm.marp.allocator_steps import step_lengths  # noqa: E402

# Qwen-7B (v1)'s config.json, as dev2's E rows state it
QWEN_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008, "vocab": 151936}


def workload(preset: str, seq_len: int, mean: float, sd: float, recompute: str):
    spec = JobSpec.model_validate(
        {
            "name": "varlen",
            "model": {"preset": preset} if preset != "qwen-7b" else {"arch": QWEN_7B},
            "training": {
                "seq_len": seq_len,
                "global_batch": 16,
                "steps": 100,
                "micro_batch": 1,
                "precision": "bf16-mixed",
                "activation_checkpointing": recompute,
            },
            "entry": {"trainer": "script", "script": "train.py", "framework": "hf-trainer"},
            "data": {"lengths": "variable", "mean": mean, "sd": sd},
        }
    )
    return spec, workload_from_spec(spec, resolve_model(spec, "."))


def main() -> int:
    plan = ParallelPlan(dp=1, micro_batch=1, grad_accum=16)
    for preset, recompute in (("qwen-7b", "full"), ("llama-2-7b", "none")):
        for longest in (512, 2048, 8192):
            try:
                _, w = workload(preset, longest, 3234.0, 2548.0, recompute)
            except Exception as exc:  # noqa: BLE001  (a preset the catalogue lacks)
                print(f"{preset}: {exc}")
                break
            rc = "full" if recompute == "full" else "none"
            args = (1, False, rc, 1, 1, True)
            fixed = steps.replayed_peak(w, (longest, longest), *args, True, "")
            conv = steps.convergence(w, *args[:5], True, (8, 16, 32, 48, 64, 128, 256))
            row = " ".join(f"{n}:{(p - fixed) / GiB:.2f}" for n, p in conv)
            lengths = list(step_lengths(longest, None, 3234.0, 2548.0, 1, 48))
            shuffled = []
            for seed in range(5):
                random.Random(seed).shuffle(lengths)
                shuffled.append((steps.replayed_peak(w, tuple(lengths), *args, True, "") - fixed) / GiB)
            steps.variable_length_excess.cache_clear()
            t0 = time.perf_counter()
            estimate_memory(w, plan, "reserved")
            first = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            for _ in range(20):
                estimate_memory(replace(w), plan, "reserved")
            again = (time.perf_counter() - t0) / 20 * 1e3
            print(
                f"{preset} {rc} longest {longest}: excess over fixed (GiB) by steps {row}; 48 shuffled: "
                + ", ".join(f"{x:.2f}" for x in shuffled)
                + f"; estimate {first:.1f} ms first, {again:.2f} ms memoised"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
