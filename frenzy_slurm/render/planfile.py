"""plan.json: the full decision and everything the job needs, for --explain, fsqueue, the runtime and audit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frenzy_slurm.errors import InputError
from frenzy_slurm.has.model import Decision
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import JobSpec, SlurmOptions
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.records import read_json
from frenzy_slurm.render.shapes import Shape
from frenzy_slurm.yamlfile import format_validation_error


class MovedFrom(BaseModel):
    """The job this one continues (`frenzy-slurm watch` moved it here): its checkpoints are resumed from."""

    model_config = ConfigDict(extra="forbid")

    job_id: int = Field(description="The Slurm job that was moved.")
    job_dir: str = Field(description="Its job directory, whose checkpoints/ this job resumes from.")
    plan: ParallelPlan = Field(description="The plan its checkpoints were written with (their layout).")


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


def plan_from(data: Any, path: Path) -> PlanFile:
    """plan.json's content, already read (by whichever bounded reader the caller trusts), as a PlanFile."""
    try:
        return PlanFile.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(str(path), exc)) from None
