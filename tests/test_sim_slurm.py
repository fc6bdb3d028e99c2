"""The simulated Slurm on hand-made cases with known answers: FIFO, backfill (Slurm's and EASY),
node-granular GRES, hetjobs starting together, time limits, --test-only style estimates."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.sim.clusters import SimCluster, SimPartition, load_cluster, parse_compact
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.run import SlurmCommandError

MIN = 60.0


def cluster(*parts: tuple[str, int, int]) -> SimCluster:
    return SimCluster(partitions=[SimPartition(name=n, gpu="A100-80GB", nodes=k, gpus_per_node=g) for n, k, g in parts])


class Run:
    """A SimSlurm whose jobs run for the minutes given at submission."""

    def __init__(self, c: SimCluster, **kw):
        self.runs: dict[int, float] = {}
        self.sim = SimSlurm(c, now=0.0, outcome=lambda j: (self.runs[j.job_id], "COMPLETED"), **kw)

    def submit(self, run_min: float, *comps: tuple[str, int, int, int]) -> int:
        """comps: (partition, nodes, GPUs per node, time limit in minutes)."""
        jid = self.sim.next_job_id
        self.runs[jid] = run_min * MIN
        reqs = [
            ComponentRequest(partition=p, gpu_type="a100_80gb", nodes=n, gpus_per_node=g, time_min=t)
            for p, n, g, t in comps
        ]
        got = self.sim.submit(BatchJob(script=Path("x.sbatch"), workdir=Path("."), components=reqs, name=f"j{jid}"))
        assert got.job_id == jid
        return jid

    def job(self, jid: int):
        return self.sim.jobs_by_id[jid]

    def finish(self):
        while self.sim.next_end() is not None:
            self.sim.advance(self.sim.next_end())


def test_fifo_waits_for_the_true_end_not_the_limit():
    r = Run(cluster(("p", 2, 4)))
    a = r.submit(30, ("p", 2, 4, 60))
    b = r.submit(10, ("p", 1, 4, 60))
    assert r.job(a).start == 0 and r.job(b).state == "PENDING"
    r.finish()
    assert r.job(b).start == 30 * MIN  # A ended early; B started then, not at A's limit
    assert r.job(b).end == 40 * MIN and r.job(b).state == "COMPLETED"


def test_backfill_starts_a_short_job_that_does_not_delay_the_reservation():
    r = Run(cluster(("p", 2, 4)))
    j1 = r.submit(100, ("p", 1, 4, 100))
    j2 = r.submit(10, ("p", 2, 4, 10))  # needs both nodes: reserved at 100 min
    j3 = r.submit(50, ("p", 1, 4, 50))  # fits on node 2 before 100 min: backfilled now
    j4 = r.submit(10, ("p", 1, 4, 200))  # would hold node 2 past 100 min: waits
    assert r.job(j1).start == 0 and r.job(j3).start == 0
    assert r.job(j2).planned_start == 100 * MIN and r.job(j4).state == "PENDING"
    r.finish()
    assert r.job(j2).start == 100 * MIN
    assert r.job(j4).start == 110 * MIN  # after j2, FIFO between the two


def test_slurm_backfill_reserves_for_every_job_easy_only_for_the_first():
    def scenario(reserve):
        r = Run(cluster(("p", 2, 4)), reserve=reserve)
        r.submit(100, ("p", 1, 4, 100))  # node 1 until 100
        r.submit(50, ("p", 2, 2, 50))  # 2 GPUs on both nodes: [100, 150)
        j3 = r.submit(50, ("p", 2, 4, 50))  # both nodes whole: [150, 200) if reserved
        j4 = r.submit(160, ("p", 1, 2, 160))  # 2 GPUs on node 2 for [0, 160): clashes only with j3
        return r, j3, j4

    r, j3, j4 = scenario(None)
    assert r.job(j4).state == "PENDING" and r.job(j3).planned_start == 150 * MIN
    r, j3, j4 = scenario(1)
    assert r.job(j4).state == "RUNNING" and r.job(j4).start == 0  # EASY: only the first blocked job is protected
    r.finish()
    assert r.job(j3).start == 160 * MIN  # ... and j3 is delayed by it


def test_gpus_are_allocated_per_node():
    r = Run(cluster(("p", 2, 4)))
    r.submit(60, ("p", 1, 3, 60))
    r.submit(30, ("p", 1, 3, 60))
    want = r.submit(5, ("p", 1, 2, 10))  # 2 GPUs free in total, but one on each node
    assert r.job(want).state == "PENDING"
    r.finish()
    assert r.job(want).start == 30 * MIN
    assert r.sim.timeline[0] == (0.0, 6)


def test_hetjob_components_start_together_and_others_backfill_around_it():
    r = Run(cluster(("a", 1, 4), ("b", 1, 4)))
    r.submit(60, ("a", 1, 4, 60))
    het = r.submit(10, ("a", 1, 4, 20), ("b", 1, 4, 20))
    short = r.submit(30, ("b", 1, 4, 30))  # b is free until the hetjob's start at 60 min
    long = r.submit(30, ("b", 1, 4, 90))
    assert r.job(het).state == "PENDING" and r.job(short).start == 0 and r.job(long).state == "PENDING"
    jobs = r.sim.jobs([het])
    assert [j.het_job_offset for j in jobs] == [0, 1] and all(j.het_job_id == het for j in jobs)
    r.finish()
    assert r.job(het).start == 60 * MIN and r.job(het).nodes == [["a-1"], ["b-1"]]
    assert r.job(long).start == 70 * MIN  # the hetjob ran 10 of its 20 minutes


def test_time_limit_ends_a_job_as_timeout():
    r = Run(cluster(("p", 1, 4)))
    j = r.submit(120, ("p", 1, 4, 60))
    r.finish()
    assert r.job(j).state == "TIMEOUT" and r.job(j).end == 60 * MIN


def test_estimates_as_test_only_ignore_the_queue_backfill_ones_do_not():
    for estimates, expected in (("test-only", 60 * MIN), ("backfill", 100 * MIN)):
        r = Run(cluster(("p", 1, 4)), estimates=estimates)
        r.submit(60, ("p", 1, 4, 60))
        r.submit(40, ("p", 1, 4, 40))  # pending, planned at 60 min
        est = r.sim.expected_start([ComponentRequest("p", "a100_80gb", 1, 4, 30)])
        assert est.start == expected and est.nodes == ["p-1"]


def test_requests_the_partition_cannot_hold_are_refused():
    r = Run(cluster(("p", 1, 4)))
    with pytest.raises(SlurmCommandError):
        r.submit(1, ("p", 2, 4, 10))
    with pytest.raises(SlurmCommandError):
        r.sim.expected_start([ComponentRequest("p", "a100_80gb", 1, 8, 10)])


def test_view_reports_nodes_and_running_jobs_with_limit_ends():
    r = Run(cluster(("p", 2, 4)))
    r.submit(30, ("p", 1, 4, 60))
    view = r.sim.load()
    assert [n.gpus_used for n in view.nodes] == [4, 0]
    (job,) = view.jobs
    assert job.phase == "running" and job.end_time == 3600 and job.nodes == ["p-1"]
    pools = view.pools()
    assert pools[0].gpus_total == 8 and pools[0].gpus_free == 4


def test_cluster_compact_form_and_errors():
    c = parse_compact("A100-80GB:2x8,V100-32GB:4x8,T4:4x4")
    assert c.gpus == 64 and [p.name for p in c.partitions] == ["a10080gb", "v10032gb", "t4"]
    assert c.site().pool("t4", "t4").gpus_per_node == 4
    with pytest.raises(InputError, match="GPU:NODESxGPUS"):
        parse_compact("A100:2")
    with pytest.raises(InputError, match="not in the catalog"):
        parse_compact("Z9000:2x8")
    with pytest.raises(InputError, match="no such file"):
        load_cluster("missing.yaml")


def test_with_a_backfill_interval_freed_gpus_wait_for_the_next_pass():
    r = Run(cluster(("p", 1, 4)), sched_interval_s=30.0)
    first = r.submit(1.5, ("p", 1, 4, 10))  # ends at 90 s
    second = r.submit(1, ("p", 1, 4, 10))
    third = r.submit(1, ("p", 1, 4, 10))
    assert r.job(first).start == 0  # a submission is tried at once
    r.finish()
    # the first pass strictly after the end (a job ending on a pass is still completing then, as observed
    # on the devcluster: see docs/simulation.md)
    assert r.job(second).start == 120.0
    assert r.job(third).start == 210.0  # second ended at 180 s


def test_a_cluster_copied_from_a_view_has_the_same_partitions():
    c = parse_compact("A100-80GB:2x8,T4:3x4")
    copy = SimCluster.from_view(SimSlurm(c).load(), c.site())
    assert [(p.name, p.gpu, p.nodes, p.gpus_per_node, p.gres) for p in copy.partitions] == [
        (p.name, p.gpu, p.nodes, p.gpus_per_node, p.gres) for p in c.partitions
    ]


def test_cluster_yaml_file_and_its_errors(tmp_path):
    good = tmp_path / "c.yaml"
    good.write_text(
        "name: lab\npartitions:\n  - {name: a100, gpu: A100-80GB, nodes: 2, gpus_per_node: 8}\n"
        "  - {name: t4, gpu: T4, nodes: 3, gpus_per_node: 4, gres_type: tesla_t4, max_time_min: 60}\n"
    )
    c = load_cluster(str(good))
    assert c.gpus == 28 and c.partitions[1].gres == "tesla_t4"
    assert SimSlurm(c).load().partition("t4").max_time_min == 60
    bad = tmp_path / "bad.yaml"
    bad.write_text("partitions:\n  - {name: a100, gpu: A100-80GB, nodes: 0, gpus_per_node: 8}\n")
    with pytest.raises(InputError, match=r"bad.yaml:2.*nodes"):
        load_cluster(str(bad))
