"""Static backend: a ClusterView snapshot file (what `fsinfo --json` writes), for planning without Slurm."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from frenzy_slurm.errors import InputError
from frenzy_slurm.records import read_json
from frenzy_slurm.slurm.backend import ComponentRequest, ReadOnlyBackend, StartEstimate
from frenzy_slurm.slurm.releases import ReleaseIndex
from frenzy_slurm.slurm.view import ClusterView, Job
from frenzy_slurm.yamlfile import format_validation_error


class StaticBackend(ReadOnlyBackend):
    name = "static"

    def __init__(self, path: Path):
        self.path = path
        self.snapshot: Path | None = path  # (the protocol's: this backend reads a saved view)
        self._view: ClusterView | None = None

    def load(self) -> ClusterView:
        if self._view is None:
            data = read_json(self.path, "cluster snapshot (write one with `fsinfo --json > FILE`)")
            if isinstance(data, dict):
                data.pop("summary", None)
            try:
                view = ClusterView.model_validate(data)
            except ValidationError as exc:
                raise InputError(format_validation_error(str(self.path), exc)) from None
            self._view = view.model_copy(update={"backend": self.name})
        return self._view

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        """From the snapshot: when enough nodes have the GPUs free for the request's time limit, after the
        running jobs end and the pending jobs ahead of it have had their turn (all components together)."""
        view = self.load()
        releases = ReleaseIndex(view, view.taken_at)
        latest, chosen = view.taken_at, []
        for c in components:
            found = releases.window(c.partition, c.gpu_type, c.nodes, c.gpus_per_node, c.time_min * 60.0)
            if found is None:
                raise InputError(
                    f"snapshot {self.path}: partition {c.partition} never has {c.nodes} node(s) with "
                    f"{c.gpus_per_node} free {c.gpu_type or 'GPU'}s"
                )
            latest = max(latest, found[0])
            chosen += found[1]
        return StartEstimate(start=latest, nodes=chosen, source="snapshot")

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        """The snapshot's jobs, as they were when it was taken."""
        wanted = set(job_ids) if job_ids is not None else None
        return [
            j
            for j in self.load().jobs
            if (wanted is None or j.job_id in wanted or (j.het_job_id or 0) in wanted)
            and (user is None or j.user == user)
        ]
