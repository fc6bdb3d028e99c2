"""The job spec (model.yaml): what to train, how, within which limits, and how to reach Slurm.

Every field has a description; docs/model-yaml.md is the reference page.
"""

from __future__ import annotations

import datetime as dt
import re
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.presets import presets
from frenzy_slurm.jobspec.sbatch_flags import refuse_sbatch_flag
from frenzy_slurm.slurm.constraint import parse_constraint
from frenzy_slurm.slurm.dependency import parse_dependency
from frenzy_slurm.slurm.timefmt import parse_slurm_time  # the seam owns Slurm's time format

Precision = Literal["fp32", "bf16-mixed", "fp16-mixed", "bf16-pure"]
Optimizer = Literal["adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adam-8bit", "adam-4bit"]
# model.yaml's optimizer names: MARP's state models, plus bitsandbytes' paged variants (states in CUDA managed memory)
OptimizerName = Literal[
    "adamw", "adam", "sgd", "sgd-momentum", "adafactor", "adam-8bit", "adam-4bit", "paged-adamw", "paged-adamw-8bit"
]
Checkpointing = Literal["none", "selective", "full", "op", "auto"]
Attention = Literal["flash", "sdpa", "eager"]
Method = Literal["full", "lora", "qlora"]
LoraTarget = Literal["q", "k", "v", "o", "mlp", "head"]
# How the job runs, in model.yaml's words (marp/frameworks.py holds each one's profile: its defaults and what it can
# parallelise): frenzy = the built-in DeepSpeed trainer; the others name the framework a user's script trains with.
FrameworkName = Literal[
    "frenzy",
    "deepspeed",
    "hf-trainer",
    "unsloth",
    "torchtune",
    "torchtitan",
    "litgpt",
    "lightning",
    "megatron",
    "torch",
    "llm.c",
]
# Training programs MARP has no profile for, by name, with why (model.yaml's entry.framework refuses them with this
# reason; the measurement reader too). None at present: llm.c, which lays out its own CUDA memory, has a profile of
# that layout (marp/llmc.py).
UNMODELLED_FRAMEWORKS: dict[str, str] = {}
# The model implementation a framework trains (marp/frameworks.py: how it computes norms, RoPE, GQA, projections)
ModelCodeName = Literal["hf", "unsloth", "frenzy", "torchtune", "litgpt", "torchtitan", "megatron", "llm.c"]
Sharding = Literal["auto", "none", "zero1", "zero2", "zero3", "full-shard", "shard-grad-op", "hybrid-shard"]

# The job script asks Slurm for USR2 this long before the time limit (--signal=USR2@300) so the runtime can
# checkpoint and requeue; NCCL owns USR1. A job must also get through start-up (srun, imports, DeepSpeed
# init, loading a checkpoint) before it can save one, so a shorter --time loses the whole run.
SIGNAL_LEAD_S = 300
STARTUP_S = 120
MIN_TIME_MIN = -(-(SIGNAL_LEAD_S + STARTUP_S) // 60)


def check_time_limit(minutes: int) -> int:
    """A requested --time in minutes, or ValueError when it leaves no room to checkpoint before the limit."""
    if minutes < MIN_TIME_MIN:
        raise ValueError(
            f"a time limit of {minutes} min is too short: Slurm signals the checkpoint {SIGNAL_LEAD_S} s before "
            f"the limit and start-up takes up to {STARTUP_S} s, so the job would be stopped before it could save "
            f"anything. Ask for at least {MIN_TIME_MIN} minutes"
        )
    return minutes


def reserved_flag(flag: str) -> str | None:
    """Why `flag` may not be passed through to sbatch, or None when it may (parsed as sbatch parses it:
    short clusters, attached values, unique abbreviations; see jobspec/sbatch_flags.py)."""
    return refuse_sbatch_flag(flag)


class _Strict(BaseModel):
    # allow_inf_nan=False: `learning_rate: "1e999"` (a string pydantic would read as inf) is refused, as
    # .inf and .nan already are when the YAML is read; JSON would store them as null
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelSource(_Strict):
    """Exactly one way of saying which model to train."""

    preset: str | None = Field(
        None, description="A built-in preset name, e.g. llama-2-7b (see `frenzy-slurm presets`)."
    )
    arch: Architecture | None = Field(None, description="An explicit architecture block.")
    hf_config: str | None = Field(None, description="Path to a Hugging Face config.json (relative to model.yaml).")
    factory: str | None = Field(
        None,
        description="`module:function` returning a torch.nn.Module. Run on the login node (meta device, exact "
        "parameter count) only with `--trace-factory`, which runs that code as you: only a module of your own files "
        "(yours, writable by no one else, not an installed package) or one the site file lists in "
        "`trusted_factories`; never a standard-library module.",
    )
    factory_kwargs: dict[str, object] = Field(default_factory=dict, description="Keyword arguments for `factory`.")
    factory_arch: Architecture | None = Field(
        None,
        description="With `factory`: the architecture numbers for activation memory (parameters come from tracing).",
    )

    @field_validator("factory")
    @classmethod
    def _not_stdlib(cls, v: str | None) -> str | None:
        """A factory is code run on the login node (with --trace-factory): never os, subprocess, builtins..."""
        top = (v or "").split(":", 1)[0].split(".", 1)[0]
        if top in sys.stdlib_module_names or top in sys.builtin_module_names:
            raise ValueError(
                f"'{v}': '{top}' is Python's standard library, which builds no models; name a "
                "function of your own package, e.g. mypkg.models:build"
            )
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSource:
        given = [k for k in ("preset", "arch", "hf_config", "factory") if getattr(self, k) is not None]
        if len(given) != 1:
            what = ", ".join(given) if given else "none"
            raise ValueError(f"give exactly one of preset, arch, hf_config, factory (got: {what})")
        if self.preset is not None:
            if self.preset not in presets():
                raise ValueError(f"unknown preset '{self.preset}'; known: {', '.join(sorted(presets()))}")
        if self.factory is not None:
            if not re.fullmatch(r"[\w.]+:\w+", self.factory, re.ASCII):
                raise ValueError(f"factory '{self.factory}' must look like 'package.module:function'")
            if self.factory_arch is None:
                raise ValueError("factory needs factory_arch (layers, hidden, heads, ...) for activation memory")
        return self


def _query_and_value() -> list[LoraTarget]:
    """LoRA's default targets: the attention's query and value projections (the LoRA paper's choice)."""
    return ["q", "v"]


class LoraSpec(_Strict):
    rank: int = Field(16, gt=0, description="LoRA rank r.")
    targets: list[LoraTarget] = Field(default_factory=_query_and_value, description="Which weights get adapters.")
    dropout: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="Dropout on the adapter input (0: none, no dropped copy kept). Default: the framework's "
        "(0.0 in torchtune's shipped configs, else 0.05).",
    )
    quantize_head: bool | None = Field(
        None,
        description="QLoRA: the output layer is quantised to 4 bits too. Default: the framework's (litgpt's "
        "bitsandbytes plugin quantises every linear; PEFT and torchtune leave the head in 16 bits).",
    )
    double_quant: bool | None = Field(
        None,
        description="QLoRA: double-quantised NF4 absmax (bnb_4bit_use_double_quant, litgpt's bnb.nf4-dq); "
        "false: plain NF4 with fp32 absmax. Default: true (the QLoRA recipe; torchao's NF4 always).",
    )
    quantizer: Literal["bitsandbytes", "torchao"] | None = Field(
        None,
        description="QLoRA's 4-bit implementation: bitsandbytes or torchao's NF4 tensor (which saves no input). "
        "Default: torchao for torchtune, bitsandbytes otherwise.",
    )
    dora: bool = Field(
        False,
        description="DoRA (PEFT use_dora): not modelled, so true is refused. Its magnitude step builds each adapted "
        "weight (W + BA) in the forward and keeps the base layer's output for the magnitude's gradient, memory "
        "that plain LoRA's prediction would leave out.",
    )
    quantizer_version: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)*$",
        description="QLoRA: the bitsandbytes release, e.g. 0.45.2. Up to 0.43.1 its 4-bit matmul saved its input for "
        "backward; from 0.43.2 it keeps only the 4-bit weight. Default: an older release (the input is saved).",
    )
    peft_version: str | None = Field(
        None,
        pattern=r"^\d+(\.\d+)*$",
        description="The PEFT release that builds the adapters (frameworks on Hugging Face models: hf-trainer, "
        "lightning, torch, deepspeed), e.g. 0.11.1. From 0.12 get_peft_model keeps the adapters of a bf16/fp16 "
        "model in fp32 (autocast_adapter_dtype), so each adapted linear keeps its own fp32 copy of its input and "
        "the adapters' gradients and optimizer states are fp32; before it they take the base weights' dtype. "
        "Default: a current release (0.12 or later).",
    )

    @field_validator("dora")
    @classmethod
    def _no_dora(cls, v: bool) -> bool:
        if v:
            raise ValueError(
                "DoRA is not modelled (each adapted weight W + BA is built in the forward and the base output kept "
                "for the magnitude's gradient), so frenzy-slurm refuses it rather than predict plain LoRA's memory; "
                "set dora: false (plain LoRA), or plan the job without frenzy-slurm"
            )
        return v


