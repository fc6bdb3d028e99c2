"""plan.json: the full decision and everything the job needs, for --explain, fsqueue, the runtime and audit.

Its schema (`PlanFile`) and its readers: `read_plan` for the job's own directory (the runtime, checked by
runtime.trust first), `read_job_plan` for a directory the reader did not make (fsqueue, calibration).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import read_job_record, read_json
from frenzy_slurm.core.yamlfile import format_validation_error
from frenzy_slurm.has.model import Allocation, Decision
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import JobSpec, SlurmOptions
from frenzy_slurm.marp.plan import ParallelPlan


class Shape(BaseModel):
    """One allocation a job marked slurm.replan may run as, with what it runs there (render/shapes.py chooses
    them; the runtime runs the one Slurm gave the job)."""

    model_config = ConfigDict(extra="forbid")

    partition: str = Field(description="Slurm partition.")
    gpu_type: str | None = Field(description="Slurm GRES type; null for untyped GRES.")
    nodes: int = Field(gt=0, description="Nodes.")
    gpus_per_node: int = Field(gt=0, description="GPUs (and tasks) per node.")
    allocation: Allocation = Field(description="HAS's allocation for this shape: its plan and predicted times.")
    ds_config: dict[str, Any] = Field(description="The DeepSpeed config rendered for this shape's plan.")

    def key(self) -> tuple[str, int, int]:
        return (self.partition, self.nodes, self.gpus_per_node)


class MovedFrom(BaseModel):
    """The job this one continues (`frenzy-slurm watch` moved it here, or it ran out of memory): its checkpoints
    are resumed from."""

    model_config = ConfigDict(extra="forbid")

    job_id: int = Field(description="The Slurm job that was moved.")
    job_dir: str = Field(description="Its job directory, whose checkpoints/ this job resumes from.")
    plan: ParallelPlan = Field(description="The plan its checkpoints were written with (their layout).")
    reason: Literal["moved", "out of memory"] = Field(
        "moved",
        description="Why: `frenzy-slurm watch` moved it, or it ran out of memory and was submitted again on a "
        "plan with more headroom (frenzy_slurm/runtime/oom_retry.py).",
    )


class PlanFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    frenzy_version: str
    submission: str = Field(description="Hash of the submission (spec + flags); also in the job comment.")
    created_at: float
    spec_path: str
    spec: JobSpec
    arch: Architecture
    model_name: str
    exact_params: int | None = None
    decision: Decision
    time_min: int
    sbatch_argv: list[str]
    command: list[str] = Field(description="What each task runs (after srun).")
    predicted: dict[str, Any] = Field(
        default_factory=dict, description="Per GPU type: predicted peak GiB and step time."
    )
    moved_from: MovedFrom | None = Field(
        None, description="The job this one continues, where `frenzy-slurm watch` moved it; null otherwise."
    )
    shapes: list[Shape] = Field(
        default_factory=list,
        description="slurm.replan: the shapes the job may be changed to while it waits, the chosen one first; "
        "the runtime runs the one Slurm gave it (render/shapes.py). Empty: the chosen allocation only.",
    )
    slurm: SlurmOptions | None = Field(
        None,
        description="The sbatch options the user gave (model.yaml's slurm: block with fsbatch's flags on top), "
        "before HAS chose a QOS: what `frenzy-slurm watch` submits a moved job with.",
    )


def read_plan(path: Path) -> PlanFile:
    return plan_from(read_json(path, "plan"), path)


def read_job_plan(path: Path, owner: int | None = None) -> PlanFile:
    """plan.json as a job directory holds it: a bounded read of a regular file, not through a link (with
    `owner`: of that uid's and writable by no one else, as `read_config_text` checks it)."""
    return plan_from(read_job_record(path, "plan", owner=owner), path)


def plan_from(data: Any, path: Path) -> PlanFile:
    """plan.json's content, already read (by whichever bounded reader the caller trusts), as a PlanFile."""
    try:
        return PlanFile.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(str(path), exc)) from None
