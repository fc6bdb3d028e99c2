"""Static backend: a ClusterView snapshot file (what `fsinfo --json` writes), for planning without Slurm."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from frenzy_slurm.cluster.backend import ComponentRequest, StartEstimate
from frenzy_slurm.cluster.model import ClusterView
from frenzy_slurm.errors import InputError
from frenzy_slurm.yamlfile import format_validation_error


class StaticBackend:
    name = "static"

    def __init__(self, path: Path):
        self.path = path
        self._view: ClusterView | None = None

    def load(self) -> ClusterView:
        if self._view is None:
            try:
                data = json.loads(self.path.read_text())
            except OSError as exc:
                raise InputError(f"{self.path}: cannot read snapshot ({exc.strerror}); write one with `fsinfo --json > FILE`.") from None
            except json.JSONDecodeError as exc:
                raise InputError(f"{self.path}:{exc.lineno}: not valid JSON: {exc.msg}.") from None
            if isinstance(data, dict):
                data.pop("summary", None)
            try:
                view = ClusterView.model_validate(data)
            except ValidationError as exc:
                raise InputError(format_validation_error(str(self.path), exc)) from None
            self._view = view.model_copy(update={"backend": self.name})
        return self._view

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        """From the snapshot: now if the GPUs were free, else when enough running jobs were due to end."""
        view = self.load()
        now = view.taken_at
        latest = now
        chosen: list[str] = []
        for c in components:
            nodes = [n for n in view.nodes if c.partition in n.partitions and (c.gpu_type in (None, n.gpu_type))
                     and n.available and n.gpus_total >= c.gpus_per_node]
            free_now = [n for n in nodes if n.gpus_free >= c.gpus_per_node]
            if len(free_now) >= c.nodes:
                chosen += [n.name for n in free_now[: c.nodes]]
                continue
            # when does each node free enough GPUs? running jobs end at their end_time
            ready = []
            for n in nodes:
                ends = sorted((j.end_time or now, j.gpus_per_node) for j in view.jobs
                              if j.phase == "running" and n.name in j.nodes and j.gpus_per_node)
                free, t = n.gpus_free if n.available else 0, now
                for end, g in ends:
                    if free >= c.gpus_per_node:
                        break
                    free, t = free + g, end
                if free >= c.gpus_per_node:
                    ready.append((t, n.name))
            ready.sort()
            if len(ready) < c.nodes:
                raise InputError(f"snapshot {self.path}: partition {c.partition} never has {c.nodes} node(s) with "
                                 f"{c.gpus_per_node} free {c.gpu_type or 'GPU'}s")
            latest = max(latest, ready[c.nodes - 1][0])
            chosen += [name for _, name in ready[: c.nodes]]
        return StartEstimate(start=latest, nodes=chosen, source="snapshot")
