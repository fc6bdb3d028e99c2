"""Measured vs predicted, per finished job: what `frenzy-slurm calibrate` fits and `fsqueue JOBID` shows.

A job directory holds plan.json (the decision) and, after the run, metrics.json: written by the
built-in trainer, or by the NVML sampler beside a user's script (`frenzy_slurm.runtime.sampler`).
The step time the model predicts is the steady state, so the measured figure leaves out the first
step (graph warm-up, allocator growth, first collectives) and the step the trainer profiles for memory.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.calibration.verify import MAX_EPILOG_BYTES, submitted_job_id
from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.core.gpus import match_gpu
from frenzy_slurm.core.records import read_job_record
from frenzy_slurm.jobdir.planfile import read_job_plan
from frenzy_slurm.jobspec import ResolvedModel
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.speed import Links, PlanCosts, plan_costs
from frenzy_slurm.site.config import SiteConfig

if TYPE_CHECKING:
    from frenzy_slurm.core.gpus import GpuSpec
    from frenzy_slurm.has.model import Allocation
    from frenzy_slurm.marp.plan import ParallelPlan, Workload

WARMUP_STEPS = 1


def steady_step_time(step_times: list[float], profiled: list[int] | None = None) -> float | None:
    """Median step time without warm-up and profiled steps (indices into `step_times`); None if no steps."""
    if not step_times:
        return None
    skip = set(range(WARMUP_STEPS)) | set(profiled if profiled is not None else [1])
    steady = [t for i, t in enumerate(step_times) if i not in skip]
    return statistics.median(steady or step_times)


def measured_step_time(metrics: dict[str, Any]) -> float | None:
    """The steady step time of a metrics.json: the trainer's own where it says which steps it profiled
    (it then leaves them out), else from its list of step times."""
    if "profiled_steps" in metrics and metrics.get("step_time_s") is not None:
        return float(metrics["step_time_s"])
    return steady_step_time(list(metrics.get("step_times_s") or []), metrics.get("profiled_steps"))


@dataclass
class Observation:
    """One finished job: what was predicted (raw, without calibration) and what it measured."""

    job_dir: Path
    job_id: str | None
    kind: str  # homogeneous / heterogeneous
    gpus: tuple[str, ...]  # catalog GPU model of each component
    precision: str
    mode: str  # framework mode for memory corrections: precision/method
    slots: int  # micro-batch slots on the critical path per step: grad_accum + pp - 1
    compute_s: float | None  # raw predicted compute seconds per step (catalog/site efficiency)
    other_s: float | None  # raw predicted communication/offload seconds per step
    measured_step_s: float | None
    memory: list[tuple[float, float]] = field(default_factory=list)  # (predicted, measured) GiB per rank
    note: str = ""
    user: str = ""  # who owns the job directory: each user's jobs together are one vote in a fit

    @property
    def raw_step_s(self) -> float | None:
        return None if self.compute_s is None or self.other_s is None else self.compute_s + self.other_s


def raw_step_parts(w: Workload, chosen: Allocation, global_batch: int, site: SiteConfig) -> tuple[float, float] | None:
    """(compute, other) seconds of the chosen plan's step with the site file's GPU specs, no calibration.

    The step-time model is linear in 1/efficiency, so two evaluations separate the compute part.
    Only homogeneous plans (else None): a heterogeneous step is the slowest stage's, mixing GPU types.
    """
    if len(chosen.components) != 1:
        return None
    c = chosen.components[0]
    return plan_step_parts(w, _plan_of(chosen), global_batch, site, c.partition, c.gpu_type)


def plan_step_parts(
    w: Workload, plan: ParallelPlan, global_batch: int, site: SiteConfig, partition: str, gres_type: str | None
) -> tuple[float, float] | None:
    """(compute, other) seconds of `plan`'s step on the pool (partition, GRES type) with the site file's GPU specs,
    without the fixed overheads; None where the site file has no such pool."""
    priced = _priced(w, plan, global_batch, site, partition, gres_type)
    if priced is None:
        return None
    costs, spec, links = priced
    spec = spec.model_copy(update={"step_overhead_s": 0.0, "microbatch_overhead_s": 0.0})
    full = costs.seconds_on(spec, links)
    half = costs.seconds_on(spec.model_copy(update={"efficiency": spec.efficiency / 2}), links)
    compute = half - full
    return compute, full - compute


def plan_step_s(
    w: Workload, plan: ParallelPlan, global_batch: int, site: SiteConfig, partition: str, gres_type: str | None
) -> float | None:
    """Seconds of `plan`'s step on the pool with the site file's GPU spec, its fixed overheads included: what the
    candidate search predicts there; None where the site file has no such pool."""
    priced = _priced(w, plan, global_batch, site, partition, gres_type)
    return None if priced is None else priced[0].seconds_on(priced[1], priced[2])


def _priced(
    w: Workload, plan: ParallelPlan, global_batch: int, site: SiteConfig, partition: str, gres_type: str | None
) -> tuple[PlanCosts, GpuSpec, Links] | None:
    """The plan's GPU-independent work, and the pool's GPU spec and links in the site file (None: no such pool)."""
    pool = site.pool(partition, gres_type)
    if pool is None:
        return None
    links = Links(pool.intra_node_gbs, site.inter_node_gbs(pool), pool.gpus_per_node)
    return plan_costs(w, plan, global_batch), pool.spec(), links


def _plan_of(chosen: Allocation) -> ParallelPlan:
    plan = chosen.plan
    return plan.to_plan() if hasattr(plan, "to_plan") else plan  # plan.json before/after ParallelPlan was stored as-is


def read_epilog_dir(directory: Path) -> dict[str, list[dict[str, Any]]]:
    """The site epilog's records (contrib/slurm/epilog): job id -> one record per node."""
    out: dict[str, list[dict]] = {}
    for f in sorted(directory.glob("*.json")):
        try:
            rec = read_job_record(f, "epilog record", MAX_EPILOG_BYTES)  # regular files, bounded, no links
            out.setdefault(str(rec["job_id"]), []).append(rec)
        except (InputError, KeyError, TypeError):
            continue
    return out