class Training(_Strict):
    seq_len: int = Field(
        gt=0, le=1 << 30, description="Tokens per sample (an encoder-decoder model's encoder input, the source)."
    )
    target_len: int | None = Field(
        None,
        gt=0,
        le=1 << 30,
        description="Decoder (target) tokens per sample of an encoder-decoder model (arch.encoder_layers > 0: T5, "
        "BART), padded or truncated to this length (max_target_length); the logits and the loss run over them. "
        "Required for such a model, refused for others.",
    )
    global_batch: int = Field(gt=0, le=1 << 30, description="Samples per optimizer step, over all data-parallel ranks.")
    micro_batch: int | Literal["auto"] = Field(
        "auto", description="Samples per GPU per forward pass, or auto (largest that fits)."
    )
    precision: Precision = Field(
        "bf16-mixed",
        description="fp32; bf16-mixed/fp16-mixed (16-bit compute, fp32 master weights and optimizer states: 16 B/param "
        "with Adam); bf16-pure (weights, grads and optimizer states all bf16: 8 B/param with Adam).",
    )
    optimizer: OptimizerName = Field(
        "adamw",
        description="Optimizer; decides the optimizer-state bytes per parameter: adamw/adam 2 states in the state "
        "dtype (fp32 with mixed precision: 8 B), sgd-momentum 1, adafactor factored, adam-8bit two 8-bit states "
        "(bitsandbytes Adam8bit / adamw_bnb_8bit: 2 B + absmax per 2048 values), adam-4bit two 4-bit states "
        "(torchao AdamW4bit: 1 B + an fp32 scale per 128 values); paged-*: bitsandbytes' paged optimizers, states "
        "in CUDA managed memory outside PyTorch's allocator.",
    )
    optimizer_impl: Literal["fused", "foreach"] | None = Field(
        None,
        description="How the optimizer steps: fused (one kernel, or per tensor: no state-sized temporary) or "
        "foreach (torch's multi-tensor default on a GPU: one state-sized temporary at the step). Default: the "
        "framework's (see `frenzy-slurm frameworks`).",
    )
    optimizer_in_backward: bool = Field(
        False,
        description="Each parameter is stepped as its gradient is ready (torchtune's optimizer_in_bwd): no "
        "full set of gradients is ever held.",
    )
    activation_checkpointing: Checkpointing = Field(
        "auto",
        description="none, selective (recompute attention core, Megatron-style), full (keep layer inputs only), "
        "op (torchtitan's per-op selective checkpointing: each block keeps the outputs of every other matmul and of "
        "the attention kernel), or auto (what the framework runs, searched).",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        description="With full checkpointing: only every k-th block is checkpointed (torchtune's ac_option, "
        "an FSDP wrap policy's every-k); default: every block.",
    )
    activation_offload: bool = Field(
        False, description="Saved activations are moved to host memory during forward (torchtune's offloading)."
    )
    fp8: bool = Field(
        False, description="float8 linears (torchao / Transformer Engine): fp8 copies of inputs and weights."
    )
    attention: Attention = Field(
        "flash", description="Attention kernel; flash/sdpa do not store the s x s score matrix."
    )
    steps: int | None = Field(None, gt=0, le=10**12, description="Optimizer steps to run (give steps or tokens).")
    tokens: int | None = Field(
        None, gt=0, le=10**18, description="Tokens to train on; steps = tokens / (global_batch * seq_len)."
    )
    method: Method = Field("full", description="full training, LoRA adapters, or QLoRA (4-bit frozen base).")
    lora: LoraSpec = Field(default_factory=LoraSpec, description="Adapter settings for lora/qlora.")
    loss_chunks: int | None = Field(
        None,
        ge=1,
        description="Compute the output layer and cross-entropy in this many chunks. Default: the framework's "
        "(litgpt: 128-token chunks; otherwise 1; torchtune's shipped configs use 8: CEWithChunkedOutputLoss).",
    )
    fused_linear_loss: bool = Field(
        False,
        description="A fused linear cross-entropy (Liger Kernel's LigerFusedLinearCrossEntropy; HF Trainer "
        "`use_liger_kernel`): the output layer and the loss run chunk by chunk in the forward, no logits are kept, "
        "and the hidden states' and the output layer's gradients are made there. Off by default in every framework.",
    )
    compile: bool = Field(False, description="torch.compile the model (fuses element-wise ops, saving activations).")
    compile_loss: bool | None = Field(
        None,
        description="With compile: the loss is compiled too. Default: the framework's (torchtune compiles only its "
        "chunked loss).",
    )
    learning_rate: float = Field(3e-4, gt=0, description="Peak learning rate.")
    warmup_steps: int = Field(0, ge=0, description="Linear warm-up steps before cosine decay.")
    checkpoint_interval: int | None = Field(
        None,
        gt=0,
        description="Save a checkpoint every this many steps (always at the end and at the time-limit signal).",
    )
    keep_checkpoints: int = Field(
        3,
        ge=1,
        description="Checkpoints kept in JOBDIR/checkpoints; older step<N> ones are deleted after each save "
        "(the latest is always kept).",
    )
    seed: int = Field(1234, ge=0, lt=1 << 32, description="Seed for initialisation and synthetic data (0 to 2^32-1).")

    @field_validator("micro_batch")
    @classmethod
    def _positive_mb(cls, v: int | str) -> int | str:
        if isinstance(v, int) and v <= 0:
            raise ValueError("micro_batch must be a positive integer or 'auto'")
        return v

    @model_validator(mode="after")
    def _check(self) -> Training:
        if isinstance(self.micro_batch, int) and self.micro_batch > self.global_batch:
            raise ValueError(
                f"micro_batch({self.micro_batch}) > global_batch({self.global_batch}); "
                "the micro-batch is per GPU, so it must not exceed the global batch"
            )
        if (self.steps is None) == (self.tokens is None):
            raise ValueError("give exactly one of steps or tokens")
        if self.precision == "fp16-mixed" and self.method == "qlora":
            raise ValueError("qlora computes in bf16; use precision bf16-mixed or bf16-pure")
        return self

    @property
    def total_steps(self) -> int:
        if self.steps is not None:
            return self.steps
        assert self.tokens is not None
        return max(1, -(-self.tokens // (self.global_batch * self.seq_len)))


class Limits(_Strict):
    max_gpus: int | None = Field(None, gt=0, description="Never use more GPUs than this.")
    min_gpus: int | None = Field(
        None, gt=0, description="Use at least this many GPUs (e.g. to force data parallelism)."
    )
    gpu_types: list[str] | None = Field(
        None, description="Only these GPU types (Slurm GRES type names or catalog names)."
    )
    time_limit: str | int | None = Field(None, description="Longest acceptable run time (Slurm time format).")
    deadline: dt.datetime | None = Field(None, description="The job must be predicted to finish before this time.")

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            parse_slurm_time(v)
        return v

    @model_validator(mode="after")
    def _range(self) -> Limits:
        if self.min_gpus and self.max_gpus and self.min_gpus > self.max_gpus:
            raise ValueError(f"min_gpus({self.min_gpus}) > max_gpus({self.max_gpus})")
        return self


# `\Z`, never `$`, ends every pattern here: Python's `$` also matches before a trailing newline, and a newline in
# a value ends its #SBATCH line (sbatch then ignores every directive after it).
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,@+=:-]+\Z")  # #SBATCH lines are not shell-parsed: keep values plain
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,%-]+\Z")


