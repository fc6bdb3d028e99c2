"""When GPUs free up: the one model of per-node GPU use over time, and the view's queue planned on it.

`GpuTimeline` is the engine. Per node it keeps busy intervals `[start, end)` of some GPUs out of the node's
capacity, and answers "when can these components (one, or a hetjob's several) start together, each node
holding its GPUs for the whole duration, and on which nodes". A window can only open now or when GPUs
free up, so that is where it looks; all components of a request share one start time. Every question
of the kind "which GPUs free up when" in the code is asked of it:
- `ReleaseIndex` (below): a ClusterView's running jobs and pending queue, for HAS (every candidate) and
  the static backend's start estimates;
- `slurm.fake.FakeSlurm.expected_start`: priority FIFO over the running jobs' time limits;
- `sim.slurm.SimSlurm`: the simulated controller's backfill passes and start estimates.
What differs between them is only what they put into the timeline and how a component picks among the nodes
that fit (`pick`): the fullest first, as Slurm's cons_tres packs jobs (the simulator), or the first in the
caller's order (the fake: partition order; the index: node name).

ReleaseIndex: running jobs free their GPUs at their end times. Pending jobs are ahead of any new
submission: each is given, in queue order (job id, as FIFO priority), the earliest window of its time
limit on nodes of its partition and GPU type, as Slurm's backfill scheduler plans them, and holds those
GPUs for that window. A new request then starts at the earliest time that enough nodes have the GPUs free
for its whole duration (so it may also start in a hole before a reservation, as backfill allows).
Without pending jobs this reduces to "when running jobs end"; `sbatch --test-only` itself ignores the
pending queue, which is why HAS's view-based estimate is kept when it is later than Slurm's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from frenzy_slurm.slurm.view import ClusterView, Node

PENDING_DEFAULT_LIMIT_S = 3600.0  # a pending job without a time limit holds its GPUs this long in the timeline

Window = tuple[float, float]  # (first, last) start time of a window; last may be inf
Shape = tuple[int, int]  # one component's (nodes, GPUs per node)
Pick = Literal["best-fit", "first"]


class GpuTimeline:
    """Per-node busy intervals (start, end, GPUs) over each node's capacity; start times are searched on them.

    For a request of g GPUs for d seconds, each node's *windows* are the ranges of start times at which g
    GPUs stay free for all of [t, t + d); they are computed once per node and request shape and kept until
    the node's intervals change, so a pass over a long queue stays linear in the nodes.
    """

    def __init__(self, capacity: Mapping[str, int], now: float):
        self.capacity = dict(capacity)  # node -> GPUs the timeline may hand out there
        self.now = now
        self.busy: dict[str, list[tuple[float, float, int]]] = {n: [] for n in self.capacity}
        self._windows: dict[str, dict[tuple[int, float], list[Window]]] = {}  # node -> (gpus, duration) -> windows

    def add(self, node: str, start: float, end: float, gpus: int) -> None:
        """`gpus` GPUs of `node` are busy during [start, end)."""
        self.busy[node].append((start, end, gpus))
        self._windows.pop(node, None)

    def free(self, node: str, t0: float, t1: float) -> int:
        """GPUs of `node` free during all of [t0, t1)."""
        ivs = [iv for iv in self.busy[node] if iv[0] < t1 and iv[1] > t0]
        if not ivs:
            return self.capacity[node]
        points = [t0] + [s for s, _, _ in ivs if s > t0]
        peak = max(sum(g for s, e, g in ivs if s <= p < e) for p in points)
        return self.capacity[node] - peak

    def windows(self, node: str, gpus: int, duration: float) -> list[Window]:
        """[(first, last)] start times at which `gpus` GPUs stay free for `duration` (last may be inf)."""
        cached = self._windows.setdefault(node, {})
        key = (gpus, duration)
        if key in cached:
            return cached[key]
        cap = self.capacity[node] - gpus
        edges: dict[float, int] = {}
        for s, e, g in self.busy[node]:
            if e <= self.now:
                continue
            s = max(s, self.now)
            edges[s] = edges.get(s, 0) + g
            edges[e] = edges.get(e, 0) - g
        out: list[Window] = []
        used, open_at = 0, self.now
        for t in sorted(edges):
            was_ok = used <= cap
            used += edges[t]
            ok = used <= cap
            if was_ok and not ok:  # a window closes at t
                if t - duration >= open_at:
                    out.append((open_at, t - duration))
            elif ok and not was_ok:
                open_at = t
        if used <= cap:
            out.append((open_at, float("inf")))
        cached[key] = out
        return out

    def earliest(
        self,
        shapes: Sequence[Shape],
        candidates: Sequence[Sequence[str]],
        not_before: float,
        duration: float,
        pick: Pick = "best-fit",
    ) -> tuple[float, list[list[str]]] | None:
        """The earliest common start (>= not_before) of all components and the nodes each gets, or None if never.

        `candidates[k]` are the nodes component k may use, in the caller's order; no node serves two
        components. `pick`: "best-fit" takes the fullest nodes that still fit (ties in the caller's order),
        "first" the first that fit in the caller's order.
        """
        wins = [
            {n: self.windows(n, per_node, duration) for n in names}
            for (_, per_node), names in zip(shapes, candidates, strict=True)
        ]
        if len(shapes) == 1:  # one component: the first moment enough nodes fit is the answer
            first = _first_covered(wins[0], shapes[0][0], not_before)
            times = [first] if first is not None else []
        else:  # several: nodes taken by one component are not the other's, so each moment is tried in turn
            times = sorted({a for w in wins for ws in w.values() for a, _ in ws} | {not_before})
        for t in times:
            if t < not_before:
                continue
            taken: set[str] = set()
            chosen: list[list[str]] = []
            for (nodes, _), w in zip(shapes, wins, strict=True):
                fits = [n for n, ws in w.items() if n not in taken and any(a <= t <= b for a, b in ws)]
                if len(fits) < nodes:
                    break
                if pick == "best-fit":  # the fullest nodes that still fit (cons_tres packs jobs), then node order
                    fits.sort(key=lambda n: self.free(n, t, t + duration))
                chosen.append(fits[:nodes])
                taken.update(chosen[-1])
            else:
                return t, chosen
        return None


def _first_covered(wins: Mapping[str, list[Window]], nodes: int, not_before: float) -> float | None:
    """The earliest t >= not_before inside a window of at least `nodes` nodes (one sweep over the windows);
    a node's windows do not overlap, so the count at t is the number of nodes that can start at t."""
    events: list[tuple[float, int]] = []
    for ws in wins.values():
        for a, b in ws:
            if b >= not_before:
                events.append((max(a, not_before), 0))  # 0 sorts first: a window is closed at both ends
                events.append((b, 1))
    events.sort()
    count = 0
    for t, kind in events:
        if kind == 1:
            count -= 1
            continue
        count += 1
        if count >= nodes:
            return t
    return None


class ReleaseIndex:
    """Built once per view; answers "when do `nodes` nodes of this pool have `per_node` GPUs free for `duration`".

    The view's running jobs and pending queue, put into one `GpuTimeline`. A node's capacity there is what it
    has free now plus what its running jobs hold, so GPUs the view counts as used without a job to release
    them stay used.
    """

    def __init__(self, view: ClusterView, now: float, queue: bool = True):
        self.view, self.now = view, now
        self.nodes: dict[str, Node] = {n.name: n for n in view.nodes if n.available}
        held: dict[str, list[tuple[float, int]]] = {name: [] for name in self.nodes}  # (release time, GPUs)
        for j in view.jobs:
            if j.gpus_per_node and j.phase == "running":
                for name in j.nodes:
                    if name in held:
                        held[name].append((max(now, float(j.end_time or now)), j.gpus_per_node))
        self.timeline = GpuTimeline(
            {name: n.gpus_free + sum(g for _, g in held[name]) for name, n in self.nodes.items()}, now
        )
        for name, releases in held.items():
            for end, gpus in releases:
                if end > now:
                    self.timeline.add(name, now, end, gpus)
        self.queued = 0  # pending jobs given a reservation
        self.reserved: set[str] = set()  # nodes where a pending job holds GPUs in the timeline
        self._cache: dict[tuple, tuple[float, list[str]] | None] = {}
        self._names: dict[tuple, list[str]] = {}  # _pool_nodes' answers (the nodes do not change)
        if queue:
            self._reserve_pending()

    def _reserve_pending(self) -> None:
        pending = sorted(
            (j for j in self.view.jobs if j.phase == "pending" and j.gpus_per_node), key=lambda j: j.job_id
        )
        for j in pending:
            need = max(j.node_count, 1)
            duration = float(j.time_limit_min) * 60 if j.time_limit_min else PENDING_DEFAULT_LIMIT_S
            for partition in filter(None, j.partition.split(",")):  # the first partition that can hold it
                found = self._earliest(partition, j.gpu_type, need, j.gpus_per_node, duration)
                if found is not None:
                    t, names = found
                    for name in names:
                        self.reserved.add(name)
                        self.timeline.add(name, t, t + duration, j.gpus_per_node)
                    self.queued += 1
                    break
        self._cache.clear()

    def _pool_nodes(self, partition: str, gpu_type: str | None, per_node: int) -> list[str]:
        """The pool's nodes that can hold `per_node` GPUs, by name (the order windows pick them in)."""
        key = (partition, gpu_type, per_node)  # a few keys per pool: per_node is at most its GPUs per node
        if key not in self._names:
            self._names[key] = sorted(
                name
                for name, n in self.nodes.items()
                if partition in n.partitions and gpu_type in (None, n.gpu_type) and n.gpus_total >= per_node
            )
        return self._names[key]

    def _earliest(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration: float
    ) -> tuple[float, list[str]] | None:
        """The timeline's earliest window on the pool's nodes; the first nodes by name that fit then."""
        names = self._pool_nodes(partition, gpu_type, per_node)
        if len(names) < nodes:
            return None
        found = self.timeline.earliest([(nodes, per_node)], [names], self.now, duration, pick="first")
        return None if found is None else (found[0], found[1][0])

    def has_reservations(self, partition: str, gpu_type: str | None) -> bool:
        """Whether pending jobs hold GPUs of this pool in the timeline (free now is then not enough)."""
        return bool(self.reserved.intersection(self._pool_nodes(partition, gpu_type, 1)))

    def window(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration_s: float = 0.0
    ) -> tuple[float, list[str]] | None:
        """(start, node names) of the earliest window, or None if the pool never has that many nodes."""
        if not self.reserved.intersection(self._pool_nodes(partition, gpu_type, per_node)):
            duration_s = 0.0  # GPUs only ever free up there: the window's length does not matter
        key = (partition, gpu_type, nodes, per_node, round(duration_s))
        if key not in self._cache:
            self._cache[key] = self._earliest(partition, gpu_type, nodes, per_node, max(duration_s, 1.0))
        return self._cache[key]

    def start(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration_s: float = 0.0
    ) -> float | None:
        found = self.window(partition, gpu_type, nodes, per_node, duration_s)
        return found[0] if found else None
