"""Per-rank peak training memory for one workload under one parallel plan.

The peak is the largest of three moments of a training step, each the sum of
what is alive then (docs/marp.md derives every term):

- ``backward-start``: weights, optimizer states, persistent gradients, every
  saved activation of the micro-batches in flight, and the logits/loss tensors;
- ``backward-end``: all local gradients exist, activations are gone;
- ``optimizer-step``: gradients, states and the optimizer's temporaries.

The breakdown reported is the one of the peak moment, so its parts add up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

from frenzy_slurm.marp import allocator
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.params import ParamCounts, count_params, lora_head_params, lora_params_per_layer
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Recompute, Workload
from frenzy_slurm.units import GiB

QLORA_BYTES_PER_PARAM = 4.127 / 8  # NF4 with double-quantised absmax (QLoRA paper, section 3)
NF4_PLAIN_BYTES_PER_PARAM = 4.5 / 8  # NF4 with an fp32 absmax per 64-element block (no double quantisation)

COMPONENTS = ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead")


@dataclass(frozen=True)
class StageMemory:
    """Bytes per rank of one pipeline stage at its peak moment."""

    stage: int
    layers: int
    params: int  # parameters this rank holds before ZeRO sharding (after TP)
    weights: float
    gradients: float
    optimizer: float  # optimizer states, including fp32 master weights
    activations: float
    logits: float  # output-layer logits and cross-entropy tensors
    buffers: float  # DeepSpeed/FSDP communication buckets, gathered ZeRO-3 params, optimizer temporaries
    overhead: float  # CUDA context, workspaces, allocator fragmentation (by metric)
    phase: str

    @cached_property
    def peak(self) -> float:
        return (
            self.weights
            + self.gradients
            + self.optimizer
            + self.activations
            + self.logits
            + self.buffers
            + self.overhead
        )

    def gib(self) -> dict[str, float]:
        return {c: getattr(self, c) / GiB for c in COMPONENTS} | {"peak": self.peak / GiB}


@dataclass(frozen=True)
class MemoryEstimate:
    plan: ParallelPlan
    metric: Metric
    stages: tuple[StageMemory, ...]

    @cached_property
    def peak(self) -> float:
        """The largest per-rank peak over stages: what every GPU of the allocation must hold."""
        return max(s.peak for s in self.stages)

    @property
    def peak_gib(self) -> float:
        return self.peak / GiB


def _bytes(w: Workload) -> tuple[float, float, float, float, float]:
    """(weight, grad, optimizer-state, master-weight, state dtype) bytes per trainable parameter.

    torch FSDP mixed precision has the same bytes as autocast: fp32 sharded parameters (they are the master),
    fp32 sharded gradients (reduce_dtype), fp32 states; the 16-bit copies are the per-unit gathered buffers.
    Megatron keeps 16-bit weights, an fp32 `main_grad` buffer and an fp32 master inside its optimizer.
    """
    mixed = w.precision in ("bf16-mixed", "fp16-mixed")
    if w.precision == "fp32":
        wb, gb, sdt = 4.0, 4.0, 4.0
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
    }[w.optimizer]
    return wb, gb, states, master, sdt


def _nf4_bytes(w: Workload) -> float:
    """Bytes per quantised weight of a QLoRA base: NF4 with double-quantised or plain fp32 absmax."""
    return QLORA_BYTES_PER_PARAM if w.nf4_double_quant else NF4_PLAIN_BYTES_PER_PARAM


def _autocast(w: Workload, plan: ParallelPlan) -> bool:
    """torch mixed precision by autocast (fp32 residual stream, 16-bit matmuls); FSDP's mixed-precision policy
    (ZeRO-3 under torch) instead runs the whole block in 16-bit on the gathered 16-bit weights."""
    return w.framework == "torch" and w.precision in ("bf16-mixed", "fp16-mixed") and plan.zero < 3


@lru_cache(maxsize=4096)  # bounded: a long simulation sees many workloads
def _layer_activation_bytes(
    w: Workload, tp: int, sp: bool, recompute: Recompute, amp: bool = False, cp: int = 1, frozen_input: bool = False
) -> float:
    """Bytes saved for backward by one transformer block, per token (Korthikanti et al. 2022, generalised).

    With context parallelism each rank holds seq/cp tokens and attends over the whole sequence in blocks
    (ring attention): per token the saved tensors are the same, the eager score matrix is s/cp wide.
    `frozen_input`: the block's input needs no gradient (the first block behind LoRA's frozen embedding), so what
    runs on it before the first trainable weight (the first norm, the adapters' dropout) saves nothing."""
    a = w.arch
    h, f, heads, s = a.hidden, a.ffn, a.heads, w.seq_len // cp
    kvd = a.kv * a.head_dim
    e = 4.0 if w.precision == "fp32" else 2.0  # matmul outputs / inputs
    li = 1.0 if w.fp8 else e  # float8 linears save their inputs as fp8 casts
    r = 4.0 if amp else e  # residual stream and norm inputs (fp32 under autocast)
    rep = tp if sp else 1  # tensors outside TP regions are split only with sequence parallelism
    # a column-parallel linear's saved input: sharded under SP (Megatron gathers it again in backward), or the
    # gathered whole where the all-gather is an op of its own (DTensor TP)
    rep_in = 1 if w.tp_saves_gathered_inputs else rep
    drop = a.dropout > 0
    lora = w.method != "full"
    adapters = set(w.lora_targets) if lora else set()
    # Linear layers whose input is saved: trainable ones; under QLoRA all of them, since bitsandbytes'
    # 4-bit matmul saves its input whenever the input needs a gradient, frozen weight or not.
    tg = (
        adapters
        if (w.method == "lora" or (w.method == "qlora" and not w.nf4_saves_inputs))
        else {"q", "k", "v", "o", "mlp"}
    )
    # dropout masks: torch's fused CUDA kernel keeps a bool mask; on the CPU dropout multiplies by a mask tensor of the
    # input's dtype (measured on the CPU grid)
    mask = e if w.dropout_mask_full_width else 1.0
    # Under LoRA the frozen base linears keep no input (their weight needs no gradient: bitsandbytes' 4-bit matmul is
    # the exception, `base_saves`); each adapter's lora_A keeps what it reads: the input it shares with the others,
    # once, or with adapter dropout its own dropped copy (PEFT, torchtune and litgpt give every adapted linear its own
    # dropout; litgpt's fused q/k/v one) and its mask; lora_B keeps lora_A's r-wide output.
    dropped = lora and w.lora_dropout
    base_saves = not lora or (w.method == "qlora" and w.nf4_saves_inputs)
    keep_mask = 0.0 if frozen_input else mask

    def adapter_inputs(n: int, shared: bool) -> float:
        """Bytes per input element that `n` adapters reading one input keep, beside the base's `shared` copy."""
        if not n:
            return 0.0
        return n * (e + keep_mask) if dropped else (0.0 if shared else li)

    # A norm keeps its input; an eager fp32-upcast norm keeps the fp32 copy and the normalised 16-bit value instead.
    # (A composite norm - CPU kernels, or an eager fp32 upcast - also keeps its normalised output for the weight's
    # gradient: fp32 copy and normalised value; a fused kernel keeps only its input and per-row statistics.)
    # (the normalised output is kept for the norm weight's gradient only: not under LoRA, where norms are frozen)
    normalised = 4.0 if w.norm_fp32_normalized else e
    norm = (
        (
            (4.0 if w.norm_upcast and not w.compile else r)
            + (normalised if (w.norm_upcast and not w.compile and not lora) else 0.0)
        )
        * h
        / rep
    )
    total = 0.0 if frozen_input else norm  # norm1 (a frozen block input: nothing to differentiate)
    # Under autocast each linear casts its fp32 input to 16 bits on its own (autocast caches only the casts of leaf
    # tensors, the weights), so separate q/k/v projections save one copy each; a fused projection saves one.
    casts_qkv = len(tg & {"q", "k", "v"}) if (amp and not w.fused_projections) else 1
    if not lora and tg & {"q", "k", "v"}:
        total += casts_qkv * li * h / rep_in  # QKV input (norm1 output)
    elif lora:
        n_qkv = len(adapters & {"q", "k", "v"})
        shared = base_saves and not frozen_input  # (bitsandbytes saves its input only if that needs a gradient)
        n_qkv = min(n_qkv, 1) if w.fused_projections else n_qkv  # (one adapter on a fused q/k/v linear)
        total += ((li if shared else 0.0) + adapter_inputs(n_qkv, shared)) * h / rep
    total += e * (h + 2 * (h if w.gqa_expand else kvd)) / tp  # q, k, v (k, v at full width if expanded)
    if w.attention == "eager":
        if recompute != "selective":
            soft = 4.0 if amp else e  # softmax runs in fp32 under autocast
            if w.softmax_fp32 and not amp and e == 2.0:
                soft = 4.0 + e  # softmax(..., dtype=float32).to(dtype): the fp32 output and its 16-bit copy
            total += heads * s * (soft + ((mask + e) if drop else 0)) / tp
        total += li * h / tp  # context (o_proj input)
    else:
        total += e * h / tp + 4.0 * heads / tp  # kernel output (also o_proj input) + log-sum-exp
        if w.fp8:
            total += li * h / tp  # o_proj's fp8 copy of its input
        elif w.unfused_rope and a.position == "rope" and "o" in tg:  # (a frozen o_proj keeps no input)
            # rotated q/k are new head-major tensors, so the kernel's output is head-major too and the
            # transpose back to (tokens, hidden) copies it: o_proj saves that copy as well
            total += e * h / tp
    if dropped and "o" in adapters:
        total += (e + mask) * h / tp  # output_proj adapter's dropped copy and mask
    if drop:
        total += mask * h / rep  # residual dropout mask
    total += norm  # norm2
    if not lora and "mlp" in tg:
        # (SwiGLU's gate and up projections each cast the input under autocast, unless fused)
        casts_mlp = 2 if (amp and not w.fused_projections and a.activation == "swiglu") else 1
        total += casts_mlp * li * h / rep_in  # FFN input
    down_in = li if "mlp" in tg else 0.0  # the product / activation output, saved by the down projection
    if lora:
        n_in = (2 if a.activation == "swiglu" else 1) if "mlp" in adapters else 0  # gate and up / fc
        total += ((li if base_saves else 0.0) + adapter_inputs(n_in, base_saves)) * h / rep  # FFN input
        down_in = (li if base_saves else 0.0) + adapter_inputs(1 if "mlp" in adapters else 0, base_saves)
        mats = len(adapters & {"q", "k", "v", "o"}) + (n_in + 1 if n_in else 0)
        total += mats * e * w.lora_rank / tp  # lora_A's outputs, saved by lora_B
        if w.lora_qkv_scatter and w.fused_projections and 0 < len(adapters & {"q", "k", "v"}) < 3:
            # the adapted q/k/v outputs, scattered into the fused width by index_copy, which saves its source
            total += e * sum(h if t == "q" else kvd for t in adapters & {"q", "k", "v"}) / tp
    # torch.compile's partitioner (measured on the CPU with inductor, torch 2.13) keeps the matmul outputs and the
    # down projection's input and recomputes only silu(gate): 3 ffn-wide tensors for SwiGLU, 4 in eager; a GELU
    # MLP keeps the fc output and the GELU output (the down projection's input) either way
    if a.activation == "swiglu":
        # gate and up outputs and the product (down-proj input); eager also keeps silu(gate)
        total += (2 * e + (0.0 if w.compile else e) + down_in) * f / tp
    else:
        # the tanh GELU in eager ops (HF's NewGELUActivation) also keeps tanh's output, 0.5*x and 1+tanh for backward
        eager_gelu = 3 * e if (w.gelu_tanh_eager and not w.compile) else 0.0
        total += (e + down_in + eager_gelu) * f / tp
    if drop:
        total += mask * h / rep  # MLP dropout mask
    return total


def _op_checkpointed_bytes(w: Workload, tp: int, sp: bool, amp: bool) -> float:
    """Bytes one block keeps per token under torchtitan's per-op selective checkpointing (SelectiveAC, read in
    torchtitan 0.3's distributed/activation_checkpoint.py): the block's input (the checkpoint's), the attention
    kernel's output and log-sum-exp, and the output of every other matmul, counted per block across steps: with an
    odd number of matmuls per block (SwiGLU's 7) the saved set alternates between steps (q, v, gate, down / k, o,
    up), so the peak holds the larger."""
    a = w.arch
    h, f, kvd = a.hidden, a.ffn, a.kv * a.head_dim
    e = 4.0 if w.precision == "fp32" else 2.0
    r = 4.0 if amp else e
    rep = tp if sp else 1
    total = r * h / rep + e * h / tp + 4.0 * a.heads / tp  # block input, attention output, log-sum-exp
    # the linears in the order the block runs them: output bytes per token, and whether they carry a bias (a biased
    # linear runs as aten.addmm, which the policy always saves and does not count among the matmuls)
    qkv_bias, all_bias = a.bias in ("qkv", "all"), a.bias == "all"
    linears = [(e * h / tp, qkv_bias), (e * kvd / tp, qkv_bias), (e * kvd / tp, qkv_bias), (e * h, all_bias)]
    ffn = [e * f / tp, e * f / tp, e * h] if a.activation == "swiglu" else [e * f / tp, e * h]  # (gate,) up, down
    linears += [(b, all_bias) for b in ffn]
    total += sum(b for b, biased in linears if biased)
    mms = [b for b, biased in linears if not biased]
    odd = sum(mms[0::2])  # the 1st, 3rd, ... matmul of a step's block (the policy saves odd counts)
    even = sum(mms[1::2])
    return total + (max(odd, even) if len(mms) % 2 else odd)


def _logit_bytes_per_token(w: Workload, tp: int) -> float:
    """Output-layer logits and cross-entropy tensors alive at once, per token."""
    a = w.arch
    if a.head == "classification":
        return 0.0
    e = 4.0 if w.precision == "fp32" else 2.0
    v = a.vocab / (tp if w.vocab_parallel else 1)
    f32 = 4.0 if w.loss_fp32 else e
    out = 4.0 if w.output_fp32 else e  # the logits the loop holds: the model's, or the framework's fp32 copy
    if w.loss_chunks > 1:
        c = w.loss_chunks
        if w.compile and w.compile_loss:
            # the compiled per-chunk loss saves its 16-bit chunk (and a per-row log-sum-exp) and writes the chunk's
            # 16-bit gradient in one kernel (measured on the CPU: 2.26 bytes x vocab per token for 8 chunks)
            return v * e * (1.0 + 1.0 / c)
        # eager: the loss's forward ends with every 16-bit chunk still alive (the model's output list), every
        # chunk's fp32 log-softmax output saved and the last chunk's upcast (measured on the CPU: 6.5 bytes x vocab
        # per token for 8 chunks); its backward holds the saved outputs and one chunk's two fp32 gradients and
        # 16-bit gradient
        # (logits the framework hands back in fp32, `out`, need no upcast for the loss)
        upcast = f32 / c if out != f32 else 0.0
        return v * max(out + f32 + upcast, (out if w.hold_logits else 0.0) + f32 + (2 * f32 + out) / c)
    # fp32 log-softmax output (saved) and, in backward, the gradients at both ends of log_softmax (a compiled loss
    # fuses them into one kernel); plus the 16-bit logits where the loop keeps the model output alive. A 16-bit
    # loss (no upcast) keeps the same three tensors at 2 bytes.
    return v * ((out if w.hold_logits else 0.0) + (2 if (w.compile and w.compile_loss) else 3) * f32)


@dataclass(frozen=True)
class _Job:
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
    tokens: int  # tokens per micro-batch on this rank (seq / cp)
    opt_div: int
    grad_div: int
    weight_div: int
    amp: bool
    per_layer_act: float  # bytes saved per token by one block
    r: float  # bytes per residual-stream element
    rep: int  # tensors outside TP regions are split only with sequence parallelism
    mixed_ds: bool  # DeepSpeed mixed precision
    e_act: float  # bytes per activation element

    @property
    def vtp(self) -> int:
        """TP degree of the embedding, output layer and logits (vocab-parallel, else replicated)."""
        return self.plan.tp if self.w.vocab_parallel else 1


def _job(w: Workload, plan: ParallelPlan) -> _Job:
    a = w.arch
    pc = count_params(a)
    wb, gb, sb, mb_, sdt = _bytes(w)
    cp = plan.cp
    # ZeRO/FSDP shard over the data-parallel ranks (times cp: context-parallel ranks hold the same weights), or
    # over one shard group of HSDP/MiCS, replicated across groups
    shard = plan.shard_group or plan.dp * cp
    amp = _autocast(w, plan)
    if w.framework == "deepspeed" and plan.zero >= 1:
        mb_ = 4.0  # the ZeRO optimizer keeps its own fp32 partition of the weights, in fp32 training too
    return _Job(
        w=w,
        plan=plan,
        pc=pc,
        scale=(w.exact_params / pc.total(a.layers)) if w.exact_params else 1.0,
        wb=wb,
        gb=gb,
        sb=sb,
        mb_=mb_,
        sdt=sdt,
        tokens=plan.micro_batch * w.seq_len // cp,  # context parallelism: each rank holds seq/cp of every sequence
        opt_div=shard if plan.zero >= 1 else 1,
        grad_div=shard if plan.zero >= 2 else 1,
        weight_div=shard if plan.zero >= 3 else 1,
        amp=amp,
        per_layer_act=_layer_activation_bytes(w, plan.tp, plan.sequence_parallel, plan.recompute, amp, cp),
        r=4.0 if (amp or w.precision == "fp32") else 2.0,
        rep=plan.tp if plan.sequence_parallel else 1,
        mixed_ds=w.framework == "deepspeed" and w.precision in ("bf16-mixed", "fp16-mixed"),
        e_act=4.0 if w.precision == "fp32" else 2.0,
    )


@dataclass(frozen=True)
class _States:
    """Model states of one stage's rank: what the parameters, their gradients and the optimizer hold."""

    params: int
    linear: float  # parameters in the blocks' linear layers
    trainable: float
    weights: float
    grads_all: float  # every local gradient, once backward has produced them all
    optimizer: float
    largest: float  # the largest matrix (per-tensor temporaries)
    head_grads: float  # the output layer's gradient (the first produced by backward)


def _model_states(j: _Job, i: int, n_layers: int) -> _States:
    """Weights, gradients and optimizer states by precision and ZeRO/FSDP stage (DeepSpeed keeps 16-bit weights
    with an fp32 master in its optimizer; torch autocast/FSDP keep fp32 parameters and gradients; Megatron an fp32
    main_grad); LoRA trains adapters over frozen 16-bit (QLoRA: NF4) weights; offload moves states to the host."""
    w, plan, a, pc = j.w, j.plan, j.w.arch, j.pc
    tp, pp = plan.tp, plan.pp
    first, last = i == 0, i == pp - 1
    lora = w.method != "full"
    params = pc.per_layer * n_layers / tp
    # Megatron splits the embedding and the output layer over tp (vocab-parallel); a replicated head holds them whole
    if first:
        params += pc.embedding / j.vtp
    if last:
        # a tied head on another stage than the embedding is its own copy of the token embedding
        tied_copy = a.vocab * a.hidden if (pp > 1 and a.tied_embeddings and a.head != "classification") else 0
        params += (pc.final + pc.head + tied_copy) / j.vtp
    params = int(params * j.scale)
    linear = pc.linear_per_layer * n_layers * j.scale / tp
    if lora:
        trainable = (
            lora_params_per_layer(a, w.lora_rank, w.lora_targets) * n_layers
            + (lora_head_params(a, w.lora_rank, w.lora_targets) if last else 0)
        ) / tp
        base_bytes = 4.0 if w.precision == "fp32" else 2.0
        if w.method == "qlora":
            # (litgpt's plugin quantises every nn.Linear, the untied output layer too)
            q_head = a.vocab * a.hidden * j.scale / j.vtp if (last and w.qlora_quantized_head and pc.head) else 0.0
            frozen = (linear + q_head) * _nf4_bytes(w) + (params - linear - q_head) * base_bytes
        else:
            frozen = params * base_bytes
        weights = frozen / j.weight_div + trainable * j.wb
        if first and w.method == "qlora" and w.bnb_stable_embedding:
            weights += a.vocab * a.hidden * j.scale / j.vtp * base_bytes  # the swapped-out embedding, still referenced
    else:
        trainable = float(params)
        weights = params * j.wb / j.weight_div
    if plan.offload_params:
        weights = 0.0
    optimizer = 0.0 if (plan.offload_optimizer or w.paged_optimizer) else trainable * (j.sb + j.mb_) / j.opt_div
    if j.mixed_ds and plan.zero == 0:
        optimizer += trainable * 4.0  # BF16/FP16 optimizer's fp32 gradient accumulation buffer
    head_grads = (
        (a.vocab * a.hidden * j.scale / j.vtp) * j.gb / j.grad_div
        if (last and not lora and a.head != "classification")
        else 0.0
    )
    return _States(
        params=params,
        linear=linear,
        trainable=trainable,
        weights=weights,
        # (stepped in backward, one parameter at a time: no full set of gradients is ever held)
        grads_all=0.0 if w.optimizer_in_backward else trainable * j.gb / j.grad_div,
        optimizer=optimizer,
        largest=pc.largest_matrix * j.scale / tp,
        head_grads=head_grads,
    )


def _gradients_persist(j: _Job, i: int) -> bool:
    """Whether gradients are alive through the forward pass: with accumulation (a pipeline stage peaks at its
    first backward with the most micro-batches in flight; its gradients exist then only if a forward follows a
    backward at that depth, grad_accum > pp - stage), when zero_grad keeps zeroed buffers (torch < 2.0), or in
    Megatron (its main_grad buffer is allocated once and kept). DeepSpeed and torch free .grad after the step."""
    w, plan = j.w, j.plan
    accumulating = plan.grad_accum > (plan.pp - i if plan.pp > 1 else 1)
    return accumulating or not w.zero_grad_to_none or w.framework == "megatron"


@dataclass
class _Buffers:
    """What is not a model state nor an activation: communication buckets, gathered ZeRO-3/FSDP parameters,
    dequantised and cast weights, pipeline buffers."""

    fb: float = 0.0  # alive from forward through backward
    unit_grads: float = 0.0  # one FSDP/ZeRO-3 unit's unsharded gradients (from a block's backward on)
    resident: float = 0.0  # allocated once and kept (ZeRO-3's gradient partition and reduce bucket)
    bucket: float = 0.0  # gradient reduction buckets (allocated when backward starts)
    flat: float = 0.0  # DeepSpeed ZeRO-0's flattened gradients (after backward)
    keeps_grads: bool = False  # the buffers keep every gradient alive (ZeRO-3's optimizer)
    released_at_loss: float = 0.0  # part of `fb` not gathered while the loss runs (FSDP2 resharded the blocks)


def _zero3_gathered(j: _Job, i: int, n_layers: int, st: _States) -> tuple[float, float]:
    """(gathered parameter bytes, one unit's unsharded gradient bytes) under ZeRO-3 / FSDP full sharding.

    Two units gathered at a time (the running one and the prefetched one); DeepSpeed adds its prefetch bucket
    (bounded by stage3_max_live_parameters) and keeps gathered whatever is used again within
    stage3_max_reuse_distance elements (the output layer and the last blocks; a small model whole); FSDP with
    reshard_after_forward=False keeps the stage's gathered weights from forward until backward."""
    w, a, pc, plan = j.w, j.w.arch, j.pc, j.plan
    tp = plan.tp
    first, last = i == 0, i == plan.pp - 1
    layer_params = pc.per_layer * j.scale / tp
    # QLoRA gathers its blocks in NF4 (torchao's NF4 tensor and bitsandbytes' 4-bit params all-gather their
    # quantised storage): as 16-bit-equivalent elements, a block is far smaller than its parameter count
    layer_gathered = layer_params
    if w.method == "qlora":
        lin = pc.linear_per_layer * j.scale / tp
        layer_gathered = (lin * _nf4_bytes(w) + (layer_params - lin) * 2.0) / 2.0
    gathered = 2 * max(layer_gathered, st.largest)
    bk = w.buckets
    if w.framework == "deepspeed":
        gathered = min(gathered + bk.stage3_prefetch_bucket_size, bk.stage3_max_live_parameters)
        # DeepSpeed releases a module's gathered parameters after its forward only if their next use lies more than
        # stage3_max_reuse_distance parameter elements further along the trace: the output layer (used again at once
        # by backward) and the last blocks, whose forward and backward uses are separated by 2 x the parameters after
        # them, stay gathered until their backward
        head_el = (
            ((pc.final + (pc.head or (a.vocab * a.hidden if a.head != "classification" else 0))) * j.scale / j.vtp)
            if last
            else 0.0
        )
        blocks_el = layer_gathered * n_layers
        reuse = bk.stage3_max_reuse_distance
        kept = head_el + min(blocks_el, max(0.0, reuse / 2 - head_el))
        if first and 2 * (blocks_el + head_el) < reuse:  # a model this small stays gathered whole
            tied_head = last and a.tied_embeddings and a.head != "classification"  # (counted as the head)
            kept += (pc.embedding - (a.vocab * a.hidden if tied_head else 0)) * j.scale / j.vtp
        gathered = max(gathered, kept)
    if not w.reshard_after_forward:  # FSDP reshard_after_forward=False / ZeRO++-style: the stage's
        gathered = max(gathered, st.params)  # gathered weights stay from forward until backward
    # one unit's unsharded gradients before reduce-scatter: only its trainable (adapter) ones under LoRA
    unit_trainable = (
        (lora_params_per_layer(a, w.lora_rank, w.lora_targets) / tp) if w.method != "full" else layer_params
    )
    return gathered * (2.0 if w.precision != "fp32" else 4.0), unit_trainable * j.gb


def _buffers(j: _Job, i: int, n_layers: int, st: _States) -> _Buffers:
    """Communication and conversion buffers by framework: ZeRO-3/FSDP gathers, DeepSpeed's reduce bucket and
    flattened gradients, DDP's gradient buckets, QLoRA's dequantised weight, autocast's and fp8's weight casts,
    ring attention's K/V blocks."""
    w, a, pc, plan = j.w, j.w.arch, j.pc, j.plan
    tp, dp, cp = plan.tp, plan.dp, plan.cp
    last = i == plan.pp - 1
    bk = w.buckets
    b = _Buffers()
    if plan.zero == 3:
        gathered, b.unit_grads = _zero3_gathered(j, i, n_layers, st)
        b.fb += gathered
        if w.framework == "torch" and w.fsdp_tail_unit and w.reshard_after_forward:
            # FSDP2 with the output layer in a tail unit (accelerate): while the loss runs every block is resharded
            # and only the tail (final norm, output layer) is gathered; a block's backward peaks in its MLP, when
            # the output projection's gradient is the only unsharded gradient it has made (CPU grid:
            # hf-trainer-fsdp2-*; the tail is resharded after its own backward)
            tail = ((pc.final + (pc.head or a.vocab * a.hidden)) * j.scale / j.vtp) if last else 0.0
            b.released_at_loss = max(0.0, gathered - tail * (2.0 if w.precision != "fp32" else 4.0))
            b.unit_grads = min(b.unit_grads, pc.largest_linear * j.scale / tp * j.gb)
        elif w.framework == "torch" and w.reshard_after_forward and plan.pp == 1:
            # FSDP2 with the output layer in the root unit (fully_shard on every block, then on the model): the root is
            # never resharded after forward, so while the loss runs only it (embedding, final norm, output layer) is
            # gathered; every block was resharded after its forward
            root = (pc.embedding + pc.final + (pc.head or 0)) * j.scale / j.vtp
            b.released_at_loss = max(0.0, gathered - root * (2.0 if w.precision != "fp32" else 4.0))
    if i == 0 and w.method == "qlora" and w.bnb_stable_embedding:
        # bitsandbytes' StableEmbedding trains outside the optimizer: its gradient, made by the first backward, is
        # never zeroed nor freed
        b.resident += a.vocab * a.hidden * j.scale / j.vtp * j.gb
    if w.framework == "deepspeed" and plan.zero == 3 and st.trainable > 0:
        # ZeRO-3's optimizer allocates once and keeps: the gradient partition of every parameter (in the
        # gradient-accumulation dtype, the model's) and, with contiguous gradients, the reduce bucket
        b.resident = bk.reduce_bucket_size * j.gb
        b.keeps_grads = not w.optimizer_in_backward
    if w.framework == "deepspeed" and plan.zero in (1, 2) and dp > 1 and st.trainable > 0:
        # contiguous_gradients: ZeRO-1/2 allocate the whole reduce bucket, whatever the model's size
        # (ZeRO-1 under mixed precision stages its fp32 gradient accumulator in the bucket)
        b.bucket += (
            bk.reduce_bucket_size * (4.0 if j.mixed_ds and plan.zero == 1 else j.gb) * (2 if bk.overlap_comm else 1)
        )
    if w.framework == "deepspeed" and plan.zero == 0 and st.trainable > 0:
        b.flat = st.trainable * j.gb  # DeepSpeed flattens all gradients for the all-reduce after backward (even on 1)
    if w.framework == "torch" and dp > 1 and plan.zero == 0 and st.trainable > 0:
        b.fb += st.trainable * j.gb  # DDP's gradient buckets: a second copy of the gradients, kept for the run
    if w.method == "qlora":
        # the 4-bit matmul dequantises one linear weight to 16 bits at a time (forward, and again in backward);
        # the embedding, and the output layer unless it is quantised too, stay 16-bit and are never dequantised
        deq = pc.largest_linear * j.scale / tp
        if last and w.qlora_quantized_head and pc.head:
            deq = max(deq, a.vocab * a.hidden * j.scale / j.vtp)
        # torchao's NF4Tensor.get_original_weight runs in eager ops: each element's 4-bit code as an int64 index
        # (8 bytes for a pair), the looked-up and scaled halves and their stack (2 bytes each per element), alive
        # together (measured on the CPU grid: torchtune-qlora-*); compiled, one kernel writes the 16-bit weight
        eager_nf4 = w.nf4_torchao and not w.compile
        b.fb += deq * (12.0 if eager_nf4 else 2.0)
    if j.amp and w.method == "full":
        b.fb += st.linear * 2.0  # autocast's 16-bit weight copies, saved for backward (not under FSDP)
    if w.fp8:
        b.fb += (st.linear / j.weight_div) * 1.0 + st.largest * 1.0  # fp8 weight casts (+ one being made)
    if cp > 1:
        # ring attention: the K/V block being received and the one being sent (double buffer), 16-bit
        kvd = a.kv * a.head_dim / tp
        b.fb += 2 * 2 * kvd * j.tokens * (4.0 if w.precision == "fp32" else 2.0)
    return b


def _step_buffers(j: _Job, st: _States) -> float:
    """The optimizer step's temporaries: torch's foreach Adam makes a state-sized sqrt(v) temporary, a fused or
    per-tensor step one tensor's; DeepSpeed's mixed-precision ZeRO hands the optimizer an fp32 gradient partition
    and all-gathers the updated weights through its bucket."""
    w, plan = j.w, j.plan
    out = 0.0
    if w.optimizer_in_backward or plan.offload_optimizer:
        return out
    local_states = st.trainable / j.opt_div
    if j.mixed_ds and plan.zero >= 1:
        out += local_states * 4.0  # fp32 gradient partition handed to the optimizer
    if w.optimizer in ("adam", "adamw") and not w.fused_optimizer:
        out += local_states * j.sdt  # foreach Adam: sqrt(v) temporary
    else:
        out += min(st.largest, local_states) * j.sdt
    if w.framework == "deepspeed" and plan.zero in (1, 2) and plan.dp > 1:
        out += min(w.buckets.allgather_bucket_size, st.params) * j.wb
    return out


def _in_flight(plan: ParallelPlan, i: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak: 1F1B keeps pp - stage of them, GPipe
    all, interleaved 1F1B with v model chunks per rank (pp - stage - 1) * 2 + (v - 1) * pp + 1 chunk-micro-batches
    in warm-up (Megatron's schedule), each 1/v of the stage's layers."""
    ga = max(plan.grad_accum, 1)
    if plan.pp == 1:
        return 1.0
    if plan.schedule == "gpipe":
        return float(ga)
    if plan.schedule == "interleaved" and plan.virtual_stages > 1:
        v = plan.virtual_stages
        return min(ga * v, (plan.pp - i - 1) * 2 + (v - 1) * plan.pp + 1) / v
    return float(min(plan.pp - i, ga))


def _activations(j: _Job, i: int, n_layers: int, inflight: float) -> tuple[float, float, float]:
    """(saved activations, the block recomputed in backward, one block's backward working set), per the
    checkpointing policy: full recomputation keeps each checkpointed block's input (recompute_layers < all: the
    rest keep everything), activation offload about two blocks' tensors in transfer; eager attention's backward
    holds score-sized gradients."""
    w, a, plan = j.w, j.w.arch, j.plan
    tp, cp, tokens = plan.tp, plan.cp, j.tokens
    per_layer_act = j.per_layer_act
    layer_input = j.r * a.hidden / j.rep
    recomputed = 0.0
    if plan.recompute == "op":
        kept_per_token = _op_checkpointed_bytes(w, tp, plan.sequence_parallel, j.amp)
        acts = n_layers * kept_per_token * tokens * inflight
        # a block's backward: what its recomputation adds to the outputs it saved (those are reused, not made again)
        recomputed = max(0.0, per_layer_act - kept_per_token) * tokens
    elif plan.recompute == "full":
        ck = n_layers if plan.recompute_layers is None else min(plan.recompute_layers, n_layers)
        kept = (ck * layer_input + (n_layers - ck) * per_layer_act) * tokens * inflight
        if w.activation_offload:  # offloaded to host memory, with about two blocks' tensors in transfer
            kept = min(2, n_layers) * layer_input * tokens
        acts = kept
        recomputed = per_layer_act * tokens  # one block recomputed during its backward (not while the loss runs)
    elif w.activation_offload:
        acts = min(2, n_layers) * per_layer_act * tokens
    else:
        acts = n_layers * per_layer_act * tokens * inflight
        stable_embedding = w.method == "qlora" and w.bnb_stable_embedding
        if i == 0 and w.method != "full" and n_layers and not stable_embedding:
            # the first block's input comes from LoRA's frozen embedding and needs no gradient
            first = _layer_activation_bytes(w, tp, plan.sequence_parallel, plan.recompute, j.amp, cp, frozen_input=True)
            acts -= (per_layer_act - first) * tokens * inflight
        if i == 0 and stable_embedding:
            acts += 4.0 * a.hidden / j.rep * tokens * inflight  # StableEmbedding's fp32 LayerNorm input
    work = 2 * max(a.ffn, a.hidden) * j.e_act * tokens / tp  # gradient working set of one block's backward
    if w.attention == "eager":
        # eager attention's backward holds two score-sized gradients (probs', scores') beside the saved
        # probabilities; selective recomputation rebuilds those probabilities first (one more)
        units = 3 if plan.recompute == "selective" else 2
        # (under autocast the softmax and its backward run in fp32, as its saved output is)
        score = 4.0 if j.amp else j.e_act
        work = max(work, units * a.heads * (w.seq_len // cp) * score * tokens / tp)
    if i == 0 and a.dropout > 0:
        acts += tokens  # embedding dropout mask (the embedding's output is the first block's saved input)
    if w.unfused_rope and a.position == "rope" and w.rope_tables_per_layer:
        acts += n_layers * inflight * 2 * w.seq_len * a.head_dim * j.e_act  # cos/sin of q and k, built per block
    return acts, recomputed, work


def _pipeline_buffers(j: _Job, i: int, inflight: float) -> float:
    """DeepSpeed's PipelineEngine keeps each micro-batch's stage output (the logits, on the last stage) in its pipe
    buffers, max(2, in-flight) of them, until the buffer is reused; and one more hidden-sized tensor per micro-batch
    in flight (the p2p copy of what is sent/received), plus its persistent receive buffers: activations (all but the
    first stage) and gradients (all but the last)."""
    w, a, plan = j.w, j.w.arch, j.plan
    if not (w.framework == "deepspeed" and plan.pp > 1):
        return 0.0
    first, last = i == 0, i == plan.pp - 1
    nbuf = max(2, min(plan.pp - i, max(plan.grad_accum, 1)))
    out = (a.vocab / plan.tp if (last and a.head != "classification") else a.hidden) * j.e_act * j.tokens
    return nbuf * out + (inflight + (not first) + (not last)) * a.hidden * j.e_act * j.tokens


def _fused_linear_loss_bytes(j: _Job, head_grads: float) -> tuple[float, float]:
    """(tensors, gradients) Liger's fused linear cross-entropy holds on the last stage, from its forward to the
    backward (liger_kernel/ops/fused_linear_cross_entropy.py): the hidden states' gradient (`grad_input`, the
    input's size and dtype) and the output layer's weight gradient (`grad_weight`, made in the forward) are kept
    for backward; one chunk of 16-bit logits exists at a time, its gradient written in place by the cross-entropy
    kernel. The chunk has next_power_of_2(ceil(tokens / ceil(vocab / hidden))) rows, so about as many elements
    as the hidden states (up to twice). No logits leave the function."""
    a, tokens = j.w.arch, j.tokens
    v = a.vocab / j.vtp
    rows = 1 << max(0, math.ceil(math.log2(max(1.0, math.ceil(tokens / math.ceil(v / a.hidden))))))
    chunk = min(rows, tokens) * v * j.e_act
    grad_input = a.hidden * j.e_act * tokens
    return chunk + grad_input, head_grads


def _loss_forward_bytes(j: _Job) -> float:
    """What the loss's forward holds at once on the last stage: the 16-bit logits, their fp32 upcast (none when
    they are fp32 already) and the log-softmax output (chunked: one chunk's upcast)."""
    w, a = j.w, j.w.arch
    if a.head == "classification":
        return 0.0
    if w.fused_linear_loss:
        return sum(_fused_linear_loss_bytes(j, 0.0))
    v = a.vocab / j.vtp
    f32 = 4.0 if w.loss_fp32 else j.e_act
    upcast = f32 if f32 != j.e_act else 0.0
    if w.loss_chunks > 1:
        return v * (j.e_act + f32 + upcast / w.loss_chunks) * j.tokens
    return v * (j.e_act + upcast + f32) * j.tokens


def _logits_and_loss(j: _Job, st: _States, persistent: bool) -> tuple[float, float, float]:
    """(logits and loss tensors, gradients the loss phase adds, the final norm's and head's saved inputs) on the
    last stage. A chunked output layer's backward sums the chunks' weight gradients in one buffer (the sum and the
    contribution being added) while the chunks' 16-bit logit gradients wait (measured on the CPU: + 2 x the head's
    gradient over the compiled loss's peak)."""
    w, a = j.w, j.w.arch
    tokens = j.tokens
    fused = w.fused_linear_loss and a.head != "classification"
    if fused:  # no logits and no saved head input (the final norm still keeps its own)
        logits, loss_grads = _fused_linear_loss_bytes(j, st.head_grads)
    else:
        logits, loss_grads = _logit_bytes_per_token(w, j.plan.tp) * tokens, 0.0
    if w.loss_chunks > 1 and st.head_grads > 0 and not fused:
        v_local = a.vocab / j.vtp
        k = 1.0 if persistent else 2.0
        chunk_phase = v_local * j.e_act * (1.0 + 1.0 / w.loss_chunks) * tokens + k * st.head_grads
        if chunk_phase > logits:
            loss_grads = k * st.head_grads
            logits = chunk_phase - loss_grads
    if w.loss_detaches_hidden and a.head != "classification" and not fused:
        # the loop's detached copies of the hidden states and their fp32 gradient accumulator (the hidden states are
        # replicated over TP before chunking: whole on every rank)
        logits += (j.e_act + 4.0) * a.hidden * tokens
    # (under LoRA the final norm's weight is frozen, so its normalised value is not kept; a frozen output layer keeps
    # no input either, unless it is bitsandbytes' 4-bit one or carries an adapter)
    lora = w.method != "full"
    normalised = 0.0 if lora else (4.0 if w.norm_fp32_normalized else j.e_act)
    final_norm = (4.0 + normalised) if (w.norm_upcast and not w.compile) else j.r
    head_saves = not fused and (
        not lora
        or "head" in w.lora_targets
        or (w.method == "qlora" and w.nf4_saves_inputs and w.qlora_quantized_head and j.pc.head > 0)
    )
    head_in = a.hidden if w.tp_saves_gathered_inputs else a.hidden / j.plan.tp  # (DTensor TP: the replicated input)
    head_inputs = (final_norm * a.hidden / j.rep + (j.e_act * head_in if head_saves else 0.0)) * tokens
    return logits, loss_grads, head_inputs


def _previous_output(j: _Job, i: int, n_layers: int, inflight: float) -> tuple[float, float, float]:
    """(this step's 16-bit output, the previous step's output, what the previous graph's custom functions hold)
    where the loop keeps the previous step's output bound until the next forward returns (litgpt): at the end of
    that forward both outputs are alive, and with them what the old graph's custom functions stored outside its
    saved tensors (bitsandbytes' 4-bit matmul stored its input on ctx: q/k/v, o_proj, MLP and down inputs)."""
    w, a, pc, plan = j.w, j.w.arch, j.pc, j.plan
    last = i == plan.pp - 1
    out_bytes = 4.0 if w.output_fp32 else j.e_act  # (Lightning Fabric hands the output back in fp32)
    has_logits = last and a.head != "classification" and not w.fused_linear_loss  # (a fused loss returns none)
    out16 = out_bytes * a.vocab / j.vtp * j.tokens if has_logits else 0.0
    prev_logits = prev_inputs = 0.0
    if w.keeps_previous_output:
        prev_logits = out16
        if w.method == "qlora" and w.nf4_saves_inputs:
            prev_inputs = n_layers * inflight * j.e_act * (3 * a.hidden + a.ffn) / plan.tp * j.tokens
            if last and w.qlora_quantized_head and pc.head:
                prev_inputs += j.e_act * a.hidden / j.rep * j.tokens  # lm_head's input (the final norm's output)
    return out16, prev_logits, prev_inputs


def _allocator_overhead(
    j: _Job,
    i: int,
    n_layers: int,
    parts: dict[str, float],
    allocated: float,
    phase: str,
    persistent: bool,
    st: _States,
    resident: float,
    metric: Metric,
    overheads: Overheads,
) -> float:
    """What the metric adds to the allocated peak (docs/marp.md, "The caching allocator"): the caching allocator's
    reserved excess - its segment packing of the long-lived tensors at their per-tensor sizes (DeepSpeed and
    Megatron flatten them into a few buffers) and of the step's tensors, the measured excess beyond that
    (`overheads.fragmentation`; `step_fragmentation` unless expandable segments), the previous step's freed
    gradients that stay reserved beside the forward's activations - and for the device metric the CUDA context,
    NCCL buffers and cuBLAS workspaces (`Overheads.device_bytes`)."""
    if metric == "allocated":
        return 0.0
    if not j.w.caching_allocator:  # the CPU: nothing held beyond the tensors, no CUDA context or workspaces
        return overheads.device_bytes(j.plan.world) if metric == "device" else 0.0
    w, a, plan = j.w, j.w.arch, j.plan
    cfg = allocator.AllocatorConfig(expandable_segments=w.expandable_segments)
    grads = st.grads_all if persistent else 0.0
    long_lived = parts["weights"] + parts["optimizer"] + grads + resident
    flat = w.framework in ("deepspeed", "megatron")
    tensors: list[tuple[float, float]] = [(resident, 1.0)]
    if flat:
        tensors += [(parts["weights"], 1.0), (parts["optimizer"], 1.0), (grads, 1.0)]
    else:
        shapes = _parameter_shapes(a, n_layers, i == 0, i == plan.pp - 1, plan.tp, j.vtp)
        lora = w.method != "full"
        trained = allocator.adapter_shapes(a, n_layers, w.lora_rank, w.lora_targets, plan.tp) if lora else shapes
        states = 0 if j.sdt == 0 else round((j.sb + j.mb_) / j.sdt)  # state tensors per parameter (Adam: 2)
        base = (4.0 if w.precision == "fp32" else 2.0) if lora else j.wb  # (QLoRA's NF4 counts as fewer tensors)
        tensors += allocator.spread(parts["weights"], shapes, base) + allocator.spread(grads, trained, j.gb)
        tensors += allocator.spread(parts["optimizer"], trained, j.sdt or 4.0, max(states, 1))
    step = max(0.0, allocated - long_lived)
    if cfg.expandable_segments:
        tensors.append((step, 1.0))  # one segment per pool, grown in pages
    hidden_tensor = a.hidden * j.e_act * j.tokens / j.rep  # a hidden-wide tensor of the micro-batch
    overhead = allocator.reserved_excess(tensors, cfg) + allocator.step_excess(step, hidden_tensor, cfg)
    overhead += long_lived * overheads.fragmentation
    if not cfg.expandable_segments:
        overhead += step * overheads.step_fragmentation
    if phase == "backward-start" and not persistent and st.grads_all > st.head_grads:
        overhead += st.grads_all - parts["gradients"]
    if metric == "device":
        overhead += overheads.device_bytes(plan.world)
    return overhead


_parameter_shapes = lru_cache(maxsize=4096)(allocator.parameter_shapes)


def estimate_memory(
    w: Workload,
    plan: ParallelPlan,
    metric: Metric = "allocated",
    overheads: Overheads = Overheads(),
    peak_stages_only: bool = False,
) -> MemoryEstimate:
    """Per-stage peak bytes per rank: each term (model states, buffers, saved activations, logits and loss, the
    optimizer step's temporaries, the allocator's and the device's overheads) from its own function, summed at
    each moment of the step (the module docstring); the breakdown is that of the largest.

    `peak_stages_only` computes only the first and last pipeline stages. With the default split (earlier
    stages get the extra layers) every middle stage holds no more layers, no more in-flight micro-batches
    and no embedding, so one of those two is the peak; the candidate search uses this to stay fast.
    """
    j = _job(w, plan)
    pp = plan.pp
    stages = []
    for i, n_layers in enumerate(plan.stage_layers(w.arch.layers)):
        if peak_stages_only and plan.layer_split is None and 0 < i < pp - 1:
            continue
        st = _model_states(j, i, n_layers)
        persistent = _gradients_persist(j, i) and not w.optimizer_in_backward
        b = _buffers(j, i, n_layers, st)
        persistent = persistent or b.keeps_grads
        step_buffers = _step_buffers(j, st)
        inflight = _in_flight(plan, i)
        acts, recomputed, work = _activations(j, i, n_layers, inflight)
        fb_buffers = b.fb + _pipeline_buffers(j, i, inflight)
        logits = loss_grads = 0.0
        if i == pp - 1:
            logits, loss_grads, head_inputs = _logits_and_loss(j, st, persistent)
            acts += head_inputs
        out16, prev_logits, prev_inputs = _previous_output(j, i, n_layers, inflight)
        fwd_grads = 0.0
        if w.zero_grad_after_forward and not persistent and not w.optimizer_in_backward:
            # the end of the forward with the previous step's gradients still alive (zero_grad runs after it):
            # this step's output and the loss's forward tensors beside them
            fwd_grads = st.grads_all
            out16 = _loss_forward_bytes(j) if i == pp - 1 else 0.0
        phase, parts, allocated = _peak_moment(
            st, persistent, b, fb_buffers, step_buffers, acts, recomputed, work, logits, loss_grads,
            out16, prev_logits, prev_inputs, j.per_layer_act * j.tokens, fwd_grads,
        )  # fmt: skip
        overhead = _allocator_overhead(
            j, i, n_layers, parts, allocated, phase, persistent, st, b.resident, metric, overheads
        )
        stages.append(StageMemory(stage=i, layers=n_layers, params=st.params, overhead=overhead, phase=phase, **parts))
    return MemoryEstimate(plan=plan, metric=metric, stages=tuple(stages))


def _peak_moment(
    st: _States,
    persistent: bool,
    b: _Buffers,
    fb_buffers: float,
    step_buffers: float,
    acts: float,
    recomputed: float,
    work: float,
    logits: float,
    loss_grads: float,
    out16: float,
    prev_logits: float,
    prev_inputs: float,
    block_acts: float,
    fwd_grads: float = 0.0,
) -> tuple[str, dict[str, float], float]:
    """The largest of the step's moments (backward-start: the loss's backward, the last block's backward, or the
    end of a forward beside the previous step's output; backward-end; optimizer-step), its breakdown and bytes."""
    const = st.weights + st.optimizer + b.resident
    grads = st.grads_all if persistent else 0.0
    early = b.bucket
    # backward-start is the larger of two instants: the loss's backward (logits and their gradients alive) and the
    # last block's backward (logits freed, the head's gradients and the block's working set alive)
    start_loss = const + grads + loss_grads + acts + logits + fb_buffers - b.released_at_loss + early
    start_block = (
        const
        + (st.grads_all if persistent else st.head_grads)
        + acts
        + recomputed
        + work
        + fb_buffers
        + b.unit_grads
        + early
    )
    # (the end of the forward with the previous step's output still bound: this step's 16-bit output beside it)
    # (or with the previous step's gradients alive: `fwd_grads`, where zero_grad runs after the forward)
    start_fwd = 0.0
    if prev_logits or prev_inputs or fwd_grads:
        start_fwd = const + (grads or fwd_grads) + acts + prev_inputs + out16 + prev_logits + fb_buffers
    start = max(start_loss, start_block, start_fwd)
    # the first block's backward: every other gradient exists, its own saved tensors are still alive
    end_acts = work + block_acts
    end = const + st.grads_all + max(end_acts + b.bucket, b.flat) + fb_buffers + b.unit_grads
    step = const + st.grads_all + step_buffers
    common = dict(weights=st.weights, optimizer=st.optimizer)
    if start >= end and start >= step:
        phase = "backward-start"
        if start_fwd >= max(start_loss, start_block):
            parts = dict(
                common,
                gradients=grads or fwd_grads,
                activations=acts + prev_inputs,
                logits=out16 + prev_logits,
                buffers=fb_buffers + b.resident,
            )
        elif start_loss >= start_block:
            parts = dict(
                common,
                gradients=grads + loss_grads,
                activations=acts,
                logits=logits,
                buffers=fb_buffers - b.released_at_loss + early + b.resident,
            )
        else:
            parts = dict(
                common,
                gradients=st.grads_all if persistent else st.head_grads,
                activations=acts + recomputed + work,
                logits=0.0,
                buffers=fb_buffers + b.unit_grads + early + b.resident,
            )
    elif end >= step:
        phase = "backward-end"
        tail = end_acts + b.bucket >= b.flat
        parts = dict(
            common,
            gradients=st.grads_all,
            activations=end_acts if tail else 0.0,
            logits=0.0,
            buffers=fb_buffers + b.unit_grads + b.resident + (b.bucket if tail else b.flat),
        )
    else:
        phase = "optimizer-step"
        parts = dict(common, gradients=st.grads_all, activations=0.0, logits=0.0, buffers=step_buffers + b.resident)
    return phase, parts, max(start, end, step)
