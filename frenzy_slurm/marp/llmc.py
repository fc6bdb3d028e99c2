"""llm.c's device memory: the buffers karpathy/llm.c's `train_gpt2.cu` allocates, read from its source.

llm.c trains GPT-2 in its own C/CUDA code. It never goes through PyTorch's caching allocator: it makes one
`cudaMalloc` per group of tensors when it starts (parameters, activations, parameter gradients, activation
gradients, AdamW's m and v, the fp32 master copy, the cuBLASLt workspace), sized by `fill_in_parameter_sizes`,
`fill_in_activation_sizes` and (until June 2024) `fill_in_grad_act_sizes`, and keeps them to the end. So its peak
is the sum of those buffers, whatever the step does, and "allocated" and "reserved" are the same figure.

The layout changed over 2024 (the dates below, each that of the master commit that made it, YYYY.MM.DD): model.yaml's
`entry.framework_version` is the date of the train_gpt2.cu the job builds (llm.c has no releases); the default is
the newest described. `layout_from_spec` maps model.yaml onto llm.c's flags and refuses what llm.c cannot run;
`buffer_bytes` sizes every buffer of one rank; `breakdown` groups them into MARP's seven parts.
"""

from __future__ import annotations

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp.allocator import MiB
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.plan import Metric, ParallelPlan
from frenzy_slurm.marp.workload import Date, LlmcLayout

# karpathy/llm.c master (first-parent) commits that changed what train_gpt2.cu allocates on the device
# 750c5fd, "Merge pull request #309 from ahrefs/zero-stage1": ZeRO-1 (m, v and the master copy sharded)
PR_309: Date = (2024, 5, 13)
LOSSES_BUFFER: Date = (2024, 5, 15)  # 0f48a28 (#412, gradient accumulation): a (B, T) `losses` activation
RECOMPUTE_GELU: Date = (2024, 5, 16)  # bd7dc7a (#422): -r, default 1: fch_gelu one layer's (B, T, 4C), not L of them
ONE_CUBLASLT_WORKSPACE: Date = (2024, 5, 17)  # f226a2c (b24279c "remove duplicate workspace allocation")
RECOMPUTE_LAYERNORM: Date = (2024, 5, 31)  # 60a1037: -r 2 keeps one layer's ln1/ln2 (B, T, C)
LAYERNORM_INTO_LNF: Date = (2024, 6, 3)  # d17893b (#532): -r 2 keeps no ln1/ln2 at all (lnf is the buffer)
NO_GRAD_ACTS: Date = (2024, 6, 13)  # 2bc0b47 (#590): grad-activation buffers replaced by scratch_bt4c, scratch_btc
FP32_STATS: Date = (2024, 6, 27)  # 2cf7c5b (mixed dtypes): layernorm means/rstds and losses in fp32
NO_PROJ_ACTS: Date = (2024, 7, 1)  # 79223b9 (optimize_attproj_fcproj): no per-layer attproj and fcproj
NEWEST: Date = (2024, 8, 16)  # 0ddedf9 (#745): the last master change to train_gpt2.cu

CUBLASLT_WORKSPACE = 32 * 1024 * 1024  # llmc/cublas_common.h (train_gpt2.cu before June): cublaslt_workspace_size
VOCAB_PADDING = 128  # train_gpt2.py pad_vocab(multiple=128): the checkpoint's padded_vocab_size
BYTES = {"fp32": 4, "bf16-mixed": 2, "fp16-mixed": 2}  # floatX: PRECISION=FP32 / BF16 (default) / FP16 builds


def llmc_version(text: str | None) -> Date:
    """entry.framework_version as the date of llm.c's source (the newest described when unset); InputError for a
    version that is not a date, or a date before the layouts MARP describes."""
    if text is None:
        return NEWEST
    parts = tuple(int(p) for p in text.split("."))
    if len(parts) != 3 or parts[0] < 2024 or not (1 <= parts[1] <= 12 and 1 <= parts[2] <= 31):
        raise InputError(
            f"entry.framework_version {text!r}: llm.c has no releases; give the date of the train_gpt2.cu you build "
            "as YYYY.MM.DD (e.g. 2024.05.13 for PR #309), or leave it unset for the newest layout described"
        )
    version: Date = (parts[0], parts[1], parts[2])
    if version < PR_309:
        raise InputError(
            f"entry.framework_version {text}: MARP describes llm.c's train_gpt2.cu from 2024.05.13 (PR #309) on; "
            "build a newer llm.c, or give a later date"
        )
    return version


