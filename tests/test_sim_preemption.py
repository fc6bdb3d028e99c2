"""QOS preemption in the simulated Slurm and the opt-in preemptible mode of `has-preempt` that uses it.

The simulated site: `PreemptType=preempt/qos`, `PreemptMode=REQUEUE`, a preemptible QOS that every other job
may preempt once the job has run `PreemptExemptTime` (`preempt_exempt_s`)."""

from __future__ import annotations

from pathlib import Path

from frenzy_slurm.sim import ErrorModel, parse_compact, simulate
from frenzy_slurm.sim.clusters import SimCluster, SimPartition
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, Placement
from frenzy_slurm.sim.policies import HasPreempt, make_policy
from frenzy_slurm.sim.runner import Runner
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.truth import Truth
from frenzy_slurm.sim.workload import WorkloadFile, WorkloadJob
from frenzy_slurm.site.config import Preemption
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest

MIN = 60.0


class Site:
    """One partition of A100 nodes; jobs run for the minutes given at submission."""

    def __init__(self, nodes: int = 1, gpus: int = 4, exempt_min: float | None = 20.0):
        c = SimCluster(partitions=[SimPartition(name="p", gpu="A100-80GB", nodes=nodes, gpus_per_node=gpus)])
        self.runs: dict[int, float] = {}
        self.sim = SimSlurm(
            c,
            outcome=lambda j: (self.runs[j.job_id], "COMPLETED"),
            preempt_exempt_s=None if exempt_min is None else exempt_min * MIN,
        )

    def submit(self, run_min: float, gpus: int, preemptible: bool = False, since: float | None = None) -> int:
        jid = self.sim.next_job_id
        self.runs[jid] = run_min * MIN
        req = ComponentRequest(partition="p", gpu_type="a100_80gb", nodes=1, gpus_per_node=gpus, time_min=600)
        job = BatchJob(script=Path("x.sbatch"), workdir=Path("."), components=[req], name=f"j{jid}")
        assert self.sim.submit_as(job, preemptible=preemptible, queued_since=since).job_id == jid
        return jid

    def state(self, jid: int) -> str:
        return self.sim.jobs_by_id[jid].state


def test_a_job_outside_the_preemptible_qos_preempts_one_that_has_run_its_exempt_time():
    s = Site()
    long = s.submit(600, 4, preemptible=True)
    s.sim.advance(10 * MIN)
    short = s.submit(30, 2)
    assert s.state(short) == "PENDING"  # inside PreemptExemptTime (20 min): it waits
    s.sim.advance(20 * MIN)  # nothing ends here: the next submission's pass preempts
    s.sim.schedule()
    assert s.state(long) == "PREEMPTED" and s.sim.jobs_by_id[long].end == 20 * MIN
    assert s.state(short) == "RUNNING" and s.sim.jobs_by_id[short].start == 20 * MIN
    assert s.sim.preemptions == 1


def test_a_multi_partition_job_preempts_in_a_partition_listed_before_one_that_is_free():
    # Slurm tries a job's partitions in order, each without and then with preemption: a plain user's
    # `sbatch -p fast,slow` whose fast partition is held by a preemptible job that has run its exempt time
    # preempts it there rather than starting on the free slow one; where nothing is preemptible it takes the slow
    c = SimCluster(
        partitions=[
            SimPartition(name="fast", gpu="H100-SXM", nodes=1, gpus_per_node=4),
            SimPartition(name="slow", gpu="T4", nodes=1, gpus_per_node=4),
        ]
    )

    def req(part: str, gres: str) -> ComponentRequest:
        return ComponentRequest(partition=part, gpu_type=gres, nodes=1, gpus_per_node=4, time_min=600)

    for exempt_s, want in ((20 * MIN, ("fast", "PREEMPTED")), (None, ("slow", "RUNNING"))):
        sim = SimSlurm(c, outcome=lambda j: (600 * MIN, "COMPLETED"), preempt_exempt_s=exempt_s)
        held = sim.submit_as(
            BatchJob(script=Path("a.sbatch"), workdir=Path("."), components=[req("fast", "h100_sxm")], name="held"),
            preemptible=True,
        ).job_id
        sim.advance(30 * MIN)
        job = BatchJob(script=Path("m.sbatch"), workdir=Path("."), components=[req("fast", "h100_sxm")], name="m")
        multi = sim.submit_any(job, [[req("slow", "t4")]]).job_id
        got = sim.jobs_by_id[multi]
        assert got.state == "RUNNING" and (got.components[0].partition, sim.jobs_by_id[held].state) == want


