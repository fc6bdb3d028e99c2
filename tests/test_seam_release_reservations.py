"""The release index's kept per-pool free ranges (`PoolRuns`) and the timeline's kept usage profile answer as a
brute-force computation on the intervals does, on random timelines and queues (issue 30 made both incremental).

The brute force asks `GpuTimeline.free` (the peak of the intervals over a span, summed afresh) at every moment a
window can open: now and every end of an interval. It shares no code with the free ranges, the profile or the
sweeps it checks."""

from __future__ import annotations

import random

from frenzy_slurm.sim.synthetic import synthetic, with_queue
from frenzy_slurm.slurm.releases import (
    INF,
    PENDING_DEFAULT_LIMIT_S,
    GpuTimeline,
    PoolRuns,
    ReleaseIndex,
    _tail_and_longest,
)
from frenzy_slurm.slurm.view import ClusterView

POOLS = [("a100", "A100-80GB", 6, 8), ("v100", "V100-32GB", 5, 8), ("t4", "T4", 8, 4)]
NOW = 1.8e9


def _brute_earliest(
    timeline: GpuTimeline, names: list[str], nodes: int, per_node: int, duration: float, now: float
) -> tuple[float, list[str]] | None:
    """The earliest moment (now or an interval's end) at which `nodes` of `names` have `per_node` GPUs free for
    `duration`, and the first of them by position."""
    moments = sorted({now} | {e for n in names for _, e, _ in timeline.busy[n] if e > now})
    for t in moments:
        fits = [n for n in names if timeline.free(n, t, t + duration) >= per_node]
        if len(fits) >= nodes:
            return t, fits[:nodes]
    return None


def _random_timeline(rng: random.Random, nodes: int) -> GpuTimeline:
    """Nodes of 4 or 8 GPUs with random busy intervals: some begun before now, some ending by it, holes of every
    length between them."""
    caps = {f"n{i:02d}": rng.choice((4, 8)) for i in range(nodes)}
    timeline = GpuTimeline(caps, NOW)
    for name, cap in caps.items():
        t = NOW - rng.choice((0.0, 600.0, 7200.0))
        for _ in range(rng.randrange(0, 7)):
            start = t + rng.choice((0.0, 0.0, 60.0, 900.0, 3600.0, 20000.0))
            end = start + rng.choice((60.0, 600.0, 3600.0, 14400.0, 86400.0))
            timeline.add(name, start, end, rng.randint(1, cap))
            t = rng.choice((start, end))  # overlapping or one after another
    return timeline


def test_kept_pool_ranges_answer_as_the_brute_force_on_random_timelines():
    rng = random.Random(30)
    tails = holes = 0
    for _ in range(40):
        timeline = _random_timeline(rng, rng.randrange(1, 9))
        names = sorted(timeline.capacity)
        for per_node in (1, 2, 4, 8):
            runs = PoolRuns(timeline, names, per_node)
            for nodes in range(1, len(names) + 1):
                for duration in (1.0, 60.0, 600.0, 3600.0, 5000.0, 86400.0, 1e6):
                    found = runs.earliest(nodes, duration, NOW)
                    got = None if found is None else (found[0], [names[k] for k in found[1]])
                    assert got == _brute_earliest(timeline, names, nodes, per_node, duration, NOW)
                    by_hole = max(runs.longest) >= duration
                    holes += by_hole and found is not None
                    tails += not by_hole and found is not None
        # a node's ranges kept across a change: only the nodes marked dirty are taken anew
        runs = PoolRuns(timeline, names, 2)
        runs.earliest(1, 600.0, NOW)
        for _ in range(5):
            name = rng.choice(names)
            start = NOW + rng.choice((0.0, 300.0, 5000.0))
            timeline.add(name, start, start + rng.choice((600.0, 7200.0)), rng.randint(1, 4))
            runs.dirty.add(names.index(name))
            for nodes in (1, 2):
                found = runs.earliest(nodes, 1200.0, NOW)
                got = None if found is None else (found[0], [names[k] for k in found[1]])
                assert got == _brute_earliest(timeline, names, nodes, 2, 1200.0, NOW)
    assert tails > 100 and holes > 100  # both ways to an answer were taken