def _refuse(what: str, why: str, fix: str) -> InputError:
    return InputError(f"{what}: llm.c {why}; {fix}")


def _check_arch(arch: Architecture) -> None:
    """llm.c's train_gpt2.cu builds GPT-2 only (fill_in_parameter_sizes: 16 tensors of fixed shapes)."""
    gpt2 = (
        arch.activation == "gelu"
        and arch.norm == "layernorm"
        and arch.position == "learned"
        and arch.bias == "all"
        and arch.tied_embeddings
        and arch.head == "lm"
        and arch.kv == arch.heads
        and arch.ffn == 4 * arch.hidden
    )
    if not gpt2:
        raise _refuse(
            "model",
            "train_gpt2.cu trains GPT-2 only (layer norm, learned positions, biases everywhere, tied embeddings, "
            "multi-head attention, a GELU FFN 4 x hidden wide)",
            "use a gpt2 preset (gpt2, gpt2-medium, gpt2-large, gpt2-xl) or an arch block of that shape",
        )


def _check_training(spec: JobSpec) -> None:
    """Settings llm.c has no equivalent of, refused naming the field and the fix."""
    t = spec.training
    refusals = (
        (t.method != "full", "training.method", "trains every weight", "set method: full"),
        (t.optimizer != "adamw", "training.optimizer", "steps with its own AdamW kernel only", "set optimizer: adamw"),
        (
            t.precision == "bf16-pure",
            "training.precision: bf16-pure",
            "keeps AdamW's m and v in fp32 whatever the build",
            "set bf16-mixed, and entry.llmc.master_weights: false for -w 0 (no fp32 master copy)",
        ),
        (
            t.activation_checkpointing in ("full", "selective", "op"),
            f"training.activation_checkpointing: {t.activation_checkpointing}",
            "checkpoints no blocks; its -r recomputes the GELU (1) or the GELU and layer norms (2)",
            "set none (or auto) and give -r as entry.llmc.recompute",
        ),
        (t.compile or t.fp8, "training.compile/fp8", "is CUDA C with its own kernels", "set them false"),
        (
            t.activation_offload or t.optimizer_in_backward or t.fused_linear_loss or (t.loss_chunks or 1) > 1,
            "training.activation_offload/optimizer_in_backward/fused_linear_loss/loss_chunks",
            "has none of these",
            "remove them",
        ),
        (
            t.precision == "fp32" and t.attention != "eager",
            f"training.precision: fp32 with attention: {t.attention}",
            "builds cuDNN's attention (USE_CUDNN=1) only in 16 bits (cudnn_att.cpp: static_assert, 'cuDNN is not "
            "supported in FP32 mode')",
            "set attention: eager (llm.c's own attention kernels) or precision: bf16-mixed",
        ),
        (
            spec.data.lengths == "variable",
            "data.lengths: variable",
            "allocates for one (B, T) at start and trains every step at it",
            "set lengths: fixed",
        ),
    )
    for refused, what, why, fix in refusals:
        if refused:
            raise _refuse(what, why, fix)


