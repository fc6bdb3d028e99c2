"""Stage 4, HAS: heterogeneity-aware scheduling of one job onto the live cluster.

    decision = decide(spec, workload, view, site, search_space_from_spec(spec), backend)
"""

from frenzy_slurm.has.decide import decide, requested_minutes
from frenzy_slurm.has.model import Allocation, Alternative, Component, Decision

__all__ = ["Allocation", "Alternative", "Component", "Decision", "decide", "requested_minutes"]
