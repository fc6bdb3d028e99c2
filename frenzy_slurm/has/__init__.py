"""Stage 4, HAS: heterogeneity-aware scheduling of one job onto the live cluster.

decision = decide(Requirements.from_spec(spec, time=cli_time), workload, view, site,
                  search_space_from_spec(spec), backend)
"""

from frenzy_slurm.has.decide import decide
from frenzy_slurm.has.model import Allocation, Alternative, Component, Decision
from frenzy_slurm.has.requirements import Requirements

__all__ = ["Allocation", "Alternative", "Component", "Decision", "Requirements", "decide"]
