"""The small interface every cluster backend implements, and the request type for start-time estimates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from frenzy_slurm.cluster.model import ClusterView


@dataclass(frozen=True)
class ComponentRequest:
    """One component of a (possibly heterogeneous) GPU request, as sbatch would get it."""

    partition: str
    gpu_type: str | None
    nodes: int
    gpus_per_node: int
    time_min: int
    cpus_per_gpu: int = 1
    mem_per_gpu_mb: int = 500


@dataclass(frozen=True)
class StartEstimate:
    start: float  # epoch seconds
    nodes: list[str]
    source: str  # "test-only", "now", ...


class ClusterBackend(Protocol):
    name: str

    def load(self) -> ClusterView:
        """One consistent snapshot of partitions, nodes and jobs."""
        ...

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        """When Slurm would start this request now (hetjob if several components)."""
        ...