def _epilog_metrics(records: list[dict], components: list) -> dict:
    """metrics.json-shaped ranks from epilog records: NVML's per-process peak per GPU vs MARP's device peak."""
    ranks = []
    for rec in records:
        for g in rec.get("gpus", []):
            spec = match_gpu(g.get("name", ""))
            comp = next(
                (c for c in components if spec and c.gpu_model == spec.name),
                components[0] if len(components) == 1 else None,
            )
            if g.get("max_process_memory_mib"):
                ranks.append(
                    {
                        "host": rec.get("host"),
                        "gpu_model": comp.gpu_model if comp else g.get("name"),
                        "peak_gib": g["max_process_memory_mib"] / 1024.0,
                        "metric": "device (epilog)",
                        "predicted_gib": comp.peak_gib if comp else None,
                    }
                )
    return {"source": "epilog", "ranks": ranks, "step_times_s": []}


def _oom_ranks(job_dir: Path) -> list[dict]:
    """The ranks' out-of-memory records (jobdir/oom.py) that measured a peak."""
    from frenzy_slurm.jobdir.oom import read_records

    return [r for r in read_records(job_dir) if isinstance(r.get("peak_gib"), int | float) and r["peak_gib"] > 0]


def _oom_metrics(records: list[dict], components: list) -> dict:
    """metrics.json-shaped ranks from a run that ran out of memory: the peak each failing rank measured (what it
    held plus what it could not get: the least it needed) against the component's planned peak. The largest
    planned peak stands for a rank whose component is not known (a record has no stage)."""
    planned = max(c.peak_gib for c in components)
    ranks = [
        {"host": r.get("host"), "peak_gib": float(r["peak_gib"]), "metric": "device (out of memory)",
         "predicted_gib": planned}
        for r in records
    ]  # fmt: skip
    return {"source": "out of memory", "job_id": records[0].get("job_id"), "ranks": ranks, "step_times_s": []}


