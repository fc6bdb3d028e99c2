"""Saved activations: the bytes one transformer block saves for backward per token, under each checkpointing
policy, and how many micro-batches a stage holds in flight (what it holds of them: memory_saved)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from frenzy_slurm.marp.plan import ParallelPlan, Recompute, Workload


@dataclass(frozen=True)
class _Block:
    """One transformer block's shapes and byte widths as the workload and plan save its tensors (per token)."""

    w: Workload
    tp: int
    amp: bool
    frozen_input: bool
    s: int  # the tokens a rank attends over per token (eager score width): seq / cp
    e: float  # matmul outputs / inputs
    li: float  # a linear's saved input: float8 linears save their inputs as fp8 casts
    rep: int  # tensors outside TP regions are split only with sequence parallelism
    # a column-parallel linear's saved input: sharded under SP (Megatron gathers it again in backward), or the
    # gathered whole where the all-gather is an op of its own (DTensor TP)
    rep_in: int
    mask: float  # bytes per dropout-mask element
    adapters: frozenset[str]  # LoRA's adapted linears (none in full training)
    tg: frozenset[str]  # linears whose input is saved
    norm: float  # one norm's saved bytes
    ae: float  # an adapter's compute width: its saved input and lora_A's r-wide output (fp32 adapters: 4)

    @classmethod
    def of(
        cls, w: Workload, tp: int, sp: bool, amp: bool, cp: int, frozen_input: bool, keys: int | None = None
    ) -> _Block:
        act = w.activations
        e = 4.0 if w.precision == "fp32" else 2.0
        r = 4.0 if amp else e  # residual stream and norm inputs (fp32 under autocast)
        rep = tp if sp else 1
        lora = w.method != "full"
        adapters = frozenset(w.adapters.lora_targets) if lora else frozenset()
        # Linear layers whose input is saved: trainable ones; under QLoRA all of them, since bitsandbytes'
        # 4-bit matmul saves its input whenever the input needs a gradient, frozen weight or not.
        only_adapters = w.method == "lora" or (w.method == "qlora" and not w.adapters.nf4_saves_inputs)
        # A norm keeps its input; an eager fp32-upcast norm keeps the fp32 copy and the normalised 16-bit value
        # instead. (A composite norm - CPU kernels, or an eager fp32 upcast - also keeps its normalised output for the
        # weight's gradient: fp32 copy and normalised value; a fused kernel keeps only its input and per-row
        # statistics.) (the normalised output is kept for the norm weight's gradient only: not under LoRA, where
        # norms are frozen)
        # (`weight * x.to(input_dtype)`: the normalised value in the norm input's dtype, fp32 under autocast)
        normalised = 4.0 if act.norm_fp32_normalized else r
        # PEFT's fp32 adapters over a 16-bit model without autocast compute in fp32 (under autocast lora_A's matmul
        # runs in 16 bits whatever the adapters' dtype; Unsloth's kernels cast the adapters to the input's dtype)
        fp32_adapters = lora and w.adapters.lora_fp32 and not w.adapters.lora_in_input_dtype
        upcast = act.norm_upcast and not act.compile
        norm = ((4.0 if upcast else r) + (normalised if (upcast and not lora) else 0.0)) * w.arch.hidden / rep
        return cls(
            w=w,
            tp=tp,
            amp=amp,
            frozen_input=frozen_input,
            s=(keys or w.seq_len) // cp,
            e=e,
            li=1.0 if act.fp8 else e,
            rep=rep,
            rep_in=1 if act.tp_saves_gathered_inputs else rep,
            # dropout masks: torch's fused CUDA kernel keeps a bool mask; on the CPU dropout multiplies by a mask
            # tensor of the input's dtype (measured on the CPU grid)
            mask=e if act.dropout_mask_full_width else 1.0,
            adapters=adapters,
            tg=adapters if only_adapters else frozenset({"q", "k", "v", "o", "mlp"}),
            norm=norm,
            ae=4.0 if (fp32_adapters and e == 2.0 and not amp) else e,
        )

    @property
    def lora(self) -> bool:
        return self.w.method != "full"

    @property
    def dropped(self) -> bool:
        """Each adapter's lora_A reads its own dropped copy of the input (adapter dropout)."""
        return self.lora and self.w.adapters.lora_dropout

    @property
    def base_saves(self) -> bool:
        """The base linear keeps its input: full training, or bitsandbytes' 4-bit matmul under QLoRA."""
        return not self.lora or (self.w.method == "qlora" and self.w.adapters.nf4_saves_inputs)

    def own_copies(self, residual: bool) -> bool:
        """Each adapter reads a copy of its input of its own: PEFT's cast to fp32 adapters (`_cast_input_dtype`),
        or under autocast lora_A's cast to 16 bits, which autocast makes afresh for every op (it caches only the
        casts of leaf tensors). `residual`: an input from the fp32 residual side under autocast (the norm's output,
        the q/k/v and gate/up inputs), which every adapter's matmul casts; o's and down's 16-bit inputs are cast
        only where PEFT first casts them to the fp32 adapters' dtype (its plain Linear always; its bitsandbytes
        Linear4bit only outside autocast: peft 0.21 tuners/lora/bnb.py `requires_conversion`)."""
        if self.ae != self.e:
            return True
        peft_cast = self.w.adapters.lora_input_cast and self.w.method == "lora"
        return self.amp and (residual or peft_cast)

    def adapter_inputs(self, n: int, shared: bool, residual: bool = True, frozen: bool | None = None) -> float:
        """Bytes per input element that `n` adapters reading one input keep, beside the base's `shared` copy.

        Under LoRA the frozen base linears keep no input (their weight needs no gradient: bitsandbytes' 4-bit
        matmul is the exception, `base_saves`); each adapter's lora_A keeps what it reads: the input it shares with
        the others, once, or a copy of its own (`own_copies`: cast to the adapter's dtype, or with adapter dropout
        its dropped copy, whose mask is as wide as the dropout's input: PEFT, torchtune and litgpt give every
        adapted linear its own dropout; litgpt's fused q/k/v one); lora_B keeps lora_A's r-wide output.
        `frozen`: the input needs no gradient, so dropout keeps no mask (default: the block's input's)."""
        if not n:
            return 0.0
        own = self.own_copies(residual)
        if self.dropped:
            mask = 4.0 if (own and self.w.activations.dropout_mask_full_width) else self.mask
            return n * (self.ae + (0.0 if (self.frozen_input if frozen is None else frozen) else mask))
        if own:
            return n * self.ae
        return 0.0 if shared else self.li


