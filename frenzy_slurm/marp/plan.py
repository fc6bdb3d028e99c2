"""Parallel plans (how one job is laid over GPUs); the MARP workload (marp/workload.py) is importable from here too.

`ParallelPlan` is the one plan type: MARP predicts for it, HAS chooses it, and `plan.json` stores it
as-is (the in-job runtime reads it back from there), so it is a frozen pydantic model.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from frenzy_slurm.core.errors import InputError

# (defined in marp/workload.py; importable from here, as before the workload had a module of its own)
from frenzy_slurm.marp.workload import DeepSpeedBuckets as DeepSpeedBuckets
from frenzy_slurm.marp.workload import Framework as Framework
from frenzy_slurm.marp.workload import Workload as Workload

# op: torchtitan's per-op selective checkpointing (every block checkpointed, the outputs of every other matmul and of
# the attention kernel saved, the rest recomputed)
Recompute = Literal["none", "selective", "full", "op"]
# sequential: naive model parallelism (Hugging Face `device_map`): the stages run one after another on each
# micro-batch, one GPU active at a time, with no pipeline schedule (one micro-batch in flight per stage)
Schedule = Literal["1f1b", "interleaved", "gpipe", "sequential"]
Metric = Literal["allocated", "reserved", "device"]


class ParallelPlan(BaseModel):
    """Degrees of parallelism and memory options for one job. world = dp * tp * pp * cp."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dp: int = Field(1, ge=1, description="Data-parallel degree (replicas, or the ZeRO/FSDP sharding world).")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree (Megatron-style column/row split).")
    pp: int = Field(1, ge=1, description="Pipeline stages.")
    cp: int = Field(1, ge=1, description="Context-parallel degree: the sequence split across ranks (ring attention).")
    zero: int = Field(
        0,
        ge=0,
        le=3,
        description="ZeRO stage: 1 shards optimizer states, 2 also gradients, "
        "3 also weights (torch FSDP full sharding = 3, SHARD_GRAD_OP = 2).",
    )
    shard_group: int | None = Field(
        None,
        ge=1,
        description="Ranks one ZeRO/FSDP shard group spans when smaller "
        "than dp (HSDP, MiCS); states are replicated across groups. None = dp.",
    )
    micro_batch: int = Field(1, ge=1, description="Sequences per rank per forward/backward.")
    grad_accum: int = Field(
        1, ge=1, description="Micro-batches per optimizer step (pipeline micro-batches when pp > 1)."
    )
    sequence_parallel: bool = Field(False, description="Megatron sequence parallelism: norms/dropout split over tp.")
    recompute: Recompute = Field(
        "none",
        description="Activation checkpointing: none, selective (attention core "
        "recomputed), full (each block recomputed from its input) or op (torchtitan's per-op selective "
        "checkpointing: every other matmul's output and the attention output kept).",
    )
    recompute_layers: int | None = Field(
        None,
        ge=0,
        description="With recompute=full: how many of a stage's "
        "blocks are checkpointed (every-k / Megatron 'block'); None = all.",
    )
    offload_optimizer: bool = Field(False, description="Optimizer states (and fp32 master) kept in host memory.")
    offload_params: bool = Field(False, description="ZeRO-3 parameters kept in host memory.")
    schedule: Schedule = Field(
        "1f1b",
        description="Pipeline schedule: 1f1b, interleaved (virtual stages), gpipe, or sequential (naive model "
        "parallelism: stages run one after another, one micro-batch in flight).",
    )
    virtual_stages: int = Field(1, ge=1, description="Model chunks per pipeline rank (interleaved schedule).")
    layer_split: tuple[int, ...] | None = Field(
        None,
        description="Blocks per pipeline stage, in order; None = as "
        "even as possible (earlier stages take the remainder, or the middle ones under layer_balance=middle).",
    )
    layer_balance: Literal["front", "middle"] = Field(
        "front",
        description="Where the default split puts the blocks left over: on the first stages (front), or on the "
        "middle ones, the first stage one block less and the last the rest (middle: torchtitan's "
        "generate_split_points, over pp x virtual_stages stages).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> ParallelPlan:
        if self.offload_params and self.zero != 3:
            raise ValueError("parameter offload needs zero=3")
        if self.offload_optimizer and self.zero == 0:
            raise ValueError("optimizer offload needs zero>=1")
        if self.layer_split is not None and len(self.layer_split) != self.pp:
            raise ValueError(f"layer_split has {len(self.layer_split)} stages but pp({self.pp})")
        if self.shard_group is not None and self.dp % self.shard_group:
            raise ValueError(f"shard_group({self.shard_group}) must divide dp({self.dp})")
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 needs schedule=interleaved")
        return self

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def shard(self) -> int:
        """Ranks that ZeRO/FSDP states are divided over."""
        return self.shard_group or self.dp

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        if self.layer_split is not None:
            return self.layer_split
        if self.layer_balance == "middle":
            return _middle_split(layers, self.pp, self.virtual_stages)
        base, extra = divmod(layers, self.pp)
        return tuple(base + (1 if i < extra else 0) for i in range(self.pp))

    def resolved(self, layers: int) -> ParallelPlan:
        """This plan with its layer split written out, as plan.json stores it (the runtime needs the exact split)."""
        return self.model_copy(update={"layer_split": self.stage_layers(layers)})

    def with_(self, **changes: object) -> ParallelPlan:
        """A validated copy with some fields changed."""
        return ParallelPlan.model_validate(self.model_dump() | changes)

    def short(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"zero={self.zero}", f"mb={self.micro_batch}"]
        if self.cp > 1:
            parts.insert(3, f"cp={self.cp}")
        if self.grad_accum > 1:
            parts.append(f"ga={self.grad_accum}")
        if self.recompute != "none":
            parts.append(f"ckpt={self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.offload_optimizer:
            parts.append("offload=opt" + ("+param" if self.offload_params else ""))
        return ",".join(parts)


def checkpoint_route(saved: ParallelPlan, loading: ParallelPlan) -> Literal["as-is", "universal"] | None:
    """How a DeepSpeed engine checkpoint written under the plan `saved` loads under `loading`, measured with
    DeepSpeed 0.19.8 on the CPU (docs/runtime.md, "Moved jobs"): "as-is" with the same layout, or both ZeRO 0
    without a pipeline (at any width); "universal" (converted with ds_to_universal) for ZeRO 1-2 into ZeRO 1-2
    and ZeRO 3 into ZeRO 3, at any width and depth; None otherwise. Tensor and context parallelism are kept."""
    if (saved.tp, saved.cp) != (loading.tp, loading.cp):
        return None
    if (saved.dp, saved.pp, saved.zero) == (loading.dp, loading.pp, loading.zero):
        return "as-is"
    if saved.zero == loading.zero == 0 and saved.pp == loading.pp == 1:
        return "as-is"  # one model-states file, the optimizer's state whole in it
    if saved.zero >= 1 and loading.zero >= 1 and (saved.zero == 3) == (loading.zero == 3):
        return "universal"  # ZeRO 3's universal files are named for ZeRO 3 alone
    return None  # a ZeRO-0 checkpoint has no optimizer shards to convert, and its pipeline stages fix the split


def plan_error(exc: ValidationError) -> str:
    """One line per problem, `field: message`, for CLI errors."""
    return "; ".join(
        f"{e['loc'][0]}({e['input']}): {e['msg']}" if e["loc"] else e["msg"].removeprefix("Value error, ")
        for e in exc.errors()
    )


_PLAN_KEYS = {
    "dp": ("dp", int),
    "tp": ("tp", int),
    "pp": ("pp", int),
    "cp": ("cp", int),
    "zero": ("zero", int),
    "mb": ("micro_batch", int),
    "ga": ("grad_accum", int),
    "ckpt": ("recompute", str),
    "sp": ("sequence_parallel", bool),
    "offload": ("offload", str),
}


def parse_plan(text: str) -> ParallelPlan:
    """`dp=4,tp=2,pp=1,zero=1,mb=2[,cp=2][,ga=8][,ckpt=full][,sp=1][,offload=opt|opt+param]`."""
    kwargs: dict[str, object] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        m = re.fullmatch(r"(\w+)=([\w+]+)", item)
        if not m or m.group(1) not in _PLAN_KEYS:
            raise InputError(
                f"--plan: cannot read '{item}'. Use comma-separated key=value with keys {', '.join(_PLAN_KEYS)}, "
                "e.g. --plan dp=4,tp=2,zero=1,mb=2"
            )
        key, value = m.groups()
        name, kind = _PLAN_KEYS[key]
        if key == "offload":
            if value not in ("none", "opt", "opt+param"):
                raise InputError(f"--plan: offload={value}; use none, opt or opt+param")
            kwargs["offload_optimizer"] = value != "none"
            kwargs["offload_params"] = value == "opt+param"
        elif kind is int:
            if not value.isdigit():
                raise InputError(f"--plan: {key}={value} must be a whole number")
            kwargs[name] = int(value)
        elif kind is bool:
            kwargs[name] = value.lower() in ("1", "true", "yes", "on")
        else:
            if value not in ("none", "selective", "full", "op"):
                raise InputError(f"--plan: ckpt={value}; use none, selective, full or op")
            kwargs[name] = value
    try:
        return ParallelPlan(**kwargs)  # type: ignore[arg-type]  # parsed text; pydantic validates it
    except ValidationError as exc:
        raise InputError(f"--plan: {plan_error(exc)}") from None


def _middle_split(layers: int, pp: int, v: int) -> tuple[int, ...]:
    """Blocks per pipeline rank as torchtitan splits them without split points (9dec370
    parallelisms/pipelining_utils.py generate_split_points): over pp x v stages, the first takes `layers // n`, each
    middle one a block more while the remainder lasts, the last what is left; rank r runs stages r, r + pp, ..."""
    n = pp * v
    if n == 1:
        return (layers,)
    base, extra = divmod(layers, n)
    sizes = [base]
    for _ in range(n - 2):
        sizes.append(base + (1 if extra > 0 else 0))
        extra -= 1
    sizes.append(layers - sum(sizes))
    return tuple(sum(sizes[r::pp]) for r in range(pp))
