"""What the simulator hands every allocation policy: the simulated Slurm and the site file.

Its own module so that policies.py (which makes the policies) and ilp.py (one of them) both import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    def site_for(self, a: Attempt) -> SiteConfig:
        """The site file with usable memory shrunk by what an OOM taught (plans then assume more memory)."""
        if a.mem_correction <= 1.0:
            return self.site
        frac = self.site.defaults.usable_fraction / a.mem_correction
        defaults = self.site.defaults.model_copy(update={"usable_fraction": frac})
        return self.site.model_copy(update={"defaults": defaults})
