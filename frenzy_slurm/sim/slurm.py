"""A simulated Slurm controller: the `SlurmBackend` interface over simulated time.

What it models, after slurmctld with `sched/backfill` and `select/cons_tres`:
- partitions of nodes with typed GPUs (GRES); jobs get whole GPUs on whole nodes (`--nodes N
  --gres=gpu:TYPE:G` per node); a node may run several jobs while GPUs remain;
- priority FIFO (priority/basic: earlier submission first), and backfill: pending jobs are walked in
  priority order, each is placed at the earliest time its GPUs are free given the running jobs' *time
  limits* (Slurm cannot know true run times) and the reservations of the jobs before it; a job whose
  earliest time is now starts now. `reserve` says how many blocked jobs get a reservation: all of the
  first `bf_max_job_test` (what Slurm's backfill does, its default) or 1 (EASY backfill);
- heterogeneous jobs: every component placed at one common start time, started together;
- time limits: a job still running at its limit ends TIMEOUT;
- QOS preemption, where `preempt_exempt_s` is set (a site with `PreemptType=preempt/qos`,
  `PreemptMode=REQUEUE`, `PreemptExemptTime` = that many seconds, and a preemptible QOS that the normal
  one may preempt): a pending job outside that QOS that cannot start now starts now if stopping
  preemptible jobs that have run at least the exempt time frees its GPUs; those end PREEMPTED (their
  runtime checkpoints at the signal) and the youngest on each node go first, only as many as the node
  needs; a multi-partition job tries its partitions in order, each without and then with preemption; the
  preemptible QOS ranks below the normal one in the queue (its Priority is lower, docs/admin.md);
- start estimates answered the way `sbatch --test-only` answers them: from running jobs' limits only
  (Slurm's will-run test ignores pending jobs), or, with `estimates="backfill"`, after the queue's
  reservations (what `squeue --start` shows).

Why its own class and not `frenzy_slurm.slurm.fake.FakeSlurm`: the unit-test fake schedules strict FIFO
and its clock moves only when a test says; the simulator needs backfill reservations, time limits versus
true run times, and ends that the runner's ground truth decides. Both ask the same engine when GPUs free
up (`frenzy_slurm.slurm.releases.GpuTimeline`); the simulator picks the fullest nodes that fit. A job's true
duration comes from the `outcome` callback when it starts (the runner knows the plan's true step time and
memory).
A heap was enough for the events; simpy's processes would add a dependency and hide the order in
which Slurm's passes run.
"""

from __future__ import annotations

import math
import time as _time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from frenzy_slurm.sim.clusters import SimCluster
from frenzy_slurm.slurm.backend import AccountingRecord, BatchJob, ComponentRequest, SbatchAnswer, StartEstimate
from frenzy_slurm.slurm.releases import GpuTimeline
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.slurm.view import ClusterView, Job, Node, Partition, PoolKey, QosLimits

