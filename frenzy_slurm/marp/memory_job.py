"""What every pipeline stage of one (workload, plan) shares, for the memory terms: byte widths per parameter
and activation element, sharding divisors, tokens per micro-batch (`Job`, made by `job`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from frenzy_slurm.marp.memory_activations import layer_activation_bytes
from frenzy_slurm.marp.memory_memo import TermMemo
from frenzy_slurm.marp.params import ParamCounts, count_params
from frenzy_slurm.marp.plan import ParallelPlan, Workload

QLORA_BYTES_PER_PARAM = 4.127 / 8  # NF4 with double-quantised absmax (QLoRA paper, section 3)
NF4_PLAIN_BYTES_PER_PARAM = 4.5 / 8  # NF4 with an fp32 absmax per 64-element block (no double quantisation)


def param_bytes(w: Workload) -> tuple[float, float, float, float, float]:
    """(weight, grad, optimizer-state, master-weight, state dtype) bytes per trainable parameter.

    torch FSDP mixed precision has the same bytes as autocast: fp32 sharded parameters (they are the master),
    fp32 sharded gradients (reduce_dtype), fp32 states; the 16-bit copies are the per-unit gathered buffers.
    Megatron keeps 16-bit weights, an fp32 `main_grad` buffer and an fp32 master inside its optimizer.
    """
    mixed = w.precision in ("bf16-mixed", "fp16-mixed")
    if w.precision == "fp32":
        wb, gb, sdt = 4.0, 4.0, 4.0
    elif w.precision == "bf16-pure" and w.method != "full" and w.adapters.lora_fp32:
        wb, gb, sdt = 4.0, 4.0, 4.0  # PEFT's fp32 adapters (the trainable parameters) over the 16-bit base
    elif w.precision == "bf16-pure":
        wb, gb, sdt = 2.0, 2.0, 2.0
    elif w.framework == "torch":  # autocast / FSDP mixed precision: parameters and grads stay fp32
        wb, gb, sdt = 4.0, 4.0, 4.0
    elif w.framework == "megatron":
        wb, gb, sdt = 2.0, 4.0, 4.0
    else:  # DeepSpeed mixed precision: 16-bit model copy, fp32 master copy inside the optimizer
        wb, gb, sdt = 2.0, 2.0, 4.0
    master = 4.0 if mixed and w.framework in ("deepspeed", "megatron") else 0.0
    h, f = w.arch.hidden, w.arch.ffn
    states = {
        "adamw": 2 * sdt,
        "adam": 2 * sdt,
        "sgd": 0.0,
        "sgd-momentum": sdt,
        "adafactor": sdt * (1.0 / h + 1.0 / f),  # factored second moment: rows + columns per matrix
        "adam-8bit": 2.0 + 2 * 4.0 / 2048,  # two uint8 states + fp32 absmax per 2048-element block
        "adam-4bit": 2 * (0.5 + 4.0 / 128),  # torchao AdamW4bit: two 4-bit states + an fp32 scale per 128 values
    }[w.states.optimizer]
    return wb, gb, states, master, sdt


def nf4_bytes(w: Workload) -> float:
    """Bytes per quantised weight of a QLoRA base: NF4 with double-quantised or plain fp32 absmax."""
    return QLORA_BYTES_PER_PARAM if w.adapters.nf4_double_quant else NF4_PLAIN_BYTES_PER_PARAM


def autocast(w: Workload, plan: ParallelPlan) -> bool:
    """torch mixed precision by autocast (fp32 residual stream, 16-bit matmuls); FSDP's mixed-precision policy
    (ZeRO-3 under torch) instead runs the whole block in 16-bit on the gathered 16-bit weights."""
    return w.framework == "torch" and w.precision in ("bf16-mixed", "fp16-mixed") and plan.zero < 3


@dataclass(frozen=True)
class Job:
    """What every stage of one (workload, plan) shares: byte widths, sharding divisors, per-token sizes."""

    w: Workload
    plan: ParallelPlan
    pc: ParamCounts
    scale: float  # exact / analytic parameters (a traced factory), else 1
    wb: float  # bytes per weight
    gb: float  # bytes per gradient
    sb: float  # optimizer-state bytes per trainable parameter
    mb_: float  # master-weight bytes per trainable parameter
    sdt: float  # bytes per optimizer-state element
    tokens: int  # tokens per micro-batch on this rank (seq / cp; an encoder-decoder model's decoder tokens)
    opt_div: int  # ranks the optimizer states are sharded over (ZeRO >= 1)
    grad_div: int  # ... the gradients (ZeRO >= 2)
    weight_div: int  # ... the weights (ZeRO 3)
    amp: bool  # torch autocast (marp.memory_job.autocast)
    per_layer_act: float  # bytes saved per token by one block
    r: float  # bytes per residual-stream element
    rep: int  # tensors outside TP regions are split only with sequence parallelism
    mixed_ds: bool  # DeepSpeed mixed precision
    e_act: float  # bytes per activation element
    # the search's memo of terms shared between its estimates (marp/memory_memo.py); None: compute every term
    memo: TermMemo | None = field(default=None, compare=False, repr=False)

    @property
    def vtp(self) -> int:
        """TP degree of the embedding, output layer and logits (vocab-parallel, else replicated)."""
        return self.plan.tp if self.w.comm.vocab_parallel else 1


def _workload_terms(w: Workload) -> tuple[ParamCounts, float, tuple[float, float, float, float, float]]:
    """(parameter counts, exact / analytic parameter scale, `param_bytes`) of `w`: what no plan changes."""
    a = w.arch
    pc = count_params(a)
    return pc, (w.exact_params / pc.total(a.layers)) if w.exact_params else 1.0, param_bytes(w)


def job(w: Workload, plan: ParallelPlan, memo: TermMemo | None = None) -> Job:
    """The `Job` of `w` under `plan`: bytes by precision and framework, divisors by ZeRO stage and shard group.

    With `memo` (the candidate search's, for `w`), what depends on the workload alone and a block's saved bytes
    per token (keyed by the arguments of `layer_activation_bytes`) are looked up there."""
    if memo is not None and memo.workload is not w and memo.workload != w:
        raise ValueError("a TermMemo holds the terms of one workload; this is another")
    terms = _workload_terms(w) if memo is None else memo.get("workload", (), lambda: _workload_terms(w))
    pc, scale, (wb, gb, sb, mb_, sdt) = terms
    cp = plan.cp
    # ZeRO/FSDP shard over the data-parallel ranks (times cp: context-parallel ranks hold the same weights), or
    # over one shard group of HSDP/MiCS, replicated across groups
    shard = plan.shard_group or plan.dp * cp
    amp = autocast(w, plan)
    if w.framework == "deepspeed" and plan.zero >= 1:
        mb_ = 4.0  # the ZeRO optimizer keeps its own fp32 partition of the weights, in fp32 training too
    act_args = (plan.tp, plan.sequence_parallel, plan.recompute, amp, cp)
    per_layer_act = (
        layer_activation_bytes(w, *act_args)
        if memo is None
        else memo.get("activations", act_args, lambda: layer_activation_bytes(w, *act_args))
    )
    return Job(
        w=w,
        plan=plan,
        pc=pc,
        scale=scale,
        wb=wb,
        gb=gb,
        sb=sb,
        mb_=mb_,
        sdt=sdt,
        # context parallelism: each rank holds seq/cp of every sequence; an encoder-decoder model's output layer and
        # loss run over its target (the encoder's tokens: memory_encdec)
        tokens=plan.micro_batch * w.decoder_len // cp,
        opt_div=shard if plan.zero >= 1 else 1,
        grad_div=shard if plan.zero >= 2 else 1,
        weight_div=shard if plan.zero >= 3 else 1,
        amp=amp,
        per_layer_act=per_layer_act,
        r=4.0 if (amp or w.precision == "fp32") else 2.0,
        rep=plan.tp if plan.sequence_parallel else 1,
        mixed_ds=w.framework == "deepspeed" and w.precision in ("bf16-mixed", "fp16-mixed"),
        e_act=4.0 if w.precision == "fp32" else 2.0,
        memo=memo,
    )
