"""Measured cases: a model.yaml a user could write for a published run, plus what was measured on it.

A case file is a model.yaml with one more top-level block, `measurement:` (world size, GPU, metric, value in
GiB, source, confidence). The accuracy benchmark predicts each case through the product's own path
(`frenzy_slurm.marp.predict_pinned`: the plan the file pins at the world size, the job's overheads, the GPU), as
`frenzy-slurm memory --world N --gpu TYPE --metric M` shows it, TYPE the catalog GPU `measurement.gpu` names. A
directory of cases may hold `unreadable.yaml`: the rows a converter (eval/convert.py) could not write as a
model.yaml, each with its reason; they count as failures.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.eval.gpu_reading import catalog_gpu
from frenzy_slurm.jobspec import JobSpec, resolve_model
from frenzy_slurm.jobspec.job import Method
from frenzy_slurm.marp import predict_pinned
from frenzy_slurm.marp.memory import MemoryEstimate
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Workload

UNREADABLE = "unreadable.yaml"
Confidence = Literal["high", "medium", "low"]


class Measurement(BaseModel):
    """What a published run measured, per GPU."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    world_size: int = Field(gt=0, le=1 << 20, description="GPUs the run used (the plan model.yaml pins at this count).")
    gpu: str = Field(min_length=1, description="The GPU measured on, as the source names it (e.g. A100-80GB).")
    metric: Metric = Field(
        description="What was measured: allocated (torch.cuda.max_memory_allocated, also peak active bytes), "
        "reserved (max_memory_reserved, the caching allocator's peak) or device (nvidia-smi / NVML used: the "
        "CUDA context and NCCL buffers included)."
    )
    value_gib: float = Field(gt=0, le=1 << 20, description="The measured peak per GPU, GiB (2^30 bytes).")
    source: str = Field(min_length=1, description="Where the number is published (URL and table or line).")
    confidence: Confidence = Field(
        description="How completely the source states the run: high, medium or low (the summary shows each)."
    )
    category: str | None = Field(
        None, description="The source's label for the run (pretraining, full finetune, LoRA, ...), shown only."
    )
    assumed: list[str] = Field(
        default_factory=list,
        description="Settings of the model.yaml the source does not state: marked as assumed by whoever wrote the "
        "measurement down, or left unstated and planned as the framework's default. The benchmark predicts the case "
        "but scores it as low confidence.",
    )

    @property
    def scored_confidence(self) -> Confidence:
        """The confidence the benchmark scores: low where a setting is assumed, else the source's."""
        return "low" if self.assumed else self.confidence


class MeasuredCase(JobSpec):
    """A model.yaml (every block as docs/model-yaml.md describes it) plus `measurement:`."""

    measurement: Measurement = Field(description="What was measured on this run.")


class Unreadable(BaseModel):
    """A measurement a converter could not write as a model.yaml, with its reason: a failure, not a dropped row."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    case: str = Field(description="The row's id.")
    reason: str = Field(description="Why no model.yaml could be written for it.")
    method: Method = Field(description="full, lora or qlora, as the row's category says (for the per-class summary).")
    confidence: Confidence = Field(description="The row's confidence.")
    category: str = Field(description="The row's category.")
    value_gib: float | None = Field(None, description="The measured value, where it is a number.")


class UnreadableList(BaseModel):
    model_config = ConfigDict(extra="forbid")

    unreadable: list[Unreadable] = Field(default_factory=list, description="Rows without a case file.")


@dataclass(frozen=True)
class Prediction:
    """A case predicted through the product's path."""

    workload: Workload
    plan: ParallelPlan
    estimate: MemoryEstimate
    gpu: str | None = None  # the catalog GPU `measurement.gpu` names (eval/gpu_reading.py), None where it pins none


def load_case(path: Path) -> MeasuredCase:
    """A case file, validated as fsbatch validates model.yaml (InputError naming file, line and field)."""
    return load_model_file(path, MeasuredCase)


def predict_case(case: MeasuredCase, path: Path) -> Prediction:
    """The case's per-GPU peak of the measured metric, as `frenzy-slurm memory --world N --gpu TYPE --metric M`
    predicts it, TYPE the catalog GPU its `measurement.gpu` names (`catalog_gpu`; without one, as without --gpu);
    InputError when its model.yaml cannot be planned at the measured world size."""
    m = case.measurement
    gpu = catalog_gpu(m.gpu)
    w, plan, est = predict_pinned(case, resolve_model(case, path.parent), m.world_size, m.metric, gpu=gpu)
    return Prediction(w, plan, est, gpu.name if gpu else None)


def case_files(directory: Path) -> list[Path]:
    """The case files of a directory (every *.yaml but unreadable.yaml), by name."""
    if not directory.is_dir():
        raise InputError(
            f"{directory}: not a directory of case files (write them with python -m frenzy_slurm.eval.convert)"
        )
    return sorted(p for p in directory.glob("*.yaml") if p.name != UNREADABLE)


def load_unreadable(directory: Path) -> list[Unreadable]:
    path = directory / UNREADABLE
    return load_model_file(path, UnreadableList).unreadable if path.exists() else []