class SlurmOptions(_Strict):
    """sbatch options: model.yaml's `slurm:` block, and the same options as fsbatch flags (which override it)."""

    account: str | None = Field(None, description="sbatch --account.")
    qos: str | None = Field(None, description="sbatch --qos.")
    time: str | int | None = Field(
        None, description="sbatch --time (Slurm time format); default: predicted run time + margin."
    )
    constraint: str | None = Field(
        None,
        description="sbatch --constraint: node features in Slurm's syntax (a&b, a|b, [a|b], a*2); HAS plans only "
        "on nodes that have them, in every hetjob component.",
    )
    exclusive: bool = Field(
        False,
        description="sbatch --exclusive: whole nodes (all their GPUs) and no other job on them; HAS plans only on "
        "nodes no job uses until they are empty.",
    )
    preemptible: bool = Field(
        False,
        description="Run in the site's preemptible QOS (site file preemption.qos): any other job may preempt it; "
        "it checkpoints, is requeued and resumes. In exchange HAS may give it more of a pool. A job predicted "
        "to run less than the site's preemption.min_run_min stays in its own QOS.",
    )
    oom_retry: bool = Field(
        True,
        description="A run that ends out of memory (CUDA's, or Slurm's OUT_OF_MEMORY on the host) is submitted "
        "again once, on the plan fsbatch chose for it with more memory headroom, from its last checkpoint "
        '(docs/runtime.md, "Out of memory"); false: it just fails (fsbatch --no-oom-retry).',
    )
    replan: bool = Field(
        False,
        description="Let `frenzy-slurm watch` change this job's shape while it waits (scontrol update: partition, "
        "nodes, GPUs per node), keeping its place in the queue: fsbatch records up to 3 shapes of the chosen GPU "
        "type in plan.json and the job runs the one Slurm gave it. Homogeneous jobs of the built-in trainer only "
        '(docs/has.md, "Re-planning waiting jobs").',
    )
    mail_type: str | None = Field(None, description="sbatch --mail-type.")
    mail_user: str | None = Field(None, description="sbatch --mail-user.")
    job_name: str | None = Field(None, description="sbatch --job-name (default: the job's name).")
    output: str | None = Field(None, description="sbatch --output (default: JOBDIR/slurm-%j.out).")
    error: str | None = Field(None, description="sbatch --error (default: same as output).")
    dependency: str | None = Field(
        None,
        description="sbatch --dependency (afterok:JOBID[:JOBID...], afterany, afternotok, after[+MINUTES], "
        "aftercorr, singleton; joined by ',' or '?'), checked before sbatch.",
    )
    extra: list[str] = Field(default_factory=list, description="More sbatch flags, e.g. ['--reservation=big'].")

    @field_validator("dependency", "constraint")
    @classmethod
    def _slurm_syntax(cls, v: str | None, info: ValidationInfo) -> str | None:
        """A dependency or constraint read with the seam's parser of Slurm's syntax: DependencyError and
        ConstraintError are ValueErrors, so pydantic names the field."""
        if v is not None:
            (parse_dependency if info.field_name == "dependency" else parse_constraint)(v)
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            check_time_limit(parse_slurm_time(v))
        return v

    @field_validator("account", "qos", "mail_type", "mail_user", "job_name")
    @classmethod
    def _word(cls, v: str | None) -> str | None:
        if v is not None and not _SAFE_WORD.match(v):
            raise ValueError(f"{v!r} may use only letters, digits and _.,@+=:-")
        return v

    @field_validator("output", "error")
    @classmethod
    def _path(cls, v: str | None) -> str | None:
        if v is not None and not _SAFE_PATH.match(v):
            raise ValueError(f"{v!r} has spaces, control or shell characters; use a plain path")
        return v

    @field_validator("extra")
    @classmethod
    def _flags(cls, v: list[str]) -> list[str]:
        for flag in v:
            if re.search(r"[\x00-\x1f\x7f]", flag):  # a newline would end the #SBATCH line and start another
                raise ValueError(f"{flag!r} is not an sbatch flag: it holds a control character (newline, tab, ...)")
            why = reserved_flag(flag)
            if why:
                raise ValueError(why)
        return v

    @model_validator(mode="after")
    def _one_qos(self) -> SlurmOptions:
        if self.preemptible and self.qos is not None:
            raise ValueError(
                f"qos {self.qos} and preemptible both choose the QOS (preemptible: the site file's preemption.qos): "
                "drop one of them"
            )
        return self

    def overridden(self, **flags: object) -> SlurmOptions:
        """These options with fsbatch's flags on top (a flag left out, None, keeps model.yaml's value)."""
        from pydantic import ValidationError

        data = self.model_dump()
        for key, value in flags.items():
            if key == "extra":
                data["extra"] = [*self.extra, *value]  # type: ignore[misc]  # fsbatch passes extra as a list
            elif value is not None:
                data[key] = value
        try:
            return SlurmOptions.model_validate(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            msg = err["msg"].removeprefix("Value error, ")
            if not err["loc"]:  # two options together (qos and preemptible): the message names both
                raise InputError(f"fsbatch flags with model.yaml's slurm: block: {msg}") from None
            field = str(err["loc"][0])
            flag = "--sbatch" if field == "extra" else f"--{field.replace('_', '-')}"
            raise InputError(f"{flag}: {msg}") from None

    def flags(self) -> list[str]:
        """The #SBATCH lines these options add (time, name and output are placed by the template)."""
        out = [
            f"--{name.replace('_', '-')}={value}"
            for name in ("account", "qos", "constraint", "mail_type", "mail_user", "dependency")
            if (value := getattr(self, name)) is not None
        ]
        if self.exclusive:
            out.append("--exclusive")
        return out + list(self.extra)


ContainerRuntime = Literal["apptainer", "singularity", "pyxis"]
# a mount is SRC[:DST[:FLAGS]]; both runtimes join mounts with ',' (pyxis --container-mounts, apptainer --bind)
_MOUNT = re.compile(r"^/[^,:\x00-\x1f\x7f]*(:/[^,:\x00-\x1f\x7f]*(:[A-Za-z0-9_+-]+)?)?\Z")


class Container(_Strict):
    """The container image the job's tasks run in (entry.environment.container); render/container.py renders it
    into the srun line and checks what can be checked before submitting."""

    runtime: ContainerRuntime = Field(
        description="apptainer or singularity: each task runs `apptainer exec [--nv] --bind JOBDIR IMAGE PYTHON ...` "
        "(the command must exist on the compute nodes, and is checked for on the login node); pyxis: srun gets "
        "`--container-image=IMAGE --container-mounts=JOBDIR:JOBDIR` (Slurm's pyxis SPANK plugin with enroot, "
        "checked through `srun --help`).",
    )
    image: str = Field(
        description="The image. apptainer: a .sif file or sandbox directory (absolute, or relative to model.yaml's "
        "directory; checked to exist and be readable) or a URI such as docker://nvcr.io/nvidia/pytorch:24.05-py3 "
        "(pulled by the job; not checked). pyxis: a squashfs file given as a path starting with /, ./, ../ or ~ "
        "(checked) or a registry reference [USER@][REGISTRY#]IMAGE[:TAG] such as nvcr.io#nvidia/pytorch:24.05-py3 "
        "(imported by enroot when the job starts; not checked).",
    )
    python: str = Field(
        "python3",
        description="The Python inside the image that runs frenzy-slurm's runtime and your script: a command on the "
        "image's PATH or an absolute path in the image. It must import frenzy_slurm (and, for the built-in trainer, "
        "torch and deepspeed).",
    )
    mounts: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="More host paths to mount, SRC[:DST[:FLAGS]] with absolute paths, e.g. /scratch/data:/data:ro. "
        "The job directory, and with trainer: script the script's directory, are always mounted at their own "
        "paths; mount entry.data's directory here.",
    )
    workdir: str | None = Field(
        None,
        description="The working directory inside the container (pyxis --container-workdir, apptainer --pwd); "
        "default: the job directory.",
    )
    gpus: bool = Field(
        True,
        description="apptainer/singularity: `--nv`, the host's NVIDIA driver and GPUs inside the container. pyxis: "
        "enroot's NVIDIA hook does this itself, so this must stay true.",
    )
    options: list[str] = Field(
        default_factory=list,
        max_length=32,
        description="Further flags for the runtime, each one word: pyxis flags (--container-..., "
        "--no-container-...; e.g. --container-remap-root, --no-container-mount-home) go to srun; apptainer flags "
        "(e.g. --cleanenv, --contain) to `apptainer exec`, before the image.",
    )

    @model_validator(mode="after")
    def _check(self) -> Container:
        for what, value in (("image", self.image), ("python", self.python), ("workdir", self.workdir or "/")):
            if not value or re.search(r"[\x00-\x20\x7f]", value):
                raise ValueError(f"container.{what} {value!r} is empty or has a space or control character")
        if self.workdir is not None and not self.workdir.startswith("/"):
            raise ValueError(f"container.workdir {self.workdir!r} must be an absolute path inside the container")
        for m in self.mounts:
            if not _MOUNT.match(m):
                raise ValueError(
                    f"container.mounts: {m!r} is not SRC[:DST[:FLAGS]] with absolute paths and no ',' (e.g. "
                    "/scratch/data:/data:ro)"
                )
        pyxis = self.runtime == "pyxis"
        for flag in self.options:
            ok = re.fullmatch(r"--?[A-Za-z][A-Za-z0-9-]*(=[^\x00-\x1f\x7f]*)?", flag)
            if pyxis and re.match(r"--container-(image|mounts|workdir)\b", flag):
                raise ValueError(f"container.options: {flag!r}: give it as container.image, mounts or workdir")
            if not ok or (pyxis and not re.match(r"--(no-)?container-", flag)):
                want = (
                    "a pyxis flag, --container-... or --no-container-..." if pyxis else "one flag, -x or --name[=value]"
                )
                raise ValueError(f"container.options: {flag!r} is not {want}")
        if pyxis and not self.gpus:
            raise ValueError("container.gpus: false is for apptainer/singularity (--nv); pyxis/enroot maps GPUs itself")
        return self


