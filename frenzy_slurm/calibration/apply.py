"""Applying a calibration: one explicit step that turns the site file into the calibrated site file.

fsbatch and `frenzy-slurm memory` call `calibrated_site()` after loading the site file; MARP and HAS
then see calibrated GPU specs and nothing else changes: the step-time corrections become each pool's
`overrides` (efficiency x factor, fixed per-step and per-micro-batch overheads), the memory factor
of the job's framework mode shrinks (or grows) the share of each GPU that plans may fill, which is
the same as multiplying every memory prediction by it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.calibration.model import CalibrationFile, calibration_path, load_calibration
from frenzy_slurm.calibration.observe import raw_step_parts
from frenzy_slurm.site.config import SiteConfig

if TYPE_CHECKING:
    from frenzy_slurm.has.model import Decision
    from frenzy_slurm.marp.plan import Workload

MAX_USABLE_FRACTION = 0.99  # a memory factor below 1 never lets plans fill a GPU completely


@dataclass
class Applied:
    """What a calibration changed for one job: shown by --explain, recorded in the job directory."""

    path: str
    created_at: float
    jobs: int
    memory_factor: float = 1.0
    memory_mode: str = ""
    pools: dict[str, dict] = field(default_factory=dict)  # "partition/gres" -> the correction applied

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "created_at": self.created_at,
            "jobs": self.jobs,
            "memory_mode": self.memory_mode,
            "memory_factor": self.memory_factor,
            "pools": self.pools,
        }


def find_calibration(
    site: SiteConfig, site_path: Path | None, enabled: bool = True
) -> tuple[CalibrationFile, Path] | None:
    """The calibration beside the site file (or $FRENZY_CALIBRATION), checked; None if there is none."""
    if not enabled or site_path is None:
        return None
    path = calibration_path(site_path)
    if not path.exists():
        return None
    return load_calibration(path, site), path


def calibrated_site(
    site: SiteConfig, cal: CalibrationFile, path: Path, precision: str, method: str
) -> tuple[SiteConfig, Applied]:
    """The site file with this job's corrections applied, and a record of them."""
    mode = f"{precision}/{method}"
    mem = cal.memory_factor(mode)
    applied = Applied(
        path=str(path),
        created_at=cal.created_at,
        jobs=len(cal.jobs),
        memory_mode=mode,
        memory_factor=mem.factor if mem else 1.0,
    )
    pools = []
    for pool in site.pools:
        base = pool.spec()
        corr = cal.step_correction(base.name, precision)
        update: dict = {}
        if corr is not None:
            eff = min(1.0, base.efficiency * corr.efficiency_factor)
            update["overrides"] = pool.overrides.model_copy(
                update={
                    "efficiency": eff,
                    "step_overhead_s": corr.step_overhead_s,
                    "microbatch_overhead_s": corr.microbatch_overhead_s,
                }
            )
            applied.pools[pool.label] = {
                "fit": corr.gpu,
                "efficiency": eff,
                "raw_efficiency": base.efficiency,
                "step_overhead_s": corr.step_overhead_s,
                "microbatch_overhead_s": corr.microbatch_overhead_s,
                "jobs": corr.jobs,
            }
        if mem is not None:
            update["usable_fraction"] = min(MAX_USABLE_FRACTION, site.usable_fraction(pool) / mem.factor)
        pools.append(pool.model_copy(update=update) if update else pool)
    return site.model_copy(update={"pools": pools}), applied


def for_job(
    site: SiteConfig, site_path: Path | None, precision: str, method: str, enabled: bool = True
) -> tuple[SiteConfig, Applied | None]:
    """fsbatch's step: the site file as MARP and HAS should see it for this job, and what was applied."""
    found = find_calibration(site, site_path, enabled)
    if found is None:
        return site, None
    cal, path = found
    return calibrated_site(site, cal, path, precision, method)


def job_record(
    applied: Applied | None, raw_site: SiteConfig, w: Workload, decision: Decision, global_batch: int
) -> dict[str, Any]:
    """calibration.json of a job directory: the calibration used, and the chosen plan's raw and calibrated step."""
    chosen = decision.chosen
    parts = raw_step_parts(w, chosen, global_batch, raw_site)
    return {
        "calibration": applied.to_json() if applied else None,
        "raw_step_time_s": sum(parts) if parts else None,
        "step_time_s": chosen.step_time_s,
    }


def explain_lines(record: dict[str, Any]) -> list[str]:
    """What --explain prints about calibration: raw and calibrated numbers side by side."""
    cal = record.get("calibration")
    raw, step = record.get("raw_step_time_s"), record["step_time_s"]
    if cal is None:
        return [
            f"calibration: none (raw predictions; step {step:.4g} s). `frenzy-slurm calibrate` fits one "
            "from finished jobs."
        ]
    import time

    when = time.strftime("%Y-%m-%d", time.gmtime(cal["created_at"]))
    raw_text = f"{raw:.4g} s" if raw is not None else "n/a (heterogeneous)"
    lines = [
        f"calibration: {cal['path']} ({cal['jobs']} jobs, fitted {when}): step time raw {raw_text} -> "
        f"calibrated {step:.4g} s"
    ]
    for pool, c in sorted(cal["pools"].items()):
        src = "site-wide fit" if c["fit"] == "*" else f"{c['fit']} fit"
        lines.append(
            f"  {pool}: efficiency {c['raw_efficiency']:.3g} -> {c['efficiency']:.3g}, "
            f"+{c['step_overhead_s']:.4g} s/step, +{c['microbatch_overhead_s']:.4g} s/micro-batch "
            f"({src}, {c['jobs']} jobs)"
        )
    if cal["memory_factor"] != 1.0:
        lines.append(
            f"  memory {cal['memory_mode']}: predictions x{cal['memory_factor']:.3f} (usable share of each "
            "GPU divided by it)"
        )
    return lines
