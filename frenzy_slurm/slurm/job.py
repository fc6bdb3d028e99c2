"""A job as Slurm lists it: `Job`, the record every backend's `jobs()` returns, its state table and the grouping of
a heterogeneous job's components.

A plain `fsqueue` listing builds only these, so this module imports no pydantic (start-up time is most of a
listing's wall time, benchmarks/fsbatch_latency.py --listing): `Job` is a standard-library dataclass that checks its
own fields. Inside the view (`ClusterView.jobs`, the static backend's snapshot) pydantic validates it as it does any
dataclass, through the same checks (`__post_init__`), with unknown fields refused (`__pydantic_config__`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import ClassVar

# Every Slurm job state (slurm.h job_states and flags as squeue prints them) in one table.
JOB_STATES = {
    "PENDING": "pending",
    "RUNNING": "running",
    "SUSPENDED": "suspended",
    "COMPLETED": "completed",
    "CANCELLED": "cancelled",
    "FAILED": "failed",
    "TIMEOUT": "timeout",
    "NODE_FAIL": "failed",
    "PREEMPTED": "cancelled",
    "BOOT_FAIL": "failed",
    "DEADLINE": "timeout",
    "OUT_OF_MEMORY": "failed",
    "COMPLETING": "running",
    "CONFIGURING": "pending",
    "REQUEUED": "pending",
    "REQUEUE_FED": "pending",
    "REQUEUE_HOLD": "pending",
    "RESIZING": "running",
    "RESV_DEL_HOLD": "pending",
    "REVOKED": "cancelled",
    "SIGNALING": "running",
    "SPECIAL_EXIT": "failed",
    "STAGE_OUT": "running",
    "STOPPED": "suspended",
    "UPDATE_DB": "running",
    "POWER_UP_NODE": "pending",
    "LAUNCH_FAILED": "failed",
    "RECONFIG_FAIL": "failed",
}
ACTIVE_JOB_STATES = {"pending", "running", "suspended"}
ENDED = ("completed", "cancelled", "failed", "timeout")  # job phases a job does not leave


def job_phase(state: str) -> str:
    """pending/running/suspended/completed/cancelled/failed/timeout, or unknown (never an error)."""
    return JOB_STATES.get(state.upper().split()[0] if state else "", "unknown")


def clean_text(value: object) -> object:
    """Text that can always be printed and written as JSON: bytes decoded as UTF-8 and lone surrogates (from a
    `surrogateescape` decoding, as pyslurm or a snapshot may hand over) replaced by U+FFFD. Names, comments and
    directories of jobs come from any user of the cluster (`sbatch -J $'caf\\xe9'`); one of them must not
    break the tools for everyone."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if not isinstance(value, str) or value.isascii():
        return value
    try:
        value.encode("utf-8")
        return value
    except UnicodeEncodeError:
        try:
            return value.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")
        except UnicodeEncodeError:  # a surrogate no decoder made: replace it too
            return value.encode("utf-8", errors="replace").decode("utf-8")


# the fields' kinds, for the checks in Job.__post_init__ (the annotations are strings: `from __future__`)
_TEXT = ("name", "user", "state", "partition", "comment")
_OPTIONAL_TEXT = ("reason", "gpu_type", "workdir", "qos")
_COUNTS = ("job_id", "node_count", "gpus_per_node")
_OPTIONAL_INTS = ("het_job_id", "het_job_offset", "start_time", "end_time", "time_limit_min")


@dataclass(kw_only=True)  # keywords only: the fields keep the order of Slurm's listing
class Job:
    """One job (or one component of a heterogeneous job) as the queue lists it."""

    # a snapshot's job with a field this version does not know is refused, as the view's models refuse one
    __pydantic_config__: ClassVar[dict[str, str]] = {"extra": "forbid"}

    job_id: int  # Slurm job id (for a hetjob component, its own id)
    het_job_id: int | None = None  # leader id of a heterogeneous job; None otherwise
    het_job_offset: int | None = None  # component index within the heterogeneous job
    name: str = ""
    user: str = ""  # owner
    state: str  # Slurm job state as reported (RUNNING, PENDING, ...)
    reason: str | None = None  # pending reason
    partition: str = ""  # the component's partition
    nodes: list[str] = field(default_factory=list)  # allocated nodes (expanded)
    node_count: int = 0  # nodes requested or allocated
    gpu_type: str | None = None  # requested GPU type, if typed
    gpus_per_node: int = 0  # GPUs per node requested
    start_time: int | None = None  # start (or expected start of a pending job), epoch seconds
    end_time: int | None = None  # end (or expected end), epoch seconds
    time_limit_min: int | None = None  # time limit in minutes
    comment: str = ""
    workdir: str | None = None  # working directory (frenzy-slurm's job directory)
    qos: str | None = None  # the job's QOS; None where the backend does not say

    def __post_init__(self) -> None:
        for name in _TEXT + _OPTIONAL_TEXT:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_TEXT:
                continue
            value = clean_text(value)
            if not isinstance(value, str):
                raise ValueError(f"job field {name}: expected text, got {type(value).__name__}")
            setattr(self, name, value)
        for name in _COUNTS + _OPTIONAL_INTS:
            value = getattr(self, name)
            if value is None and name in _OPTIONAL_INTS:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"job field {name}: expected a whole number, got {value!r}")
            if name in _COUNTS and value < 0:
                raise ValueError(f"job field {name}: must be >= 0, got {value}")
        if not isinstance(self.nodes, list):
            raise ValueError("job field nodes: expected a list of node names")
        self.nodes = [_node_name(n) for n in self.nodes]

    @property
    def phase(self) -> str:
        return job_phase(self.state)

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * max(self.node_count, 1)

    @property
    def display_id(self) -> str:
        """`1234` or `1234+1` as squeue shows hetjob components."""
        if self.het_job_id:
            return f"{self.het_job_id}+{self.het_job_offset or 0}"
        return str(self.job_id)


def _node_name(value: object) -> str:
    value = clean_text(value)
    if not isinstance(value, str):
        raise ValueError(f"job field nodes: expected node names, got {value!r}")
    return value


def group_het_jobs(jobs: list[Job]) -> dict[int, list[Job]]:
    """Jobs keyed by the id users see: a heterogeneous job's components under its leader's id."""
    out: dict[int, list[Job]] = defaultdict(list)
    for j in jobs:
        out[j.het_job_id or j.job_id].append(j)
    for comps in out.values():
        comps.sort(key=lambda j: j.het_job_offset or 0)
    return dict(out)
