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

from bisect import bisect_left
from collections.abc import Mapping, Sequence
from functools import lru_cache
from itertools import islice
from typing import Literal

from frenzy_slurm.slurm.view import ClusterView, Node, job_phase

INF = float("inf")
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
        # node -> gpus -> the maximal ranges [open, close) during which that many GPUs are free; a window for a
        # duration is such a range shortened by it, so a new duration (every job asks its own) costs no sweep
        self._runs: dict[str, dict[int, list[Window]]] = {}
        # node -> its usage profile from now on: the times at which its GPUs in use change, sorted, and the change
        # at each; kept up to date by add() (a reservation inserts two times), so the free ranges of every GPU
        # count are one pass over it, not a sort of the node's intervals each (issue 30)
        self._edges: dict[str, tuple[list[float], list[int]]] = {}

    def add(self, node: str, start: float, end: float, gpus: int) -> None:
        """`gpus` GPUs of `node` are busy during [start, end)."""
        self.busy[node].append((start, end, gpus))
        self._windows.pop(node, None)
        self._runs.pop(node, None)
        edges = self._edges.get(node)
        if edges is not None and end > self.now:
            _add_edge(edges, max(start, self.now), gpus)
            _add_edge(edges, end, -gpus)

    def reset(self, node: str, busy: list[tuple[float, float, int]]) -> None:
        """`node`'s busy intervals are `busy` (a copy is kept), as if added in that order."""
        self.busy[node] = list(busy)
        self._windows.pop(node, None)
        self._runs.pop(node, None)
        self._edges.pop(node, None)

    def profile(self, node: str) -> tuple[list[float], list[int]]:
        """(times, changes): from now on, `node`'s GPUs in use change by changes[i] at times[i] (sorted, each time
        once; intervals that end by now left out, those begun before it counted from now)."""
        edges = self._edges.get(node)
        if edges is None:
            by_time: dict[float, int] = {}
            for s, e, g in self.busy[node]:
                if e <= self.now:
                    continue
                s = max(s, self.now)
                by_time[s] = by_time.get(s, 0) + g
                by_time[e] = by_time.get(e, 0) - g
            times = sorted(by_time)
            edges = self._edges[node] = (times, [by_time[t] for t in times])
        return edges

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
        out = [(a, b - duration) for a, b in self.free_runs(node, gpus) if b - duration >= a]
        cached[key] = out
        return out

    def free_runs(self, node: str, gpus: int) -> list[Window]:
        """[(open, close)]: maximal ranges of time from now on with `gpus` GPUs of `node` free (close may be inf)."""
        runs = self._runs.get(node)
        if runs is None:
            runs = self._runs[node] = {}
        elif gpus in runs:
            return runs[gpus]
        out = runs[gpus] = _free_ranges(self.profile(node), self.capacity[node] - gpus, self.now)
        return out

    def _earliest_one(
        self, shape: Shape, names: Sequence[str], not_before: float, duration: float, pick: Pick
    ) -> tuple[float, list[list[str]]] | None:
        """earliest() for one component: one sweep finds the moment and the nodes whose windows hold it."""
        nodes, per_node = shape
        names = list(dict.fromkeys(names))  # a node named twice is one node
        if nodes == 1:  # from the free ranges: no window lists for this duration
            found = _first_one([self.free_runs(n, per_node) for n in names], not_before, duration)
        else:
            found = _first_covered_nodes(
                _windows_of([self.free_runs(n, per_node) for n in names], duration), nodes, not_before
            )
        if found is None:
            return None
        t, holding = found
        fits = [n for k, n in enumerate(names) if k in holding]  # in the caller's order
        if pick == "best-fit":  # the fullest nodes that still fit (cons_tres packs jobs), then node order
            fits.sort(key=lambda n: self.free(n, t, t + duration))
        return t, [fits[:nodes]]

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
        if len(shapes) == 1:  # one component: the first moment enough nodes fit is the answer
            return self._earliest_one(shapes[0], candidates[0], not_before, duration, pick)
        wins = [
            {n: self.windows(n, per_node, duration) for n in names}
            for (_, per_node), names in zip(shapes, candidates, strict=True)
        ]
        # several: nodes taken by one component are not the other's, so each moment is tried in turn
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


