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


class Component(_M):
    """One Slurm (het)job component: GPUs of one type in one partition."""

    partition: str = Field(description="Slurm partition.")
    gpu_type: str | None = Field(description="Slurm GRES type; null for GPUs whose GRES has no type (--gres=gpu:N).")
    gpu_model: str = Field(description="Catalog GPU model.")
    nodes: int = Field(gt=0, description="Nodes.")
    gpus_per_node: int = Field(gt=0, description="GPUs (and tasks) per node.")
    cpus_per_task: int = Field(4, gt=0, description="CPUs per task (site file's cpus_per_gpu).")
    stages: list[int] = Field(description="Pipeline stages this component runs.")
    peak_gib: float = Field(description="Predicted per-GPU peak (device memory) on this component.")
    capacity_gib: float = Field(description="Usable memory per GPU.")
    capped_gib: float = Field(
        0.0,
        ge=0,
        description="Of the variable-length cache, what peak_gib leaves out to stay within the GPU's memory (the "
        "caching allocator frees its cache before it reports out of memory; it decides no fit).",
    )
    needed_gib: float | None = Field(
        None,
        description="Of peak_gib, what decides the fit: the peak less the variable-length cache the allocator gives "
        "back first; null where that is the whole peak.",
    )

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class Allocation(_M):
    kind: Literal["homogeneous", "heterogeneous"]
    components: list[Component]
    plan: ParallelPlan = Field(description="The parallel plan, its layer split written out (the runtime runs it).")
    step_time_s: float
    run_time_s: float
    time_min: int = Field(gt=0, description="sbatch --time HAS chose: the user's, else the prediction with margin.")
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


class Fallback(_M):
    """A plan to resubmit on when the chosen one runs out of memory anyway (has/fallback.py)."""

    memory_factor: float = Field(
        description="HAS decided this with every memory prediction multiplied by this factor: it fits where the "
        "real use exceeds the predictions by up to that much, the chosen plan only up to less."
    )
    resumes: bool = Field(
        description="Whether it loads the chosen plan's checkpoints; false: it fits only a run that saved none."
    )
    allocation: Allocation


class Decision(_M):
    chosen: Allocation
    alternatives: list[Alternative] = Field(default_factory=list)
    decided_at: float
    decision_ms: float
    oom_fallbacks: list[Fallback] = Field(
        default_factory=list,
        description="Where a run of the chosen plan that runs out of memory is submitted again (slurm.oom_retry), "
        "most preferred first.",
    )
