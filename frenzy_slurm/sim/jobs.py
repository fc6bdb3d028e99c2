"""What policies hand the simulator: one attempt of a workload job and the placement chosen for it.

A placement carries both the Slurm request (components, time limit) and what was predicted for it
(step time, peak memory per component); the runner turns the prediction into the truth.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.jobspec import JobSpec, resolve_model
from frenzy_slurm.jobspec.presets import presets
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.sim.workload import WorkloadJob, job_spec
from frenzy_slurm.slurm.backend import ComponentRequest


@dataclass
class Attempt:
    """One submission of a workload job (the first, or a resubmission after OOM or time limit)."""

    job: WorkloadJob
    steps: int  # steps still to run
    number: int = 1
    mem_correction: float = 1.0  # after an OOM: how much more memory than predicted to plan for
    ooms: int = 0
    timeouts: int = 0
    last_gpus: int | None = None  # GPUs of the previous attempt (user-fixed doubles them after an OOM)
    last_pool: str | None = None
    tried_pools: list[str] = field(default_factory=list)
    max_gpus: int | None = None  # limits.max_gpus of the job's model.yaml (simulate --max-gpus)

    @cached_property
    def spec(self) -> JobSpec:
        return job_spec(self.job, steps=self.steps, max_gpus=self.max_gpus)

    @cached_property
    def workload(self) -> Workload:
        return workload_from_spec(self.spec, resolve_model(self.spec, Path(".")))

    @cached_property
    def space(self) -> SearchSpace:
        return search_space_from_spec(self.spec)

    @property
    def requirements(self) -> Requirements:
        return Requirements.from_spec(self.spec)

    @property
    def params_b(self) -> float:
        return presets()[self.job.model].params_b


@dataclass(frozen=True)
class PlacedComponent:
    request: ComponentRequest
    gpu_model: str
    predicted_peak_gib: float  # device memory per GPU, as predicted
    memory_gib: float  # the GPU's physical memory


@dataclass(frozen=True)
class Placement:
    components: list[PlacedComponent]
    step_time_s: float  # predicted
    label: str
    kind: str = "homogeneous"
    # a multi-partition submission (slurm-multi): every placement the job may start as, this one first;
    # the simulated Slurm starts it as the one that can start first
    alternatives: tuple[Placement, ...] = ()
    # the plan MARP predicted the step of (HAS's: its checkpoint's layout); None for a user's own request
    plan: ParallelPlan | None = None

    @property
    def gpus(self) -> int:
        return sum(c.request.nodes * c.request.gpus_per_node for c in self.components)