def test_the_kept_usage_profile_is_the_one_built_afresh():
    rng = random.Random(31)
    for _ in range(30):
        timeline = _random_timeline(rng, 3)
        for name in timeline.capacity:
            timeline.profile(name)  # kept from here on: later intervals are inserted into it
        for _ in range(6):
            name = rng.choice(sorted(timeline.capacity))
            start = NOW + rng.choice((-600.0, 0.0, 60.0, 3600.0))
            timeline.add(name, start, start + rng.choice((0.0, 60.0, 600.0, 3600.0)), rng.randint(1, 4))
        fresh = GpuTimeline(timeline.capacity, NOW)
        for name, busy in timeline.busy.items():
            fresh.reset(name, busy)
            assert timeline.profile(name) == fresh.profile(name)
            for gpus in (1, 3, 4, 8):
                assert timeline.free_runs(name, gpus) == fresh.free_runs(name, gpus)


def test_tail_and_longest_are_those_of_the_free_ranges():
    """PoolRuns takes each node's tail and longest hole straight from its profile, without the ranges: the same
    numbers as the ranges give, on random timelines, for every GPU count (some above the node's, no range)."""
    rng = random.Random(33)
    seen = set()
    for _ in range(60):
        timeline = _random_timeline(rng, 4)
        for name, cap in timeline.capacity.items():
            for gpus in range(1, 10):
                ranges = timeline.free_runs(name, gpus)
                tail = next((a for a, b in ranges if b == INF), INF)
                longest = max((b - a for a, b in ranges if b != INF), default=-INF)
                got = _tail_and_longest(timeline.profile(name), cap - gpus, NOW)
                assert got == (tail, longest)
                seen.add((tail == INF, longest == -INF))
    # with a tail and with or without a closed range, and neither (more GPUs than the node has); every interval
    # ends, so a node that can hold the GPUs at all has a tail
    assert seen == {(False, False), (False, True), (True, True)}


def _brute_reservations(view: ClusterView) -> GpuTimeline:
    """The view's pending jobs reserved in queue order as ReleaseIndex documents it, each at the brute-force
    earliest window on the first of its partitions that can hold it, on the running jobs' timeline."""
    index = ReleaseIndex(view, view.taken_at, queue=False)  # the running jobs only
    timeline = index.timeline
    pending = sorted((j for j in view.jobs if j.state == "PENDING" and j.gpus_per_node), key=lambda j: j.job_id)
    for j in pending:
        duration = float(j.time_limit_min) * 60 if j.time_limit_min else PENDING_DEFAULT_LIMIT_S
        for partition in filter(None, j.partition.split(",")):
            names = index._pool_nodes(partition, j.gpu_type, j.gpus_per_node)
            need = max(j.node_count, 1)
            found = (
                _brute_earliest(timeline, names, need, j.gpus_per_node, duration, view.taken_at)
                if len(names) >= need
                else None
            )
            if found is not None:
                for name in found[1]:
                    timeline.add(name, found[0], found[0] + duration, j.gpus_per_node)
                break
    return timeline


def test_an_index_reserves_a_random_queue_as_the_brute_force_does_and_answers_as_it():
    rng = random.Random(32)
    for seed in range(6):
        view = with_queue(synthetic(POOLS, busy=rng.choice((0.3, 0.7, 1.0)), seed=seed), POOLS, 45, seed=seed)
        index = ReleaseIndex(view, view.taken_at)
        brute = _brute_reservations(view)
        assert index.timeline.busy == brute.busy
        for partition, gpu, _, gpn in POOLS:
            gres = gpu.lower().replace("-", "_")
            for per_node in sorted({1, 2, gpn // 2, gpn}):
                names = index._pool_nodes(partition, gres, per_node)
                for nodes in (1, 2, 3, 5):
                    for duration in (60.0, 1800.0, 3600.0, 14400.0, 86400.0):
                        want = _brute_earliest(brute, names, nodes, per_node, duration, view.taken_at)
                        assert index.window(partition, gres, nodes, per_node, duration) == want