@lru_cache(maxsize=4096)  # bounded: a long simulation sees many workloads
def layer_activation_bytes(
    w: Workload,
    tp: int,
    sp: bool,
    recompute: Recompute,
    amp: bool = False,
    cp: int = 1,
    frozen_input: bool = False,
    keys: int | None = None,
) -> float:
    """Bytes saved for backward by one transformer block, per token (Korthikanti et al. 2022, generalised).

    With context parallelism each rank holds seq/cp tokens and attends over the whole sequence in blocks
    (ring attention): per token the saved tensors are the same, the eager score matrix is s/cp wide.
    `frozen_input`: the block's input needs no gradient (the first block behind LoRA's frozen embedding), so what
    runs on it before the first trainable weight (the first norm, the adapters' dropout) saves nothing.
    `keys`: the positions each token attends over, where they are not the workload's sequence (an encoder-decoder
    model's decoder block attends over its target: memory_encdec)."""
    b = _Block.of(w, tp, sp, amp, cp, frozen_input, keys)
    total = 0.0
    # (added one by one in the block's order, so that every stage's bytes stay exactly what they were)
    for term in (*_attention_terms(b, recompute), *_mlp_terms(b)):
        total += term
    return total


def layer_activation_terms(
    w: Workload, tp: int, sp: bool, recompute: Recompute, amp: bool = False, cp: int = 1, frozen_input: bool = False
) -> tuple[float, ...]:
    """The bytes per token of each tensor (or group of tensors made together) one block saves for backward, in the
    order its forward makes them: the terms `layer_activation_bytes` adds up. The allocator replay's request
    sequence reads them (`marp/allocator_requests.py`)."""
    b = _Block.of(w, tp, sp, amp, cp, frozen_input)
    return (*_attention_terms(b, recompute), *_mlp_terms(b))


