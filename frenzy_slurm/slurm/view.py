"""The orchestrator view: one typed snapshot of partitions, nodes (with GPUs) and jobs.

It is also the file format of `fsinfo --json` and of the static backend, so it is a pydantic model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, NamedTuple

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# a job as the queue lists it lives in its own pydantic-free module (the plain `fsqueue` listing builds only jobs)
from frenzy_slurm.slurm.job import (  # noqa: F401 (re-exported: the view's names)
    ACTIVE_JOB_STATES,
    ENDED,
    JOB_STATES,
    Job,
    clean_text,
    group_het_jobs,
    job_phase,
)

# Node base states that take a node out of free capacity (Slurm's node_states plus flags we fold in).
UNAVAILABLE_NODE_STATES = {
    "down",
    "drain",
    "drained",
    "draining",
    "fail",
    "failing",
    "future",
    "maint",
    "reserved",
    "unknown",
    "power_down",
    "powered_down",
    "powering_down",
    "not_responding",
    "reboot_requested",
    "reboot_issued",
    "inval",
}

Text = Annotated[str, BeforeValidator(clean_text)]


# How a pool of untyped GRES (Gres=gpu:N, no type) is named in notes and keys: `gpu/untyped`
UNTYPED_LABEL = "untyped"


def pool_label(partition: str, gres_type: str | None) -> str:
    """`partition/type`, or `partition/untyped` for GPUs without a GRES type."""
    return f"{partition}/{gres_type or UNTYPED_LABEL}"


def gres_spelling(gres_type: str | None, count: int | str) -> str:
    """How Slurm writes these GPUs: `gpu:TYPE:N`, or `gpu:N` without a type."""
    return f"gpu:{gres_type}:{count}" if gres_type else f"gpu:{count}"


class PoolKey(NamedTuple):
    """A GPU pool: one partition's GPUs of one GRES type (None: GPUs whose GRES has no type, `gpu:4`)."""

    partition: str
    gres_type: str | None

    def __str__(self) -> str:
        return pool_label(self.partition, self.gres_type)


class _M(BaseModel):
    # defer_build: a model's validator is built when it first validates, not at import; `fsqueue` validates Job
    # rows only and never pays for ClusterView, Node, Partition or the QOS models (behaviour is the same)
    model_config = ConfigDict(extra="forbid", defer_build=True)


class Partition(_M):
    name: Text = Field(description="Partition name.")
    state: Text = Field("UP", description="UP, DOWN, DRAIN or INACTIVE.")
    nodes: list[Text] = Field(default_factory=list, description="Node names (expanded).")
    is_default: bool = Field(False, description="The cluster's default partition.")
    default_time_min: int | None = Field(None, description="DefaultTime in minutes.")
    max_time_min: int | None = Field(None, description="MaxTime in minutes; null = unlimited.")
    max_nodes: int | None = Field(None, description="MaxNodes per job; null = unlimited.")


class Node(_M):
    name: Text = Field(description="Node name.")
    partitions: list[Text] = Field(default_factory=list, description="Partitions the node belongs to.")
    state: Text = Field(description="Base state, lower case (idle, mixed, allocated, down, drained, ...).")
    flags: list[Text] = Field(default_factory=list, description="State flags (DRAIN, RESERVED, ...), upper case.")
    reason: Text | None = Field(None, description="Why the node is down or drained.")
    gpu_type: Text | None = Field(
        None, description="GRES type of the node's GPUs (e.g. a100); null without GPUs or for untyped GRES (gpu:4)."
    )
    gpus_total: int = Field(0, ge=0, description="GPUs configured (typed or not).")
    gpus_used: int = Field(0, ge=0, description="GPUs allocated to jobs.")
    cpus: int = Field(0, ge=0, description="CPUs configured.")
    cpus_alloc: int = Field(0, ge=0, description="CPUs allocated.")
    memory_mb: int = Field(0, ge=0, description="RealMemory, MB.")
    memory_alloc_mb: int = Field(0, ge=0, description="Allocated memory, MB.")
    features: list[Text] | None = Field(
        None,
        description="Available node features (slurm.conf Features=), what -C/--constraint asks; null where the "
        "backend does not read them (the text formats, older snapshots).",
    )

    @property
    def in_use(self) -> bool:
        """Some job holds part of the node (GPUs, CPUs or memory): an --exclusive job cannot start on it."""
        return bool(self.gpus_used or self.cpus_alloc or self.memory_alloc_mb) or self.state.lower() in (
            "mixed",
            "allocated",
            "completing",
        )

    @property
    def available(self) -> bool:
        """Schedulable now: not down, drained, reserved or otherwise out of service."""
        return self.state.lower() not in UNAVAILABLE_NODE_STATES and not any(
            f.lower() in UNAVAILABLE_NODE_STATES for f in self.flags
        )

    @property
    def gpus_free(self) -> int:
        return max(0, self.gpus_total - self.gpus_used) if self.available else 0