def test_preemptible_jobs_never_preempt_and_a_site_without_preemption_never_does():
    s = Site()
    first = s.submit(600, 4, preemptible=True)
    s.sim.advance(60 * MIN)
    second = s.submit(30, 2, preemptible=True)  # also in the preemptible QOS: waits like any job
    s.sim.schedule()
    assert s.state(first) == "RUNNING" and s.state(second) == "PENDING"
    off = Site(exempt_min=None)  # PreemptType=preempt/none
    a = off.submit(600, 4, preemptible=True)
    off.sim.advance(60 * MIN)
    b = off.submit(30, 2)
    assert off.state(a) == "RUNNING" and off.state(b) == "PENDING" and off.sim.preemptions == 0


def test_only_as_many_jobs_as_the_node_needs_are_preempted_the_youngest_first():
    s = Site()
    old = s.submit(600, 2, preemptible=True)
    s.sim.advance(5 * MIN)
    young = s.submit(600, 2, preemptible=True)
    s.sim.advance(60 * MIN)
    s.submit(30, 2)
    assert s.state(young) == "PREEMPTED" and s.state(old) == "RUNNING" and s.sim.preemptions == 1


def test_a_requeued_job_keeps_its_place_in_the_queue():
    s = Site()
    s.submit(60, 4)  # the node for an hour
    s.sim.advance(10 * MIN)
    later = s.submit(30, 4)  # queued at 10 min
    s.sim.advance(20 * MIN)
    requeued = s.submit(30, 4, since=5 * MIN)  # a job preempted and requeued: queued since 5 min
    s.sim.advance(60 * MIN)
    assert s.state(requeued) == "RUNNING" and s.state(later) == "PENDING"


def _workload() -> WorkloadFile:
    jobs = [
        WorkloadJob(
            id=0, submit_s=0, model="gpt2-medium", precision="bf16-mixed", seq_len=1024, global_batch=64, steps=40000
        ),
        *(
            WorkloadJob(
                id=i, submit_s=3600 * i, model="gpt2", precision="bf16-mixed", seq_len=1024, global_batch=16, steps=300
            )
            for i in range(1, 4)
        ),
    ]
    return WorkloadFile(jobs=jobs)


def test_has_preempt_runs_long_jobs_preemptible_and_a_preempted_job_finishes_every_step():
    # a site that lets a preemptible job take the whole pool: the short jobs can start only by preempting it
    wide = {"has_preempt_max_job_share": 1.0}
    r = simulate(_workload(), parse_compact("A100-80GB:1x4"), "has-preempt", seed=1, load=None, knobs=wide)
    by_id = {x.id: x for x in r.records}
    assert all(x.state == "done" for x in r.records)
    assert r.extra["preempted"] >= 1  # the long job (preemptible: over an hour) made way for the short ones
    assert by_id[0].attempts >= 2 and by_id[0].run_s > 0
    # nothing is preempted under has, whose jobs are never in the preemptible QOS
    plain = simulate(_workload(), parse_compact("A100-80GB:1x4"), "has", seed=1, load=None)
    assert plain.extra["preempted"] == 0