def _attention_terms(b: _Block, recompute: Recompute) -> list[float]:
    """The attention half's saved tensors in the order the block makes them: norm1, the q/k/v input, q/k/v, the
    attention core's, o_proj's input and adapters, the residual dropout mask."""
    act, a = b.w.activations, b.w.arch
    h, li = a.hidden, b.li
    kvd = a.kv * a.head_dim
    terms = [0.0 if b.frozen_input else b.norm]  # norm1 (a frozen block input: nothing to differentiate)
    # Under autocast each linear casts its fp32 input to 16 bits on its own (autocast caches only the casts of leaf
    # tensors, the weights), so separate q/k/v projections save one copy each; a fused projection saves one.
    casts_qkv = len(b.tg & {"q", "k", "v"}) if (b.amp and not act.fused_projections) else 1
    if not b.lora and b.tg & {"q", "k", "v"}:
        terms.append(casts_qkv * li * h / b.rep_in)  # QKV input (norm1 output)
    elif b.lora:
        n_qkv = len(b.adapters & {"q", "k", "v"})
        shared = b.base_saves and not b.frozen_input  # (bitsandbytes saves its input only if that needs a gradient)
        n_qkv = min(n_qkv, 1) if act.fused_projections else n_qkv  # (one adapter on a fused q/k/v linear)
        terms.append(((li if shared else 0.0) + b.adapter_inputs(n_qkv, shared)) * h / b.rep)
    inner = a.inner  # heads x head size: hidden, except where the head size is set on its own (T5's d_kv)
    terms.append(b.e * (inner + 2 * (inner if act.gqa_expand else kvd)) / b.tp)  # q, k, v (k, v full if expanded)
    terms += _core_terms(b, recompute, b.s)
    return terms


def _core_terms(b: _Block, recompute: Recompute, keys: int) -> list[float]:
    """What the attention core and o_proj save per query token, over `keys` key positions: the eager scores'
    softmax (and dropout) or the kernel's output and log-sum-exp, o_proj's input and adapters, the residual dropout
    mask. T5's relative position bias under SDPA: transformers 5.17's integrations/sdpa_attention.py
    `create_position_bias_mask` makes each layer's float mask (the bias where the padding or causal mask allows:
    heads x keys per query token, per sample), which the kernel keeps for backward (the bias needs a gradient)."""
    act, a = b.w.activations, b.w.arch
    e, li, tp, inner = b.e, b.li, b.tp, a.inner
    drop = a.dropout > 0
    terms: list[float] = []
    if act.attention == "eager":
        if recompute != "selective":
            soft = e
            if b.amp or (act.softmax_fp32 and e == 2.0):
                # the fp32 softmax (autocast runs softmax in fp32; HF's softmax(..., dtype=float32)) and the 16-bit
                # copy the probs @ v matmul reads (autocast's cast, or HF's .to(dtype)): each saved
                soft = 4.0 + e
            terms.append(a.heads * keys * (soft + ((b.mask + e) if drop else 0)) / tp)
        if b.base_saves or ("o" in b.adapters and not b.dropped):
            # the context (probs @ v, made contiguous) is kept by o_proj, or by its adapter's lora_A reading it
            # undropped (or its own cast of it); a frozen o_proj keeps only its weight, and probs @ v saves probs
            # and v, not its output
            base = li if b.base_saves else 0.0
            o_ad = b.adapter_inputs(1, b.base_saves, residual=False) if "o" in b.adapters else 0.0
            terms.append((base + o_ad) * inner / tp)
    else:
        terms.append(e * inner / tp + 4.0 * a.heads / tp)  # kernel output (also o_proj input) + log-sum-exp
        if a.position == "relative":
            terms.append(e * a.heads * keys / tp)  # the position-bias mask the kernel keeps
        if act.fp8:
            terms.append(li * inner / tp)  # o_proj's fp8 copy of its input
        elif "o" in b.adapters and not b.dropped and b.own_copies(False):
            terms.append(b.ae * inner / tp)  # o's adapter's own cast of the kernel's output
        elif act.unfused_rope and a.position == "rope" and "o" in b.tg:  # (a frozen o_proj keeps no input)
            # rotated q/k are new head-major tensors, so the kernel's output is head-major too and the
            # transpose back to (tokens, hidden) copies it: o_proj saves that copy as well
            terms.append(e * inner / tp)
    if b.dropped and "o" in b.adapters:
        # o's adapter's dropped copy and mask (the context needs a gradient behind q/k/v's adapters, in any block)
        terms.append(b.adapter_inputs(1, False, residual=False, frozen=False) * inner / tp)
    if drop:
        terms.append(b.mask * a.hidden / b.rep)  # residual dropout mask
    return terms