def _free_ranges(edges: tuple[list[float], list[int]], cap: int, now: float) -> list[Window]:
    """The maximal ranges from `now` on during which a profile (GpuTimeline.profile) has at most `cap` GPUs in use."""
    out: list[Window] = []
    used, open_at, ok = 0, now, cap >= 0
    for t, change in zip(*edges, strict=True):
        used += change
        if used <= cap:
            if not ok:  # a range opens at t
                open_at, ok = t, True
        elif ok:  # the range closes at t
            out.append((open_at, t))
            ok = False
    if ok:
        out.append((open_at, INF))
    return out


def _tail_and_longest(edges: tuple[list[float], list[int]], cap: int, now: float) -> tuple[float, float]:
    """(tail, longest) of `_free_ranges(edges, cap, now)` without building the ranges: where its range open to the
    end opens (inf: none) and the length of its longest closed range (-inf: none). The same walk, the same sums."""
    used, open_at, ok, longest = 0, now, cap >= 0, -INF
    for t, change in zip(*edges, strict=True):
        used += change
        if used <= cap:
            if not ok:  # a range opens at t
                open_at, ok = t, True
        elif ok:  # the range [open_at, t) closes
            if t - open_at > longest:
                longest = t - open_at
            ok = False
    return (open_at if ok else INF), longest


def _add_edge(edges: tuple[list[float], list[int]], t: float, change: int) -> None:
    """Add `change` GPUs in use from `t` on to a profile (GpuTimeline.profile), in place."""
    times, changes = edges
    i = bisect_left(times, t)
    if i < len(times) and times[i] == t:
        changes[i] += change
    else:
        times.insert(i, t)
        changes.insert(i, change)


def _first_one(runs: Sequence[list[Window]], not_before: float, duration: float) -> tuple[float, set[int]] | None:
    """_first_covered_nodes for one node, from each node's free ranges and without the sweep: a range [a, b)
    is the window [a, b - duration] where that is not empty (GpuTimeline.windows); a node's ranges are in time
    order, so its first window ending at or after not_before gives its earliest start, and the earliest of
    those is the moment. The nodes that can start then are those whose earliest start it is: none starts
    sooner, and a node's windows do not overlap (one pass per queued job of a deep queue: issue 30)."""
    starts = []
    for rs in runs:
        start = INF
        for a, b in rs:
            last = b - duration
            if last >= a and last >= not_before:
                start = a if a > not_before else not_before
                break
        starts.append(start)
    first = min(starts, default=INF)
    if first == INF:
        return None
    return first, {k for k, t in enumerate(starts) if t == first}


def _windows_of(runs: Sequence[list[Window]], duration: float) -> list[list[Window]]:
    """Each node's windows for `duration` from its free ranges (GpuTimeline.windows without keeping them: a
    queue of jobs, each with its own time limit, asks each duration once, so kept lists were built and dropped)."""
    return [[(a, b - duration) for a, b in rs if b - duration >= a] for rs in runs]


def _first_covered_nodes(wins: Sequence[list[Window]], nodes: int, not_before: float) -> tuple[float, set[int]] | None:
    """The earliest t >= not_before inside a window of at least `nodes` nodes (one sweep over the windows), and the
    positions (in `wins`, one list per node) of every node with a window holding t; a node's windows do not
    overlap, so the count at t is the number of nodes that can start at t."""
    events: list[tuple[float, int, int]] = []
    for k, ws in enumerate(wins):
        for a, b in ws:
            if b >= not_before:
                events.append((max(a, not_before), 0, k))  # 0 sorts first: a window is closed at both ends
                events.append((b, 1, k))
    events.sort()
    count = 0
    open_now: set[int] = set()
    found: float | None = None
    for t, kind, k in events:
        if found is not None and (t > found or kind == 1):
            break  # every window opening at the moment found is in: those open then are all that hold it
        if kind == 1:
            count -= 1
            open_now.discard(k)
            continue
        count += 1
        open_now.add(k)
        if found is None and count >= nodes:
            found = t
    return None if found is None else (found, open_now)


