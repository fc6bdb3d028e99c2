"""MARP accuracy against published measurements.

    python benchmarks/marp_accuracy.py --data ../shared/data/memory_measurements_dev.csv [--json OUT]

Prints, per row, predicted vs measured GiB and accuracy = 1 - |pred - meas| / meas for
MARP and two reference estimators, then a summary per category and confidence.
Rows that cannot be interpreted are listed with the reason.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.eval.dataset import RowError, interpret_row, read_measurements  # noqa: E402
from frenzy_slurm.eval.reference import deepspeed_states, megatron_formula  # noqa: E402
from frenzy_slurm.marp.memory import estimate_memory  # noqa: E402

# a goal for every category (pretraining too): full training and fine-tuning 95%, adapters 90%
GOALS = {
    "full training": 0.95,
    "pretraining": 0.95,
    "full finetune": 0.95,
    "full fine-tune": 0.95,
    "lora": 0.90,
    "qlora": 0.90,
}


def accuracy(pred: float, meas: float) -> float:
    return 1.0 - abs(pred - meas) / meas


def summarize(rows: list[dict], key: str, field: str = "accuracy", pred: str = "predicted_gib") -> dict:
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r[field] is not None:
            groups[r[key]].append(r)
            groups["all"].append(r)
    out = {}
    for name, items in sorted(groups.items()):
        accs = [r[field] for r in items]
        under = [(r[pred] - r["measured_gib"]) / r["measured_gib"] for r in items if r[pred] < r["measured_gib"]]
        out[name] = {
            "rows": len(items),
            "mean_accuracy": sum(accs) / len(accs),
            "within_5pct": sum(a >= 0.95 for a in accs) / len(accs),
            "worst_under_prediction": min(under) if under else 0.0,
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--data", type=Path, required=True, help="measurements CSV")
    ap.add_argument("--json", type=Path, help="write per-row results and the summary as JSON")
    ap.add_argument("--exclude", default="", help="comma-separated row ids to leave out of the summary (still listed)")
    args = ap.parse_args()
    try:
        rows = read_measurements(args.data)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # a category the summary does not know is an error, not a row left out of every goal
    unknown = sorted({r.category for r in rows if r.category.lower() not in GOALS})
    if unknown:
        print(
            f"error: {args.data}: category {', '.join(map(repr, unknown))} has no accuracy goal; known: "
            f"{', '.join(sorted(GOALS))} (fix the row's category, or give the new category a goal in GOALS)",
            file=sys.stderr,
        )
        return 2
    excluded = {x.strip() for x in args.exclude.split(",") if x.strip()}
    results = []
    for row in rows:
        rec = {
            "row_id": row.row_id,
            "category": row.category,
            "confidence": row.confidence,
            "measured_gib": row.measured_gib,
            "predicted_gib": None,
            "accuracy": None,
            "skipped_reason": None,
            "deepspeed_states_gib": None,
            "deepspeed_states_accuracy": None,
            "megatron_formula_gib": None,
            "megatron_formula_accuracy": None,
            "phase": None,
            "excluded": row.row_id in excluded,
        }
        try:
            if not math.isfinite(row.measured_gib) or row.measured_gib <= 0:
                raise RowError("measured value is missing or not positive")
            it = interpret_row(row)
            est = estimate_memory(it.workload, it.plan, it.metric, it.overheads)
            rec["predicted_gib"] = est.peak_gib
            rec["accuracy"] = accuracy(est.peak_gib, row.measured_gib)
            rec["phase"] = max(est.stages, key=lambda s: s.peak).phase
            for name, fn in (("deepspeed_states", deepspeed_states), ("megatron_formula", megatron_formula)):
                val = fn(it.workload, it.plan) / GiB
                rec[f"{name}_gib"] = val
                rec[f"{name}_accuracy"] = accuracy(val, row.measured_gib)
        except RowError as exc:
            rec["skipped_reason"] = str(exc)
        results.append(rec)

    print(
        f"{'row':5} {'category':13} {'conf':6} {'meas':>7} {'MARP':>7} {'acc':>6} "
        f"{'DS':>7} {'acc':>6} {'Mega':>7} {'acc':>6}  phase"
    )
    for r in results:
        if r["skipped_reason"]:
            print(
                f"{r['row_id']:5} {r['category'][:13]:13} {r['confidence'][:6]:6} {r['measured_gib']:7.2f}  "
                f"skipped: {r['skipped_reason']}"
            )
            continue
        flag = "  (excluded)" if r["excluded"] else ""
        print(
            f"{r['row_id']:5} {r['category'][:13]:13} {r['confidence'][:6]:6} {r['measured_gib']:7.2f} "
            f"{r['predicted_gib']:7.2f} {r['accuracy']:6.1%} "
            f"{r['deepspeed_states_gib']:7.2f} {r['deepspeed_states_accuracy']:6.1%} "
            f"{r['megatron_formula_gib']:7.2f} {r['megatron_formula_accuracy']:6.1%}  {r['phase']}{flag}"
        )

    scored = [r for r in results if not r["excluded"]]
    summary = {}
    for key in ("category", "confidence"):
        summary[f"by_{key}"] = {
            "marp": summarize(scored, key),
            "deepspeed_states": summarize(scored, key, "deepspeed_states_accuracy", "deepspeed_states_gib"),
            "megatron_formula": summarize(scored, key, "megatron_formula_accuracy", "megatron_formula_gib"),
        }
    goals = GOALS
    by_cat = summary["by_category"]["marp"]
    summary["category_targets"] = {
        name: {
            "goal": goals[name.lower()],
            "mean_accuracy": v["mean_accuracy"],
            "met": v["mean_accuracy"] >= goals[name.lower()],
        }
        for name, v in by_cat.items()
        if name != "all"
    }
    full = [
        r
        for r in scored
        if r["category"].lower() in ("full training", "pretraining", "full finetune", "full fine-tune")
    ]
    adapters = [r for r in scored if "lora" in r["category"].lower()]
    high = [r for r in scored if r["confidence"] == "high" and r["accuracy"] is not None]
    summary["targets"] = {
        "full_mean_accuracy": summarize(full, "category").get("all", {}).get("mean_accuracy"),
        "lora_qlora_mean_accuracy": summarize(adapters, "category").get("all", {}).get("mean_accuracy"),
        "high_confidence_worst_under_prediction": min(
            [(r["predicted_gib"] - r["measured_gib"]) / r["measured_gib"] for r in high] + [0.0]
        ),
        # an over-prediction wastes GPUs and queue time: no high-confidence row over by more than 15%
        "high_confidence_worst_over_prediction": max(
            [(r["predicted_gib"] - r["measured_gib"]) / r["measured_gib"] for r in high] + [0.0]
        ),
    }
    summary["skipped"] = {r["row_id"]: r["skipped_reason"] for r in results if r["skipped_reason"]}
    summary["excluded"] = sorted(excluded)

    print()
    for key in ("category", "confidence"):
        print(f"by {key}: {'':14} {'rows':>4} {'MARP':>7} {'<=5%':>6} {'worst under':>11} {'DS':>7} {'Mega':>7}")
        m, d, g = (summary[f"by_{key}"][k] for k in ("marp", "deepspeed_states", "megatron_formula"))
        for name in m:
            print(
                f"  {name[:24]:24} {m[name]['rows']:4} {m[name]['mean_accuracy']:7.1%} {m[name]['within_5pct']:6.0%} "
                f"{m[name]['worst_under_prediction']:11.1%} {d[name]['mean_accuracy']:7.1%} "
                f"{g[name]['mean_accuracy']:7.1%}"
            )
    t = summary["targets"]

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    print(
        f"\ntargets: full-training/fine-tune mean {pct(t['full_mean_accuracy'])} (goal >= 95%), "
        f"LoRA/QLoRA mean {pct(t['lora_qlora_mean_accuracy'])} (goal >= 90%), "
        f"worst high-confidence under-prediction {pct(t['high_confidence_worst_under_prediction'])} (goal >= -5%), "
        f"over-prediction {pct(t['high_confidence_worst_over_prediction'])} (goal <= +15%)"
    )
    print(
        "per category: "
        + ", ".join(
            f"{n} {v['mean_accuracy']:.1%} (goal {v['goal']:.0%}: {'met' if v['met'] else 'NOT met'})"
            for n, v in summary["category_targets"].items()
        )
    )
    print(f"skipped {len(summary['skipped'])} rows; excluded from summary: {', '.join(summary['excluded']) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps({"rows": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