class JobEnvironment(_Strict):
    """Where the job's Python comes from (entry.environment); job.sbatch loads and activates it before srun."""

    python: str | None = Field(
        None,
        description="The Python that runs your script, e.g. /opt/envs/train/bin/python (absolute, or relative to "
        "model.yaml's directory), or a command name such as python3.11, found on the job's PATH once the modules "
        "are loaded.",
    )
    venv: str | None = Field(
        None,
        description="A virtual environment directory whose bin/python runs your script (absolute, or relative to "
        "model.yaml's directory); job.sbatch puts its bin/ first on PATH.",
    )
    conda: str | None = Field(
        None,
        description="A conda environment, by name or prefix path; job.sbatch runs `conda activate` with it (conda "
        "must be on the job's PATH, e.g. from a module).",
    )
    modules: list[str] = Field(
        default_factory=list,
        description="Environment modules to load, in order, before anything else runs (`module load NAME`), "
        "e.g. [gcc/12, cuda/12.4].",
        max_length=64,
    )
    container: Container | None = Field(
        None,
        description="A container image the job's tasks run in, with Apptainer/Singularity or Slurm's pyxis/enroot "
        "(docs/runtime.md, \"Containers\"): the image's Python runs frenzy-slurm's runtime and your script.",
    )

    @model_validator(mode="after")
    def _check(self) -> JobEnvironment:
        given = [k for k in ("python", "venv", "conda") if getattr(self, k) is not None]
        if self.container is not None and given:
            raise ValueError(
                f"environment: with a container the image's Python runs the job; name it in container.python, not "
                f"{given[0]}"
            )
        if len(given) > 1:
            raise ValueError(f"environment: give one of python, venv or conda, not {' and '.join(given)}")
        for key in ("python", "venv"):
            value = getattr(self, key)
            if value is not None and (not value or re.search(r"[\x00-\x1f\x7f]", value)):
                raise ValueError(f"environment.{key} {value!r} is empty or has a control character")
        if self.conda is not None and not re.fullmatch(r"[A-Za-z0-9._+/~-]+", self.conda):
            raise ValueError(
                f"environment.conda {self.conda!r}: a conda environment name or prefix path, of letters, digits "
                "and ._+/~-"
            )
        for name in self.modules:
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+/@:-]*", name):
                raise ValueError(
                    f"environment.modules: {name!r} is not a module name (letters, digits and ._+/@:-, as in cuda/12.4)"
                )
        return self


