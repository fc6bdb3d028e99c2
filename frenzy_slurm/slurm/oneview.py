"""`OneView`: a backend whose cluster view is read once, every other call passed to the backend it wraps.

A sweep plans every combination on the same view (one set of sinfo/squeue queries, not one per job); the
watcher's pass decides every move on one view. Each protocol method is written out (no attribute forwarding),
so the type checker sees a whole `SlurmBackend` (tests/test_backend_protocol.py checks it as it checks the
others).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from frenzy_slurm.slurm.backend import (
    AccountingRecord,
    BatchJob,
    ComponentRequest,
    SbatchAnswer,
    SlurmBackend,
    StartEstimate,
)
from frenzy_slurm.slurm.view import ClusterView, Job, PoolKey, QosLimits


class OneView:
    """`inner` with its cluster view read at the first `load()` and kept."""

    def __init__(self, backend: SlurmBackend):
        self.inner = backend
        self.name = backend.name
        self.snapshot: Path | None = backend.snapshot
        self._view: ClusterView | None = None

    def load(self) -> ClusterView:
        if self._view is None:
            self._view = self.inner.load()
        return self._view

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        return self.inner.expected_start(components)

    def submit(self, job: BatchJob) -> SbatchAnswer:
        return self.inner.submit(job)

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        return self.inner.jobs(job_ids, user)

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self.inner.cancel(job_id, signal)

    def requeue(self, job_id: int) -> None:
        self.inner.requeue(job_id)

    def hold(self, job_id: int) -> None:
        self.inner.hold(job_id)

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        self.inner.update_pending(job_id, component, restate_tasks)

    def release(self, job_id: int) -> None:
        self.inner.release(job_id)

    def is_operator(self) -> bool:
        return self.inner.is_operator()

    def preempted(self, job_id: int) -> bool:
        return self.inner.preempted(job_id)

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        return self.inner.accounting(job_ids)

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        return self.inner.gpu_memory_peaks(job_ids)

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        return self.inner.qos_limits(qos)

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        return self.inner.run_step(pool, gpus, argv, timeout)
