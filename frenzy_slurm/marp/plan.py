"""Parallel plans (how one job is laid over GPUs) and the MARP workload description."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from frenzy_slurm.errors import InputError
from frenzy_slurm.spec.arch import Architecture
from frenzy_slurm.spec.job import Attention, Method, Optimizer, Precision

Recompute = Literal["none", "selective", "full"]
Framework = Literal["deepspeed", "torch"]
Metric = Literal["allocated", "reserved", "device"]


@dataclass(frozen=True)
class ParallelPlan:
    """Degrees of parallelism and memory options for one job. world = dp * tp * pp."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    zero: int = 0
    micro_batch: int = 1
    grad_accum: int = 1
    sequence_parallel: bool = False
    recompute: Recompute = "none"
    offload_optimizer: bool = False
    offload_params: bool = False
    layer_split: tuple[int, ...] | None = None  # layers per pipeline stage; None = as even as possible

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "micro_batch", "grad_accum"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}({getattr(self, name)}) must be >= 1")
        if self.zero not in (0, 1, 2, 3):
            raise ValueError(f"zero({self.zero}) must be 0, 1, 2 or 3")
        if self.offload_params and self.zero != 3:
            raise ValueError("parameter offload needs zero=3")
        if self.offload_optimizer and self.zero == 0:
            raise ValueError("optimizer offload needs zero>=1")
        if self.layer_split is not None and len(self.layer_split) != self.pp:
            raise ValueError(f"layer_split has {len(self.layer_split)} stages but pp({self.pp})")

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def stage_layers(self, layers: int) -> tuple[int, ...]:
        if self.layer_split is not None:
            return self.layer_split
        base, extra = divmod(layers, self.pp)
        return tuple(base + (1 if i < extra else 0) for i in range(self.pp))

    def short(self) -> str:
        parts = [f"dp={self.dp}", f"tp={self.tp}", f"pp={self.pp}", f"zero={self.zero}", f"mb={self.micro_batch}"]
        if self.grad_accum > 1:
            parts.append(f"ga={self.grad_accum}")
        if self.recompute != "none":
            parts.append(f"ckpt={self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.offload_optimizer:
            parts.append("offload=opt" + ("+param" if self.offload_params else ""))
        return ",".join(parts)


_PLAN_KEYS = {
    "dp": ("dp", int), "tp": ("tp", int), "pp": ("pp", int), "zero": ("zero", int),
    "mb": ("micro_batch", int), "ga": ("grad_accum", int), "ckpt": ("recompute", str),
    "sp": ("sequence_parallel", bool), "offload": ("offload", str),
}


def parse_plan(text: str) -> ParallelPlan:
    """`dp=4,tp=2,pp=1,zero=1,mb=2[,ga=8][,ckpt=full][,sp=1][,offload=opt|opt+param]`."""
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
            if value not in ("none", "selective", "full"):
                raise InputError(f"--plan: ckpt={value}; use none, selective or full")
            kwargs[name] = value
    try:
        return ParallelPlan(**kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        raise InputError(f"--plan: {exc}") from None


@dataclass(frozen=True)
class DeepSpeedBuckets:
    """DeepSpeed communication buffer sizes (elements), as frenzy-slurm writes them into ds_config.json."""

    reduce_bucket_size: int = 200_000_000
    allgather_bucket_size: int = 200_000_000
    overlap_comm: bool = False
    stage3_prefetch_bucket_size: int = 50_000_000
    stage3_max_live_parameters: int = 1_000_000_000


@dataclass(frozen=True)
class Workload:
    """Everything about a training run that decides memory, apart from the parallel plan."""

    arch: Architecture
    seq_len: int
    precision: Precision = "bf16-mixed"
    optimizer: Optimizer = "adamw"
    attention: Attention = "flash"
    method: Method = "full"
    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "v")
    lora_dropout: bool = True
    loss_chunks: int = 1
    compile: bool = False
    framework: Framework = "deepspeed"  # torch = plain PyTorch/FSDP training loop (AMP keeps fp32 weights)
    fused_optimizer: bool = False  # False: foreach kernels (one optimizer-state-sized temporary at step)
    optimizer_in_backward: bool = False
    activation_offload: bool = False
    paged_optimizer: bool = False
    norm_upcast: bool = False  # norm computed on an fp32 copy of its input (HF/torchtune/litgpt RMSNorm, eager)
    gqa_expand: bool = False  # K/V repeated to all query heads before the attention kernel (HF repeat_kv)
    nf4_saves_inputs: bool = True  # bitsandbytes' 4-bit matmul saves its input (torchao's NF4 linear does not)
    hold_logits: bool = False  # the training loop keeps the 16-bit logits alive (HF-style model outputs)
    zero_grad_to_none: bool = True  # grads freed after each step (torch >= 2.0 default); False keeps zeroed buffers  # states in CUDA managed memory, outside the caching allocator's counts
    exact_params: int | None = None  # from tracing: scales the analytic weights to the exact count
    buckets: DeepSpeedBuckets = field(default_factory=DeepSpeedBuckets)

    def with_(self, **changes: object) -> "Workload":
        return replace(self, **changes)  # type: ignore[arg-type]