class Parallel(_Strict):
    """What the plan may use, in the frameworks' words; `auto` lets the search choose among what the framework
    can run (`frenzy-slurm frameworks`), a value pins it."""

    sharding: Sharding = Field(
        "auto",
        description="none (DDP), zero1/zero2/zero3 (DeepSpeed ZeRO stages), full-shard (FSDP, = zero3), "
        "shard-grad-op (FSDP SHARD_GRAD_OP, = zero2), hybrid-shard (HSDP: full-shard within shard_group ranks, "
        "replicated across groups), or auto. Under hf-trainer the name picks the backend: zero1/zero2/zero3 "
        "predict Trainer with a DeepSpeed config (fp32 master copy, the `deepspeed:` buckets), the FSDP names and "
        "auto predict accelerate's FSDP.",
    )
    shard_group: int | None = Field(
        None, ge=1, description="With hybrid-shard (or ZeRO++/MiCS): ranks one shard group spans (default: a node)."
    )
    reshard_after_forward: bool | None = Field(
        None,
        description="FSDP: free each unit's gathered weights after its forward (true, FSDP's default) or keep "
        "them until backward (false: SHARD_GRAD_OP-like memory).",
    )
    fsdp_version: Literal[1, 2] | None = Field(
        None,
        description="Which FSDP API shards the model (accelerate's name for the same choice): 1, "
        "FullyShardedDataParallel (flat parameters per wrapped unit: MARP adds the cache its wrapping leaves and "
        "its all-gathers' stream pool to the reserved estimate), or 2, fully_shard (per-parameter sharding). "
        "Only with an FSDP sharding (full-shard, shard-grad-op, hybrid-shard, or auto). Default: what the "
        "framework runs at its version (`frenzy-slurm frameworks`): FSDP1 for Lightning's FSDPStrategy, litgpt and "
        "hf-trainer before transformers 5.10; FSDP2 for torchtune, torchtitan, hf-trainer from 5.10 and a plain "
        "torch loop from torch 2.4 (FSDP1 before it).",
    )
    tp: int | Literal["auto"] = Field("auto", description="Tensor-parallel degree, or auto.")
    pp: int | Literal["auto"] = Field("auto", description="Pipeline stages, or auto.")
    cp: int = Field(1, ge=1, description="Context-parallel degree (the sequence split across ranks).")
    sequence_parallel: bool | None = Field(
        None, description="Megatron-style sequence parallelism with tp > 1 (default: on whenever tp > 1)."
    )
    ep: int = Field(
        1,
        ge=1,
        le=1024,
        description="Expert-parallel degree of a Mixture-of-Experts model. MoE is not modelled (model.arch.experts), "
        "so ep > 1 is refused.",
    )
    ulysses: int = Field(
        1,
        ge=1,
        le=1024,
        description="DeepSpeed-Ulysses sequence parallelism (all-to-all over attention heads): not modelled, so a "
        "degree > 1 is refused. Ring-attention context parallelism is `cp`; Megatron's is `sequence_parallel`.",
    )
    schedule: Literal["1f1b", "interleaved", "gpipe", "sequential"] = Field(
        "1f1b",
        description="Pipeline schedule: 1f1b, interleaved (virtual stages), gpipe, or sequential: naive model "
        "parallelism (Hugging Face `device_map`, layers split over the GPUs and run one GPU at a time, no pipeline "
        "schedule: the first stage holds the embeddings, the last the output layer and the loss). Under hf-trainer "
        "pp > 1 is only this one.",
    )
    virtual_stages: int = Field(1, ge=1, description="Model chunks per pipeline rank (interleaved schedule).")
    offload_optimizer: bool = Field(
        False, description="Optimizer states in host memory (ZeRO-Offload, FSDP CPU offload); needs sharding."
    )
    offload_params: bool = Field(False, description="Parameters in host memory (ZeRO-3 / FSDP); needs zero3.")
    heterogeneous: bool | None = Field(
        None,
        description="Pipeline stages on different GPU types in one Slurm heterogeneous job, each stage sized to its "
        "GPU. Your script must build its stages from plan.json's layer_split, as the built-in trainer does. "
        "Default: on for the built-in trainer only.",
    )

    @field_validator("ep")
    @classmethod
    def _no_ep(cls, v: int) -> int:
        if v > 1:
            raise ValueError(
                "expert parallelism needs a Mixture-of-Experts model, and MoE is not modelled (experts, top-k routing "
                "and all-to-all buffers change memory and step time); frenzy-slurm refuses it rather than plan the "
                "model as dense. Set ep: 1 for a dense model"
            )
        return v

    @field_validator("ulysses")
    @classmethod
    def _no_ulysses(cls, v: int) -> int:
        if v > 1:
            raise ValueError(
                "DeepSpeed-Ulysses sequence parallelism is not modelled (its all-to-all over attention heads and "
                "the sequence split across the group change activation memory); frenzy-slurm refuses it rather "
                "than predict a run without it. Set ulysses: 1, or use cp (ring-attention context parallelism) "
                "where your framework runs it"
            )
        return v

    @field_validator("tp", "pp")
    @classmethod
    def _degree(cls, v: int | str) -> int | str:
        if isinstance(v, int) and not 1 <= v <= 1024:
            raise ValueError("a parallel degree must be between 1 and 1024, or auto")
        return v

    @model_validator(mode="after")
    def _check(self) -> Parallel:
        if self.virtual_stages > 1 and self.schedule != "interleaved":
            raise ValueError("virtual_stages > 1 needs schedule: interleaved")
        if self.offload_params and self.sharding not in ("zero3", "full-shard", "hybrid-shard"):
            raise ValueError("offload_params needs sharding: zero3 or full-shard")
        if self.offload_optimizer and self.sharding == "none":
            raise ValueError("offload_optimizer needs sharding (zero1 or more)")
        if self.shard_group is not None and self.sharding not in ("hybrid-shard", "zero1", "zero2", "zero3"):
            raise ValueError("shard_group needs sharding: hybrid-shard (or a ZeRO stage)")
        if self.fsdp_version is not None and self.sharding in ("none", "zero1", "zero2", "zero3"):
            raise ValueError(
                f"fsdp_version: {self.fsdp_version} needs an FSDP sharding (full-shard, shard-grad-op, hybrid-shard "
                f"or auto); sharding: {self.sharding} is "
                + ("DDP" if self.sharding == "none" else "DeepSpeed's ZeRO")
                + ", which runs no FSDP. Remove fsdp_version or name FSDP's sharding"
            )
        return self

    @property
    def zero_stages(self) -> tuple[int, ...] | None:
        """The ZeRO stage(s) the sharding names, or None for auto."""
        return {
            "auto": None,
            "none": (0,),
            "zero1": (1,),
            "zero2": (2,),
            "shard-grad-op": (2,),
            "zero3": (3,),
            "full-shard": (3,),
            "hybrid-shard": (3,),
        }[self.sharding]