def test_a_preemptible_job_may_take_more_of_a_pool_than_max_job_share():
    cluster = parse_compact("A100-80GB:1x8,T4:1x4")
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="bf16-mixed", seq_len=1024, global_batch=64, steps=200000
    )
    a = Attempt(job, job.steps)
    narrow = make_policy("has").place(a, Context(SimSlurm(cluster), cluster.site(), Truth(ErrorModel.exact(), 1)))
    policy = HasPreempt(preemption=Preemption(qos="preemptible", min_run_min=60, max_job_share=1.0))
    wide = policy.place(a, Context(SimSlurm(cluster), cluster.site(), Truth(ErrorModel.exact(), 1)))
    assert narrow is not None and wide is not None
    assert narrow.gpus <= 4 < wide.gpus  # the site's max_job_share (0.5) holds has's job to half the pool
    assert policy.preemptible(a, wide)
    short = Attempt(job, 10)  # predicted well under an hour: not preemptible, so decided within the share
    placed = policy.place(short, Context(SimSlurm(cluster), cluster.site(), Truth(ErrorModel.exact(), 1)))
    assert placed is not None and not policy.preemptible(short, placed) and placed.gpus <= 4


def test_a_preemptible_job_grows_into_idle_gpus_only_while_nothing_waits_and_stays_preemptible():
    cluster = parse_compact("A100-80GB:1x8,T4:1x4")
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="bf16-mixed", seq_len=1024, global_batch=64, steps=20000
    )
    a = Attempt(job, job.steps)
    preemption = Preemption(qos="preemptible", min_run_min=60, max_job_share=0.5)

    def started(move_share: float | None) -> tuple[HasPreempt, SimSlurm, Context, int, Placement]:
        sim = SimSlurm(cluster)
        ctx = Context(sim, cluster.site(), Truth(ErrorModel.exact(), 1))
        policy = HasPreempt(preemption=preemption.model_copy(update={"move_share": move_share}))
        p = policy.place(a, ctx)
        assert p is not None and p.gpus == 4 and policy.preemptible(a, p)  # half the pool: the share
        batch = BatchJob(
            script=Path("x.sbatch"), workdir=Path("."), components=[c.request for c in p.components], name="j"
        )
        jid = sim.submit(batch).job_id
        sim.advance(10 * MIN)
        return policy, sim, ctx, jid, p

    policy, sim, ctx, jid, p = started(1.0)
    ((moved, there),) = policy.move(ctx, [(jid, a, p, 0.0, 18_000)])
    assert moved == jid and there.gpus == 8
    # predicted under min_run_min (60) on 8 GPUs, but the job was admitted to the preemptible QOS and keeps it:
    # a job outside it could not otherwise take back the GPUs it grew into
    assert there.step_time_s * a.steps < 60 * MIN and policy.preemptible(a, there)
    # the site's share holds it where the watcher is not allowed to grow it
    policy, sim, ctx, jid, p = started(None)
    assert policy.move(ctx, [(jid, a, p, 0.0, 18_000)]) == []
    # while any job waits (here for the T4s) the idle A100s are not given to the running job: the waiting job may
    # be re-planned onto them, and growth that a later preemption undoes costs two restarts
    policy, sim, ctx, jid, p = started(1.0)
    for name in ("t1", "t2"):
        t4 = ComponentRequest(partition="t4", gpu_type="t4", nodes=1, gpus_per_node=4, time_min=600)
        sim.submit(BatchJob(script=Path("x.sbatch"), workdir=Path("."), components=[t4], name=name))
    assert [j.state for j in sim.load().jobs].count("PENDING") == 1
    assert policy.move(ctx, [(jid, a, p, 0.0, 18_000)]) == []


def test_the_watcher_knob_turns_off_moves_then_re_planning():
    full, pending, none = (make_policy("has-preempt", knobs={"has_preempt_watcher": w}) for w in (2, 1, 0))
    assert isinstance(full, HasPreempt) and isinstance(pending, HasPreempt) and isinstance(none, HasPreempt)
    assert (full.replans, full.moves_running) == (True, True)
    assert (pending.replans, pending.moves_running) == (True, False)
    assert (none.replans, none.moves_running) == (False, False)
    # no watcher: fsbatch's QOS preemption alone, and still every long job preemptible
    r = simulate(
        _workload(),
        parse_compact("A100-80GB:1x4"),
        "has-preempt",
        seed=1,
        load=None,
        knobs={"has_preempt_max_job_share": 1.0, "has_preempt_watcher": 0},
    )
    assert r.extra["preempted"] >= 1 and r.extra.get("moves", 0) == 0 and r.extra.get("updates", 0) == 0