class PoolRuns:
    """One pool's tails and longest holes for one GPU count per node: what answers most questions without a sweep.

    In a deep queue a pool's nodes are booked far ahead: each node's free ranges are a few holes between
    reservations and a last range open to the end (its *tail*). A window of `duration` lies either in a hole at
    least that long or in a tail; where no node has such a hole (97% of the reservations of the benchmark's deep
    queue), the earliest start is the `nodes`-th earliest tail, found without a sweep. Otherwise the timeline's
    own sweep runs over the nodes' free ranges (GpuTimeline.free_runs, kept there until a node changes). A
    reservation changes a few nodes: only their tails and holes are taken anew (`dirty`), so a deep queue's
    reservations each cost the nodes they changed, not a pass over every node (issue 30). Nodes are positions in
    the pool's node list (by name, the order `ReleaseIndex` picks them; `position` maps a name to its own).
    """

    def __init__(self, timeline: GpuTimeline, names: list[str], per_node: int):
        self.timeline, self.names, self.per_node = timeline, names, per_node
        self.position = {name: k for k, name in enumerate(names)}
        self.tail = [INF] * len(names)  # where each node's range open to the end opens (inf: none)
        self.longest = [-INF] * len(names)  # each node's longest closed range, b - a (-inf: none)
        self.dirty: set[int] = set(range(len(names)))  # positions whose ranges changed in the timeline since

    def _refresh(self) -> None:
        # tail and longest straight from each node's profile: the ranges themselves are built (and kept by the
        # timeline) only where a hole is long enough to need the sweep, which a deep queue's reservations and
        # HAS's candidates rarely are (they were most of the objects a decision allocated, issue 30)
        timeline, per_node = self.timeline, self.per_node
        for k in self.dirty:
            name = self.names[k]
            self.tail[k], self.longest[k] = _tail_and_longest(
                timeline.profile(name), timeline.capacity[name] - per_node, timeline.now
            )
        self.dirty.clear()

    def earliest(self, nodes: int, duration: float, now: float) -> tuple[float, list[int]] | None:
        """The earliest t >= now at which `nodes` nodes each hold a free range covering [t, t + duration), and the
        first `nodes` positions that can start then: GpuTimeline.earliest's answer with pick "first".

        A closed range [a, b) holds the windows [max(a, now), b - duration] only if b - a >= duration; a tail
        holds every start from max(a, now) on. Where no closed range is that long, the nodes that can start at t
        are those whose tail starts by t: the sweep's moment is the `nodes`-th earliest of those starts, and the
        nodes it finds are all of them, of which the first `nodes` are taken."""
        if nodes > len(self.names):
            return None
        self._refresh()
        if max(self.longest) >= duration:  # a hole may hold the window: the timeline's own sweep
            runs = [self.timeline.free_runs(name, self.per_node) for name in self.names]
            if nodes == 1:
                found = _first_one(runs, now, duration)
            else:
                found = _first_covered_nodes(_windows_of(runs, duration), nodes, now)
            return None if found is None else (found[0], sorted(found[1])[:nodes])
        # a node's start is max(tail, now), which keeps the tails' order: the `nodes`-th earliest start is that of
        # the `nodes`-th earliest tail, and a node can start by t >= now exactly where its tail is by t
        kth = min(self.tail) if nodes == 1 else sorted(self.tail)[nodes - 1]
        t = kth if kth > now else now
        if t == INF:
            return None
        return t, list(islice((k for k, tail in enumerate(self.tail) if tail <= t), nodes))


@lru_cache(maxsize=256)
def _phase(state: str) -> str:
    """job_phase, kept per state string: a deep queue asks it of every job at every decision (issue 20)."""
    return job_phase(state)


