"""What the simulator hands every allocation policy: the simulated Slurm and the site file.

Its own module so that policies.py (which makes the policies) and ilp.py (one of them) both import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.sim.calibrating import SiteCalibration
from frenzy_slurm.sim.jobs import Attempt
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.truth import Truth
from frenzy_slurm.site.config import SiteConfig


@dataclass
class Context:
    sim: SimSlurm
    site: SiteConfig
    # the ground truth, for baselines that model what a user knows from earlier runs (slurm-multi's
    # --time from the true run time) and for the restart cost sia plans with; HAS never reads it
    truth: Truth | None = None
    # the site's calibration as it stands now (`--calibrate-every`), for the policies that plan with MARP
    calibration: SiteCalibration | None = None

    def move_cost(self, a: Attempt) -> float:
        """What stopping the job and resuming it elsewhere costs in the truth: a start-up and the checkpoint's
        restart (`Truth.restart_s`); 120 s without a truth. Sia's R and has-preempt's watcher plan with it."""
        if self.truth is None:
            return 120.0
        return self.truth.model.startup_s + self.truth.restart_s(a.params_b, a.job.method)

    def resume_allowance(self, a: Attempt) -> float:
        """What a resumed start of the job pays in the truth for its checkpoint beyond the start-up and the constant
        `restart_s` (`ErrorModel.checkpoint_gbs`); 0 for a fresh start. A policy that knows it (sia) sets --time with
        it (`Requirements.resume_s`)."""
        if self.truth is None or a.steps >= a.job.steps:
            return 0.0
        return self.truth.restart_s(a.params_b, a.job.method) - self.truth.model.restart_s

    def site_for(self, a: Attempt, calibrated: bool = False) -> SiteConfig:
        """The site file as a policy plans the attempt with it: calibrated (`calibrated`, for the policies that plan
        with MARP, as fsbatch applies the site's calibration), and with usable memory shrunk by what an OOM taught
        (plans then assume more memory)."""
        site = self.site
        if calibrated and self.calibration is not None:
            site = self.calibration.site_for(a.job.precision, a.job.method)
        if a.mem_correction <= 1.0:
            return site
        frac = site.defaults.usable_fraction / a.mem_correction
        defaults = site.defaults.model_copy(update={"usable_fraction": frac})
        # a pool with its own share (a calibrated memory factor sets one) shrinks by the same correction
        pools = [
            p.model_copy(update={"usable_fraction": p.usable_fraction / a.mem_correction}) if p.usable_fraction else p
            for p in site.pools
        ]
        return site.model_copy(update={"defaults": defaults, "pools": pools})
