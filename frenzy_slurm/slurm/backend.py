"""The one interface to Slurm: every read, estimate, submission, query and cancellation goes through it.

Implementations: `cli.SlurmCliBackend` (Slurm's command-line tools, any version), `pyslurm_backend`
(reads through pyslurm; submits through the CLI backend, since pyslurm cannot express hetjobs),
`static.StaticBackend` (a saved view; reads only), `fake.FakeSlurm` (in memory, for unit tests) and
the simulator's `sim.slurm.SimSlurm` (a trace-driven Slurm; tests/test_seam_backend_protocol.py checks all five
against this protocol). Callers never run a Slurm command or import pyslurm themselves.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, Protocol

from frenzy_slurm.slurm.run import SlurmUnavailable

if TYPE_CHECKING:  # the view's pydantic models: not imported by a plain `fsqueue` listing (start-up time)
    from frenzy_slurm.slurm.job import Job
    from frenzy_slurm.slurm.view import ClusterView, PoolKey, QosLimits

__all__ = [
    "AccountingRecord",
    "BatchJob",
    "ComponentRequest",
    "ReadOnlyBackend",
    "SbatchAnswer",
    "SlurmBackend",
    "StartEstimate",
]


@dataclass(frozen=True)
class ComponentRequest:
    """One component of a (possibly heterogeneous) GPU request, as sbatch would get it."""

    partition: str
    gpu_type: str | None
    nodes: int
    gpus_per_node: int
    time_min: int
    cpus_per_gpu: int = 1
    mem_per_gpu_mb: int = 500
    constraint: str | None = None  # --constraint (node features), as the job's every component carries it
    exclusive: bool = False  # --exclusive: whole nodes


@dataclass(frozen=True)
class StartEstimate:
    start: float  # epoch seconds
    nodes: list[str]
    source: str  # "test-only", "snapshot", "fake", ...


@dataclass(frozen=True)
class BatchJob:
    """What is handed to Slurm: the rendered script, and the same request in structured form.

    The script is what real Slurm runs (`sbatch --parsable SCRIPT`, its own `#SBATCH` lines say
    everything); `components`, `name` and `comment` repeat those lines for backends that cannot read
    a script (the fake and the simulator), so what was planned is what runs there too.
    """

    script: Path
    workdir: Path
    components: list[ComponentRequest]
    name: str = ""
    comment: str = ""
    # the file-mode mask sbatch runs under: Slurm hands the submitter's umask to the job and creates the
    # job's output files (-o/-e) with it, before the script's own `umask` line runs
    umask: int = 0o077
    # sbatch --dependency on the command line, which sbatch reads over the script's own line: what is known only
    # at submission (a sweep's --max-running chain names the job id of an earlier job of the sweep)
    dependency: str | None = None


@dataclass(frozen=True)
class SbatchAnswer:
    """What sbatch answered: the job id (and cluster, from `jobid;cluster`) and the argv that was run. The
    submit stage's own result, with the job directory, is `frenzy_slurm.submission.Submitted`."""

    job_id: int
    cluster: str | None
    argv: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class AccountingRecord:
    """One job's record in Slurm's accounting (sacct), for jobs that have left the queue."""

    job_id: int
    state: str
    exit_code: str | None = None
    start: int | None = None
    end: int | None = None
    elapsed_s: int | None = None
    user: str | None = None  # who ran it: calibrate accepts a job directory only of the job's own user
    work_dir: str | None = None  # the job's working directory (frenzy-slurm's job directory)
    nodes: int | None = None  # NNodes: the nodes it was allocated (calibrate compares them with plan.json)
    alloc_gpus: int | None = None  # gres/gpu in AllocTRES: the GPUs it was allocated, all nodes together


