"""When GPUs free up: each node's running jobs' end times, turned into per-node ready times.

Used by the static backend's start estimates and by HAS for candidates that cannot start now.
"""

from __future__ import annotations

from frenzy_slurm.slurm.model import ClusterView


class ReleaseIndex:
    """Built once per view; answers "when do `nodes` nodes of this pool have `per_node` GPUs free"."""

    def __init__(self, view: ClusterView, now: float):
        self.view, self.now = view, now
        self.by_node: dict[str, list[tuple[float, int]]] = {}
        for j in view.jobs:
            if j.gpus_per_node and j.phase == "running":
                for n in j.nodes:
                    self.by_node.setdefault(n, []).append((max(now, float(j.end_time or now)), j.gpus_per_node))
        for ends in self.by_node.values():
            ends.sort()
        self._cache: dict[tuple[str, str | None, int], list[tuple[float, str]]] = {}

    def ready(self, partition: str, gpu_type: str | None, per_node: int) -> list[tuple[float, str]]:
        """(time, node) for every available node of the pool, sorted by when it has `per_node` GPUs free."""
        key = (partition, gpu_type, per_node)
        if key not in self._cache:
            out = []
            for n in self.view.nodes:
                if (partition not in n.partitions or gpu_type not in (None, n.gpu_type) or not n.available
                        or n.gpus_total < per_node):
                    continue
                free, t = n.gpus_free, self.now
                for end, g in self.by_node.get(n.name, ()):
                    if free >= per_node:
                        break
                    free, t = free + g, end
                if free >= per_node:
                    out.append((t, n.name))
            self._cache[key] = sorted(out)
        return self._cache[key]

    def start(self, partition: str, gpu_type: str | None, nodes: int, per_node: int) -> float | None:
        ready = self.ready(partition, gpu_type, per_node)
        return ready[nodes - 1][0] if len(ready) >= nodes else None
