"""A site that calibrates: the product's `frenzy-slurm calibrate` fit, run on the simulated jobs' measurements.

A site running frenzy-slurm refits its calibration from the jobs that finished (docs/admin.md "Calibration", e.g. a
cron job). The simulator does the same with the product's own functions:

- every run of a job that a MARP-planning policy placed (HAS and its variants, `sia`, `ilp`, `fastest-fit`) that
  took steps is an `Observation`, as `calibration.observe` makes one from a job directory: MARP's raw compute and
  other seconds of its plan on the site file (`calibration.observe.plan_step_parts`), the true steady step time it
  ran at, and its predicted and true peak memory; a heterogeneous run counts for memory only, as in the product;
- every `every_s` the product's `calibration.fit` turns all observations so far into a `CalibrationFile`, each
  correction held within `max_change` of the previous calibration's, as `frenzy-slurm calibrate` holds it;
- the policies that plan with MARP see the site as fsbatch shows it to them (`calibration.calibrated_site`). The
  users who do not use frenzy-slurm, and the baselines that stand for users (`slurm-multi`, `user-fixed`), do not.

The truth stays apart from it: a job's true step time is computed from what MARP predicts for its plan on the site
file without calibration (`raw_step_s`), so a calibration changes what policies decide, never what a job costs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from frenzy_slurm.calibration.apply import calibrated_site
from frenzy_slurm.calibration.fit import fit
from frenzy_slurm.calibration.model import CalibrationFile, FitBounds, site_fingerprint
from frenzy_slurm.calibration.observe import Observation, plan_step_parts, plan_step_s
from frenzy_slurm.core.version import __version__
from frenzy_slurm.sim.jobs import Attempt, Placement
from frenzy_slurm.site.config import SiteConfig

SIM_CALIBRATION = "simulated-site.calibration.yaml"  # the path a CalibrationFile records; nothing is written


@dataclass
class SiteCalibration:
    """The site's calibration as it stands at the simulated clock, and the observations it is fitted from."""

    site: SiteConfig  # the site file, uncalibrated
    every_s: float  # how often the site refits (the admin's cron)
    bounds: FitBounds = field(default_factory=FitBounds)
    observations: list[Observation] = field(default_factory=list)
    current: CalibrationFile | None = None
    fits: int = 0  # refits that wrote a calibration (a fit with nothing to apply writes none)
    next_fit_s: float = 0.0
    _sites: dict[tuple[str, str], SiteConfig] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.next_fit_s = self.every_s

    def site_for(self, precision: str, method: str) -> SiteConfig:
        """The site file as fsbatch shows it to a job of this precision and method (the file itself before the
        first calibration)."""
        if self.current is None:
            return self.site
        key = (precision, method)
        if key not in self._sites:
            self._sites[key] = calibrated_site(self.site, self.current, Path(SIM_CALIBRATION), precision, method)[0]
        return self._sites[key]

    def observe(self, a: Attempt, p: Placement, measured_step_s: float, true_peaks: list[float], user: str) -> None:
        """A run of `a` on `p` that took steps at `measured_step_s` (true), its components' true peaks (GiB)."""
        parts = None
        if p.plan is not None and len(p.components) == 1:
            r = p.components[0].request
            parts = plan_step_parts(a.workload, p.plan, a.requirements.global_batch, self.site, r.partition, r.gpu_type)
        self.observations.append(
            Observation(
                job_dir=Path(f"job-{a.job.id}-{a.number}-{len(self.observations)}"),
                job_id=str(a.job.id),
                kind=p.kind,
                gpus=tuple(c.gpu_model for c in p.components),
                precision=a.job.precision,
                mode=f"{a.job.precision}/{a.job.method}",
                slots=_slots(p),
                compute_s=parts[0] if parts else None,
                other_s=parts[1] if parts else None,
                measured_step_s=measured_step_s if parts else None,
                memory=[(c.predicted_peak_gib, t) for c, t in zip(p.components, true_peaks, strict=True)],
                user=user,
            )
        )

    def refit(self, now: float) -> None:
        """The cron's run at `now`: fit every observation so far, each correction within `bounds.max_change` of the
        calibration it replaces (a fit with nothing to apply keeps the previous file, as calibrate does)."""
        while self.next_fit_s <= now:
            self.next_fit_s += self.every_s
        if not self.observations:
            return
        steps, memory, findings = fit(self.observations, self.bounds, self.current)
        if not (steps or memory):
            return
        self.current = CalibrationFile(
            site_file=SIM_CALIBRATION,
            site_fingerprint=site_fingerprint(self.site),
            created_at=now,
            valid_until=now + 90 * 86400,
            frenzy_version=__version__,
            limits=self.bounds,
            step_time=steps,
            memory=memory,
            jobs=[str(o.job_dir) for o in self.observations],
            not_applied=[f.text for f in findings if f.refused],
            notes=[f.text for f in findings if not f.refused],
        )
        self._sites.clear()
        self.fits += 1

    def raw_step_s(self, a: Attempt, p: Placement) -> float:
        """What MARP predicts for `p`'s plan on the site file without calibration: the step the truth scales.

        Exact for a one-pool plan (the candidate search's own cost model on the uncalibrated pool). A pipeline over
        pools, or a placement without its plan, undoes the calibration where it is largest: the calibrated step
        less the fixed overheads the calibration added, times the largest ratio of calibrated to raw efficiency of
        its GPU types (the truth runs a pipeline at its slowest type's factor)."""
        if self.current is None:
            return p.step_time_s
        if p.plan is not None and len(p.components) == 1:
            r = p.components[0].request
            step = plan_step_s(a.workload, p.plan, a.requirements.global_batch, self.site, r.partition, r.gpu_type)
            if step is not None:
                return step
        cal = self.site_for(a.job.precision, a.job.method)
        slots = _slots(p)
        ratios, fixed = [], 0.0
        for c in p.components:
            raw = self.site.pool(c.request.partition, c.request.gpu_type)
            now = cal.pool(c.request.partition, c.request.gpu_type)
            if raw is None or now is None:
                continue
            ratios.append(now.spec().efficiency / raw.spec().efficiency)
            added = now.spec().step_overhead_s - raw.spec().step_overhead_s
            added += (now.spec().microbatch_overhead_s - raw.spec().microbatch_overhead_s) * slots
            fixed = max(fixed, added)
        return max(p.step_time_s - fixed, 0.0) * (max(ratios) if ratios else 1.0)


def _slots(p: Placement) -> int:
    """Micro-batch slots on the critical path of `p`'s step, as the calibration counts them (grad_accum + pp - 1)."""
    return p.plan.grad_accum + p.plan.pp - 1 if p.plan is not None else 1
