"""The one model of when GPUs free up (`slurm.releases.GpuTimeline`), and its three users: the view's release
index (HAS, the static backend), the fake backend's estimates and the simulated controller."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from frenzy_slurm.sim.clusters import SimCluster, SimPartition
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.releases import GpuTimeline, ReleaseIndex
from frenzy_slurm.slurm.run import SlurmUnavailable
from frenzy_slurm.slurm.view import ClusterView, Job, Node, Partition

T0 = 1.8e9
INF = float("inf")


def test_windows_are_the_start_times_that_keep_the_gpus_free_for_the_duration():
    timeline = GpuTimeline({"n1": 8}, now=0.0)
    timeline.add("n1", 0.0, 100.0, 6)  # running: 2 free until 100
    timeline.add("n1", 300.0, 400.0, 8)  # reserved: none free in [300, 400)
    assert timeline.free("n1", 0.0, 50.0) == 2 and timeline.free("n1", 100.0, 300.0) == 8
    assert timeline.free("n1", 0, 500) == 0
    assert timeline.windows("n1", 2, 50.0) == [(0.0, 250.0), (400.0, INF)]
    assert timeline.windows("n1", 4, 50.0) == [(100.0, 250.0), (400.0, INF)]
    assert timeline.windows("n1", 4, 250.0) == [(400.0, INF)]  # the hole [100, 300) is too short


def test_earliest_picks_the_fullest_nodes_or_the_first_in_the_callers_order():
    timeline = GpuTimeline({"a": 8, "b": 8, "c": 8}, now=0.0)
    timeline.add("b", 0.0, 1000.0, 4)  # b has 4 free, a and c 8
    assert timeline.earliest([(1, 4)], [["a", "b", "c"]], 0.0, 60.0) == (0.0, [["b"]])  # best fit: the fullest
    assert timeline.earliest([(1, 4)], [["a", "b", "c"]], 0.0, 60.0, pick="first") == (0.0, [["a"]])
    assert timeline.earliest([(2, 8)], [["c", "b", "a"]], 0.0, 60.0, pick="first") == (0.0, [["c", "a"]])
    assert timeline.earliest([(3, 8)], [["a", "b", "c"]], 0.0, 60.0) == (1000.0, [["a", "b", "c"]])
    assert timeline.earliest([(3, 8)], [["a", "b", "c"]], 2000.0, 60.0) == (2000.0, [["a", "b", "c"]])  # not before
    assert timeline.earliest([(4, 1)], [["a", "b", "c"]], 0.0, 60.0) is None  # never 4 nodes


def test_a_hetjobs_components_start_together_on_different_nodes():
    timeline = GpuTimeline({"a": 8, "b": 8, "t": 4}, now=0.0)
    timeline.add("a", 0.0, 500.0, 8)
    timeline.add("t", 0.0, 900.0, 4)
    # one a-or-b node of 8 and the t node of 4: the t node frees last, so both start at 900 (a and b equally
    # full then: the caller's order)
    assert timeline.earliest([(1, 8), (1, 4)], [["a", "b"], ["t"]], 0.0, 60.0) == (900.0, [["a"], ["t"]])
    assert timeline.earliest([(1, 8), (1, 4)], [["a", "b"], ["t"]], 0.0, 60.0, pick="first") == (900.0, [["a"], ["t"]])
    # two 8-GPU components on the two nodes that can hold them: not before a frees at 500
    assert timeline.earliest([(1, 8), (1, 8)], [["a", "b"], ["a", "b"]], 0.0, 60.0, pick="first") == (
        500.0,
        [["a"], ["b"]],
    )


@pytest.mark.parametrize("seed", range(40))
def test_earliest_is_the_first_moment_enough_nodes_have_the_gpus_free_throughout(seed):
    """Against the definition: the first of now and the moments GPUs free up at which `nodes` nodes have
    `per_node` GPUs free for all of [t, t + duration) (integer times: no rounding)."""
    rng = random.Random(seed)
    names = [f"n{i}" for i in range(rng.randint(1, 6))]
    timeline = GpuTimeline({n: 8 for n in names}, now=100.0)
    for _ in range(rng.randint(0, 14)):
        s = float(rng.randrange(0, 2000, 50))
        timeline.add(rng.choice(names), s, s + rng.randrange(50, 1500, 50), rng.randint(1, 8))
    for _ in range(20):
        nodes, per_node = rng.randint(1, len(names)), rng.randint(1, 8)
        duration, not_before = float(rng.randrange(50, 1000, 50)), float(rng.randrange(0, 1500, 50))
        moments = sorted(
            {max(not_before, timeline.now)} | {e for ivs in timeline.busy.values() for _, e, _ in ivs if e > not_before}
        )
        want = next(
            (t for t in moments if sum(timeline.free(n, t, t + duration) >= per_node for n in names) >= nodes), None
        )
        got = timeline.earliest([(nodes, per_node)], [names], not_before, duration, pick="first")
        assert (got[0] if got else None) == want
        if got:
            assert all(timeline.free(n, got[0], got[0] + duration) >= per_node for n in got[1][0])


def _node(name: str, used: int) -> Node:
    return Node(
        name=name,
        partitions=["p"],
        state="mixed" if used else "idle",
        gpu_type="a100",
        gpus_total=8,
        gpus_used=used,
        cpus=64,
        memory_mb=512_000,
    )


def _job(job_id: int, state: str, gpus: int, minutes: int, nodes: list[str] | None = None, end: float | None = None):
    return Job(
        job_id=job_id,
        state=state,
        partition="p",
        nodes=nodes or [],
        node_count=1,
        gpu_type="a100",
        gpus_per_node=gpus,
        time_limit_min=minutes,
        start_time=int(T0 - 60) if end else None,
        end_time=int(end) if end else None,
    )


def test_a_reservation_ending_where_another_begins_leaves_the_gpus_between_them_free():
    """One node of 8: a running job holds 3 until +1 h; pending job 2 (7 GPUs) is planned at +1 h, pending job 3
    (2 GPUs, 1 h) in the hole before it. A new 1-GPU job of 2 h fits now: 3 GPUs are free before +1 h and 1
    after. The former per-node timeline applied job 2's start before job 3's end at +1 h and saw -1 free
    there, so it answered +1 h."""
    view = ClusterView(
        cluster="c",
        backend="static",
        taken_at=T0,
        nodes=[_node("n1", 3)],
        partitions=[Partition(name="p", nodes=["n1"], default_time_min=60)],
        jobs=[_job(1, "RUNNING", 3, 61, ["n1"], end=T0 + 3600), _job(2, "PENDING", 7, 60), _job(3, "PENDING", 2, 60)],
    )
    idx = ReleaseIndex(view, T0)
    assert idx.queued == 2 and idx.reserved == {"n1"}
    assert idx.timeline.busy["n1"] == [(T0, T0 + 3600, 3), (T0 + 3600, T0 + 7200, 7), (T0, T0 + 3600, 2)]
    assert idx.window("p", None, 1, 1, 7200) == (T0, ["n1"])
    assert idx.window("p", None, 1, 2, 7200) == (T0 + 7200, ["n1"])  # 2 GPUs: only after job 2


def test_gpus_the_view_counts_as_used_without_a_job_stay_used():
    view = ClusterView(
        cluster="c",
        backend="static",
        taken_at=T0,
        nodes=[_node("n1", 6)],
        partitions=[Partition(name="p", nodes=["n1"], default_time_min=60)],
        jobs=[_job(1, "RUNNING", 4, 60, ["n1"], end=T0 + 600)],
    )  # 2 more used by no listed job
    idx = ReleaseIndex(view, T0)
    assert idx.timeline.capacity == {"n1": 6} and idx.start("p", None, 1, 6) == T0 + 600
    assert idx.start("p", None, 1, 7) is None


def _request(gpus: int, minutes: int, nodes: int = 1) -> list[ComponentRequest]:
    return [ComponentRequest("p", None, nodes, gpus, minutes)]


def test_the_fake_estimates_fifo_on_the_engine():
    """Two nodes of 8. Running: 8 GPUs on n1 until +10 min (its limit; it would end sooner). Pending ahead: a
    16-GPU job, which waits for n1 and then holds both nodes for 30 min. A 4-GPU request starts after it (FIFO:
    no backfill into n2's free GPUs), on the first node of the partition."""
    view = ClusterView(
        cluster="c",
        backend="static",
        taken_at=T0,
        nodes=[_node("n1", 0), _node("n2", 0)],
        partitions=[Partition(name="p", nodes=["n1", "n2"], default_time_min=60)],
    )
    fake = FakeSlurm(view)
    run = fake.submit(BatchJob(script=Path("a"), workdir=Path("."), components=_request(8, 10))).job_id
    fake.set_run_time(run, 120)
    fake.advance(1)
    fake.submit(BatchJob(script=Path("b"), workdir=Path("."), components=_request(8, 30, nodes=2)))
    fake.advance(1)
    est = fake.expected_start(_request(4, 5))
    assert (est.start, est.nodes) == (T0 + 600 + 1800, ["n1"])
    # submitted at this same moment, the request sorts ahead of the pending job (as the fake always did)
    fresh = FakeSlurm(view, now=T0)
    fresh.submit(BatchJob(script=Path("a"), workdir=Path("."), components=_request(8, 10)))
    fresh.submit(BatchJob(script=Path("b"), workdir=Path("."), components=_request(8, 30, nodes=2)))
    assert fresh.expected_start(_request(4, 5)).start == T0


def test_the_three_users_agree_where_their_rules_do():
    """With no pending job and every running job at its limit, the fake's estimate, the simulator's `--test-only`
    estimate and the release index over either's view give the same start."""
    cluster = SimCluster(partitions=[SimPartition(name="p", gpu="A100-80GB", nodes=3, gpus_per_node=8)])
    sim = SimSlurm(cluster, now=0.0)
    for gpus, minutes in ((8, 30), (6, 90), (4, 60)):
        sim.submit(
            BatchJob(
                script=Path("x"), workdir=Path("."), components=[ComponentRequest("p", "a100_80gb", 1, gpus, minutes)]
            )
        )
    fake = FakeSlurm(sim.load(), now=0.0)
    for j in sorted(sim.jobs_by_id.values(), key=lambda j: j.job_id):
        fake.submit(BatchJob(script=Path("x"), workdir=Path("."), components=j.components))
    for nodes, gpus, minutes in ((1, 2, 10), (1, 4, 10), (1, 8, 10), (2, 8, 120), (3, 8, 10), (2, 4, 45)):
        req = [ComponentRequest("p", "a100_80gb", nodes, gpus, minutes)]
        from_sim, from_fake = sim.expected_start(req).start, fake.expected_start(req).start
        assert (
            from_sim
            == from_fake
            == ReleaseIndex(sim.load(), 0.0).start("p", None, nodes, gpus, minutes * 60.0)
            == ReleaseIndex(fake.load(), 0.0).start("p", None, nodes, gpus, minutes * 60.0)
        )
    assert fake.expected_start([ComponentRequest("p", None, 3, 8, 10)]).start == 90 * 60


def test_the_simulator_refuses_job_steps_and_has_no_gpu_accounting():
    sim = SimSlurm(SimCluster(partitions=[SimPartition(name="p", gpu="A100-80GB", nodes=1, gpus_per_node=8)]))
    from frenzy_slurm.slurm.view import PoolKey

    with pytest.raises(SlurmUnavailable, match="the sim backend simulates a cluster; it cannot run job steps"):
        sim.run_step(PoolKey("p", "a100_80gb"), 1, ["nvidia-smi"], 10.0)
    assert sim.gpu_memory_peaks([1]) is None
