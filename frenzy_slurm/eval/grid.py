"""The CPU ground-truth grid (benchmarks/cpu_memory_grid.py): reading its dataset and MARP's prediction
of each measured rank.

Each point stores the model.yaml that describes its run (`spec`); MARP predicts it through the product's
path, `workload_from_spec` (on the CPU) and the candidate search's own plan (`pinned_plan`), as fsbatch
would for that model.yaml.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.marp import pinned_plan, workload_from_spec
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan, Workload


@dataclass(frozen=True)
class GridRank:
    point: str
    rank: int
    stage: int
    measured: float  # peak live tensor bytes during a steady step
    predicted: float  # MARP, allocated bytes of the same stage
    predicted_phase: str = ""  # MARP's instant of the peak (forward-end, backward-start, backward-end, optimizer-step)
    measured_part: str | None = None  # the part of the step the profiler was in at the peak (None: not recorded)

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured

    @property
    def phase_agrees(self) -> bool | None:
        """Whether the part of the step the profiler was in at the measured peak is MARP's peak instant (None: not
        recorded). MARP's backward-start is the loss and the first backward functions after it."""
        if self.measured_part is None:
            return None
        return self.measured_part in PHASE_PARTS.get(self.predicted_phase, ("forward",))


# MARP's peak instants (memory.py) as the parts of a step the profiler's ranges tell apart (runtime/memory.py)
PHASE_PARTS = {
    "backward-start": ("loss", "backward"),
    "backward-end": ("backward",),
    "optimizer-step": ("optimizer",),
}


def spec_of(point: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(point["spec"])


def workload_of(point: dict[str, Any]) -> tuple[Workload, ParallelPlan]:
    """The point's Workload and plan, as fsbatch derives them from its model.yaml (on the CPU)."""
    spec = spec_of(point)
    assert spec.model.arch is not None
    w = workload_from_spec(spec, ResolvedModel(arch=spec.model.arch, name=spec.name), device="cpu")
    world = {r["rank"] for r in point["ranks"]}
    return w, pinned_plan(spec, w, len(world))


def predict(point: dict[str, Any]) -> list[GridRank]:
    """Per pipeline stage: the largest peak over its ranks (what every GPU of the stage must hold) and MARP's."""
    w, plan = workload_of(point)
    est = estimate_memory(w, plan, "allocated")
    worst: dict[int, dict] = {}
    for r in point["ranks"]:
        if r["stage"] not in worst or r["peak_bytes"] > worst[r["stage"]]["peak_bytes"]:
            worst[r["stage"]] = r
    return [
        GridRank(
            point["name"],
            r["rank"],
            s,
            r["peak_bytes"],
            est.stages[s].peak,
            est.stages[s].phase,
            (r.get("at_peak") or {}).get("part"),
        )
        for s, r in sorted(worst.items())
    ]


def load_grid(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text())["points"]