class DeepSpeedBuffers(_Strict):
    """DeepSpeed's communication buffer sizes (elements), written into ds_config.json; they count in memory
    (MARP's Workload carries them as they are: frozen, so a Workload stays hashable)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, frozen=True)

    reduce_bucket_size: int = Field(200_000_000, ge=1, description="zero_optimization.reduce_bucket_size.")
    allgather_bucket_size: int = Field(200_000_000, ge=1, description="zero_optimization.allgather_bucket_size.")
    overlap_comm: bool = Field(False, description="zero_optimization.overlap_comm.")
    stage3_prefetch_bucket_size: int = Field(50_000_000, ge=0, description="ZeRO-3 prefetch bucket.")
    stage3_max_live_parameters: int = Field(1_000_000_000, ge=0, description="ZeRO-3 max live parameters.")
    stage3_max_reuse_distance: int = Field(
        1_000_000_000, ge=0, description="ZeRO-3 keeps a gathered parameter reused within this many elements."
    )


class Data(_Strict):
    """How the training data is cut into sequences, as far as memory depends on it (docs/model-yaml.md, "data")."""

    lengths: Literal["fixed", "variable"] = Field(
        "fixed",
        description="fixed: every sequence is training.seq_len tokens (packed, or padded to seq_len). variable: each "
        "micro-batch is as long as its longest sample (a collator padding to the longest, or one unpadded sample per "
        "micro-batch), so steps differ in length and the longest sets the peak.",
    )
    longest: int | None = Field(
        None,
        gt=0,
        le=1 << 30,
        description="With lengths: variable, the longest sample in tokens after truncation (at most "
        "training.seq_len, its default).",
    )
    median: int | None = Field(
        None,
        gt=0,
        le=1 << 30,
        description="With lengths: variable, the median sample in tokens after truncation: the caching allocator "
        "keeps a shorter step's blocks when a longer one comes, which reserved memory shows. Default: the mean where "
        "stated (at most the longest), else half the longest.",
    )
    mean: float | None = Field(
        None,
        gt=0,
        le=1 << 30,
        description="With lengths: variable, the mean sample length in tokens before truncation (with sd): the "
        "replayed steps' lengths are drawn from that normal distribution, truncated at the longest "
        '(docs/marp.md, "Variable sequence lengths", has the one-liner that computes both).',
    )
    sd: float | None = Field(
        None,
        ge=0,
        le=1 << 30,
        description="With lengths: variable and mean, the standard deviation of the sample lengths in tokens "
        "before truncation.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Data:
        stated = [n for n in ("longest", "median", "mean", "sd") if getattr(self, n) is not None]
        if self.lengths == "fixed" and stated:
            raise ValueError(f"{', '.join(stated)} describe variable lengths; set lengths: variable or remove them")
        if (self.mean is None) != (self.sd is None):
            given, missing = ("mean", "sd") if self.sd is None else ("sd", "mean")
            raise ValueError(f"data.{given} needs data.{missing}: the lengths are drawn from both (or give neither)")
        if self.longest is not None and self.median is not None and self.median > self.longest:
            raise ValueError(f"median {self.median} is longer than longest {self.longest}; swap them")
        return self


class LlmcFlags(_Strict):
    """llm.c's train_gpt2.cu flags that decide its memory and have no model.yaml field of their own."""

    recompute: Literal[0, 1, 2] | None = Field(
        None,
        description="-r: recompute in backward nothing (0), the GELU (1) or the GELU and the layer norms (2). "
        "Default: llm.c's at entry.framework_version (1 from 2024.05.16, when -r came; 0 before).",
    )
    master_weights: bool = Field(
        True, description="-w: keep an fp32 master copy of the parameters (llm.c's default, 1)."
    )


