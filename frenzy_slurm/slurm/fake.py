"""FakeSlurm: an in-memory Slurm behind the same interface, for unit tests.

It keeps partitions, nodes with typed GPUs, and jobs over a clock that only moves when told
(`advance`). Scheduling is what matters to frenzy-slurm's callers: priority FIFO over whole requests,
node-granular GPU allocation, all components of a heterogeneous job starting together, jobs ending at
their run time (or their time limit), and start estimates computed the way `sbatch --test-only`
answers (from running jobs' limits), planned on the one model of when GPUs free up
(`releases.GpuTimeline`, which the simulator and HAS's release index use too). It never replaces the live
tests against real Slurm; it serves failures real Slurm cannot be made to produce on demand (an outage,
a submission that times out after the job was created) and code that needs a Slurm without one (HAS's
refinement).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path

from frenzy_slurm.slurm.backend import AccountingRecord, BatchJob, ComponentRequest, SbatchAnswer, StartEstimate
from frenzy_slurm.slurm.releases import GpuTimeline
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmTimeout, SlurmUnavailable
from frenzy_slurm.slurm.view import ClusterView, Job, Node, Partition, PoolKey, QosLimits, job_phase


def _afterany(dependency: str | None) -> list[int]:
    """The job ids of `afterany:ID[:ID...]` terms joined by ',' (what a sweep's --max-running chain submits);
    the fake models no other kind of dependency and refuses it as the unknown request it is."""
    ids: list[int] = []
    for term in (dependency or "").split(",") if dependency else []:
        kind, _, rest = term.partition(":")
        if kind != "afterany" or not rest or not all(p.isdigit() for p in rest.split(":")):
            raise SlurmCommandError(["sbatch"], 1, f"sbatch: error: FakeSlurm models only afterany:ID, not {term!r}")
        ids += [int(p) for p in rest.split(":")]
    return ids


@dataclass
class FakeJob:
    """One submitted (het)job: its components and, once started, the nodes of each."""

    job_id: int
    components: list[ComponentRequest]
    name: str
    comment: str
    user: str
    workdir: str | None
    submitted: float
    run_s: float | None  # how long it runs once started; None: until its time limit
    state: str = "PENDING"
    start: float | None = None
    end: float | None = None
    nodes: list[list[str]] = field(default_factory=list)
    # a plain user's update (no TasksPerNode) to more GPUs per node than the job was submitted with is accepted but
    # leaves it never runnable, as slurmctld's BadConstraints (measured on 22.05, docs/admin.md)
    bad_constraints: bool = False
    submitted_per_node: int = 0  # the first component's tasks (GPUs) per node as submitted
    held: bool = False  # scontrol hold: not started until released
    after: list[int] = field(default_factory=list)  # --dependency=afterany:ID[:ID...]: starts once those ended

    @property
    def limit_s(self) -> float:
        return max(c.time_min for c in self.components) * 60.0


class FakeSlurm:
    """An in-memory cluster. Build it from a view (its nodes and partitions; its jobs are ignored)."""

    name = "fake"
    snapshot: Path | None = None  # an in-memory controller, not a saved view

    def __init__(self, view: ClusterView, now: float | None = None, user: str = "user", accounting: bool = True):
        self.now = float(now if now is not None else view.taken_at)
        self.cluster = view.cluster or "fake"
        self.partitions = [p.model_copy() for p in view.partitions]
        self.nodes = {n.name: n.model_copy(update={"gpus_used": 0}) for n in view.nodes}
        self.user = user
        self.accounting_enabled = accounting
        self.fake_jobs: dict[int, FakeJob] = {}
        self._next_id = 1000
        self.down = False  # True: every call fails as an unreachable controller does
        self.submit_times_out = False  # True: the job is created, but the caller sees a timeout
        self.calls: list[str] = []  # which interface methods were called, in order (for tests)
        self.preempting: set[int] = set()  # job ids a test says Slurm is preempting (preempted())
        self.signals: list[tuple[int, str]] = []  # what cancel(job_id, signal) sent (for tests)
        self.gpu_peaks_gib: dict[int, float] = {}  # what Slurm's GPU accounting would report, per job
        self.step_output: dict[PoolKey, str] = {}  # what a job step on a pool prints (site detection)
        self.qos: dict[str, QosLimits] = {}  # the QOS table (name -> limits) accounting would hold
        self.default_qos = "normal"  # what a job gets without --qos
        self.operator = False  # a Slurm operator (AdminLevel=Operator) may update other users' jobs

    # -- the clock ---------------------------------------------------------------------------------
    def advance(self, seconds: float) -> None:
        """Move the clock, ending and starting jobs at the right moments on the way."""
        target = self.now + seconds
        while True:
            self._schedule()
            ends = [
                j.start + self._duration(j)
                for j in self.fake_jobs.values()
                if j.state == "RUNNING" and j.start is not None
            ]
            nxt = min((e for e in ends if e <= target), default=None)
            if nxt is None:
                break
            self.now = max(self.now, nxt)
            self._finish_due()
        self.now = target
        self._finish_due()
        self._schedule()

    def _duration(self, j: FakeJob) -> float:
        return min(j.run_s, j.limit_s) if j.run_s is not None else j.limit_s

    def _finish_due(self) -> None:
        for j in self.fake_jobs.values():
            if j.state == "RUNNING" and j.start is not None and j.start + self._duration(j) <= self.now:
                j.state = "TIMEOUT" if j.run_s is None or j.run_s > j.limit_s else "COMPLETED"
                j.end = j.start + self._duration(j)

    # -- allocation --------------------------------------------------------------------------------
    def _used(self) -> dict[str, int]:
        used: dict[str, int] = {}
        for j in self.fake_jobs.values():
            if j.state == "RUNNING":
                for comp, names in zip(j.components, j.nodes, strict=True):
                    for n in names:
                        used[n] = used.get(n, 0) + comp.gpus_per_node
        return used

    def _candidates(self, c: ComponentRequest) -> list[Node]:
        part = self._partition(c.partition)
        return [
            n
            for name in part.nodes
            if (n := self.nodes.get(name)) is not None
            and n.available
            and (c.gpu_type is None or n.gpu_type == c.gpu_type)
            and n.gpus_total >= c.gpus_per_node
        ]

    def _place(self, comps: list[ComponentRequest], used: dict[str, int]) -> list[list[str]] | None:
        taken: set[str] = set()
        out = []
        for c in comps:
            free = [
                n.name
                for n in self._candidates(c)
                if n.name not in taken and n.gpus_total - used.get(n.name, 0) >= c.gpus_per_node
            ]
            if len(free) < c.nodes:
                return None
            out.append(free[: c.nodes])
            taken.update(free[: c.nodes])
        return out

    def _schedule(self) -> None:
        """Priority FIFO: pending jobs in submission order; the first that cannot start blocks the rest."""
        used = self._used()
        for j in sorted(self.fake_jobs.values(), key=lambda j: (j.submitted, j.job_id)):
            if j.state != "PENDING" or j.held or j.bad_constraints or self._waiting(j):
                continue  # as Slurm: a job whose dependency is unmet does not block the queue behind it
            placed = self._place(j.components, used)
            if placed is None:
                break
            j.state, j.start, j.nodes = "RUNNING", self.now, placed
            for comp, names in zip(j.components, placed, strict=True):
                for n in names:
                    used[n] = used.get(n, 0) + comp.gpus_per_node

    def _waiting(self, j: FakeJob) -> bool:
        """Whether a job its afterany dependency names has not ended yet."""
        return any((d := self.fake_jobs.get(i)) is not None and d.state in ("PENDING", "RUNNING") for i in j.after)

    def _partition(self, name: str) -> Partition:
        part = next((p for p in self.partitions if p.name == name), None)
        if part is None:
            raise SlurmCommandError(["sbatch"], 1, "sbatch: error: invalid partition specified: " + name)
        return part

    def _check(self, comps: list[ComponentRequest]) -> None:
        for c in comps:
            part = self._partition(c.partition)
            if part.max_time_min is not None and c.time_min > part.max_time_min:
                raise SlurmCommandError(
                    ["sbatch"], 1, "sbatch: error: Requested time limit is invalid (missing or exceeds some limit)"
                )
            if len(self._candidates(c)) < c.nodes:
                raise SlurmCommandError(
                    ["sbatch"],
                    1,
                    "sbatch: error: Batch job submission failed: Requested node configuration is not available",
                )

    def _guard(self, what: str) -> None:
        self.calls.append(what)
        if self.down:
            raise SlurmUnavailable(
                "Slurm is unreachable: Unable to contact slurm controller (connect failure) (from the fake backend)."
            )

    # -- the interface -----------------------------------------------------------------------------
    def load(self) -> ClusterView:
        self._guard("load")
        used = self._used()
        nodes = []
        for n in self.nodes.values():
            u = used.get(n.name, 0)
            state = (
                n.state if not n.available else ("allocated" if u >= n.gpus_total and u else "mixed" if u else "idle")
            )
            nodes.append(n.model_copy(update={"gpus_used": u, "state": state}))
        return ClusterView(
            cluster=self.cluster,
            backend=self.name,
            slurm_version="fake",
            taken_at=self.now,
            partitions=[p.model_copy() for p in self.partitions],
            nodes=nodes,
            jobs=self._job_rows(self.fake_jobs.values()),
        )

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        """When the request would start if nothing else arrived: running jobs end at their limits (as
        Slurm's own estimate assumes) and pending jobs ahead of it start first (FIFO)."""
        self._guard("expected_start")
        self._check(components)
        found = self._fifo_start(components)
        if found is None:
            raise SlurmCommandError(["sbatch", "--test-only"], 1, "sbatch: error: Job can never start here")
        start, nodes = found
        return StartEstimate(start=start, nodes=[n for ns in nodes for n in ns], source="fake")

    def _fifo_start(self, components: list[ComponentRequest]) -> tuple[float, list[list[str]]] | None:
        """Where and when `components` start behind the queue, planned on the one GPU timeline engine.

        Running jobs hold their GPUs until their limits; each pending job, in submission order, starts no
        earlier than the one before it (strict FIFO: the first that cannot start blocks the rest) on the
        first nodes of its partition that fit, and holds them for its limit; the request comes last.
        Every interval then starts no later than the next start, so "fits at that moment" and "fits for
        the whole limit" are the same question, and the answer is the one the clock would give.
        """
        timeline = GpuTimeline({name: n.gpus_total for name, n in self.nodes.items()}, self.now)
        for j in self.fake_jobs.values():
            if j.state == "RUNNING" and j.start is not None:
                for comp, names in zip(j.components, j.nodes, strict=True):
                    for n in names:
                        timeline.add(n, j.start, j.start + j.limit_s, comp.gpus_per_node)
        # the request counts as submitted now, ahead of jobs submitted at this same moment
        queue = [
            j.components
            for j in sorted(self.fake_jobs.values(), key=lambda j: (j.submitted, j.job_id))
            if j.state == "PENDING" and j.submitted < self.now
        ]
        not_before = self.now
        found = None
        for comps in [*queue, list(components)]:
            limit_s = max(c.time_min for c in comps) * 60.0
            found = timeline.earliest(
                [(c.nodes, c.gpus_per_node) for c in comps],
                [[n.name for n in self._candidates(c)] for c in comps],
                not_before,
                max(limit_s, 1.0),
                pick="first",
            )
            if found is None:
                return None
            not_before = found[0]
            for comp, names in zip(comps, found[1], strict=True):
                for n in names:
                    timeline.add(n, not_before, not_before + limit_s, comp.gpus_per_node)
        return found

    def submit(self, job: BatchJob) -> SbatchAnswer:
        self._guard("submit")
        if not job.components:
            raise SlurmCommandError(["sbatch"], 1, "sbatch: error: no resources requested")
        self._check(job.components)
        after = _afterany(job.dependency)
        jid = self._next_id
        self._next_id += len(job.components)  # as in Slurm, hetjob components take consecutive ids
        self.fake_jobs[jid] = FakeJob(
            job_id=jid,
            components=list(job.components),
            submitted_per_node=job.components[0].gpus_per_node,
            name=job.name,
            comment=job.comment,
            user=self.user,
            workdir=str(job.workdir),
            submitted=self.now,
            run_s=None,
            after=after,
        )
        self._schedule()
        if self.submit_times_out:
            raise SlurmTimeout("'sbatch --parsable' did not answer within 60s: slurmctld is overloaded or down.")
        dep = [f"--dependency={job.dependency}"] if job.dependency is not None else []
        return SbatchAnswer(job_id=jid, cluster=None, argv=["sbatch", "--parsable", *dep, str(job.script)])

    def set_run_time(self, job_id: int, seconds: float) -> None:
        """How long a job runs once started (default: until its time limit)."""
        self.fake_jobs[job_id].run_s = seconds

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        self._guard("jobs")
        wanted = set(job_ids) if job_ids is not None else None
        rows = self._job_rows(j for j in self.fake_jobs.values() if user is None or j.user == user)
        return [r for r in rows if wanted is None or r.job_id in wanted or (r.het_job_id or 0) in wanted]

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        """As scancel: a hetjob by its leader's id, all components at once; with `signal`, a running job's
        steps get it (recorded in `signals`), a job that is not running refuses as scancel does."""
        self._guard("cancel")
        j = self.fake_jobs.get(job_id)
        if j is None:
            raise SlurmCommandError(["scancel", str(job_id)], 1, f"scancel: error: Invalid job id {job_id}")
        if signal is not None:
            if j.state != "RUNNING":
                raise SlurmCommandError(
                    ["scancel", f"--signal={signal}", str(job_id)],
                    1,
                    f"scancel: error: Kill job error on job id {job_id}: Job is pending execution",
                )
            self.signals.append((job_id, signal))
            return
        if job_phase(j.state) in ("pending", "running", "suspended"):
            j.state, j.end = "CANCELLED", self.now
        self._schedule()

    def preempted(self, job_id: int) -> bool:
        """Whether a test marked the job preempted (`preempting`)."""
        self._guard("preempted")
        return job_id in self.preempting

    def requeue(self, job_id: int) -> None:
        self._guard("requeue")
        j = self.fake_jobs[job_id]
        j.state, j.start, j.nodes = "PENDING", None, []
        self._schedule()

    def hold(self, job_id: int) -> None:
        """As scontrol hold: a pending job is kept from starting; any other refuses."""
        self._guard("hold")
        j = self.fake_jobs.get(job_id)
        if j is None or j.state != "PENDING":
            raise SlurmCommandError(["scontrol", "hold", str(job_id)], 1, "Job is no longer pending execution")
        j.held = True

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        """As scontrol update of a pending job's shape: its id, submit time and place stay; a job that is not
        pending, another user's (unless `operator`), a heterogeneous one or an unknown partition refuses, and so
        does TasksPerNode (`restate_tasks`) from anyone but an operator. Without it, more GPUs per node than the job
        was submitted with are taken but leave it never runnable (BadConstraints)."""
        self._guard("update_pending")
        j = self.fake_jobs.get(job_id)
        argv = ["scontrol", "update", f"JobId={job_id}"]
        if j is None or j.state != "PENDING":
            raise SlurmCommandError(argv, 1, "Job is no longer pending execution")
        if j.user != self.user and not self.operator:  # slurmctld's ESLURM_USER_ID_MISSING, as 22.05 words it
            raise SlurmCommandError(argv, 1, f"Invalid user id for job {job_id}")
        if len(j.components) != 1:
            raise SlurmCommandError(argv, 1, "Job is a heterogeneous job: update its components")
        if component.partition not in {p.name for p in self.partitions}:
            raise SlurmCommandError(argv, 1, "Invalid partition name specified")
        if restate_tasks and not self.operator:
            raise SlurmCommandError(argv, 1, f"Access/permission denied for job {job_id}")
        old = j.components[0]
        if not restate_tasks and component.gpus_per_node > j.submitted_per_node:
            j.bad_constraints = True
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
        self._schedule()

    def is_operator(self) -> bool:
        return self.operator

    def release(self, job_id: int) -> None:
        """As scontrol release: an unknown job refuses."""
        self._guard("release")
        if job_id not in self.fake_jobs:
            raise SlurmCommandError(["scontrol", "release", str(job_id)], 1, f"Invalid job id specified ({job_id})")
        self.fake_jobs[job_id].held = False
        self._schedule()

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        self._guard("accounting")
        if not self.accounting_enabled:
            return None
        out = {}
        for i in job_ids:
            j = self.fake_jobs.get(i)
            if j is not None:
                out[i] = AccountingRecord(
                    job_id=i,
                    state=j.state,
                    exit_code="0:0" if j.state == "COMPLETED" else None,
                    start=int(j.start) if j.start else None,
                    end=int(j.end) if j.end else None,
                    elapsed_s=int((j.end or self.now) - j.start) if j.start else None,
                    user=j.user,
                    work_dir=str(j.workdir) if j.workdir else None,
                    nodes=sum(len(n) for n in j.nodes) if j.nodes else None,  # not started: nothing allocated
                    alloc_gpus=sum(len(n) * c.gpus_per_node for n, c in zip(j.nodes, j.components, strict=False))
                    if j.nodes
                    else None,
                )
        return out

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        self._guard("gpu_memory_peaks")
        if not self.accounting_enabled:
            return None
        return {i: self.gpu_peaks_gib[i] for i in job_ids if i in self.gpu_peaks_gib}

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        """The limits set in `qos` for this QOS (the default one without a name), as the fake's user's."""
        self._guard("qos_limits")
        if not self.accounting_enabled:
            return None
        found = self.qos.get(qos or self.default_qos)
        return found.model_copy(update={"user": self.user}) if found else None

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        """The canned output set for the pool; a pool without a free node fails as `srun --immediate` does."""
        self._guard("run_step")
        comp = ComponentRequest(pool.partition, pool.gres_type, 1, gpus, 1)
        if self._place([comp], self._used()) is None:
            raise SlurmCommandError(
                ["srun", *argv], 1, "srun: error: Unable to allocate resources: Requested nodes are busy"
            )
        return self.step_output.get(pool, "")

    def _job_rows(self, fake_jobs: Iterable[FakeJob]) -> list[Job]:
        """Squeue's view: one row per component, hetjob components numbered from the leader's id."""
        rows = []
        for j in sorted(fake_jobs, key=lambda j: j.job_id):
            het = j.job_id if len(j.components) > 1 else None
            for k, c in enumerate(j.components):
                names = j.nodes[k] if j.nodes else []
                end = j.end if j.end is not None else (j.start + j.limit_s if j.start is not None else None)
                rows.append(
                    Job(
                        job_id=j.job_id + k,
                        het_job_id=het,
                        het_job_offset=k if het else None,
                        name=j.name,
                        user=j.user,
                        state=j.state,
                        partition=c.partition,
                        nodes=names,
                        node_count=c.nodes,
                        gpu_type=c.gpu_type,
                        gpus_per_node=c.gpus_per_node,
                        start_time=int(j.start) if j.start is not None else None,
                        end_time=int(end) if end is not None else None,
                        time_limit_min=c.time_min,
                        comment=j.comment,
                        workdir=j.workdir,
                    )
                )
        return rows
