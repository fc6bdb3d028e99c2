"""Stage 3, the orchestrator view: read the live cluster (pyslurm, Slurm CLI JSON, or a static snapshot).

    from frenzy_slurm.cluster import open_backend
    view = open_backend("auto").load()
"""

from __future__ import annotations

from pathlib import Path

from frenzy_slurm.cluster.backend import ClusterBackend, ComponentRequest, StartEstimate
from frenzy_slurm.cluster.model import ClusterView, GpuPool, Job, Node, Partition, group_het_jobs, job_phase
from frenzy_slurm.errors import InputError

__all__ = [
    "ClusterBackend", "ClusterView", "ComponentRequest", "GpuPool", "Job", "Node", "Partition", "StartEstimate",
    "group_het_jobs", "job_phase", "open_backend",
]

BACKENDS = ("auto", "cli", "pyslurm", "static")


def open_backend(name: str = "auto", snapshot: Path | None = None) -> ClusterBackend:
    """auto: pyslurm where it imports and matches the running Slurm, else the CLI tools."""
    if name == "static":
        if snapshot is None:
            raise InputError("--backend static needs --snapshot FILE (write one with `fsinfo --json > FILE`)")
        from frenzy_slurm.cluster.static import StaticBackend

        return StaticBackend(snapshot)
    if name in ("auto", "pyslurm"):
        from frenzy_slurm.cluster.pyslurm_backend import PyslurmBackend, try_import

        module = try_import()
        if module is not None or name == "pyslurm":
            return PyslurmBackend(module)
    if name not in BACKENDS:
        raise InputError(f"--backend {name}: choose one of {', '.join(BACKENDS)}")
    from frenzy_slurm.cluster.slurm_cli import SlurmCliBackend

    return SlurmCliBackend()