class SlurmBackend(Protocol):
    name: str
    # The saved cluster view this backend reads (a snapshot file), or None where it asks a Slurm controller (a live
    # one, the fake's or the simulator's). A saved view is the whole answer: no start estimates beyond its own
    # timeline, no submissions, no queue to check a job in.
    snapshot: Path | None

    def load(self) -> ClusterView:
        """One consistent snapshot of partitions, nodes and jobs."""
        ...

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        """When Slurm would start this request now (a hetjob if several components)."""
        ...

    def submit(self, job: BatchJob) -> SbatchAnswer:
        """Submit a batch or heterogeneous job. Raises SlurmCommandError when Slurm refuses it."""
        ...

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        """The queue's jobs (all components of hetjobs), in one query: these ids, this user's, or all."""
        ...

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        """Cancel a job (every component of a hetjob: `job_id` is its leader's), as `scancel JOBID`; with
        `signal` (a name such as USR2, without SIG), send it to the job's steps instead, as `scancel --signal`.
        Raises SlurmCommandError when Slurm refuses (an unknown or already finished job)."""
        ...

    def requeue(self, job_id: int) -> None:
        """Put a running job back in the queue (its batch script runs again)."""
        ...

    def hold(self, job_id: int) -> None:
        """Keep a pending job from starting (`scontrol hold`) until it is released. Raises SlurmCommandError
        where Slurm refuses: a job that is no longer pending (it started meanwhile) or unknown."""
        ...

    def release(self, job_id: int) -> None:
        """Let a held job start again (`scontrol release`)."""
        ...

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        """Change a pending single-component job, in place, to `component`'s partition, GPU type, GPUs per node
        (one task each) and node count, as `scontrol update JobId=N Partition=P NumNodes=M TasksPerNode=K
        NumTasks=M*K CPUsPerTask=C Gres=gpu:TYPE:K`: it keeps its id, submit time and priority, its place in
        the queue. Its time limit and memory stay as submitted. Raises SlurmCommandError where Slurm refuses
        (the job started meanwhile, is unknown, or the partition does not take it). `restate_tasks=False` (a
        plain user's update) leaves out TasksPerNode, which only operators may change: the job keeps its
        submitted tasks per node as a bound, so only shapes with no more GPUs per node than it was submitted
        with run (more leave it BadConstraints)."""
        ...

    def is_operator(self) -> bool:
        """Whether this user may change what only Slurm's operators may (another user's job, a pending job's
        tasks per node): AdminLevel Operator or Administrator in accounting, or root. False where it cannot say."""
        ...

    def preempted(self, job_id: int) -> bool:
        """Whether Slurm is preempting the job (its PreemptTime is set): the SIGTERM its steps got is a
        preemption, which the job answers by requeueing after its checkpoint, not a scancel, which stops it."""
        ...

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        """sacct records of these jobs in one query; None where the site keeps no accounting."""
        ...

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        """Per job, the most GPU memory (GiB) one task used, from Slurm's own GPU accounting (sacct
        TRESUsageInMax gres/gpumem, Slurm 23.02+ with AccountingStorageTRES=gres/gpu); jobs without it are
        left out. None where the site keeps no accounting."""
        ...

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        """The GPU limits of QOS `qos` (None: the QOS the user's jobs get by default) for the current user, as
        Slurm enforces them (MaxTRESPerJob, MaxTRESPerUser, GrpTRES on gres/gpu); None where Slurm enforces
        no QOS limits (no accounting, AccountingStorageEnforce without `limits`) or the backend cannot say."""
        ...

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        """Run `argv` as one short job step on one node of `pool` holding `gpus` GPUs; its stdout.

        For site tools (`frenzy-slurm site detect`): fails rather than queues when no node is free.
        """
        ...


class ReadOnlyBackend:
    """Mixin for backends that can only read (a saved snapshot): the rest says so plainly."""

    name = "read-only"

    def _refuse(self, what: str) -> NoReturn:
        raise SlurmUnavailable(
            f"the {self.name} backend only reads a saved view; it cannot {what}. "
            "Use --backend cli (or auto) on a machine that reaches Slurm."
        )

    def submit(self, job: BatchJob) -> SbatchAnswer:
        self._refuse("submit jobs")

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self._refuse("cancel or signal jobs")

    def requeue(self, job_id: int) -> None:
        self._refuse("requeue jobs")

    def hold(self, job_id: int) -> None:
        self._refuse("hold jobs")

    def release(self, job_id: int) -> None:
        self._refuse("release jobs")

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        self._refuse("update pending jobs")

    def is_operator(self) -> bool:
        return False  # a saved view changes no job

    def preempted(self, job_id: int) -> bool:
        self._refuse("ask Slurm about a running job")

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        return None

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        self._refuse("run job steps")

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        return None

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        return None  # a saved view keeps no accounting