class Entry(_Strict):
    trainer: Literal["builtin", "script"] = Field("builtin", description="The built-in trainer or your own script.")
    framework: FrameworkName | None = Field(
        None,
        description="What the job trains with, which decides what MARP predicts and which plans are proposed: "
        "frenzy (the built-in trainer; the only choice with trainer: builtin), deepspeed (your DeepSpeed script), "
        "hf-trainer (Transformers Trainer/accelerate), unsloth (Unsloth's FastLanguageModel under TRL/transformers' "
        "Trainer, one GPU or DDP), torchtune, torchtitan, litgpt, lightning, megatron "
        "(Megatron-Core/NeMo), torch (a plain DDP/FSDP loop) or llm.c (karpathy/llm.c's train_gpt2.cu: entry.script "
        "is its binary, MARP sums the buffers its source allocates; entry.llmc gives its -r and -w). Default: "
        "frenzy for the built-in trainer, deepspeed for a script. `frenzy-slurm frameworks` lists each profile's "
        "defaults.",
    )
    model_code: ModelCodeName | None = Field(
        None,
        description="The model implementation the framework trains, where it is not the framework's own: hf "
        "(Transformers' modeling code), unsloth (Transformers' classes with Unsloth's forwards and Triton kernels), "
        "frenzy (frenzy_slurm.models), torchtune, litgpt, torchtitan, megatron. "
        "Default: the framework's (hf for hf-trainer, lightning, torch and deepspeed).",
    )
    holds_logits: bool | None = Field(
        None,
        description="Your loop keeps the model output bound through backward (`logits = model(x); loss = "
        "f(logits, y); loss.backward()`), so the 16-bit logits stay alive. Default: the framework's.",
    )
    empty_cache_after_setup: bool | None = Field(
        None,
        description="The program calls torch.cuda.empty_cache() after FSDP has wrapped the model and before the "
        "measured steps, returning what wrapping left cached (read only for parallel.fsdp_version 1, whose wrap "
        "leaves the shards scattered over segments the step starts from). Default: the framework's (Lightning's "
        "Trainer does, in resume_end after its strategy's setup; accelerate, Fabric and litgpt do not).",
    )
    loss_upcast: bool | None = Field(
        None,
        description="With training.precision bf16-pure, or DeepSpeed's fp16/bf16 engine (the module cast to 16 bits, "
        "no autocast): the cross-entropy runs on an fp32 copy of the logits "
        "(`logits.float()`: Transformers' loss, torchtune's chunked loss, Lightning Fabric's fp32 output); false: on "
        "the 16-bit logits as the model returns them. Default: the framework's (an fp32 copy for every profile).",
    )
    transformers_version: str | None = Field(
        None,
        description="The transformers release whose model classes the job runs (entry.model_code hf) under a "
        "framework other than hf-trainer, whose entry.framework_version is it already, e.g. '4.25'. It decides "
        "whether a 16-bit module's loss upcasts the logits: GPT-2/OPT-style classes ran a 16-bit loss before 4.49, "
        "Llama-style ones before 4.31 (entry.loss_upcast overrides it); under unsloth, which trains through "
        "transformers' Trainer, it also picks the Trainer's default optimizer. Default: a current release.",
        pattern=r"^[0-9]+(\.[0-9]+){0,2}$",
    )
    torch_version: str | None = Field(
        None,
        description="The job's torch version where it matters to memory: before 1.13 CUDA kernels were loaded at "
        "start (the larger CUDA context: the site pool's overheads.eager_context_gib, 1.3 GiB by default, instead of "
        "context_gib, 0.5 GiB; entry.env CUDA_MODULE_LOADING overrides it), and before 2.0 gradients were zeroed in "
        "place, not freed. Default: a current release.",
        pattern=r"^[0-9]+(\.[0-9]+){0,2}$",
    )
    framework_version: str | None = Field(
        None,
        description="The framework's version, e.g. '4.57' (defaults change between releases; a profile says which "
        "versions it describes, and a version outside them is noted); for llm.c, which has no releases, the date of "
        "the train_gpt2.cu built as YYYY.MM.DD, e.g. '2024.05.13'; for torchtitan before its first release (0.1.0), "
        "the snapshot's date the same way, e.g. '2024.12.26', as for litgpt before its first release (lit-gpt, "
        "e.g. '2023.10.16'); for unsloth its release, year.month.patch, e.g. '2025.3.14'. Default: the newest the "
        "profile describes.",
        pattern=r"^[0-9]+(\.[0-9]+){0,2}$",
    )
    llmc: LlmcFlags = Field(
        default_factory=lambda: LlmcFlags(),
        description="llm.c's own flags that decide its memory (framework llm.c only); the others map onto "
        "model.yaml: -b training.micro_batch, -t training.seq_len, -z parallel.sharding (none or zero1), "
        "USE_CUDNN=1 training.attention flash (eager: llm.c's own attention kernels).",
    )
    script: str | None = Field(None, description="Path of your training script (trainer: script).")
    args: list[str] = Field(default_factory=list, description="Arguments passed to the script.")
    data: str | None = Field(
        None,
        description="Token file (flat array of token ids) for the built-in trainer, relative "
        "to model.yaml's directory; synthetic if unset.",
    )
    data_dtype: Literal["uint16", "uint32", "int32", "int64"] = Field(
        "uint16", description="Element type of the token file."
    )
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables set in the job.")
    environment: JobEnvironment = Field(
        default_factory=JobEnvironment,
        description="The job's software environment: modules to load, and (trainer: script) the Python, venv or "
        "conda environment that runs your script. Default: the Python that runs fsbatch. fsbatch checks it can "
        "find the framework's packages (see docs/runtime.md).",
    )

    @field_validator("framework", mode="before")
    @classmethod
    def _modelled(cls, v: object) -> object:
        if isinstance(v, str) and v.strip().lower() in UNMODELLED_FRAMEWORKS:
            raise ValueError(
                f"framework {v} is not modelled: {UNMODELLED_FRAMEWORKS[v.strip().lower()]}. frenzy-slurm cannot "
                "predict its memory, so it does not plan it"
            )
        return v

    @model_validator(mode="after")
    def _check(self) -> Entry:
        if self.trainer == "builtin" and any(
            v is not None for v in (self.environment.python, self.environment.venv, self.environment.conda)
        ):
            raise ValueError(
                "environment.python/venv/conda choose the Python of your script (trainer: script); the built-in "
                "trainer runs in frenzy-slurm's own Python (install frenzy-slurm[train] there). environment.modules "
                "works with both."
            )
        if self.trainer == "script" and not self.script:
            raise ValueError("trainer: script needs script: path/to/train.py")
        if self.trainer == "builtin" and self.script:
            raise ValueError("script is only used with trainer: script")
        if self.trainer == "builtin" and self.framework not in (None, "frenzy"):
            raise ValueError(
                f"framework {self.framework} runs your own script: set trainer: script and script: path/to/train.py "
                "(the built-in trainer is framework frenzy)"
            )
        if self.framework != "llm.c" and self.llmc != LlmcFlags():
            raise ValueError(
                "llmc: llm.c's flags are read only with framework: llm.c; remove the llmc block or set framework: llm.c"
            )
        if self.trainer == "script" and self.framework == "frenzy":
            raise ValueError(
                "framework frenzy is the built-in trainer: use trainer: builtin, or name your script's framework"
            )
        for what, path in (("script", self.script), ("data", self.data)):
            if path is not None and re.search(r"[\x00-\x1f\x7f]", path):  # the script path reaches job.sbatch
                raise ValueError(
                    f"{what} {path!r} contains a control character (newline, tab, ...); rename the "
                    "file to a path without one"
                )
        for key in self.env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"env name {key!r} is not a valid shell variable name (letters, digits and _)")
        return self

    @property
    def runs_with(self) -> FrameworkName:
        """The framework named, or the default: frenzy for the built-in trainer, deepspeed for a script."""
        if self.framework is not None:
            return self.framework
        return "frenzy" if self.trainer == "builtin" else "deepspeed"


