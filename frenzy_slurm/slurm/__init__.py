"""The one seam to Slurm: every Slurm command and every pyslurm call of the package lives in this package.

    from frenzy_slurm.slurm import open_backend
    backend = open_backend("auto")        # pyslurm where it matches the running Slurm, else the CLI tools
    view = backend.load()                 # partitions, nodes with GPUs, jobs
    backend.jobs(user="alice")            # one batched queue query
    backend.submit(BatchJob(...))         # sbatch --parsable (batch and heterogeneous jobs)

Backends: `cli` (Slurm's command-line tools), `pyslurm` (reads through pyslurm; submits, cancels and
queries accounting through the CLI backend), `static` (a saved view, reads only) and `fake.FakeSlurm`
(in memory, for unit tests and simulation; never chosen by `open_backend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import InputError

# The names below are loaded on first use (PEP 562 `__getattr__`), so that importing one small module of the seam
# (`frenzy_slurm.slurm.timefmt`, as `fsqueue` does) does not build the view's pydantic models: start-up time.
_LAZY = {
    "AccountingRecord": "backend",
    "BatchJob": "backend",
    "ComponentRequest": "backend",
    "PoolKey": "view",
    "SbatchAnswer": "backend",
    "SlurmBackend": "backend",
    "StartEstimate": "backend",
    "SlurmCommandError": "run",
    "SlurmUnavailable": "run",
    "ClusterView": "view",
    "GpuPool": "view",
    "Job": "job",
    "Node": "view",
    "Partition": "view",
    "group_het_jobs": "job",
    "job_phase": "job",
}

if TYPE_CHECKING:
    from frenzy_slurm.slurm.backend import (
        AccountingRecord,
        BatchJob,
        ComponentRequest,
        SbatchAnswer,
        SlurmBackend,
        StartEstimate,
    )
    from frenzy_slurm.slurm.job import Job, group_het_jobs, job_phase
    from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
    from frenzy_slurm.slurm.view import ClusterView, GpuPool, Node, Partition, PoolKey

__all__ = [
    "AccountingRecord",
    "BACKENDS",
    "BatchJob",
    "ClusterView",
    "ComponentRequest",
    "GpuPool",
    "Job",
    "Node",
    "Partition",
    "PoolKey",
    "SbatchAnswer",
    "SlurmBackend",
    "SlurmCommandError",
    "SlurmUnavailable",
    "StartEstimate",
    "group_het_jobs",
    "job_phase",
    "open_backend",
]

BACKENDS = ("auto", "cli", "pyslurm", "static")


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from importlib import import_module

        return getattr(import_module(f"frenzy_slurm.slurm.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'frenzy_slurm.slurm' has no attribute {name!r}")


def open_backend(name: str = "auto", snapshot: Path | None = None) -> SlurmBackend:
    """auto: pyslurm where it imports and matches the running Slurm, else the CLI tools."""
    if name not in BACKENDS:
        raise InputError(f"--backend {name}: choose one of {', '.join(BACKENDS)}")
    if name == "static":
        if snapshot is None:
            raise InputError("--backend static needs --snapshot FILE (write one with `fsinfo --json > FILE`)")
        # each backend only once chosen: pyslurm is an optional extra, and a listing starts faster
        from frenzy_slurm.slurm.static import StaticBackend

        return StaticBackend(snapshot)
    if name in ("auto", "pyslurm"):
        # each backend only once chosen: pyslurm is an optional extra, and a listing starts faster
        from frenzy_slurm.slurm.pyslurm_backend import PyslurmBackend, try_import

        module = try_import()
        if module is not None or name == "pyslurm":
            return PyslurmBackend(module)
    # each backend only once chosen: pyslurm is an optional extra, and a listing starts faster
    from frenzy_slurm.slurm.cli import SlurmCliBackend

    return SlurmCliBackend()
