"""MARP's step time against published LLM training throughput, predicted through the product's own path (issue 29/30).

    python benchmarks/marp_step_time.py [--data CSV] [--json OUT] [--rows]             # about 10 s on one core

Each row of benchmarks/data/step_time_published.csv is one published figure (tokens/s per GPU, with the model, sequence
length, micro-batch, accumulation, GPU count, precision, sharding, tensor and pipeline degrees, recomputation and GPU
type, and where it was read): llm-foundry's MPT tables (A100-40GB, A100-80GB, H100), DLPerf's Megatron-LM runs on
V100-SXM2-16GB, torchtitan's Llama tables (A100-80GB) and the Megatron-LM paper's single V100-32GB. None of them is the
simulator's truth (frenzy_slurm/sim/data/throughput_sources.yaml).

For each row the benchmark writes the model.yaml its user would write (`model.arch`, `training`, `parallel`,
`entry.framework`), builds the Workload fsbatch builds (`workload_from_spec`, a CUDA pool), the one plan it pins at the
row's GPU count (`pinned_plan`) and prices it with MARP's step-time function (`marp.speed.step_time`) on the row's GPU
type from the catalog, with the row's network (per-GPU share of the inter-node bandwidth; NVLink from the catalog).

It reports predicted / measured step time per row (`--rows`), per GPU type and overall: the geometric mean and the
spread (geometric standard deviation, min, max). The single-node rows (at most 8 GPUs: no inter-node communication in
MARP's model) alternate, within each GPU type in file order, between a tuning half and a held-out half; `--fit` reads
each type's matmul efficiency from the tuning half (the value that makes its geometric-mean ratio 1) and scores the
held-out half with it. The multi-node rows are reported apart: their error is mostly MARP's network model.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.gpus import catalog  # noqa: E402
from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.marp import GpuOption, pinned_plan, workload_from_spec  # noqa: E402
from frenzy_slurm.marp.speed import step_time  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "step_time_published.csv"
# Catalog types that are one chip at the same clocks and power (GA100 SXM4, GV100 SXM2): their GEMMs run alike, so
# their rows read one matmul efficiency; they differ in memory bandwidth, which the memory-bound term prices.
CHIP = {"A100-40GB": "A100", "A100-80GB": "A100", "V100-16GB": "V100", "V100-32GB": "V100", "H100-SXM": "H100-SXM"}


def model_yaml(row: dict) -> dict:
    """The model.yaml a user would write for this published run."""
    arch = {
        "layers": int(row["layers"]),
        "hidden": int(row["hidden"]),
        "heads": int(row["heads"]),
        "kv_heads": int(row["kv_heads"]),
        "ffn": int(row["ffn"]),
        "activation": row["activation"],
        "vocab": int(row["vocab"]),
        "tied_embeddings": row["tied_embeddings"] == "true",
        "max_positions": int(row["seq_len"]),
        "norm": row["norm"],
        "position": row["position"],
        "bias": row["bias"],
    }
    return {
        "name": "published",
        "model": {"arch": arch},
        "training": {
            "seq_len": int(row["seq_len"]),
            "global_batch": int(row["global_batch"]),
            "micro_batch": int(row["micro_batch"]),
            "steps": 1,
            "precision": row["precision"],
            "activation_checkpointing": row["checkpointing"],
            "attention": row["attention"],
        },
        "entry": {"trainer": "script", "script": "train.py", "framework": row["framework"]},
        "parallel": {"sharding": row["sharding"], "tp": int(row["tp"]), "pp": int(row["pp"])},
    }


def predict(row: dict, efficiency: dict[str, float] | None = None) -> float:
    """MARP's seconds per step for the row (the catalog's GPU spec, or it with another efficiency)."""
    spec = JobSpec.model_validate(model_yaml(row))
    assert spec.model.arch is not None
    w = workload_from_spec(spec, ResolvedModel(arch=spec.model.arch, name=row["model"]), device="cuda")
    gpus = int(row["gpus"])
    plan = pinned_plan(spec, w, gpus)
    gpu = catalog()[row["gpu"]]
    if efficiency and row["gpu"] in efficiency:
        gpu = gpu.model_copy(update={"efficiency": efficiency[row["gpu"]]})
    links = GpuOption(row["gpu"], gpu, gpus, inter_node_gbs=float(row["inter_node_gbs"])).links
    return step_time(w, plan, gpu, spec.training.global_batch, links)


def measured_s(row: dict) -> float:
    tokens = int(row["global_batch"]) * int(row["seq_len"])
    return tokens / (float(row["tokens_per_s_per_gpu"]) * int(row["gpus"]))


def spread(ratios: list[float]) -> dict:
    logs = [math.log(r) for r in ratios]
    return {
        "n": len(ratios),
        "geomean": math.exp(statistics.fmean(logs)),
        "gsd": math.exp(statistics.pstdev(logs)) if len(logs) > 1 else 1.0,
        "min": min(ratios),
        "max": max(ratios),
    }


def single_node(row: dict) -> bool:
    """Whether MARP prices the row's run with no inter-node communication (at most one node of 8 GPUs)."""
    return int(row["gpus"]) <= 8


