"""When GPUs free up, queue included: per-node GPU timelines from running jobs and the pending queue.

Running jobs free their GPUs at their end times. Pending jobs are ahead of any new submission: each is
given, in queue order (job id, as FIFO priority), the earliest window of its time limit on nodes of its
partition and GPU type, as Slurm's backfill scheduler plans them, and holds those GPUs for that
window. A new request then starts at the earliest time that enough nodes have the GPUs free for its
whole duration (so it may also start in a hole before a reservation, as backfill allows).

Without pending jobs this reduces to "when running jobs end"; `sbatch --test-only` itself ignores the
pending queue, which is why HAS's view-based estimate is kept when it is later than Slurm's.
Used by HAS for every candidate and by the static backend's start estimates.
"""

from __future__ import annotations

import bisect

from frenzy_slurm.slurm.model import ClusterView, Node

PENDING_DEFAULT_LIMIT_S = 3600.0  # a pending job without a time limit holds its GPUs this long in the plan


class _Timeline:
    """One node's free GPUs over time: free now, then changes (+ at an end, - at a reservation)."""

    def __init__(self, free_now: int):
        self.free_now = free_now
        self.times: list[float] = []
        self.deltas: list[int] = []

    def add(self, t: float, delta: int) -> None:
        i = bisect.bisect_right(self.times, t)
        self.times.insert(i, t)
        self.deltas.insert(i, delta)

    def min_free(self, t0: float, t1: float) -> int:
        """The fewest GPUs free at any moment of [t0, t1)."""
        free = self.free_now
        i = 0
        while i < len(self.times) and self.times[i] <= t0:
            free += self.deltas[i]
            i += 1
        low = free
        while i < len(self.times) and self.times[i] < t1:
            free += self.deltas[i]
            low = min(low, free)
            i += 1
        return low


class ReleaseIndex:
    """Built once per view; answers "when do `nodes` nodes of this pool have `per_node` GPUs free for `duration`"."""

    def __init__(self, view: ClusterView, now: float, queue: bool = True):
        self.view, self.now = view, now
        self.nodes: dict[str, Node] = {n.name: n for n in view.nodes if n.available}
        self.lines: dict[str, _Timeline] = {name: _Timeline(n.gpus_free) for name, n in self.nodes.items()}
        for j in view.jobs:
            if j.gpus_per_node and j.phase == "running":
                for name in j.nodes:
                    if name in self.lines:
                        self.lines[name].add(max(now, float(j.end_time or now)), j.gpus_per_node)
        self.queued = 0  # pending jobs given a reservation
        self.reserved: set[str] = set()  # nodes where a pending job holds GPUs in the plan
        self._cache: dict[tuple, tuple[float, list[str]] | None] = {}
        self._names: dict[tuple, list[str]] = {}  # _pool_nodes' answers (the nodes do not change)
        if queue:
            self._reserve_pending()

    def _reserve_pending(self) -> None:
        pending = sorted((j for j in self.view.jobs if j.phase == "pending" and j.gpus_per_node),
                         key=lambda j: j.job_id)
        for j in pending:
            need = max(j.node_count, 1)
            duration = float(j.time_limit_min) * 60 if j.time_limit_min else PENDING_DEFAULT_LIMIT_S
            for partition in filter(None, j.partition.split(",")):  # the first partition that can hold it
                found = self._earliest(partition, j.gpu_type, need, j.gpus_per_node, duration)
                if found is not None:
                    t, names = found
                    for name in names:
                        self.reserved.add(name)
                        self.lines[name].add(t, -j.gpus_per_node)
                        self.lines[name].add(t + duration, j.gpus_per_node)
                    self.queued += 1
                    break
        self._cache.clear()

    def _pool_nodes(self, partition: str, gpu_type: str | None, per_node: int) -> list[str]:
        key = (partition, gpu_type, per_node)  # a few keys per pool: per_node is at most its GPUs per node
        if key not in self._names:
            self._names[key] = [name for name, n in self.nodes.items() if partition in n.partitions
                                and gpu_type in (None, n.gpu_type) and n.gpus_total >= per_node]
        return self._names[key]

    def _earliest(self, partition: str, gpu_type: str | None, nodes: int, per_node: int,
                  duration: float) -> tuple[float, list[str]] | None:
        names = self._pool_nodes(partition, gpu_type, per_node)
        if len(names) < nodes:
            return None
        if not self.reserved.intersection(names):
            return self._earliest_releases_only(names, nodes, per_node)
        return self._earliest_scan(names, nodes, per_node, duration)

    def _earliest_releases_only(self, names: list[str], nodes: int, per_node: int) -> tuple[float, list[str]] | None:
        """`_earliest_scan`'s answer where no pending job holds GPUs on these nodes: GPUs then only free up,
        so each node has `per_node` free from one moment on (now, or one of its release times) for any
        duration, and the window opens when the `nodes`-th node is ready."""
        ready: dict[str, float] = {}
        for name in names:
            line = self.lines[name]
            free, i = line.free_now, 0
            while i < len(line.times) and line.times[i] <= self.now:
                free += line.deltas[i]
                i += 1
            if free >= per_node:
                ready[name] = self.now
                continue
            while i < len(line.times):
                free += line.deltas[i]
                if free >= per_node:
                    ready[name] = line.times[i]
                    break
                i += 1
        if len(ready) < nodes:
            return None
        t = sorted(ready.values())[nodes - 1]
        return t, sorted(name for name, at in ready.items() if at <= t)[:nodes]

    def _earliest_scan(self, names: list[str], nodes: int, per_node: int,
                       duration: float) -> tuple[float, list[str]] | None:
        # a window can only open now or when some GPUs of the pool are freed
        times = sorted({self.now, *(t for n in names for t, d in zip(self.lines[n].times, self.lines[n].deltas)
                                   if d > 0 and t > self.now)})
        for t in times:
            fits = [n for n in names if self.lines[n].min_free(t, t + duration) >= per_node]
            if len(fits) >= nodes:
                return t, sorted(fits)[:nodes]
        return None

    def has_reservations(self, partition: str, gpu_type: str | None) -> bool:
        """Whether pending jobs hold GPUs of this pool in the plan (free now is then not enough)."""
        return bool(self.reserved.intersection(self._pool_nodes(partition, gpu_type, 1)))

    def window(self, partition: str, gpu_type: str | None, nodes: int, per_node: int,
               duration_s: float = 0.0) -> tuple[float, list[str]] | None:
        """(start, node names) of the earliest window, or None if the pool never has that many nodes."""
        if not self.reserved.intersection(self._pool_nodes(partition, gpu_type, per_node)):
            duration_s = 0.0  # GPUs only ever free up there: the window's length does not matter
        key = (partition, gpu_type, nodes, per_node, round(duration_s))
        if key not in self._cache:
            self._cache[key] = self._earliest(partition, gpu_type, nodes, per_node, max(duration_s, 1.0))
        return self._cache[key]

    def start(self, partition: str, gpu_type: str | None, nodes: int, per_node: int,
              duration_s: float = 0.0) -> float | None:
        found = self.window(partition, gpu_type, nodes, per_node, duration_s)
        return found[0] if found else None