@lru_cache(maxsize=4096)
def cross_attention_bytes(
    w: Workload, tp: int, sp: bool, recompute: Recompute, amp: bool, source_len: int
) -> tuple[float, float]:
    """(bytes per target token, bytes per source token) one decoder block's cross-attention saves for backward
    (transformers 5.17 models/t5/modeling_t5.py T5LayerCrossAttention, models/bart/modeling_bart.py
    BartDecoderLayer.encoder_attn): over the target, its norm, q's input, q, the core over `source_len` keys and
    o_proj's input; over the source, k and v projected from the encoder's output (which every decoder block's k
    and v linears save: one tensor, counted once for the stack by the caller), under autocast each linear's own
    16-bit cast of it. LoRA: the frozen k/v save nothing, an adapter on k or v its input (dropped copy) and its
    r-wide lora_A output over the source."""
    b = _Block.of(w, tp, sp, amp, 1, False)
    act, a = w.activations, w.arch
    h, e, li, kvd = a.hidden, b.e, b.li, a.kv * a.head_dim
    target = [b.norm]
    if not b.lora and "q" in b.tg:
        target.append(li * h / b.rep_in)  # q's input (the norm's output)
    elif b.lora:
        shared = b.base_saves
        target.append(((li if shared else 0.0) + b.adapter_inputs(int("q" in b.adapters), shared)) * h / b.rep)
        target.append(int("q" in b.adapters) * b.ae * w.adapters.lora_rank / tp)  # lora_A's output
    target.append(e * a.inner / tp)  # q
    target += _core_terms(b, recompute, source_len)
    kv_width = a.inner if act.gqa_expand else kvd
    source = [e * 2 * kv_width / tp]  # k, v
    if not b.lora:
        source.append((2 * li * h / b.rep_in) if b.amp and not act.fused_projections else 0.0)  # k's and v's casts
    else:
        n_kv = len(b.adapters & {"k", "v"})
        source.append(b.adapter_inputs(n_kv, True) * h / b.rep + n_kv * b.ae * w.adapters.lora_rank / tp)
    return sum(target), sum(source)


def _mlp_terms(b: _Block) -> list[float]:
    """The MLP half's saved tensors in order: norm2, the FFN input, the adapters', the MLP's, the dropout mask."""
    act, a = b.w.activations, b.w.arch
    h, e, li = a.hidden, b.e, b.li
    terms = [b.norm]  # norm2
    if not b.lora and "mlp" in b.tg:
        # (SwiGLU's gate and up projections each cast the input under autocast, unless fused)
        casts_mlp = 2 if (b.amp and not act.fused_projections and a.gated) else 1
        terms.append(casts_mlp * li * h / b.rep_in)  # FFN input
    down_in = li if "mlp" in b.tg else 0.0  # the product / activation output, saved by the down projection
    if b.lora:
        down_in = _lora_mlp_terms(b, terms)
    # torch.compile's partitioner (measured on the CPU with inductor, torch 2.13) keeps the matmul outputs and the
    # down projection's input and recomputes only silu(gate): 3 ffn-wide tensors for SwiGLU, 4 in eager; a GELU
    # MLP keeps the fc output and the GELU output (the down projection's input) either way
    # the tanh GELU in eager ops (HF's NewGELUActivation) also keeps tanh's output, 0.5*x and 1+tanh for backward
    eager_gelu = 3 * e if (act.gelu_tanh_eager and not act.compile) else 0.0
    # dropout after the activation (T5's DenseActDense / DenseGatedActDense, BART's activation_dropout): an ffn-wide
    # mask, and the down projection saves the dropped copy instead of the activation's output
    act_drop = b.mask if a.activation_dropout > 0 else 0.0
    if a.gated and b.lora and act.lora_mlp_saves_gate_up:
        # one autograd function over the adapted MLP: the gate and up outputs, nothing of the product
        terms.append(2 * e * a.ffn / b.tp)
    elif a.gated:
        # gate and up outputs and the product (down-proj input); eager also keeps silu(gate) / gelu(gate)
        terms.append((2 * e + (0.0 if act.compile else e) + down_in + act_drop + eager_gelu) * a.ffn / b.tp)
    elif a.activation == "relu":
        # ReLU keeps its output (threshold_backward reads it), which is also the down projection's input unless
        # a dropout comes between them
        terms.append((e + (down_in if act_drop else 0.0) + act_drop) * a.ffn / b.tp)
    else:
        terms.append((e + down_in + eager_gelu + act_drop) * a.ffn / b.tp)
    if a.dropout > 0:
        terms.append(b.mask * h / b.rep)  # MLP dropout mask
    return terms


