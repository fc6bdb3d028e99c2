"""Metrics of a simulated run, the JSON and Markdown reports, and the plots (matplotlib, optional).

JCT = completion - arrival of jobs that finished (OOM and time-limit resubmissions included);
queueing delay = JCT minus the time the job's attempts ran; makespan = last completion - first
arrival; GPU utilisation = GPU-seconds allocated / (GPUs x makespan), and the useful share (the
attempts that completed). Decision overhead: per decision (HAS and the other per-job policies) or per
round (ilp), wall milliseconds on this machine.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict
from itertools import pairwise
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.sim.runner import RunResult

if TYPE_CHECKING:  # matplotlib is optional (the sim extra), imported only to plot
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def _mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def summarize(r: RunResult) -> dict[str, Any]:
    done = [x for x in r.records if x.state == "done"]
    jct = [x.jct for x in done if x.jct is not None]
    queue = [x.jct - x.run_s for x in done if x.jct is not None]
    first = min((x.submit for x in r.records), default=0.0)
    last = max((x.end for x in r.records if x.end is not None), default=first)
    makespan = max(last - first, 1e-9)
    busy = 0.0
    for (t0, used), (t1, _) in pairwise(r.timeline):
        busy += used * (t1 - t0)
    lists = ("per_job_ms", "decision_ms_without_marp", "decision_cpu_ms")
    extra = {k: v for k, v in r.extra.items() if k not in lists}
    without_marp = r.extra.get("decision_ms_without_marp", [])
    cpu = r.extra.get("decision_cpu_ms", [])
    per_job = r.extra.get("per_job_ms", r.decision_ms)  # round policies: a round shared by its jobs
    sim_hours = max((r.timeline[-1][0] - r.timeline[0][0]) / 3600.0, 1e-9) if r.timeline else 1e-9
    return {
        "policy": r.policy,
        "seed": r.seed,
        "gpus": r.gpus,
        "cluster": r.cluster,
        "load": r.load,
        "jobs": len(r.records),
        "completed": len(done),
        "unplaceable": sum(x.state == "unplaceable" for x in r.records),
        "unfinished": sum(x.state in ("unfinished", "gave-up") for x in r.records),
        "avg_jct_s": statistics.fmean(jct) if jct else float("nan"),
        # the policy's own jobs, and those of users who do not use frenzy-slurm (Runner's plain_share)
        "avg_jct_own_s": _mean([x.jct for x in done if x.jct is not None and not x.plain]),
        "avg_jct_plain_s": _mean([x.jct for x in done if x.jct is not None and x.plain]),
        "plain_jobs": sum(x.plain for x in r.records),
        # each completed job's JCT and whether a plain user's: comparisons over the jobs two policies both completed
        "done_jct": {str(x.id): [x.jct, x.plain] for x in done if x.jct is not None},
        # the jobs it did not complete (never placed, gave up, still waiting): their arrival, and when the run's
        # last job ended, so that a comparison can count them (`paired_all`) rather than leave them out
        "open_jobs": {str(x.id): [x.submit, x.plain] for x in r.records if x.state != "done"},
        "last_end_s": last,
        "p50_jct_s": _pct(jct, 0.5),
        "p95_jct_s": _pct(jct, 0.95),
        "p99_jct_s": _pct(jct, 0.99),
        "avg_queue_s": statistics.fmean(queue) if queue else float("nan"),
        "makespan_s": makespan,
        "gpu_util": busy / (r.gpus * makespan),
        **queue_depth(r),
        "ooms": sum(x.ooms for x in r.records),
        "timeouts": sum(x.timeouts for x in r.records),
        "heterogeneous_jobs": sum(x.kind == "heterogeneous" for x in done),
        "avg_gpus_per_job": statistics.fmean(x.gpus for x in done) if done else float("nan"),
        "gpu_hours": sum(x.gpu_s for x in r.records) / 3600.0,
        "decisions": len(r.decision_ms),
        "decision_ms_median": _pct(r.decision_ms, 0.5),
        "decision_ms_p95": _pct(r.decision_ms, 0.95),
        "per_job_ms_median": _pct(per_job, 0.5),
        "per_job_ms_p95": _pct(per_job, 0.95),
        # the same decisions less the time in MARP's search (per-arrival policies; NaN for round policies)
        "per_job_ms_without_marp_median": _pct(without_marp, 0.5),
        "per_job_ms_without_marp_p95": _pct(without_marp, 0.95),
        "per_job_cpu_ms_median": _pct(cpu, 0.5),  # the same decisions' CPU time (per-arrival policies)
        "per_job_cpu_ms_p95": _pct(cpu, 0.95),
        # CPU of the policy (decisions, rounds, MARP searches included) per simulated hour of the cluster
        "policy_cpu_s_per_sim_hour": r.extra.get("policy_cpu_s", 0.0) / sim_hours,
        "sim_wall_s": r.sim_wall_s,
        **extra,
    }


def aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and standard deviation over seeds, per (policy, cluster)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for row in rows:
        groups[(row["gpus"], row["policy"])].append(row)
    out = []
    for (gpus, policy), items in groups.items():
        agg = {"policy": policy, "gpus": gpus, "seeds": len(items)}
        for key in (
            "avg_jct_s",
            "p50_jct_s",
            "p99_jct_s",
            "avg_queue_s",
            "makespan_s",
            "gpu_util",
            "ooms",
            "decision_ms_median",
            "decision_ms_p95",
            "completed",
            "heterogeneous_jobs",
        ):
            vals = [float(i[key]) for i in items]
            agg[key] = statistics.fmean(vals)
            agg[key + "_sd"] = statistics.stdev(vals) if len(vals) > 1 else 0.0
        out.append(agg)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    """One line per (cluster size, policy): mean (and standard deviation over seeds where several)."""
    multi = any(r.get("seeds", 1) > 1 for r in rows)

    def cell(r: dict, key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
        v = fmt.format(r[key] / scale)
        if multi and key + "_sd" in r:
            v += " ± " + fmt.format(r[key + "_sd"] / scale)
        return v

    head = (
        "| GPUs | policy | avg JCT h | p50 JCT h | p99 JCT h | queue h | makespan h | GPU util | OOMs | "
        "hetero | decision ms p50 / p95 |"
    )
    lines = [head, "|" + "|".join(["---"] * 11) + "|"]
    for r in sorted(rows, key=lambda r: (r["gpus"], r["avg_jct_s"])):
        lines.append(
            f"| {r['gpus']} | {r['policy']} | {cell(r, 'avg_jct_s', 3600)} | {cell(r, 'p50_jct_s', 3600)} | "
            f"{cell(r, 'p99_jct_s', 3600)} | {cell(r, 'avg_queue_s', 3600)} | {cell(r, 'makespan_s', 3600)} | "
            f"{cell(r, 'gpu_util', 0.01, '{:.0f}')}% | {cell(r, 'ooms', 1, '{:.1f}')} | "
            f"{cell(r, 'heterogeneous_jobs', 1, '{:.1f}')} | "
            f"{r['decision_ms_median']:.1f} / {r['decision_ms_p95']:.1f} |"
        )
    return "\n".join(lines)


def plot(results: list[RunResult], out_dir: Path) -> list[Path]:
    """JCT CDF per policy, GPUs allocated and queue length over time, one PNG each per cluster size."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("--plot needs matplotlib: pip install 'frenzy-slurm[sim]'") from None
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpus in sorted({r.gpus for r in results}):
        runs = [r for r in results if r.gpus == gpus]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in runs:
            jct = sorted(x.jct / 3600 for x in r.records if x.jct is not None)
            if jct:
                ax.step(
                    jct,
                    [(i + 1) / len(r.records) for i in range(len(jct))],
                    where="post",
                    label=f"{r.policy} (seed {r.seed})",
                )
        ax.set_xscale("log")
        written.append(
            _finish(
                plt,
                fig,
                ax,
                "job completion time (h, log scale)",
                "fraction of jobs",
                f"JCT CDF, {gpus} GPUs",
                out_dir / f"jct_cdf_{gpus}.png",
            )
        )
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in runs:
            ts = [t / 3600 for t, _ in r.timeline]
            ax.step(ts, [100.0 * u / r.gpus for _, u in r.timeline], where="post", label=f"{r.policy} (seed {r.seed})")
        ends = sorted(r.timeline[-1][0] / 3600 for r in runs if r.timeline)
        if len(ends) > 2:  # one policy's long tail (a job left alone for days) would squash the others
            ax.set_xlim(0, min(ends[-1], 2 * ends[len(ends) // 2]) * 1.02)
        written.append(
            _finish(
                plt,
                fig,
                ax,
                "simulated time (h)",
                "GPUs allocated (%)",
                f"GPU utilisation, {gpus} GPUs",
                out_dir / f"utilisation_{gpus}.png",
            )
        )
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for r in runs:
            ts, counts = queue_length(r)
            ax.step([t / 3600 for t in ts], counts, where="post", label=f"{r.policy} (seed {r.seed})")
        if len(ends) > 2:
            ax.set_xlim(0, min(ends[-1], 2 * ends[len(ends) // 2]) * 1.02)
        written.append(
            _finish(
                plt,
                fig,
                ax,
                "simulated time (h)",
                "jobs waiting for their first start",
                f"Queue length, {gpus} GPUs",
                out_dir / f"queue_{gpus}.png",
            )
        )
    return written


def queue_depth(r: RunResult) -> dict[str, float]:
    """How deep the queue was (queue_length's count): as each job arrived (median, p95, max) and on average over
    the time from the first arrival to the last."""
    ts, counts = queue_length(r)
    if not ts:
        return {"queue_at_arrival_p50": 0.0, "queue_at_arrival_p95": 0.0, "queue_max": 0.0, "queue_mean": 0.0}
    # the count just before each arrival: jobs that arrived earlier and had not started
    seen = [float(counts[bisect.bisect_left(ts, x.submit) - 1]) if ts[0] < x.submit else 0.0 for x in r.records]
    last = max(x.submit for x in r.records)
    ends = ts[1:] + [last]  # each count holds until the next change
    area = sum(n * (min(t1, last) - t0) for t0, n, t1 in zip(ts, counts, ends, strict=True) if t0 < last)
    return {
        "queue_at_arrival_p50": _pct(seen, 0.5),
        "queue_at_arrival_p95": _pct(seen, 0.95),
        "queue_max": float(max(counts)),
        "queue_mean": area / (last - ts[0]) if last > ts[0] else 0.0,
    }


def queue_length(r: RunResult) -> tuple[list[float], list[int]]:
    """Jobs arrived and not yet started (first start; resubmissions not counted) after each change."""
    net: dict[float, int] = defaultdict(int)  # events at one moment count together (arrive and start at once)
    for x in r.records:
        net[x.submit] += 1
        end = x.first_start if x.first_start is not None else x.end
        if end is not None:
            net[end] -= 1
    ts, counts, n = [], [], 0
    for t in sorted(net):
        n += net[t]
        ts.append(t)
        counts.append(n)
    return ts, counts


def _finish(plt: ModuleType, fig: Figure, ax: Axes, xlabel: str, ylabel: str, title: str, path: Path) -> Path:
    """Label, grid, legend; write the PNG and free the figure."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    png = io.BytesIO()
    fig.savefig(png, dpi=120, format="png")
    write_atomic(path, png.getvalue(), mode=0o644)  # never through a planted link
    plt.close(fig)
    return path


def paired(
    rows: list[dict[str, Any]], policy: str, baseline: str, key: str = "avg_jct_s", resamples: int = 10_000
) -> dict[str, Any]:
    """`policy` against `baseline` on the runs both made (same cluster, load and seed: same jobs, same truth).

    Per pair the relative reduction 1 - policy/baseline (positive: `policy` is better) and the difference in
    hours; their mean with a 95% interval from Student's t over the pairs and from a seeded percentile
    bootstrap (`resamples` resamples of the pairs)."""
    idx = {(r["cluster"], r.get("load"), r["seed"], r["policy"]): r for r in rows}
    rel: list[float] = []
    diff_h: list[float] = []
    for (cluster, load, seed, name), r in sorted(idx.items(), key=lambda kv: str(kv[0])):
        b = idx.get((cluster, load, seed, baseline))
        if (
            name != policy or b is None or not (r[key] == r[key] and b[key] == b[key]) or b[key] <= 0
        ):  # NaN: no job done
            continue
        rel.append(1.0 - r[key] / b[key])
        diff_h.append((r[key] - b[key]) / 3600.0)
    return _reductions(policy, baseline, rel, diff_h, resamples)


def paired_common(
    rows: list[dict[str, Any]], policy: str, baseline: str, who: str = "all", resamples: int = 10_000
) -> dict[str, Any]:
    """`paired`, each run's average JCT taken over the jobs both policies completed in it (`who`: all, own or
    plain users' jobs). A run's average counts only its completed jobs, so a policy that completes a job the other
    never places or finishes (a very long one) has a higher average for it; here both average the same jobs. Runs
    without per-job records (an older --reuse file) are left out."""
    idx = {(r["cluster"], r.get("load"), r["seed"], r["policy"]): r for r in rows}
    rel: list[float] = []
    diff_h: list[float] = []
    for (cluster, load, seed, name), r in sorted(idx.items(), key=lambda kv: str(kv[0])):
        b = idx.get((cluster, load, seed, baseline))
        if name != policy or b is None or "done_jct" not in r or "done_jct" not in b:
            continue
        mine, theirs = r["done_jct"], b["done_jct"]
        both = [j for j in mine if j in theirs and (who == "all" or mine[j][1] == (who == "plain"))]
        if not both:
            continue
        m, t = statistics.fmean(mine[j][0] for j in both), statistics.fmean(theirs[j][0] for j in both)
        rel.append(1.0 - m / t)
        diff_h.append((m - t) / 3600.0)
    return _reductions(policy, baseline, rel, diff_h, resamples) | {"common": True}


def paired_all(
    rows: list[dict[str, Any]], policy: str, baseline: str, who: str = "all", resamples: int = 10_000
) -> dict[str, Any]:
    """`paired` over every job of each run, completed or not (`who`: all, own or plain users' jobs). A job a
    policy did not complete (never placed, gave up after failures, still waiting) counts from its arrival to the
    later of the two runs' ends: a lower bound of a completion time it never reached, so a policy gains nothing
    by leaving a job out. Runs without per-job records (an older --reuse file) are left out."""
    idx = {(r["cluster"], r.get("load"), r["seed"], r["policy"]): r for r in rows}
    rel: list[float] = []
    diff_h: list[float] = []
    for (cluster, load, seed, name), r in sorted(idx.items(), key=lambda kv: str(kv[0])):
        b = idx.get((cluster, load, seed, baseline))
        if name != policy or b is None or any("open_jobs" not in x or "done_jct" not in x for x in (r, b)):
            continue
        horizon = max(r["last_end_s"], b["last_end_s"])
        avgs = [_all_jobs_mean(x, horizon, who) for x in (r, b)]
        if avgs[0] is None or avgs[1] is None or avgs[1] <= 0:
            continue
        rel.append(1.0 - avgs[0] / avgs[1])
        diff_h.append((avgs[0] - avgs[1]) / 3600.0)
    return _reductions(policy, baseline, rel, diff_h, resamples) | {"all_jobs": True}


def _all_jobs_mean(run: dict[str, Any], horizon: float, who: str) -> float | None:
    """The run's average JCT over every job of `who`, each job it did not complete counted until `horizon`."""

    def mine(plain: bool) -> bool:
        return who == "all" or plain == (who == "plain")

    jcts = [jct for jct, plain in run["done_jct"].values() if mine(plain)]
    jcts += [max(0.0, horizon - submit) for submit, plain in run["open_jobs"].values() if mine(plain)]
    return statistics.fmean(jcts) if jcts else None


def _reductions(policy: str, baseline: str, rel: list[float], diff_h: list[float], resamples: int) -> dict[str, Any]:
    """The mean relative reduction and hour difference over the pairs, each with its Student's t and bootstrap
    95% intervals."""
    import random

    out: dict = {"policy": policy, "baseline": baseline, "pairs": len(rel)}
    if not rel:
        return out
    rng = random.Random(20)
    for name, xs in (("reduction", rel), ("diff_h", diff_h)):
        m = statistics.fmean(xs)
        half = _t975(len(xs) - 1) * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else float("nan")
        boots = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(resamples))
        out[name] = m
        out[name + "_t95"] = (m - half, m + half)
        out[name + "_boot95"] = (boots[int(0.025 * resamples)], boots[int(0.975 * resamples) - 1])
    return out


def _t975(df: int) -> float:
    """Student's t 97.5% quantile (scipy where installed, else the normal's 1.96 with a small-sample table)."""
    if df <= 0:
        return float("nan")
    try:
        from scipy.stats import t

        return float(t.ppf(0.975, df))
    except ImportError:
        table = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}
        return table.get(df, 2.228 if df < 20 else 1.96)