class GpuLimit(_M):
    """One QOS limit on GPUs, as Slurm's TRES strings give it (`gres/gpu=4,gres/gpu:a100=2`)."""

    gpus: int | None = Field(None, ge=0, description="gres/gpu: all GPUs, typed or not; null = no limit.")
    by_type: dict[Text, int] = Field(default_factory=dict, description="gres/gpu:TYPE: GPUs of that GRES type.")

    def cap(self, gres_type: str | None) -> int | None:
        """The most GPUs of this GRES type the limit allows (None: no limit); untyped GPUs only meet gres/gpu."""
        caps = [c for c in (self.gpus, self.by_type.get(gres_type) if gres_type else None) if c is not None]
        return min(caps) if caps else None

    @property
    def unlimited(self) -> bool:
        return self.gpus is None and not self.by_type

    def describe(self) -> str:
        """`gres/gpu=2,gres/gpu:a100=1`, as sacctmgr writes it."""
        parts = ([f"gres/gpu={self.gpus}"] if self.gpus is not None else []) + [
            f"gres/gpu:{t}={n}" for t, n in sorted(self.by_type.items())
        ]
        return ",".join(parts)


class QosLimits(_M):
    """The GPU limits of the QOS a job would run under (`fsbatch -q`, else the association's default), as
    Slurm's accounting (sacctmgr) has them and only where it enforces them (AccountingStorageEnforce=limits).
    Part of the view so that HAS plans within them: `sbatch --test-only` ignores QOS limits."""

    name: Text = Field(description="QOS name.")
    user: Text = Field(description="The user the per-user limit is counted for (whose running jobs count).")
    per_job: GpuLimit = Field(default_factory=GpuLimit, description="MaxTRESPerJob: GPUs one job may have.")
    per_user: GpuLimit = Field(default_factory=GpuLimit, description="MaxTRESPerUser: GPUs one user's jobs may hold.")
    group: GpuLimit = Field(default_factory=GpuLimit, description="GrpTRES: GPUs all jobs of the QOS may hold.")


class ClusterView(_M):
    cluster: Text = Field("", description="Cluster name.")
    backend: Text = Field(description="Where the view came from: cli, pyslurm or static.")
    slurm_version: Text | None = Field(None, description="Version of the Slurm tools/daemons.")
    taken_at: float = Field(default_factory=time.time, description="When the view was read, epoch seconds.")
    partitions: list[Partition] = Field(default_factory=list, description="Partitions.")
    nodes: list[Node] = Field(default_factory=list, description="Nodes.")
    jobs: list[Job] = Field(default_factory=list, description="Jobs known to the controller (incl. recently finished).")
    qos: QosLimits | None = Field(
        None, description="GPU limits of the QOS the job would run under; null without accounting or limits."
    )

    def node(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def partition(self, name: str) -> Partition | None:
        return next((p for p in self.partitions if p.name == name), None)

    def pools(self) -> list[GpuPool]:
        """GPU capacity per (partition, GPU type); nodes whose GRES has no type (`gpu:4`) make a pool of type None.

        A simulated decision asks this of a view of hundreds of nodes and jobs (issue 20), hence the loops
        below: each node's availability is read once, and a pending job finds its pool by key (for a typed job)
        or as its partition's first pool (for an untyped one) instead of going through all pools."""
        acc: dict[tuple[str, str | None], GpuPool] = {}
        first: dict[str, GpuPool] = {}  # each partition's first pool, in the order they are made
        for n in self.nodes:
            if not n.gpus_total:
                continue
            up = n.available
            free = max(0, n.gpus_total - n.gpus_used) if up else 0  # Node.gpus_free
            for p in n.partitions:
                pool = acc.get((p, n.gpu_type))
                if pool is None:
                    pool = acc[(p, n.gpu_type)] = GpuPool(p, n.gpu_type)
                    first.setdefault(p, pool)
                pool.add_counts(up, n.gpus_total, free)
        phases: dict[str, str] = {}  # job_phase per state string (a few distinct ones)
        for j in self.jobs:
            if not j.gpus_per_node:
                continue
            phase = phases.get(j.state)
            if phase is None:
                phase = phases[j.state] = job_phase(j.state)
            if phase != "pending":
                continue
            for pname in j.partition.split(","):
                # the first pool of the partition whose type the job accepts (any type when it names none)
                found = first.get(pname) if j.gpu_type is None else acc.get((pname, j.gpu_type))
                if found is not None:
                    found.gpus_pending += j.gpus
                    break
        return sorted(acc.values(), key=lambda p: (p.partition, p.gpu_type or ""))


@dataclass
class GpuPool:
    partition: str
    gpu_type: str | None  # None: GPUs without a GRES type (Gres=gpu:4)
    nodes_up: int = 0
    nodes_down: int = 0
    gpus_total: int = 0
    gpus_free: int = 0
    gpus_pending: int = 0
    gpus_per_node: int = 0

    @property
    def key(self) -> PoolKey:
        return PoolKey(self.partition, self.gpu_type)

    def add(self, n: Node) -> None:
        self.add_counts(n.available, n.gpus_total, n.gpus_free)

    def add_counts(self, up: bool, gpus_total: int, gpus_free: int) -> None:
        """Count a node that is `up` (available) or not, with these GPUs configured and free."""
        if up:
            self.nodes_up += 1
        else:
            self.nodes_down += 1
        self.gpus_total += gpus_total
        self.gpus_free += gpus_free
        self.gpus_per_node = max(self.gpus_per_node, gpus_total)
