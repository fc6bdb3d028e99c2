"""MARP accuracy against published measurements, predicted through the product's own path.

    python benchmarks/marp_accuracy.py --data ../shared/data/memory_measurements_dev.csv [--json OUT]
    python benchmarks/marp_accuracy.py --cases DIR [--json OUT]

Each measurement is a case file (frenzy_slurm/eval/cases.py): the model.yaml its run's user would write plus
`measurement:` (world size, GPU, metric, value, source). `--data` first converts a CSV into case files in a
temporary directory (python -m frenzy_slurm.eval.convert CSV DIR writes them where you can read them); a row
the converter cannot read is a failure, listed with its reason and counted in the summary. Each case is
predicted as `frenzy-slurm memory CASE --world N --metric M` predicts it (frenzy_slurm.marp.predict_pinned: the
plan the file pins at the measured world size, the CUDA context of its model.yaml, the default pool overheads);
the benchmark sets nothing else. Accuracy = 1 - |pred - meas| / meas, beside two reference estimators. The
summary's `mean` is over the predicted rows, `fail=0` over every row with each failure counted as 0 %; a case whose
measurement lists `assumed` settings is scored as low confidence.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.errors import InputError  # noqa: E402
from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.eval.cases import case_files, load_case, load_unreadable, predict_case  # noqa: E402
from frenzy_slurm.eval.convert import convert  # noqa: E402
from frenzy_slurm.eval.reference import deepspeed_states, megatron_formula  # noqa: E402

# the goals per class: full training (pretraining and full fine-tuning) 95 %, adapters (LoRA, QLoRA) 90 %
GOALS = {"full": 0.95, "lora/qlora": 0.90}


def accuracy(pred: float, meas: float) -> float:
    return 1.0 - abs(pred - meas) / meas


def score_case(path: Path) -> dict:
    """One case predicted through the product's path; a case the product cannot plan is a failure with its reason."""
    rec: dict = {"case": path.stem, "predicted_gib": None, "accuracy": None, "failure": None}
    try:
        case = load_case(path)
        m = case.measurement
        rec |= {
            "class": "full" if case.training.method == "full" else "lora/qlora",
            "category": m.category or case.training.method,
            "confidence": m.scored_confidence,
            "assumed": m.assumed,
            "measured_gib": m.value_gib,
            "metric": m.metric,
        }
        pred = predict_case(case, path)
    except InputError as exc:
        rec.setdefault("class", "full")
        rec.setdefault("confidence", "low")
        rec.setdefault("measured_gib", None)
        return rec | {"failure": f"cannot be predicted: {exc.message}"}
    est = pred.estimate
    rec |= {
        "predicted_gib": est.peak_gib,
        "accuracy": accuracy(est.peak_gib, m.value_gib),
        "plan": pred.plan.short(),
        "phase": max(est.stages, key=lambda s: s.peak).phase,
        "gpu": pred.gpu,
        "capped_gib": est.released / GiB,
    }
    for name, fn in (("deepspeed_states", deepspeed_states), ("megatron_formula", megatron_formula)):
        rec[f"{name}_gib"] = fn(pred.workload, pred.plan) / GiB
    return rec


def score_directory(directory: Path) -> list[dict]:
    """Every case file of the directory scored, and every unreadable row as a failure."""
    results = [score_case(p) for p in case_files(directory)]
    for u in load_unreadable(directory):
        results.append(
            {
                "case": u.case,
                "class": "full" if u.method == "full" else "lora/qlora",
                "category": u.category,
                "confidence": u.confidence,
                "measured_gib": u.value_gib,
                "predicted_gib": None,
                "accuracy": None,
                "failure": f"unreadable: {u.reason}",
            }
        )
    return sorted(results, key=lambda r: r["case"])


def summarize(rows: list[dict]) -> dict:
    """Rows (failures included), failures, mean accuracy of the predicted rows, the mean over ALL rows with each
    failure counted as 0 % (`fail=0`: a failure can never lift it), the share within 5 % of ALL rows (a failure is
    not within 5 %), and the worst under-prediction of a predicted high-confidence row."""
    done = [r for r in rows if r["accuracy"] is not None]
    high = [(r["predicted_gib"] - r["measured_gib"]) / r["measured_gib"] for r in done if r["confidence"] == "high"]
    return {
        "rows": len(rows),
        "failures": len(rows) - len(done),
        "mean_accuracy": sum(r["accuracy"] for r in done) / len(done) if done else None,
        "mean_failures_as_zero": sum(r["accuracy"] for r in done) / len(rows) if rows else None,
        "within_5pct": sum(r["accuracy"] >= 0.95 for r in done) / len(rows) if rows else None,
        "high_confidence_worst_under": min([e for e in high if e < 0], default=0.0),
        "high_confidence_worst_over": max([e for e in high if e > 0], default=0.0),
    }


