"""Renders the model.yaml reference (docs/model-yaml.md) from the pydantic schema, so it cannot drift."""

from __future__ import annotations

import typing

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import (
    Container,
    Data,
    DeepSpeedBuffers,
    Entry,
    JobEnvironment,
    JobSpec,
    Limits,
    LlmcFlags,
    LoraSpec,
    ModelSource,
    Parallel,
    SlurmOptions,
    Training,
)

SECTIONS: list[tuple[str, type[BaseModel]]] = [
    ("top level", JobSpec),
    ("model", ModelSource),
    ("model.arch", Architecture),
    ("training", Training),
    ("training.lora", LoraSpec),
    ("limits", Limits),
    ("slurm", SlurmOptions),
    ("entry", Entry),
    ("entry.environment", JobEnvironment),
    ("entry.environment.container", Container),
    ("entry.llmc", LlmcFlags),
    ("parallel", Parallel),
    ("deepspeed", DeepSpeedBuffers),
    ("data", Data),
]


def _type_name(tp: object) -> str:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in typing.get_args(tp))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join(_type_name(a) for a in typing.get_args(tp) if a is not type(None))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "mapping"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "block"
    return getattr(tp, "__name__", str(tp))


def render() -> str:
    out = [
        "# model.yaml reference",
        "",
        "Generated from `frenzy_slurm/jobspec` by `frenzy-slurm spec-reference`; do not edit by hand.",
        "Unknown keys are errors, and so is a key given twice in one block. Numbers must be finite (`.inf` and",
        "`.nan` are refused). Relative paths are relative to model.yaml's directory. See `examples/` for complete",
        "files.",
        "",
    ]
    for title, model in SECTIONS:
        out += [f"## {title}", "", "| field | type | default | description |", "|---|---|---|---|"]
        for name, f in model.model_fields.items():
            if f.is_required():
                default = "**required**"
            elif f.default_factory is not None:
                made = f.get_default(call_default_factory=True)  # the factory's value
                default = f"`{made}`" if not isinstance(made, BaseModel) else "see below"
            elif f.default is PydanticUndefined or f.default is None:
                default = "-"
            else:
                default = f"`{f.default}`"
            out.append(f"| `{name}` | {_type_name(f.annotation)} | {default} | {f.description or ''} |")
        out.append("")
    return "\n".join(out)