def split(rows: list[dict]) -> tuple[list[int], list[int], list[int]]:
    """(tuning, held-out single-node, multi-node) row indices: the single-node rows of each GPU type alternate between
    tuning and held out, in file order; multi-node rows are never tuned on (their communication is MARP's network
    model, not the GPU type's speed)."""
    seen: dict[str, int] = {}
    tune, held, multi = [], [], []
    for i, r in enumerate(rows):
        if not single_node(r):
            multi.append(i)
            continue
        k = seen.get(r["gpu"], 0)
        seen[r["gpu"]] = k + 1
        (tune if k % 2 == 0 else held).append(i)
    return tune, held, multi


def evaluate(rows: list[dict], efficiency: dict[str, float] | None = None) -> list[dict]:
    out = []
    for r in rows:
        pred, meas = predict(r, efficiency), measured_s(r)
        out.append({"gpu": r["gpu"], "source": r["source"], "location": r["location"], "model": r["model"],
                    "predicted_s": pred, "measured_s": meas, "ratio": pred / meas})  # fmt: skip
    return out


def by_type(results: list[dict], idx: list[int] | None = None) -> dict[str, dict]:
    chosen = [results[i] for i in idx] if idx is not None else results
    types = sorted({r["gpu"] for r in chosen})
    return {t: spread([r["ratio"] for r in chosen if r["gpu"] == t]) for t in types}


def efficiency_fit(rows: list[dict], tune: list[int]) -> dict[str, float]:
    """Per chip (CHIP), the matmul efficiency at which its tuning rows' geometric-mean predicted / measured ratio is 1
    (bisection on the log ratio; the ratio falls as the efficiency rises), given to each catalog type of the chip."""
    fit = {}
    for chip in sorted({CHIP.get(rows[i]["gpu"], rows[i]["gpu"]) for i in tune}):
        types = [t for t in catalog() if CHIP.get(t, t) == chip]
        mine = [rows[i] for i in tune if rows[i]["gpu"] in types]
        lo, hi = 0.05, 1.0
        for _ in range(40):
            mid = math.sqrt(lo * hi)
            g = spread([r["ratio"] for r in evaluate(mine, dict.fromkeys(types, mid))])["geomean"]
            lo, hi = (mid, hi) if g > 1.0 else (lo, mid)
        fit |= dict.fromkeys(types, round(math.sqrt(lo * hi), 3))
    return fit


def table(title: str, stats: dict[str, dict]) -> None:
    print(f"\n{title}\n{'type':12} {'n':>4} {'geomean':>8} {'gsd':>6} {'min':>6} {'max':>6}")
    for t, s in stats.items():
        print(f"{t:12} {s['n']:4d} {s['geomean']:8.3f} {s['gsd']:6.3f} {s['min']:6.3f} {s['max']:6.3f}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rows", action="store_true", help="print every row's ratio")
    ap.add_argument("--fit", action="store_true", help="read each type's efficiency from the tuning rows")
    args = ap.parse_args()
    rows = list(csv.DictReader(args.data.open()))
    results = evaluate(rows)
    tune, held, multi = split(rows)
    if args.rows:
        for r in results:
            print(f"{r['gpu']:10} {r['ratio']:6.3f}  {r['source']:17} {r['model']:16} {r['location']}")
    report = {"rows": results, "all": by_type(results) | {"all": spread([r["ratio"] for r in results])}}
    for name, idx in (("tuning", tune), ("held_out", held), ("multi_node", multi)):
        report[name] = by_type(results, idx) | {"all": spread([results[i]["ratio"] for i in idx])}
    table("predicted / measured step time, all rows (catalog efficiency)", report["all"])
    table("single-node tuning rows", report["tuning"])
    table("single-node held-out rows", report["held_out"])
    table("multi-node rows (MARP's network model)", report["multi_node"])
    if args.fit:
        fit = efficiency_fit(rows, tune)
        refit = evaluate([rows[i] for i in held], fit)
        report["efficiency_fit"] = fit
        report["held_out_refit"] = by_type(refit) | {"all": spread([r["ratio"] for r in refit])}
        table("single-node held-out rows, efficiency read from the tuning rows", report["held_out_refit"])
        print("\nefficiency read from the tuning rows: " + ", ".join(f"{t} {e:.3f}" for t, e in fit.items()))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