def summary_of(results: list[dict]) -> dict:
    classes = {c: summarize([r for r in results if r["class"] == c]) for c in GOALS}
    by_conf = {c: summarize([r for r in results if r["confidence"] == c]) for c in ("high", "medium", "low")}
    return {
        "by_class": classes,
        "by_confidence": by_conf,
        "all": summarize(results),
        "goals": {
            c: {"goal": g, "met": (classes[c]["mean_accuracy"] or 0.0) >= g and not classes[c]["failures"]}
            for c, g in GOALS.items()
        },
        "reference_by_confidence": {c: reference_means([r for r in results if r["confidence"] == c]) for c in by_conf},
        "failures": {r["case"]: r["failure"] for r in results if r["failure"]},
    }


def reference_means(rows: list[dict]) -> dict:
    """Mean accuracy of MARP and of each reference estimator over the same predicted rows."""
    done = [r for r in rows if r["accuracy"] is not None]
    if not done:
        return {}
    out = {"marp": sum(r["accuracy"] for r in done) / len(done)}
    for name in ("deepspeed_states", "megatron_formula"):
        out[name] = sum(accuracy(r[f"{name}_gib"], r["measured_gib"]) for r in done) / len(done)
    return out


def pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def print_report(results: list[dict], summary: dict) -> None:
    n = min(28, max([4] + [len(r["case"]) for r in results]))
    cols = f"{'meas':>7} {'MARP':>7} {'acc':>7} {'DS':>7} {'Mega':>7}"
    print(f"{'case':{n}} {'class':10} {'conf':6} {cols}  plan / phase")
    for r in results:
        head = f"{r['case'][:n]:{n}} {r['class']:10} {r['confidence'][:6]:6} "
        meas = f"{r['measured_gib']:7.2f}" if r["measured_gib"] is not None else f"{'?':>7}"
        if r["failure"]:
            print(f"{head}{meas}  FAILED: {r['failure']}")
            continue
        print(
            f"{head}{meas} {r['predicted_gib']:7.2f} {pct(r['accuracy']):>7} {r['deepspeed_states_gib']:7.2f} "
            f"{r['megatron_formula_gib']:7.2f}  {r['plan']} / {r['phase']}"
        )
    print(
        f"\n{'':14} {'rows':>4} {'failed':>6} {'mean':>7} {'fail=0':>7} {'<=5%':>6} {'worst high-conf under':>22} "
        f"{'over':>7}"
    )
    groups = list(summary["by_class"].items()) + list(summary["by_confidence"].items()) + [("all", summary["all"])]
    for name, s in groups:
        print(
            f"  {name:12} {s['rows']:4} {s['failures']:6} {pct(s['mean_accuracy']):>7} "
            f"{pct(s['mean_failures_as_zero']):>7} {pct(s['within_5pct']):>6} "
            f"{pct(s['high_confidence_worst_under']):>22} {pct(s['high_confidence_worst_over']):>7}"
        )
    for c, g in summary["goals"].items():
        s = summary["by_class"][c]
        print(f"goal {c}: mean >= {g['goal']:.0%} with no failure: {'met' if g['met'] else 'NOT met'}")
    print(
        f"{len(summary['failures'])} failures (counted above: a failure is never within 5 %, and counts 0 % in fail=0; "
        "mean is over the predicted rows)"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, action="append", default=[], help="measurements CSV (repeatable)")
    ap.add_argument("--cases", type=Path, action="append", default=[], help="directory of case files (repeatable)")
    ap.add_argument("--json", type=Path, help="write per-case results and the summary as JSON")
    args = ap.parse_args()
    if not args.data and not args.cases:
        ap.error("give --data CSV or --cases DIR")
    results: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="marp-cases-") as tmp:
            for i, csv_path in enumerate(args.data):
                out = Path(tmp) / f"{i}-{csv_path.stem}"
                convert(csv_path, out)
                results += score_directory(out)
            for directory in args.cases:
                results += score_directory(directory)
    except (OSError, ValueError, InputError) as exc:
        print(f"error: {getattr(exc, 'message', exc)}", file=sys.stderr)
        return 2
    summary = summary_of(results)
    print_report(results, summary)
    if args.json:
        args.json.write_text(json.dumps({"cases": results, "summary": summary}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