def _lora_mlp_terms(b: _Block, terms: list[float]) -> float:
    """Appends LoRA's FFN-input, lora_A-output and scattered q/k/v terms; returns the down projection's saved
    input bytes per ffn element."""
    w, a = b.w, b.w.arch
    h, e, li, tp = a.hidden, b.e, b.li, b.tp
    base = li if b.base_saves else 0.0
    n_in = (2 if a.gated else 1) if "mlp" in b.adapters else 0  # gate and up / fc
    terms.append((base + b.adapter_inputs(n_in, b.base_saves)) * h / b.rep)  # FFN input
    down_in = base + b.adapter_inputs(1 if "mlp" in b.adapters else 0, b.base_saves, residual=False)
    qkv = b.adapters & {"q", "k", "v"}
    mats = len(b.adapters & {"q", "k", "v", "o"}) + (n_in + 1 if n_in else 0)
    terms.append(mats * b.ae * w.adapters.lora_rank / tp)  # lora_A's outputs, saved by lora_B
    if w.adapters.lora_qkv_scatter and w.activations.fused_projections and 0 < len(qkv) < 3:
        # the adapted q/k/v outputs, scattered into the fused width by index_copy, which saves its source
        terms.append(e * sum(h if t == "q" else a.kv * a.head_dim for t in qkv) / tp)
    return down_in


def op_checkpointed_bytes(w: Workload, tp: int, sp: bool, amp: bool) -> float:
    """Bytes one block keeps per token under torchtitan's per-op selective checkpointing (SelectiveAC, read in
    torchtitan 0.3's distributed/activation_checkpoint.py): the block's input (the checkpoint's), the attention
    kernel's output and log-sum-exp, and the output of every other matmul, counted per block across steps: with an
    odd number of matmuls per block (SwiGLU's 7) the saved set alternates between steps (q, v, gate, down / k, o,
    up), so the peak holds the larger. Compiled (training.compile: each block under torch.compile), AOTAutograd's
    partitioner saves only what the backward graph reads, MUST_SAVE outputs included: the block's last matmul (the
    down projection) writes into the residual sum, which no backward op reads, so it is not kept (measured on the
    CPU, benchmarks/float8_sac_cpu.py: 3216 bytes per token compiled against 3728 eager, the down projection's
    output; eager, the policy's cache keeps every MUST_SAVE output until the recomputation, torch/utils/
    checkpoint.py _CachingTorchDispatchMode)."""
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
    ffn = [e * f / tp, e * f / tp, e * h] if a.gated else [e * f / tp, e * h]  # (gate,) up, down
    linears += [(b, all_bias) for b in ffn]
    total += sum(b for b, biased in linears if biased)
    mms = [b for b, biased in linears if not biased]
    if w.activations.compile and mms and not linears[-1][1]:
        mms[-1] = 0.0  # the down projection's output: saved by the policy, read by no backward op
    odd = sum(mms[0::2])  # the 1st, 3rd, ... matmul of a step's block (the policy saves odd counts)
    even = sum(mms[1::2])
    return total + (max(odd, even) if len(mms) % 2 else odd)


def in_flight(plan: ParallelPlan, i: int) -> float:
    """Micro-batches whose activations a pipeline stage holds at its peak: 1F1B keeps pp - stage of them, GPipe
    all, interleaved 1F1B with v model chunks per rank (pp - stage - 1) * 2 + (v - 1) * pp + 1 chunk-micro-batches
    in warm-up (Megatron's schedule), each 1/v of the stage's layers; sequential stages (naive model parallelism)
    run each micro-batch's forward and backward through every stage before the next starts: one. Under FSDP2's
    unsharded pipeline gradients (torchtitan) the stage's peak instant comes from the schedule's replay instead
    (marp/pipeline_order.py grad_moments)."""
    ga = max(plan.grad_accum, 1)
    if plan.pp == 1 or plan.schedule == "sequential":
        return 1.0
    if plan.schedule == "gpipe":
        return float(ga)
    if plan.schedule == "interleaved" and plan.virtual_stages > 1:
        v = plan.virtual_stages
        return min(ga * v, (plan.pp - i - 1) * 2 + (v - 1) * plan.pp + 1) / v
    return float(min(plan.pp - i, ga))
