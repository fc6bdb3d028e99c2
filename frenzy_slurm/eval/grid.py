"""The CPU ground-truth grid (benchmarks/cpu_memory_grid.py): reading its dataset and MARP's prediction
of each measured rank."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.plan import DeepSpeedBuckets, ParallelPlan, Workload


@dataclass(frozen=True)
class GridRank:
    point: str
    rank: int
    stage: int
    measured: float  # peak live tensor bytes during a steady step
    predicted: float  # MARP, allocated bytes of the same stage

    @property
    def error(self) -> float:
        return (self.predicted - self.measured) / self.measured


def workload_of(point: dict) -> tuple[Workload, ParallelPlan]:
    w = dict(point["workload"])
    w["lora_targets"] = tuple(w["lora_targets"])
    w["buckets"] = DeepSpeedBuckets(**w.get("buckets", {}))
    return Workload(arch=Architecture(**point["arch"]), **w), ParallelPlan(**point["plan"])


def predict(point: dict) -> list[GridRank]:
    """Per pipeline stage: the largest peak over its ranks (what every GPU of the stage must hold) and MARP's."""
    w, plan = workload_of(point)
    est = estimate_memory(w, plan, "allocated")
    worst: dict[int, dict] = {}
    for r in point["ranks"]:
        if r["stage"] not in worst or r["peak_bytes"] > worst[r["stage"]]["peak_bytes"]:
            worst[r["stage"]] = r
    return [
        GridRank(point["name"], r["rank"], s, r["peak_bytes"], est.stages[s].peak) for s, r in sorted(worst.items())
    ]


def load_grid(path: Path) -> list[dict]:
    return json.loads(path.read_text())["points"]