def _job_id_of(job_dir: Path) -> str | None:
    return submitted_job_id(job_dir)


def observe(
    job_dir: Path,
    site: SiteConfig,
    epilog: dict[str, list[dict[str, Any]]] | None = None,
    sacct_gib: dict[int, float] | None = None,
) -> Observation | str:
    """The job's observation, or why it cannot be used (one line). For jobs whose directory records no
    memory (a user's script without NVML in its Python): `epilog`, read_epilog_dir()'s records, and
    `sacct_gib`, Slurm's own per-job GPU memory peaks (SlurmBackend.gpu_memory_peaks)."""
    job_id = _job_id_of(job_dir)
    records = (epilog or {}).get(job_id or "", [])
    slurm_peak = (sacct_gib or {}).get(int(job_id)) if job_id and job_id.isdigit() else None
    ooms = _oom_ranks(job_dir)
    if not os.path.lexists(job_dir / "metrics.json") and not records and slurm_peak is None and not ooms:
        return "no metrics.json (not finished, or ran without the trainer or the NVML sampler) and no epilog record"
    try:
        pf = read_job_plan(job_dir / "plan.json")
        if ooms and not os.path.lexists(job_dir / "metrics.json"):
            metrics = _oom_metrics(ooms, pf.decision.chosen.components)
        elif os.path.lexists(job_dir / "metrics.json"):
            metrics = read_job_record(job_dir / "metrics.json", "metrics")  # bounded, regular, no link
            if not isinstance(metrics, dict):
                return "unreadable: metrics.json is not a JSON object"
        else:
            metrics = _epilog_metrics(records, pf.decision.chosen.components)
    except (FrenzyError, OSError) as exc:
        return f"unreadable: {getattr(exc, 'message', exc)}"
    chosen = pf.decision.chosen
    plan = chosen.plan
    t = pf.spec.training

    w = workload_from_spec(pf.spec, ResolvedModel(arch=pf.arch, name=pf.model_name, exact_params=pf.exact_params))
    parts = raw_step_parts(w, chosen, t.global_batch, site)
    try:
        memory = _memory_pairs(metrics)
        measured = measured_step_time(metrics)
    except (TypeError, ValueError, AttributeError):  # a metrics.json of the wrong shape is no measurement
        return "unreadable: metrics.json has values of the wrong type (numbers expected)"
    if not memory and slurm_peak:  # sacct's gres/gpumem: the busiest task's device memory
        memory.append((max(c.peak_gib for c in chosen.components), slurm_peak))
    return Observation(
        job_dir=job_dir,
        job_id=metrics.get("job_id"),
        kind=chosen.kind,
        gpus=tuple(c.gpu_model for c in chosen.components),
        precision=t.precision,
        mode=f"{t.precision}/{t.method}",
        slots=plan.grad_accum + plan.pp - 1,
        compute_s=parts[0] if parts else None,
        other_s=parts[1] if parts else None,
        measured_step_s=measured,
        memory=memory,
        note="" if parts else "step time: heterogeneous or pool no longer in the site file (memory only)",
    )


def _memory_pairs(metrics: dict) -> list[tuple[float, float]]:
    """(predicted, measured) GiB of each rank that recorded both, as positive finite numbers."""
    import math

    pairs = []
    for r in metrics.get("ranks") or []:
        pred = r.get("predicted_gib", r.get("predicted_allocated_gib"))
        meas = r.get("peak_gib")
        if pred and meas:
            pair = (float(pred), float(meas))
            if not all(math.isfinite(v) and v > 0 for v in pair):
                raise ValueError("not a positive number")
            pairs.append(pair)
    return pairs


def job_dirs_under(root: Path) -> list[Path]:
    """Every job directory below `root` that has a plan.json (one level, as fsbatch lays them out)."""
    return sorted(p.parent for p in root.glob("*/plan.json"))