def test_slurm_requeues_a_preempted_job_with_its_request():
    """Slurm restarts a preempted job as it was submitted (same partition, GPUs and time limit): the requeue is
    not a new decision; a watcher may move the requeued job as it moves any pending one (a new submission)."""

    def decided(watcher: int) -> tuple[list[int], dict[int, int]]:
        knobs = {"has_preempt_max_job_share": 1.0, "has_preempt_watcher": watcher}
        runner = Runner(_workload(), parse_compact("A100-80GB:1x4"), "has-preempt", seed=1, load=None, knobs=knobs)
        placed: list[int] = []
        place = runner.policy.place

        def counted(a: Attempt, ctx: Context) -> Placement | None:
            placed.append(a.job.id)
            return place(a, ctx)

        runner.policy.place = counted  # type: ignore[method-assign]
        r = runner.run()
        assert r.extra["preempted"] >= 1 and all(x.state == "done" for x in r.records)
        return placed, {x.id: x.attempts for x in r.records}

    placed, attempts = decided(0)
    assert sorted(placed) == [0, 1, 2, 3]  # each job decided once: the requeue is not a decision
    assert attempts[0] >= 2  # yet the long job ran again after its preemption
    placed, _ = decided(1)
    assert sorted(placed) == [0, 1, 2, 3]  # with the watcher too: it moves a requeued job only where that pays


def test_the_preemptible_qos_ranks_below_the_normal_one():
    """A preemptible job waiting since earlier holds no reservation ahead of a normal job (admin.md: the
    preemptible QOS's Priority is below the normal QOS's)."""
    s = Site()
    s.submit(60, 4)  # the node for an hour
    s.sim.advance(10 * MIN)
    early = s.submit(30, 4, preemptible=True)
    s.sim.advance(20 * MIN)  # (advance takes the time to run to)
    late = s.submit(30, 2)
    s.sim.advance(65 * MIN)
    assert s.state(late) == "RUNNING" and s.state(early) == "PENDING"


def test_the_watcher_decides_each_running_job_on_the_cluster_the_moves_before_it_left():
    """frenzy-slurm watch reads the cluster again after each move; the simulated watcher likewise decides one job
    at a time, after the moves before it were submitted (on one view, several jobs moved onto the same GPUs)."""
    one = {"precision": "bf16-mixed", "seq_len": 1024, "global_batch": 64}
    jobs = [WorkloadJob(id=0, submit_s=0, model="gpt2", steps=2000, **one)]
    jobs += [WorkloadJob(id=i, submit_s=60 * i, model="gpt2-medium", steps=40000, **one) for i in range(1, 4)]
    runner = Runner(
        WorkloadFile(jobs=jobs), parse_compact("A100-80GB:1x8,V100-32GB:1x8,T4:1x8"), "has-preempt", seed=1, load=None
    )
    calls: list[tuple[float, int, int, int]] = []
    move = runner.policy.move  # type: ignore[attr-defined]

    def seen(ctx: Context, running: list) -> list:
        out = move(ctx, running)
        calls.append((ctx.sim.now, len(running), ctx.sim.next_job_id, len(out)))
        return out

    runner.policy.move = seen  # type: ignore[attr-defined]
    r = runner.run()
    assert all(x.state == "done" for x in r.records)
    assert {n for _, n, _, _ in calls} == {1}  # one running job per decision
    # a move is submitted before the next job of the same pass is decided: that decision sees the new job
    after_a_move = [(a, b) for a, b in zip(calls, calls[1:], strict=False) if a[0] == b[0] and a[3]]
    assert after_a_move and all(b[2] > a[2] for a, b in after_a_move)
