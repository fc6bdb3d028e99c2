"""HAS output: an Allocation (one component per partition) and the alternatives it beat.

These are pydantic models because `plan.json` stores them: fsqueue, the in-job runtime and
`fsbatch --explain` read the decision back from that file.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.marp.plan import ParallelPlan


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PlanModel(_M):
    """ParallelPlan as stored in plan.json."""

    dp: int
    tp: int
    pp: int
    zero: int
    micro_batch: int
    grad_accum: int
    sequence_parallel: bool
    recompute: Literal["none", "selective", "full"]
    offload_optimizer: bool
    offload_params: bool
    layer_split: list[int]

    @classmethod
    def of(cls, p: ParallelPlan, layers: int) -> "PlanModel":
        return cls(dp=p.dp, tp=p.tp, pp=p.pp, zero=p.zero, micro_batch=p.micro_batch, grad_accum=p.grad_accum,
                   sequence_parallel=p.sequence_parallel, recompute=p.recompute, offload_optimizer=p.offload_optimizer,
                   offload_params=p.offload_params, layer_split=list(p.stage_layers(layers)))

    def to_plan(self) -> ParallelPlan:
        return ParallelPlan(dp=self.dp, tp=self.tp, pp=self.pp, zero=self.zero, micro_batch=self.micro_batch,
                            grad_accum=self.grad_accum, sequence_parallel=self.sequence_parallel,
                            recompute=self.recompute, offload_optimizer=self.offload_optimizer,
                            offload_params=self.offload_params, layer_split=tuple(self.layer_split))

    def short(self) -> str:
        return self.to_plan().short()


class Component(_M):
    """One Slurm (het)job component: GPUs of one type in one partition."""

    partition: str = Field(description="Slurm partition.")
    gpu_type: str = Field(description="Slurm GRES type.")
    gpu_model: str = Field(description="Catalog GPU model.")
    nodes: int = Field(gt=0, description="Nodes.")
    gpus_per_node: int = Field(gt=0, description="GPUs (and tasks) per node.")
    cpus_per_task: int = Field(4, gt=0, description="CPUs per task (site file's cpus_per_gpu).")
    stages: list[int] = Field(description="Pipeline stages this component runs.")
    peak_gib: float = Field(description="Predicted per-GPU peak (device memory) on this component.")
    capacity_gib: float = Field(description="Usable memory per GPU.")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Allocation(_M):
    kind: Literal["homogeneous", "heterogeneous"]
    components: list[Component]
    plan: PlanModel
    step_time_s: float
    run_time_s: float
    start: float = Field(description="Predicted start, epoch seconds.")
    start_source: str = Field(description="now (GPUs free), view (running jobs' end times) or test-only (Slurm).")

    @property
    def completion(self) -> float:
        return self.start + self.run_time_s

    @property
    def gpus(self) -> int:
        return sum(c.gpus for c in self.components)

    def label(self) -> str:
        return " + ".join(f"{c.gpus}x{c.gpu_model}({c.partition})" for c in self.components)


class Alternative(_M):
    allocation: Allocation | None = None
    description: str
    lost_because: str


class Decision(_M):
    chosen: Allocation
    alternatives: list[Alternative] = Field(default_factory=list)
    decided_at: float
    decision_ms: float