def layout_from_spec(spec: JobSpec, arch: Architecture) -> LlmcLayout:
    """model.yaml in llm.c's terms: -r (entry.llmc.recompute, default 1 from 2024.05.16 and 0 before, when -r came),
    cuDNN (training.attention flash/sdpa: USE_CUDNN=1; eager: llm.c's own attention kernels), -w
    (entry.llmc.master_weights), the PRECISION build (training.precision), the date of the source. InputError naming
    the field and the fix for what llm.c cannot run."""
    _check_arch(arch)
    _check_training(spec)
    if spec.longest_tokens > arch.max_positions:
        raise _refuse(
            f"training.seq_len: {spec.longest_tokens}",
            f"asserts T <= maxT, the positional embedding's {arch.max_positions} rows (model.arch.max_positions)",
            "train at most that many tokens per sample",
        )
    version = llmc_version(spec.entry.framework_version)
    said = spec.entry.llmc.recompute
    if said is not None and said > 0 and version < RECOMPUTE_GELU:
        raise _refuse(
            f"entry.llmc.recompute: {said}",
            "train_gpt2.cu has no -r before 2024.05.16 (bd7dc7a)",
            "set 0, or a later entry.framework_version",
        )
    if said == 2 and version < RECOMPUTE_LAYERNORM:
        raise _refuse(
            "entry.llmc.recompute: 2",
            "train_gpt2.cu has -r 2 (layernorm recomputation) from 2024.05.31 (60a1037)",
            "set 0 or 1, or a later entry.framework_version",
        )
    return LlmcLayout(
        version=version,
        recompute=recompute_level(spec, version),
        cudnn=spec.training.attention != "eager",
        master_weights=spec.entry.llmc.master_weights,
        floatx=BYTES[spec.training.precision],
        padded_vocab=-(-arch.vocab // VOCAB_PADDING) * VOCAB_PADDING,
        max_seq=arch.max_positions,
    )


def recompute_level(spec: JobSpec, version: Date) -> int:
    """llm.c's -r for this job: entry.llmc.recompute, else its default at `version` (1 from bd7dc7a, 0 before)."""
    said = spec.entry.llmc.recompute
    return said if said is not None else (1 if version >= RECOMPUTE_GELU else 0)


def parameter_count(arch: Architecture, lay: LlmcLayout) -> int:
    """fill_in_parameter_sizes: wte (Vp, C), wpe (maxT, C), per layer ln1 w/b, qkv w (3C, C) and b, attproj w (C, C)
    and b, ln2 w/b, fc w (4C, C) and b, fcproj w (C, 4C) and b; lnf w/b."""
    c, n = arch.hidden, arch.layers
    return lay.padded_vocab * c + lay.max_seq * c + n * (12 * c * c + 13 * c) + 2 * c


def _activation_bytes(arch: Architecture, lay: LlmcLayout, b: int, t: int) -> dict[str, int]:
    """fill_in_activation_sizes (and, before 2024.06.13, fill_in_grad_act_sizes) at one date, in bytes."""
    n, c, nh, v = arch.layers, arch.hidden, arch.heads, lay.padded_vocab
    bt, x, f4 = b * t, lay.floatx, 4
    stat = f4 if lay.version >= FP32_STATS else x  # ln means/rstds and losses: floatX, fp32 from 2cf7c5b
    ln = n * bt * c if lay.recompute < 2 else (bt * c if lay.version < LAYERNORM_INTO_LNF else 0)
    acts = {
        "encoded": bt * c * x,
        "ln1": ln * x,
        "ln1_mean_rstd": 2 * n * bt * stat,
        "atty": n * bt * c * x,
        # cuDNN: fp32 softmax statistics (L, B, NH, T); llm.c's own kernels: the (L, B, NH, T, T) attention matrix
        "att": n * b * nh * t * f4 if lay.cudnn else n * b * nh * t * t * x,
        "attproj": n * bt * c * x if lay.version < NO_PROJ_ACTS else 0,
        "residual2": n * bt * c * x,
        "ln2": ln * x,
        "ln2_mean_rstd": 2 * n * bt * stat,
        "fch": n * bt * 4 * c * x,
        "fch_gelu": (n if lay.recompute < 1 else 1) * bt * 4 * c * x,
        "fcproj": n * bt * c * x if lay.version < NO_PROJ_ACTS else 0,
        "residual3": n * bt * c * x,
        "lnf": bt * c * x,
        "lnf_mean_rstd": 2 * bt * stat,
        "losses": bt * stat if lay.version >= LOSSES_BUFFER else 0,
        "qkvr": n * bt * 3 * c * x,
        # the logits, their gradient in training, and the blocks' scratchpad: (B, T, max(3C, NH*T, Vp))
        "output": bt * max(3 * c, nh * t, v) * x,
    }
    if lay.version >= NO_GRAD_ACTS:
        acts |= {"scratch_bt4c": bt * 4 * c * x, "scratch_btc": bt * c * x}
    return acts


def _grad_act_bytes(arch: Architecture, lay: LlmcLayout, b: int, t: int) -> int:
    """fill_in_grad_act_sizes, before 2024.06.13: bt4c (B, T, 4C), residual3 (B, T, C), and without cuDNN preatt
    (B, NH, T, T); a buffer of its own, allocated at the first backward."""
    if lay.version >= NO_GRAD_ACTS:
        return 0
    bt, c = b * t, arch.hidden
    return (bt * 4 * c + bt * c + (0 if lay.cudnn else b * arch.heads * t * t)) * lay.floatx


def shard(params: int, plan: ParallelPlan) -> int:
    """The parameters whose m, v and master copy one rank holds: ZeRO-1 splits them over the data-parallel ranks,
    only where they divide evenly (set_zero_configs: otherwise it prints that ZeRO is disabled and runs stage 0)."""
    if plan.zero == 1 and plan.dp > 1 and params % plan.dp == 0:
        return params // plan.dp
    return params


def buffer_bytes(arch: Architecture, lay: LlmcLayout, plan: ParallelPlan, seq_len: int) -> dict[str, int]:
    """Every device buffer one rank of llm.c allocates, in bytes, by the name its source prints or declares."""
    b, t = plan.micro_batch, seq_len
    params = parameter_count(arch, lay)
    owned = shard(params, plan)
    acts = _activation_bytes(arch, lay, b, t)
    out = {
        "parameters": params * lay.floatx,
        "parameter gradients": params * lay.floatx,
        "AdamW m": owned * 4,
        "AdamW v": owned * 4,
        "master copy of params": owned * 4 if lay.master_weights else 0,
        "activations": sum(v for k, v in acts.items() if k != "output"),
        "output (logits, scratch)": acts["output"],
        "activation gradients": _grad_act_bytes(arch, lay, b, t),
        "inputs and targets": 2 * b * t * 4,  # int32 (B, T) each
        "cuBLASLt workspace": CUBLASLT_WORKSPACE * (2 if lay.version < ONE_CUBLASLT_WORKSPACE else 1),
    }
    return out


def printed_mib(buffers: dict[str, int]) -> dict[str, int]:
    """What llm.c prints at start-up ("allocated N MiB for ..."): round() for parameters, activations (with the
    output buffer) and gradients, a right shift by 20 for m, v and the master copy."""
    whole = ("parameters", "parameter gradients", "activation gradients")
    out = {k: round(buffers[k] / MiB) for k in whole}
    out["activations"] = round((buffers["activations"] + buffers["output (logits, scratch)"]) / MiB)
    out |= {k: buffers[k] >> 20 for k in ("AdamW m", "AdamW v", "master copy of params")}
    return out


def breakdown(
    arch: Architecture, lay: LlmcLayout, plan: ParallelPlan, seq_len: int, metric: Metric, overheads: Overheads
) -> dict[str, float]:
    """MARP's seven parts of one rank's memory: every buffer is alive from start-up on, so this is the peak of every
    moment. `device` adds the CUDA context and NCCL's buffers (overheads.driver_bytes); torch's cuBLAS workspaces
    are not there (llm.c's own cuBLASLt workspace is among its buffers). Not counted: cuDNN's workspace, which
    cudnn_att.cpp allocates as the graphs ask (graph-dependent, up to 256 MiB by its comment)."""
    buf = buffer_bytes(arch, lay, plan, seq_len)
    return {
        "weights": buf["parameters"],
        "gradients": buf["parameter gradients"],
        "optimizer": buf["AdamW m"] + buf["AdamW v"] + buf["master copy of params"],
        "activations": buf["activations"] + buf["activation gradients"],
        "logits": buf["output (logits, scratch)"],
        "buffers": buf["inputs and targets"] + buf["cuBLASLt workspace"],
        "overhead": overheads.driver_bytes(plan.world) if metric == "device" else 0.0,
    }
