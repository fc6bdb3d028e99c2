"""Parallel plans (how one job is laid over GPUs) and the MARP workload description.

`ParallelPlan` is the one plan type: MARP predicts for it, HAS chooses it, and `plan.json` stores it
as-is (the in-job runtime reads it back from there), so it is a frozen pydantic model.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import Attention, DeepSpeedBuffers, Method, Optimizer, Precision

# op: torchtitan's per-op selective checkpointing (every block checkpointed, the outputs of every other matmul and of
# the attention kernel saved, the rest recomputed)
Recompute = Literal["none", "selective", "full", "op"]
Schedule = Literal["1f1b", "interleaved", "gpipe"]
Framework = Literal["deepspeed", "torch", "megatron"]
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
    schedule: Schedule = Field("1f1b", description="Pipeline schedule: 1f1b, interleaved (virtual stages) or gpipe.")
    virtual_stages: int = Field(1, ge=1, description="Model chunks per pipeline rank (interleaved schedule).")
    layer_split: tuple[int, ...] | None = Field(
        None,
        description="Blocks per pipeline stage, in order; None = as "
        "even as possible (earlier stages take the remainder).",
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


# DeepSpeed's buffer sizes as model.yaml's `deepspeed:` section gives them (and ds_config.json writes them)
DeepSpeedBuckets = DeepSpeedBuffers


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
    # Liger's fused linear cross-entropy: chunks of ~hidden-size logits in the forward, no logits kept (marp/memory.py)
    fused_linear_loss: bool = False
    compile: bool = False
    compile_loss: bool = True  # with compile: the loss is compiled too (False: the model's blocks only)
    framework: Framework = "deepspeed"  # torch = plain PyTorch/FSDP training loop (AMP keeps fp32 weights)
    fused_optimizer: bool = False  # False: foreach kernels (one optimizer-state-sized temporary at step)
    optimizer_in_backward: bool = False
    activation_offload: bool = False
    paged_optimizer: bool = False  # states in CUDA managed memory, outside the caching allocator's counts
    norm_upcast: bool = False  # norm computed on an fp32 copy of its input (HF/torchtune/litgpt RMSNorm, eager)
    # the upcast norm keeps its normalised value in fp32 (torchtune's F.rms_norm(x.float(), weight=...)), not 16-bit
    norm_fp32_normalized: bool = False
    gqa_expand: bool = False  # K/V repeated to all query heads before the attention kernel (HF repeat_kv)
    nf4_double_quant: bool = True  # QLoRA's double-quantised absmax (4.127 bits); False: plain NF4, 4.5 bits
    nf4_torchao: bool = False  # QLoRA's NF4 is torchao's tensor subclass (dequantised in eager ops unless compiled)
    nf4_saves_inputs: bool = True  # bitsandbytes' 4-bit matmul saves its input (torchao's NF4 linear does not)
    qlora_quantized_head: bool = False  # QLoRA quantises the (untied) output layer too (litgpt's bitsandbytes plugin)
    hold_logits: bool = False  # the training loop keeps the 16-bit logits alive (HF-style model outputs)
    # the loop keeps the previous step's output bound until the next forward returns (litgpt's `logits = model(...)`):
    # its 16-bit logits and, through their autograd graph, what custom functions stored on their ctx (bitsandbytes'
    # 4-bit matmul inputs) are alive at the end of the next forward
    keeps_previous_output: bool = False
    # the loop zeroes gradients between the forward and the backward (Lightning's automatic optimization: its closure
    # runs training_step, then zero_grad, then backward), so the previous step's gradients live through the forward
    zero_grad_after_forward: bool = False
    zero_grad_to_none: bool = True  # grads freed after each step (torch >= 2.0 default); False keeps zeroed buffers
    unfused_rope: bool = (
        False  # rotary embedding in eager ops (HF/litgpt/torchtune/built-in): rotated q, k are new tensors
    )
    rope_tables_per_layer: bool = False  # cos/sin built in every block (the built-in model) instead of once per forward
    vocab_parallel: bool = True  # tp splits the embedding, output layer and logits (Megatron); False: replicated
    softmax_fp32: bool = False  # eager attention's softmax(..., dtype=float32).to(dtype) (HF Llama-style eager)
    fp8: bool = False  # float8 linears (torchao/Transformer Engine): fp8 copies of inputs and weights, amax history
    reshard_after_forward: bool = True  # FSDP: False keeps each unit's gathered 16-bit weights from forward to backward
    # FSDP2 units: the embedding on its own, the final norm and output layer in a tail unit gathered from its forward
    # to its backward (accelerate); False: the root unit holds them (torch's examples)
    fsdp_tail_unit: bool = False
    # DTensor TP (torchtitan): the column-parallel linears save their all-gathered input (whole under SP)
    tp_saves_gathered_inputs: bool = False
    # the chunked loss's detached hidden-state chunks and fp32 gradient accumulator (torchtitan's ChunkedLossWrapper)
    loss_detaches_hidden: bool = False
    # GELU's tanh approximation in eager ops (HF's gelu_new, NewGELUActivation: GPT-2): 0.5*x*(1+tanh(...)) keeps
    # tanh's output, 0.5*x and 1+tanh besides its input
    gelu_tanh_eager: bool = False
    output_fp32: bool = False  # the loop gets the model's output converted to fp32 (Lightning Fabric) and holds it
    lora_qkv_scatter: bool = False  # fused-q/k/v LoRA scatters adapter outputs with index_copy (litgpt), saving them
    # bitsandbytes QLoRA swaps in bitsandbytes' StableEmbedding after building the optimizer (litgpt): the old embedding
    # stays, the new one's gradient is never freed, its fp32 LayerNorm saves an fp32 copy of its output
    bnb_stable_embedding: bool = False
    # dropout keeps a mask of its input's dtype (the CPU: torch's dropout multiplies by a noise tensor); False: the
    # fused CUDA kernel's bool mask
    dropout_mask_full_width: bool = False
    fused_projections: bool = False  # q/k/v (and SwiGLU gate/up) are one fused linear (litgpt, GPT-2, NeoX, Megatron)
    loss_fp32: bool = (
        True  # cross-entropy computed on an fp32 upcast of the logits (torch's F.cross_entropy on .float())
    )
    exact_params: int | None = None  # from tracing: scales the analytic weights to the exact count
    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF expandable_segments:True (marp/allocator.py)
    # torch's CUDA caching allocator keeps freed blocks in its segments (reserved > allocated); the CPU allocator
    # hands memory back to the C allocator, so on the CPU (the site's `device: cpu`) reserved is what is allocated
    caching_allocator: bool = True
    buckets: DeepSpeedBuckets = field(default_factory=DeepSpeedBuckets)

    def with_(self, **changes: object) -> Workload:
        return replace(self, **changes)  # type: ignore[arg-type]  # replace() checks names and types at run time
