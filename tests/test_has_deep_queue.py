"""HAS on a deep queue: what makes a decision cheap gives the answers the plain computation gives.

- `GpuTimeline.windows` comes from per-node free ranges cached across durations: compared with the sweep it
  replaced, on random intervals;
- `ReleaseIndex.extend` (the last decision's index plus the jobs queued since) against a new index of the same
  view, on a simulated cluster with a queue, and where it must refuse;
- the simulated controller's cached view records and --test-only timeline against fresh ones;
- a whole simulation with the index kept between decisions against one that builds it for every decision.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from frenzy_slurm.has.kept import Kept
from frenzy_slurm.sim import ErrorModel, load_workload, parse_compact
from frenzy_slurm.sim.clusters import SimCluster, SimPartition
from frenzy_slurm.sim.metrics import summarize
from frenzy_slurm.sim.runner import Runner
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.synthetic import synthetic, with_queue
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.releases import GpuTimeline, ReleaseIndex

INF = float("inf")
# workloads sampled from the Philly trace (sample_philly(trace, SEED, JOBS)), shipped so that a checkout without
# ../shared/data runs these tests; tests/test_sim_shipped_workloads.py checks them against the trace where it is
WORKLOADS = Path(__file__).parent / "data" / "sim"


def _sweep_windows(busy: list[tuple[float, float, int]], capacity: int, now: float, gpus: int, duration: float):
    """The windows as GpuTimeline computed them before the free ranges were cached (one sweep per duration)."""
    cap = capacity - gpus
    edges: dict[float, int] = {}
    for s, e, g in busy:
        if e <= now:
            continue
        s = max(s, now)
        edges[s] = edges.get(s, 0) + g
        edges[e] = edges.get(e, 0) - g
    out, used, open_at = [], 0, now
    for t in sorted(edges):
        was_ok = used <= cap
        used += edges[t]
        ok = used <= cap
        if was_ok and not ok:
            if t - duration >= open_at:
                out.append((open_at, t - duration))
        elif ok and not was_ok:
            open_at = t
    if used <= cap:
        out.append((open_at, INF))
    return out


def test_windows_from_cached_free_ranges_equal_the_sweep_for_every_duration():
    rng = random.Random(7)
    for _ in range(300):
        now = rng.choice([0.0, 50.0])
        timeline = GpuTimeline({"n": 8}, now)
        busy = []
        for _ in range(rng.randrange(0, 7)):
            s = rng.uniform(0, 500)
            iv = (s, s + rng.uniform(1, 300), rng.randrange(1, 9))
            busy.append(iv)
            timeline.add("n", *iv)
            for gpus in (1, 4, 8):  # asked between adds: the cache must follow each add
                assert timeline.windows("n", gpus, 30.0) == _sweep_windows(busy, 8, now, gpus, 30.0)
        for gpus in (1, 2, 4, 8):
            for duration in (1.0, 60.0, 120.0, 1000.0):
                assert timeline.windows("n", gpus, duration) == _sweep_windows(busy, 8, now, gpus, duration)


def _cluster() -> SimCluster:
    return SimCluster(
        name="deep",
        partitions=[
            SimPartition(name="a100", gpu="A100-80GB", nodes=4, gpus_per_node=8, gres_type="a100"),
            SimPartition(name="t4", gpu="T4", nodes=3, gpus_per_node=4, gres_type="t4"),
        ],
    )


def _job(i: int, partition: str, nodes: int, per_node: int, minutes: int) -> BatchJob:
    comp = ComponentRequest(
        partition=partition, gpu_type=partition, nodes=nodes, gpus_per_node=per_node, time_min=minutes
    )
    return BatchJob(script=Path(f"j{i}/job.sbatch"), workdir=Path(f"j{i}"), components=[comp], name=f"j{i}")


def _queries(index: ReleaseIndex) -> list:
    out = []
    for part, per_nodes in (("a100", (1, 2, 4, 8)), ("t4", (1, 2, 4))):
        for nodes in (1, 2, 3):
            for per_node in per_nodes:
                for minutes in (10, 60, 600):
                    out.append(index.window(part, part, nodes, per_node, minutes * 60.0))
        out.append(index.has_reservations(part, part))
    return out + [index.queued, sorted(index.reserved)]


def test_an_extended_index_answers_as_a_new_index_of_the_same_view():
    sim = SimSlurm(_cluster(), now=0.0)
    rng = random.Random(3)
    shapes = [("a100", 1, 8), ("a100", 2, 8), ("a100", 1, 2), ("a100", 1, 4), ("t4", 1, 4), ("t4", 2, 4), ("t4", 1, 1)]
    for i in range(12):  # fills the cluster: most of these run, the rest wait
        part, nodes, per_node = rng.choice(shapes)
        sim.submit(_job(i, part, nodes, per_node, rng.choice([30, 90, 240])))
    index = ReleaseIndex(sim.load(), sim.now)
    assert index.queued > 0  # there is a queue to keep
    extended = 0
    for i in range(12, 40):
        sim.now += rng.choice([0.0, 5.0, 20.0])  # the clock moves, no job ends in this time
        part, nodes, per_node = rng.choice(shapes)
        sim.submit(_job(i, part, nodes, per_node, rng.choice([30, 90, 240])))
        view = sim.load()
        fresh = ReleaseIndex(view, sim.now)
        if index.extend(view, sim.now):
            extended += 1
        else:
            index = ReleaseIndex(view, sim.now)
        assert _queries(index) == _queries(fresh)
    assert extended >= 20  # most decisions reuse the index: jobs only queued behind it


def test_the_indexs_kept_ranges_find_the_windows_the_timeline_finds():
    rng = random.Random(11)
    shapes = [("a100", 1, 8), ("a100", 2, 4), ("a100", 1, 2), ("t4", 1, 4), ("t4", 2, 2), ("t4", 1, 1)]
    compared = 0
    for seed in range(6):
        sim = SimSlurm(_cluster(), now=0.0)
        for i in range(rng.randrange(5, 30)):
            part, nodes, per_node = rng.choice(shapes)
            sim.submit(_job(i, part, nodes, per_node, rng.choice([10, 45, 120, 300])))
            if rng.random() < 0.2:
                sim.advance(sim.now + rng.uniform(0, 3000))
        index = ReleaseIndex(sim.load(), sim.now + seed)
        for part, per_nodes in (("a100", (1, 2, 3, 4, 8)), ("t4", (1, 2, 4))):
            for nodes in (1, 2, 3, 4):
                for per_node in per_nodes:
                    for duration in (1.0, 600.0, 3600.0, 7200.5, 20000.0):
                        fast = index._earliest_kept(part, part, nodes, per_node, duration)
                        assert fast == index._earliest(part, part, nodes, per_node, duration)
                        compared += fast is not None and fast[0] > index.now  # a start after some end
    assert compared > 50


def test_an_index_is_not_extended_where_a_new_one_would_differ():
    sim = SimSlurm(_cluster(), now=0.0)
    for i in range(6):
        sim.submit(_job(i, "a100", 4, 8, 60))  # one runs on all A100 nodes, five wait behind it
    index = ReleaseIndex(sim.load(), sim.now)
    assert index.queued == 5
    assert index.extend(sim.load(), sim.now)  # the same view: nothing new to reserve
    assert not index.extend(sim.load(), sim.now - 1.0)  # the clock went back
    assert not index.extend(sim.load(), 3601.0)  # past the first reservation (the running job's end, 3600)
    sim.advance(3600.0)  # the running job ends, the next starts: the running jobs differ
    assert not index.extend(sim.load(), sim.now)
    assert not ReleaseIndex(sim.load(), sim.now, queue=False).extend(sim.load(), sim.now)  # built without a queue


def test_an_index_compares_its_own_views_running_jobs_the_first_time_it_is_extended():
    """The index takes its view's signature (nodes, running jobs) only when extend() first asks for it: that is
    still the signature of the view it was built from, whatever view extend() is first given."""
    sim = SimSlurm(_cluster(), now=0.0)
    for i in range(6):
        sim.submit(_job(i, "a100", 4, 8, 60))
    built_on = sim.load()
    index = ReleaseIndex(built_on, sim.now)
    sim.advance(3600.0)  # the running job ends, the next starts
    assert not index.extend(sim.load(), sim.now)  # refused: other running jobs, though asked first with them
    assert index.extend(built_on, 0.0)  # its own view still is the index's (nothing new to reserve)


def test_a_pools_nodes_are_those_of_its_partition_type_and_size_by_name():
    """ReleaseIndex groups the nodes by partition once; each pool filters its partition's: the same nodes in the
    same order as a pass over every node, with nodes in several partitions (one named twice) and one drained."""
    pools = [("a100", "A100-80GB", 4, 8), ("t4", "T4", 5, 4)]
    view = with_queue(synthetic(pools, busy=0.5, seed=3), pools, 20, seed=3)
    extra = {"a100-2": ["a100", "shared"], "t4-3": ["shared", "t4", "shared"], "t4-5": ["t4", "shared"]}
    nodes = [n.model_copy(update={"partitions": extra.get(n.name, n.partitions)}) for n in view.nodes]
    nodes[0] = nodes[0].model_copy(update={"state": "drained"})
    view = view.model_copy(update={"nodes": nodes})
    index = ReleaseIndex(view, view.taken_at)
    for partition in ("a100", "t4", "shared", "none"):
        for gpu_type in (None, "a100_80gb", "t4"):
            for per_node in (1, 4, 8):
                want = sorted(
                    n.name
                    for n in view.nodes
                    if n.available
                    and partition in n.partitions
                    and gpu_type in (None, n.gpu_type)
                    and n.gpus_total >= per_node
                )
                assert index._pool_nodes(partition, gpu_type, per_node) == want


def test_the_simulated_controllers_cached_view_and_estimates_equal_fresh_ones():
    sim = SimSlurm(_cluster(), now=0.0)
    rng = random.Random(5)
    for i in range(30):
        sim.submit(_job(i, "a100", rng.choice([1, 2]), rng.choice([2, 4, 8]), rng.choice([20, 60])))
        if i % 5 == 4:
            sim.advance(sim.now + 1500.0)
        view = sim.load()
        sim._node_records.clear()  # built anew below
        sim._job_records.clear()
        sim._partitions = None
        assert view.model_dump() == sim.load().model_dump()
        req = [ComponentRequest(partition="a100", gpu_type="a100", nodes=2, gpus_per_node=8, time_min=60)]
        cached = sim.expected_start(req)
        sim._test_timeline = None
        assert cached == sim.expected_start(req)


def test_a_simulation_keeping_the_index_between_decisions_decides_as_one_building_it_each_time(monkeypatch):
    cluster = parse_compact("A100-80GB:2x8,V100-32GB:2x8,T4:2x4")
    wl = load_workload(WORKLOADS / "philly-seed2-80.yaml")  # arriving 6x faster than 48 GPUs serve them: a long queue

    def run():
        r = Runner(wl, cluster, "has", 2, load=6.0, errors=ErrorModel(truth="published"), plain_share=0.3).run()
        return [(x.id, x.label, x.components, x.jct, x.state) for x in r.records], r

    kept, r = run()
    assert summarize(r)["queue_max"] >= 20  # a queue deep enough for the index to be kept and extended
    monkeypatch.setattr(Kept, "release_index", lambda self, view, now: ReleaseIndex(view, now))
    fresh, _ = run()
    assert kept == fresh


@pytest.mark.parametrize("policy", ["has-homogeneous"])
def test_the_kept_index_serves_several_decisions_on_one_view(policy, monkeypatch):
    """Decisions that reuse the kept index (extended view to view) are those made with a fresh index each time."""
    cluster = parse_compact("A100-80GB:1x8,T4:1x4")
    wl = load_workload(WORKLOADS / "philly-seed4-30.yaml")
    runs = []
    for fresh in (False, True):
        if fresh:
            monkeypatch.setattr(Kept, "release_index", lambda self, view, now: ReleaseIndex(view, now))
        r = Runner(wl, cluster, policy, 4, load=4.0, errors=ErrorModel(truth="published")).run()
        runs.append([(x.id, x.label, x.jct) for x in r.records])
    assert runs[0] == runs[1]


def test_the_kept_search_of_a_job_shape_is_the_search_with_the_jobs_own_steps():
    from frenzy_slurm.has import Requirements
    from frenzy_slurm.has.kept import SearchKey
    from frenzy_slurm.has.pools import usable_pools
    from frenzy_slurm.jobspec import load_job_spec, resolve_model
    from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
    from frenzy_slurm.marp.candidates import search
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    examples = Path(__file__).resolve().parent.parent / "examples"
    pools_spec = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8)]
    spec = load_job_spec(examples / "gpt2-medium.yaml")
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"gpu_types": None})})
    w, space = workload_from_spec(spec, resolve_model(spec, examples)), search_space_from_spec(spec)
    req = Requirements.from_spec(spec)
    pools, _ = usable_pools(req, synthetic(pools_spec, busy=0.5, seed=1), synthetic_site(pools_spec))
    options = [p.option for p in pools]
    kept = Kept()

    def kept_search(global_batch: int, steps: int) -> dict:
        key = SearchKey.of(w, options, global_batch, req.max_gpus, space)
        return kept.search(key, steps, lambda: search(w, options, global_batch, steps, req.max_gpus, space))

    first = kept_search(req.global_batch, 100)
    assert first == search(w, options, req.global_batch, 100, req.max_gpus, space)
    again = kept_search(req.global_batch, 250)  # from the cache
    assert len(kept.searches) == 1
    direct = search(w, options, req.global_batch, 250, req.max_gpus, space)
    assert again == direct and again != first
    assert [c.run_time_s for cs in again.values() for c in cs] == [c.run_time_s for cs in direct.values() for c in cs]
    other = kept_search(req.global_batch * 2, 250)  # another shape
    assert len(kept.searches) == 2 and other == search(w, options, req.global_batch * 2, 250, req.max_gpus, space)