class JobSpec(_Strict):
    """The whole model.yaml."""

    # pydantic's `pattern` runs on the Rust regex crate, whose `$` is the end of the text (a trailing newline is
    # refused: tests/test_spec_no_newlines.py checks it)
    name: str = Field(
        description="Job name (Slurm job name and job directory).", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
    )
    model: ModelSource = Field(description="Which model to train.")
    training: Training = Field(description="How to train it.")
    limits: Limits = Field(default_factory=Limits, description="What the scheduler may use.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions, description="Slurm pass-through options.")
    entry: Entry = Field(default_factory=Entry, description="What runs in the job.")
    parallel: Parallel = Field(default_factory=Parallel, description="What the parallel plan may use.")
    deepspeed: DeepSpeedBuffers = Field(
        default_factory=DeepSpeedBuffers, description="DeepSpeed buffer sizes (frameworks that run DeepSpeed)."
    )
    data: Data = Field(
        default_factory=Data, description="How the data is cut into sequences (fixed or variable lengths)."
    )

    @model_validator(mode="after")
    def _data_within_seq_len(self) -> JobSpec:
        for name in ("longest", "median"):
            value = getattr(self.data, name)
            if value is not None and value > self.training.seq_len:
                raise ValueError(
                    f"data.{name}: {value} is longer than training.seq_len {self.training.seq_len}, to which samples "
                    f"are truncated; give the length after truncation (at most {self.training.seq_len})"
                )
        return self

    @property
    def longest_tokens(self) -> int:
        """The tokens of the longest sequence a step trains on: what sets the memory peak."""
        return self.data.longest or self.training.seq_len

    @property
    def median_tokens(self) -> int | None:
        """With variable lengths, a typical step's sequence length (the data block's median, else half the longest);
        None with fixed lengths."""
        if self.data.lengths == "fixed":
            return None
        if self.data.median is None and self.data.mean is not None:  # a normal's median is its mean
            return max(1, min(self.longest_tokens, round(self.data.mean)))
        return self.data.median or max(1, self.longest_tokens // 2)

    @model_validator(mode="after")
    def _trainer_supports(self) -> JobSpec:
        if self.entry.trainer == "builtin" and self.training.method != "full":
            raise ValueError(
                f"the built-in trainer trains all weights; training.method {self.training.method} needs "
                "entry.trainer: script (your LoRA code), or use method: full"
            )
        if self.entry.trainer == "builtin" and self.data.lengths == "variable":
            raise ValueError(
                "the built-in trainer packs its data into training.seq_len-token sequences (fixed lengths); "
                "data.lengths: variable describes your own script's batches (entry.trainer: script)"
            )
        if self.entry.trainer == "builtin" and self.model.factory is not None:
            raise ValueError(
                "the built-in trainer builds its own model from the architecture; a model.factory "
                "needs entry.trainer: script"
            )
        return self