def _base_signature(view: ClusterView) -> tuple:
    """What a ReleaseIndex takes from a view besides its pending jobs: the usable nodes and the running jobs."""
    nodes = []
    for n in view.nodes:
        if n.available:  # then Node.gpus_free is this (read without asking `available` again)
            nodes.append((n.name, max(0, n.gpus_total - n.gpus_used), n.gpus_total, tuple(n.partitions), n.gpu_type))
    running = tuple(
        (j.job_id, tuple(j.nodes), j.gpus_per_node, j.end_time)
        for j in view.jobs
        if j.gpus_per_node and _phase(j.state) == "running"
    )
    return tuple(nodes), running


def _pending_signature(view: ClusterView) -> list[tuple]:
    """The view's pending jobs with GPUs, in queue order, as a ReleaseIndex reserves them."""
    pending = sorted((j for j in view.jobs if j.gpus_per_node and _phase(j.state) == "pending"), key=lambda j: j.job_id)
    return [(j.job_id, j.partition, j.gpu_type, j.node_count, j.gpus_per_node, j.time_limit_min) for j in pending]


class ReleaseIndex:
    """Built once per view; answers "when do `nodes` nodes of this pool have `per_node` GPUs free for `duration`".

    The view's running jobs and pending queue, put into one `GpuTimeline`. A node's capacity there is what it
    has free now plus what its running jobs hold, so GPUs the view counts as used without a job to release
    them stay used.
    """

    def __init__(self, view: ClusterView, now: float, queue: bool = True):
        self.view, self.now = view, now
        self.nodes: dict[str, Node] = {n.name: n for n in view.nodes if n.available}
        # _base_signature(view), taken when extend() first compares a view with it: a decision from cold never
        # does (a tuple per node and running job); `self.view` has the same signature whenever it is taken
        # (extend adopts a view only where they are equal, and a view is not changed once read)
        self._base: tuple | None = None
        self._pending: list[tuple] = []  # the queue reserved so far, as _pending_signature lists it
        self._first_reservation = float("inf")  # the earliest start a pending job was given
        self._queue = queue
        held: dict[str, list[tuple[float, int]]] = {name: [] for name in self.nodes}  # (release time, GPUs)
        for j in view.jobs:
            if j.gpus_per_node and _phase(j.state) == "running":
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
        # each node's intervals before any reservation: the first this many of its busy list, which reservations
        # only append to (_refit resets a node to them); a count, not a copy of every node's list
        self._running = {name: len(ivs) for name, ivs in self.timeline.busy.items()}
        self._group: dict[str, int] | None = None  # partition -> its group of partitions sharing nodes (_groups)
        self._group_by_name: dict[str, int | None] = {}  # a pending job's partition list -> _group_of's answer
        self._first_in: dict[int | None, float] = {}  # group -> the earliest start a pending job was given there
        self._queued_in: dict[int | None, int] = {}  # group -> its pending jobs given a reservation
        self.queued = 0  # pending jobs given a reservation
        self.reserved: set[str] = set()  # nodes where a pending job holds GPUs in the timeline
        self._cache: dict[tuple, tuple[float, list[str]] | None] = {}
        # (partition, GRES type, GPUs per node) -> the pool's free ranges, kept up to date node by node (_touched)
        # as pending jobs are reserved; node -> the PoolRuns it is in (its position there: PoolRuns.position)
        self._pool_runs: dict[tuple, PoolRuns] = {}
        self._runs_of: dict[str, list[PoolRuns]] = {}
        self._names: dict[tuple, list[str]] = {}  # _pool_nodes' answers (the nodes do not change)
        self._in_partition: dict[str, list[Node]] | None = None  # partition -> its nodes, by name (_pool_nodes)
        if queue:
            self._reserve_pending()

    def _reserve_pending(self, pending: list[tuple] | None = None) -> None:
        """Reserve the view's pending jobs in queue order (or `pending`, the rest of that queue)."""
        if pending is None:
            pending = _pending_signature(self.view)
        for _, partitions, gpu_type, node_count, per_node, limit_min in pending:
            need = max(node_count, 1)
            duration = float(limit_min) * 60 if limit_min else PENDING_DEFAULT_LIMIT_S
            for partition in filter(None, partitions.split(",")):  # the first partition that can hold it
                found = self._earliest_kept(partition, gpu_type, need, per_node, duration)
                if found is not None:
                    t, names = found
                    for name in names:
                        self.reserved.add(name)
                        self.timeline.add(name, t, t + duration, per_node)
                        self._touched(name)
                    self.queued += 1
                    self._first_reservation = min(self._first_reservation, t)
                    group = self._groups().get(partition)
                    self._first_in[group] = min(self._first_in.get(group, INF), t)
                    self._queued_in[group] = self._queued_in.get(group, 0) + 1
                    break
        self._pending += pending
        self._cache.clear()

    def extend(self, view: ClusterView, now: float) -> bool:
        """Make this index that of `view` at `now` (True), where that is this index plus pending jobs queued behind
        its own; else leave it as it is (False: build a new one). A deep queue then costs each decision the jobs
        queued since the last one, not the whole queue again (issue 20).

        Why the result is the index `ReleaseIndex(view, now)` would build: the nodes, their free GPUs and the
        running jobs are the same (compared), and so are the pending jobs this index reserved, in the same queue
        order (a prefix of the new queue). Each was given the earliest window t >= the old now on the timeline
        of the running jobs and the reservations before it. Those timelines are the same from `now` on (a running
        job's interval starts at the index's now, and windows never open before the timeline's now), so for
        t >= now the same start times fit on the same nodes; the earliest fitting t >= now is then the old t
        wherever the old t >= now, which is checked for every reservation (the earliest of them). A job that fit
        nowhere fits nowhere still (that depends only on the pool's nodes). The jobs behind are reserved as a new
        index reserves them. The timeline keeps its older now and the free ranges it computed from it: the GPUs
        in use at any t >= the new now are the same either way, and every question starts at the index's now
        (not_before), so a range from the older now, cut there, is the range computed from the new one.
        """
        if not self._queue or now < self.now or self._first_reservation < now:
            return False
        if self._base is None:
            self._base = _base_signature(self.view)
        if _base_signature(view) != self._base:
            return False
        pending = _pending_signature(view)
        if pending[: len(self._pending)] != self._pending:
            return now == self.now and self._refit(view, pending)
        self.view = view
        self.nodes = {n.name: n for n in view.nodes if n.available}
        self.now = now  # the timeline keeps its own now and windows (see above)
        self._reserve_pending(pending[len(self._pending) :])
        return True

    def _groups(self) -> dict[str, int]:
        """Partition -> its group: partitions that share a node are one group. A pending job reserves GPUs only on
        nodes of its own partitions, so the reservations in one group never depend on the queue of another."""
        if self._group is None:
            parent: dict[str, str] = {}

            def root(p: str) -> str:
                while parent.setdefault(p, p) != p:
                    p = parent[p]
                return p

            for n in self.nodes.values():
                first = n.partitions[0] if n.partitions else None
                for p in n.partitions:
                    parent[root(p)] = root(first or p)
            roots = sorted({root(p) for p in parent})
            self._group = {p: roots.index(root(p)) for p in parent}
        return self._group

    def _refit(self, view: ClusterView, pending: list[tuple]) -> bool:
        """extend() where pending jobs left the queue or joined it anywhere, not only behind (the watcher decides
        each of a user's pending jobs on the view without it, issue 30): only the groups of partitions whose queue
        changed are reserved again, from their running jobs, in queue order; the others' reservations are those a
        new index would make, since a pending job reserves only nodes of its own partitions (_groups). A job
        naming partitions of several groups makes this give up (False: build a new index)."""
        old, new = self._by_group(self._pending), self._by_group(pending)
        if old is None or new is None:
            return False
        changed = {g for g in old.keys() | new.keys() if old.get(g) != new.get(g)}
        groups = self._groups()
        for name, node in self.nodes.items():
            if any(groups.get(p) in changed for p in node.partitions):
                self.timeline.reset(name, self.timeline.busy[name][: self._running[name]])
                self._touched(name)
                self.reserved.discard(name)
        for g in changed:
            self._first_in.pop(g, None)
            self.queued -= self._queued_in.pop(g, 0)
        self._first_reservation = min(self._first_in.values(), default=INF)
        self.view = view
        self._pending = []
        self._reserve_pending([job for job in pending if self._group_of(job) in changed])
        self._pending = pending
        return True

    def _group_of(self, job: tuple) -> int | None:
        """The group of the partitions a pending job names (None: none of the nodes'); -1 where several."""
        partitions = job[1]
        if partitions not in self._group_by_name:  # kept per partition list: a watcher pass asks it of the queue
            named = {self._groups().get(p) for p in filter(None, partitions.split(","))}  # twice per decision
            self._group_by_name[partitions] = next(iter(named), None) if len(named) <= 1 else -1
        return self._group_by_name[partitions]

    def _by_group(self, queue: list[tuple]) -> dict[int | None, list[tuple]] | None:
        out: dict[int | None, list[tuple]] = {}
        for job in queue:
            g = self._group_of(job)
            if g == -1:
                return None
            out.setdefault(g, []).append(job)
        return out

    def _pool_nodes(self, partition: str, gpu_type: str | None, per_node: int) -> list[str]:
        """The pool's nodes that can hold `per_node` GPUs, by name (the order windows pick them in)."""
        key = (partition, gpu_type, per_node)  # a few keys per pool: per_node is at most its GPUs per node
        if key not in self._names:
            if self._in_partition is None:  # each pool's nodes from its partition's, not from every node's
                self._in_partition = {}
                for name in sorted(self.nodes):
                    for p in set(self.nodes[name].partitions):  # a partition named twice is one
                        self._in_partition.setdefault(p, []).append(self.nodes[name])
            self._names[key] = [
                n.name
                for n in self._in_partition.get(partition, ())
                if gpu_type in (None, n.gpu_type) and n.gpus_total >= per_node
            ]
        return self._names[key]

    def _earliest(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration: float
    ) -> tuple[float, list[str]] | None:
        """The timeline's earliest window on the pool's nodes; the first nodes by name that fit then. What
        `_earliest_kept` answers, from the timeline's own search (the tests compare the two)."""
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
            self._cache[key] = self._earliest_kept(partition, gpu_type, nodes, per_node, max(duration_s, 1.0))
        return self._cache[key]

    def _earliest_kept(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration: float
    ) -> tuple[float, list[str]] | None:
        """_earliest from the pool's free ranges kept per node (`PoolRuns`): what HAS asks for every candidate and
        the index for every pending job it reserves (a deep queue made this most of a decision, issue 30)."""
        names = self._pool_nodes(partition, gpu_type, per_node)
        if len(names) < nodes:
            return None
        key = (partition, gpu_type, per_node)
        runs = self._pool_runs.get(key)
        if runs is None:
            runs = self._pool_runs[key] = PoolRuns(self.timeline, names, per_node)
            for name in names:
                self._runs_of.setdefault(name, []).append(runs)
        found = runs.earliest(nodes, duration, self.now)
        return None if found is None else (found[0], [names[k] for k in found[1]])

    def _touched(self, name: str) -> None:
        """`name`'s intervals in the timeline changed: the pools' kept free ranges take its new ones when next asked."""
        for runs in self._runs_of.get(name, ()):
            runs.dirty.add(runs.position[name])

    def start(
        self, partition: str, gpu_type: str | None, nodes: int, per_node: int, duration_s: float = 0.0
    ) -> float | None:
        found = self.window(partition, gpu_type, nodes, per_node, duration_s)
        return found[0] if found else None