FINAL_STATES = {"COMPLETED", "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "CANCELLED", "PREEMPTED"}


@dataclass
class SimNode:
    name: str
    partition: str
    gres: str
    gpus: int
    cpus: int
    used: int = 0
    up: bool = True


@dataclass
class SimJob:
    job_id: int
    components: list[ComponentRequest]
    submit: float
    name: str = ""
    comment: str = ""
    user: str = "sim"
    state: str = "PENDING"
    reason: str | None = "Priority"
    start: float | None = None
    end: float | None = None
    planned_start: float | None = None  # backfill's reservation for a pending job
    nodes: list[list[str]] = field(default_factory=list)  # per component, once started
    ends_as: str = "COMPLETED"  # what the outcome says the job ends as, if it ends before its limit
    # `sbatch -p a,b,c`: every request the job may start as (one partition each), in the order listed; each
    # backfill pass takes the one that starts first (the order breaks ties), and `components` becomes it
    alternatives: list[list[ComponentRequest]] = field(default_factory=list)
    preemptible: bool = False  # submitted in the site's preemptible QOS
    held: bool = False  # scontrol hold: backfill passes it over until it is released

    @property
    def limit_s(self) -> float:
        return 60.0 * max(c.time_min for c in self.components)

    @property
    def gpus(self) -> int:
        return sum(c.nodes * c.gpus_per_node for c in self.components)


Outcome = Callable[[SimJob], tuple[float, str]]  # started job -> (seconds it runs, final state if < limit)


def _shapes(components: list[ComponentRequest]) -> list[tuple[int, int]]:
    """The components as the plan asks for them: (nodes, GPUs per node) each."""
    return [(c.nodes, c.gpus_per_node) for c in components]


class SimSlurm:
    """The simulated controller; implements frenzy_slurm.slurm.backend.SlurmBackend."""

    name = "sim"
    snapshot: Path | None = None  # the simulated controller, not a saved view

    def __init__(
        self,
        cluster: SimCluster,
        now: float = 0.0,
        reserve: int | None = None,
        bf_max_job_test: int = 500,
        estimates: str = "test-only",
        outcome: Outcome | None = None,
        on_end: Callable[[SimJob], None] | None = None,
        first_job_id: int = 1,
        sched_interval_s: float = 0.0,
        preempt_exempt_s: float | None = None,
    ):
        self.cluster = cluster
        self.now = now
        self.reserve = reserve  # None: every tested job gets a reservation (Slurm); 1: EASY
        self.bf_max_job_test = bf_max_job_test
        if estimates not in ("test-only", "backfill"):
            raise ValueError(f"estimates must be test-only or backfill, not {estimates}")
        self.estimates = estimates
        self.outcome = outcome
        self.on_end = on_end
        # 0: a job end triggers a scheduling pass at once; > 0: the next pass on this period's grid (Slurm's
        # bf_interval; submissions are still tried at once, as the main scheduler does)
        self.sched_interval_s = sched_interval_s
        self.preempt_exempt_s = preempt_exempt_s  # None: no preemption (PreemptType=preempt/none)
        self.preemptions = 0
        self._tick: float | None = None
        self.nodes: dict[str, SimNode] = {}
        self.by_pool: dict[tuple[str, str], list[str]] = {}
        for p in cluster.partitions:
            for i in range(1, p.nodes + 1):
                name = f"{p.name}-{i}"
                self.nodes[name] = SimNode(name, p.name, p.gres, p.gpus_per_node, 8 * p.gpus_per_node)
                self.by_pool.setdefault((p.name, p.gres), []).append(name)
        self.jobs_by_id: dict[int, SimJob] = {}
        self._next_id = first_job_id
        self._ends: dict[int, tuple[float, str]] = {}  # running job -> (end time, final state)
        self.timeline: list[tuple[float, int]] = [(now, 0)]  # (time, GPUs allocated) after each change
        self.schedule_s = 0.0  # wall time spent in scheduling passes
        self._queue_timeline: GpuTimeline | None = None  # the queue's reservations, until the next pass
        # Cheaper answers to the same questions (a deep queue asks them for every decision): the running jobs'
        # timeline for --test-only estimates, kept while no job starts or ends and the clock stands (keyed by
        # (now, changes)); the view's Node and Job records, rebuilt only for nodes and jobs that changed
        self._changes = 0  # job starts and ends so far
        self._test_timeline: tuple[tuple[float, int], GpuTimeline] | None = None
        self._partitions: list[Partition] | None = None
        self._node_records: dict[str, tuple[tuple, Node]] = {}
        self._job_records: dict[int, tuple[tuple, list[Job]]] = {}

    # ---- SlurmBackend -------------------------------------------------------------------------
    def load(self) -> ClusterView:
        if self._partitions is None:  # the partitions never change
            self._partitions = [
                Partition(
                    name=p.name,
                    nodes=[n for n in self.nodes if self.nodes[n].partition == p.name],
                    default_time_min=60,
                    max_time_min=p.max_time_min,
                )
                for p in self.cluster.partitions
            ]
        return ClusterView(
            cluster=self.cluster.name,
            backend="sim",
            slurm_version="sim",
            taken_at=self.now,
            partitions=list(self._partitions),
            nodes=[self._node_record(n) for n in self.nodes.values()],
            jobs=self.jobs(),
        )

    def _node_record(self, n: SimNode) -> Node:
        """The view's record of `n`, the same object while its state and GPUs in use have not changed."""
        key = (self._node_state(n), n.used, n.gpus, n.cpus)
        kept = self._node_records.get(n.name)
        if kept is not None and kept[0] == key:
            return kept[1]
        node = Node(
            name=n.name,
            partitions=[n.partition],
            state=key[0],
            gpu_type=n.gres,
            gpus_total=n.gpus,
            gpus_used=n.used,
            cpus=n.cpus,
            memory_mb=64000 * n.gpus,
        )
        self._node_records[n.name] = (key, node)
        return node

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        candidates = [self._candidates(c) for c in components]
        if any(len(c) < comp.nodes for c, comp in zip(candidates, components, strict=True)):
            raise SlurmCommandError(
                ["sbatch", "--test-only"], 1, "sbatch: error: Requested node configuration is not available"
            )
        timeline = self._estimate_timeline()
        duration = 60.0 * max(c.time_min for c in components)
        found = timeline.earliest(_shapes(components), candidates, self.now, duration)
        if found is None:
            raise SlurmCommandError(["sbatch", "--test-only"], 1, "sbatch: error: Job violates accounting/QOS policy")
        t, nodes = found
        return StartEstimate(start=t, nodes=[n for ns in nodes for n in ns], source=self.estimates)

    def submit(self, job: BatchJob) -> SbatchAnswer:
        if job.dependency is not None:
            raise SlurmUnavailable("the simulator models no job dependencies (a sweep's --max-running chain)")
        return self.submit_as(job)

    def submit_as(self, job: BatchJob, preemptible: bool = False, queued_since: float | None = None) -> SbatchAnswer:
        """`submit`, with what the simulator knows apart from the request. `preemptible`: submitted in the site's
        preemptible QOS (`--qos`, which the script's own lines say). `queued_since`: a preempted job requeued
        (Slurm keeps its id and so its place in the queue) under the request its owner's tool updated it to
        (`scontrol update`), which this models as one submission."""
        for c in job.components:
            pool = self._candidates(c)
            if len(pool) < c.nodes:
                raise SlurmCommandError(
                    ["sbatch"],
                    1,
                    "sbatch: error: Batch job submission failed: Requested node configuration is not available",
                )
        jid = self._next_id
        self._next_id += max(1, len(job.components))  # hetjob components take consecutive ids
        self.jobs_by_id[jid] = SimJob(
            jid,
            list(job.components),
            self.now if queued_since is None else queued_since,
            name=job.name,
            comment=job.comment,
            preemptible=preemptible,
        )
        self.schedule()
        return SbatchAnswer(job_id=jid, cluster=None, argv=["sbatch", "--parsable", str(job.script)])

    def submit_any(self, job: BatchJob, alternatives: list[list[ComponentRequest]]) -> SbatchAnswer:
        """A multi-partition submission (`sbatch -p a,b,c`): the job starts as whichever of `job.components`
        and `alternatives` backfill can start first. Real Slurm gives one job one GRES count for all its
        partitions; a different count per partition is what a user gets by submitting one job per partition
        and cancelling the others when one starts, which this models without the extra jobs."""
        ok = [
            alt
            for alt in [list(job.components), *alternatives]
            if all(len(self._candidates(c)) >= c.nodes for c in alt)
        ]
        if not ok:
            raise SlurmCommandError(
                ["sbatch"],
                1,
                "sbatch: error: Batch job submission failed: Requested node configuration is not available",
            )
        jid = self._next_id
        self._next_id += 1
        sj = SimJob(jid, ok[0], self.now, name=job.name, comment=job.comment, alternatives=ok if len(ok) > 1 else [])
        self.jobs_by_id[jid] = sj
        self.schedule()
        return SbatchAnswer(job_id=jid, cluster=None, argv=["sbatch", "--parsable", str(job.script)])

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        wanted = set(job_ids) if job_ids is not None else None
        out = []
        for j in self.jobs_by_id.values():
            if j.state in FINAL_STATES or (wanted is not None and j.job_id not in wanted):
                continue
            if user is not None and j.user != user:
                continue
            out += self._job_records_of(j)
        return out

    def _job_records_of(self, j: SimJob) -> list[Job]:
        """The view's records of `j` (one per component), the same objects while nothing they show has changed;
        the components are compared by identity (a request is replaced, never edited, by submit)."""
        key = (j.state, j.reason, j.start, j.planned_start, j.name, j.user, j.comment, tuple(map(tuple, j.nodes)))
        kept = self._job_records.get(j.job_id)
        if kept is not None and kept[0][0] == key and len(kept[0][1]) == len(j.components):
            if all(a is b for a, b in zip(kept[0][1], j.components, strict=True)):
                return kept[1]
        out = []
        het = len(j.components) > 1
        for k, c in enumerate(j.components):
            start = j.start if j.start is not None else j.planned_start
            out.append(
                Job(
                    job_id=j.job_id + k,
                    het_job_id=j.job_id if het else None,
                    het_job_offset=k if het else None,
                    name=j.name,
                    user=j.user,
                    state=j.state,
                    reason=j.reason,
                    partition=c.partition,
                    nodes=j.nodes[k] if j.nodes else [],
                    node_count=c.nodes,
                    gpu_type=c.gpu_type,
                    gpus_per_node=c.gpus_per_node,
                    start_time=int(start) if start is not None else None,
                    end_time=int(start + j.limit_s) if start is not None else None,
                    time_limit_min=c.time_min,
                    comment=j.comment,
                )
            )
        self._job_records[j.job_id] = ((key, list(j.components)), out)
        return out

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        j = self.jobs_by_id.get(job_id)
        if j is None or j.state in FINAL_STATES or signal is not None:
            return  # a simulated job runs no processes: a signal changes nothing
        if j.state == "RUNNING":
            self._finish(j, "CANCELLED")
        else:
            j.state, j.end = "CANCELLED", self.now
        self.schedule()

    def is_operator(self) -> bool:
        return True  # the simulated cluster's watcher may change what it plans

    def preempted(self, job_id: int) -> bool:
        """False: a simulated job runs no code that could ask (its preemption is the runner's PREEMPTED end)."""
        return False

    def hold(self, job_id: int) -> None:
        j = self.jobs_by_id.get(job_id)
        if j is None or j.state != "PENDING":
            raise SlurmCommandError(["scontrol", "hold", str(job_id)], 1, "Job is no longer pending execution")
        j.held = True

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        """As scontrol update of a pending job's shape: it keeps its id, submit time and place in the queue (the
        simulated users' watcher runs with an operator's rights, `is_operator`)."""
        j = self.jobs_by_id.get(job_id)
        argv = ["scontrol", "update", f"JobId={job_id}"]
        if j is None or j.state != "PENDING":
            raise SlurmCommandError(argv, 1, "Job is no longer pending execution")
        if len(j.components) != 1:
            raise SlurmCommandError(argv, 1, "Job is a heterogeneous job: update its components")
        old = j.components[0]
        j.components = [
            replace(
                old,
                partition=component.partition,
                gpu_type=component.gpu_type,
                nodes=component.nodes,
                gpus_per_node=component.gpus_per_node,
                cpus_per_gpu=component.cpus_per_gpu,
            )
        ]
        j.alternatives = []  # the update names one partition
        self.schedule()

    def release(self, job_id: int) -> None:
        j = self.jobs_by_id.get(job_id)
        if j is not None:
            j.held = False
            self.schedule()

    def requeue(self, job_id: int) -> None:
        j = self.jobs_by_id.get(job_id)
        if j is None or j.state != "RUNNING":
            return
        self._release(j)
        j.state, j.start, j.nodes, j.reason = "PENDING", None, [], "BeginTime"
        self.schedule()

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        out = {}
        for i in job_ids:
            j = self.jobs_by_id.get(i)
            if j is not None:
                out[i] = AccountingRecord(
                    job_id=i,
                    state=j.state,
                    start=int(j.start) if j.start is not None else None,
                    end=int(j.end) if j.end is not None else None,
                    elapsed_s=int(j.end - j.start) if j.end is not None and j.start is not None else None,
                )
        return out

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        """None, as from a site without GPU accounting: the simulated jobs' memory is the runner's ground
        truth, not something the controller measured."""
        return None

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        """None, as from a site without accounting: the simulated cluster has no QOS limits."""
        return None

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        """Refused: a simulated node runs no programs."""
        raise SlurmUnavailable(
            f"the {self.name} backend simulates a cluster; it cannot run job steps (asked for "
            f"{gpus} GPU(s) of partition {pool.partition}). Use --backend cli (or auto) on a "
            "machine that reaches Slurm."
        )

    @property
    def next_job_id(self) -> int:
        """The id the next submission gets (the runner files its timeline under it before submitting)."""
        return self._next_id

    # ---- the clock --------------------------------------------------------------------------------
    def next_end(self) -> float | None:
        """The next time something happens by itself: a job ends, or a deferred scheduling pass runs."""
        ends = [t for t, _ in self._ends.values()]
        if self._tick is not None:
            ends.append(self._tick)
        return min(ends, default=None)

    def advance(self, until: float) -> list[SimJob]:
        """Run the clock to `until`: end the jobs due by then (each end frees GPUs and schedules again)."""
        done = []
        while True:
            due = self.next_end()
            if due is None or due > until:
                break
            self.now = max(self.now, due)
            batch = sorted((jid for jid, (t, _) in self._ends.items() if t <= self.now))
            for jid in batch:
                j = self.jobs_by_id[jid]
                self._finish(j, self._ends[jid][1])
                done.append(j)
            if self.sched_interval_s <= 0 or (self._tick is not None and self._tick <= self.now):
                self._tick = None
                self.schedule()
            elif batch and self._tick is None:
                # GPUs freed by an end are used by the next periodic pass (bf_interval), not at once
                k = math.floor(self.now / self.sched_interval_s) + 1
                self._tick = k * self.sched_interval_s
        self.now = max(self.now, until)
        return done

    # ---- scheduling -------------------------------------------------------------------------------
    def schedule(self) -> list[SimJob]:
        """One backfill pass: start what can start now without delaying a reservation of an earlier job."""
        t0 = _time.perf_counter()
        self._queue_timeline = None
        timeline = self._running_timeline()
        started = []
        reservations = 0
        pending = sorted(
            (j for j in self.jobs_by_id.values() if j.state == "PENDING" and not j.held),
            # with QOS preemption the preemptible QOS ranks below the normal one (its Priority is lower: admin.md),
            # then the queue is by submission: a requeued preemptible job holds no reservation ahead of others
            key=lambda j: (self.preempt_exempt_s is not None and j.preemptible, j.submit, j.job_id),
        )
        for j in pending[: self.bf_max_job_test]:
            preempting = self._start_now_by_preempting(j, timeline)
            found = (self.now, preempting) if preempting is not None else self._earliest(j, timeline)
            if found is None:
                j.reason, j.planned_start = "Resources", None
                continue
            t, nodes = found
            if t <= self.now:
                self._start(j, nodes)
                for c, ns in zip(j.components, nodes, strict=True):
                    for n in ns:
                        timeline.add(n, self.now, self.now + j.limit_s, c.gpus_per_node)
                started.append(j)
            elif self.reserve is None or reservations < self.reserve:
                for c, ns in zip(j.components, nodes, strict=True):
                    for n in ns:
                        timeline.add(n, t, t + j.limit_s, c.gpus_per_node)
                reservations += 1
                j.planned_start, j.reason = t, ("Priority" if reservations > 1 else "Resources")
            else:
                j.planned_start, j.reason = None, "Priority"
        for j in pending[self.bf_max_job_test :]:
            j.planned_start, j.reason = None, "Priority"
        self.schedule_s += _time.perf_counter() - t0
        return started

    def _start_now_by_preempting(self, j: SimJob, timeline: GpuTimeline) -> list[list[str]] | None:
        """Where a job outside the preemptible QOS starts now by preempting, when Slurm tries its partitions in
        order, each at once without and then with preemption (job_scheduler.c queues one record per partition;
        cons_tres's run-now test preempts only where the job cannot start otherwise), so that a partition listed
        earlier where preempting makes room comes before a later one free now; None: let `_earliest` decide (no
        preemption here, or a partition where it starts without preempting, or none where it starts now)."""
        if self.preempt_exempt_s is None or j.preemptible:
            return None
        for comps in j.alternatives or [j.components]:
            cands = [self._candidates(c) for c in comps]
            found = timeline.earliest(_shapes(comps), cands, self.now, 60.0 * max(c.time_min for c in comps))
            if found is not None and found[0] <= self.now:
                return None  # it starts now without preempting, in the first such partition: `_earliest`'s choice
            freed = self._preempt_for(j, comps)
            if freed is not None and self._fits_now(j, freed):
                return freed
        return None

    def _preemptable(self) -> list[SimJob]:
        assert self.preempt_exempt_s is not None
        return [
            x
            for x in self.jobs_by_id.values()
            if x.state == "RUNNING"
            and x.preemptible
            and x.start is not None
            and self.now - x.start >= self.preempt_exempt_s
        ]

    def _preempt_for(self, j: SimJob, comps: list[ComponentRequest]) -> list[list[str]] | None:
        """Where `j` starts now as the request `comps` if preemptible jobs make room (None: it does not), those
        jobs stopped and `comps` made its components."""
        victims = self._preemptable()
        if not victims:
            return None
        gone = {x.job_id for x in victims}
        timeline = GpuTimeline({name: n.gpus for name, n in self.nodes.items()}, self.now)
        for x in self.jobs_by_id.values():
            if x.state == "RUNNING" and x.job_id not in gone:
                assert x.start is not None
                for c, ns in zip(x.components, x.nodes, strict=True):
                    for n in ns:
                        timeline.add(n, x.start, max(x.start + x.limit_s, self.now + 1.0), c.gpus_per_node)
        found = timeline.earliest(
            _shapes(comps), [self._candidates(c) for c in comps], self.now, 60.0 * max(c.time_min for c in comps)
        )
        if found is None or found[0] > self.now:
            return None
        nodes, j.components = found[1], comps
        need: dict[str, int] = {}
        for c, ns in zip(j.components, nodes, strict=True):
            for n in ns:
                need[n] = need.get(n, 0) + c.gpus_per_node
        for n, want in need.items():
            on_node = sorted((x for x in victims if any(n in ns for ns in x.nodes)), key=lambda x: -(x.start or 0.0))
            for x in on_node:
                if self.nodes[n].gpus - self.nodes[n].used >= want:
                    break
                if x.state == "RUNNING":
                    self.preemptions += 1
                    self._finish(x, "PREEMPTED")
        return nodes

    def _fits_now(self, j: SimJob, nodes: list[list[str]]) -> bool:
        free = {n: self.nodes[n].gpus - self.nodes[n].used for ns in nodes for n in ns}
        for c, ns in zip(j.components, nodes, strict=True):
            for n in ns:
                free[n] -= c.gpus_per_node
        return all(v >= 0 for v in free.values())

    def _earliest(self, j: SimJob, timeline: GpuTimeline) -> tuple[float, list[list[str]]] | None:
        """When and where `j` can start; a multi-partition job takes the request that starts first (Slurm's
        backfill tests each partition and keeps the earliest start) and keeps it as its components."""
        best: tuple[float, list[list[str]], list[ComponentRequest]] | None = None
        for comps in j.alternatives or [j.components]:
            cands = [self._candidates(c) for c in comps]
            found = timeline.earliest(_shapes(comps), cands, self.now, 60.0 * max(c.time_min for c in comps))
            if found is not None and (best is None or found[0] < best[0]):
                best = (found[0], found[1], comps)
        if best is None:
            return None
        j.components = best[2]
        return best[0], best[1]

    def _running_timeline(self) -> GpuTimeline:
        timeline = GpuTimeline({name: n.gpus for name, n in self.nodes.items()}, self.now)
        for j in self.jobs_by_id.values():
            if j.state == "RUNNING":
                assert j.start is not None
                for c, ns in zip(j.components, j.nodes, strict=True):
                    for n in ns:
                        timeline.add(n, j.start, max(j.start + j.limit_s, self.now + 1.0), c.gpus_per_node)
        return timeline

    def _estimate_timeline(self) -> GpuTimeline:
        if self.estimates == "test-only":  # estimates only read it (and fill its caches): kept until a change
            key = (self.now, self._changes)
            if self._test_timeline is None or self._test_timeline[0] != key:
                self._test_timeline = (key, self._running_timeline())
            return self._test_timeline[1]
        if self._queue_timeline is None:
            timeline = self._running_timeline()
            for j in self.jobs_by_id.values():
                if j.state == "PENDING" and j.planned_start is not None:
                    cands = [self._candidates(c) for c in j.components]
                    found = timeline.earliest(_shapes(j.components), cands, j.planned_start, j.limit_s)
                    if found:
                        for c, ns in zip(j.components, found[1], strict=True):
                            for n in ns:
                                timeline.add(n, found[0], found[0] + j.limit_s, c.gpus_per_node)
            self._queue_timeline = timeline
        return self._queue_timeline

    def _candidates(self, c: ComponentRequest) -> list[str]:
        if c.gpu_type is None:
            names = [n for (p, _), ns in self.by_pool.items() if p == c.partition for n in ns]
        else:
            names = self.by_pool.get((c.partition, c.gpu_type), [])
        return [n for n in names if self.nodes[n].up and self.nodes[n].gpus >= c.gpus_per_node]

    def _start(self, j: SimJob, nodes: list[list[str]]) -> None:
        j.state, j.start, j.nodes, j.reason, j.planned_start = "RUNNING", self.now, nodes, None, None
        for c, ns in zip(j.components, nodes, strict=True):
            for n in ns:
                self.nodes[n].used += c.gpus_per_node
        seconds, final = self.outcome(j) if self.outcome else (j.limit_s, "COMPLETED")
        if seconds >= j.limit_s:
            seconds, final = j.limit_s, "TIMEOUT"
        j.ends_as = final
        self._ends[j.job_id] = (self.now + max(seconds, 0.0), final)
        self._record()

    def _release(self, j: SimJob) -> None:
        for c, ns in zip(j.components, j.nodes, strict=True):
            for n in ns:
                self.nodes[n].used -= c.gpus_per_node
        self._ends.pop(j.job_id, None)
        self._record()

    def _finish(self, j: SimJob, state: str) -> None:
        self._release(j)
        j.state, j.end = state, self.now
        if self.on_end is not None:
            self.on_end(j)

    def _record(self) -> None:
        self._changes += 1
        used = sum(n.used for n in self.nodes.values())
        if self.timeline and self.timeline[-1][0] == self.now:
            self.timeline[-1] = (self.now, used)
        else:
            self.timeline.append((self.now, used))

    @staticmethod
    def _node_state(n: SimNode) -> str:
        if not n.up:
            return "down"
        return "idle" if n.used == 0 else ("allocated" if n.used >= n.gpus else "mixed")
