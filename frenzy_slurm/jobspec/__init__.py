"""Stage 1: read and validate model.yaml into a JobSpec, and resolve its Architecture.

from frenzy_slurm.jobspec import load_job_spec, resolve_model
spec = load_job_spec(Path("examples/llama2-7b.yaml"))
model = resolve_model(spec, Path("examples"))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.hf import architecture_from_hf_config
from frenzy_slurm.jobspec.job import JobSpec, Training
from frenzy_slurm.jobspec.presets import presets
from frenzy_slurm.slurm.timefmt import parse_slurm_time

__all__ = [
    "Architecture",
    "JobSpec",
    "ResolvedModel",
    "Training",
    "load_job_spec",
    "parse_slurm_time",
    "presets",
    "resolve_model",
]


@dataclass(frozen=True)
class ResolvedModel:
    """The architecture plus, where MARP traced a factory, the exact parameter count."""

    arch: Architecture
    name: str
    exact_params: int | None = None


def load_job_spec(path: Path, overrides: Mapping[str, Any] | None = None) -> JobSpec:
    """Parse model.yaml, with `overrides` (dotted key -> value: fsbatch --set, the API's overrides) applied
    before validation; raises InputError naming file, line and field (or the --set) on any problem.

    Relative paths in it are relative to model.yaml's own directory (as `hf_config` and `entry.script` are):
    `entry.data` is made absolute here, since the job runs in its job directory, where a relative path
    would name a different file, or none.
    """
    spec = load_model_file(path, JobSpec, overrides)
    data = spec.entry.data
    if data is not None and not Path(data).is_absolute():
        absolute = str((path.parent / data).absolute())
        spec = spec.model_copy(update={"entry": spec.entry.model_copy(update={"data": absolute})})
    return spec


def resolve_model(spec: JobSpec, base_dir: Path) -> ResolvedModel:
    """Turn the model source into an Architecture (no torch). A factory's exact parameter count is MARP's
    business: `frenzy_slurm.marp.with_exact_params` traces it."""
    src = spec.model
    if src.preset is not None:
        return ResolvedModel(arch=presets()[src.preset].arch, name=src.preset)
    if src.arch is not None:
        return ResolvedModel(arch=src.arch, name=spec.name)
    if src.hf_config is not None:
        path = Path(src.hf_config)
        path = path if path.is_absolute() else base_dir / path
        return ResolvedModel(arch=architecture_from_hf_config(path), name=path.parent.name or spec.name)
    assert src.factory is not None and src.factory_arch is not None
    return ResolvedModel(arch=src.factory_arch, name=src.factory)
