"""The built-in model's op list for the step's requests (marp/step_requests.py, issue 29): the ops of
frenzy_slurm/models/gpt.py's forward and loss as autograd records them, in fp32, in bf16 (autocast over fp32
weights, or bf16 weights: the dtypes from marp/step_dtypes.py) and with LoRA's adapters on a frozen base.

What this module owns: `frenzy_graph` (the embedding, the blocks, the final norm, the head and the loss),
`norm` (RMSNorm's composite, LayerNorm's kernel), `linear` (with autocast's casts, frozen or trainable), LoRA's
adapter (`_lora`, peft's vanilla forward), the built-in model's RoPE, the residual adds' dtype promotion, and
`sdpa_scratch` (SDPA's CPU workspaces). transformers' Llama (`_hf_graph` in step_requests.py) reuses `norm`,
`linear`, `adapted` (peft's LoRA layers compute what `_lora` does) and `sdpa_scratch`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.step_dtypes import (
    StepDtypes,
    promoted,
    promotion_temporary,
    sdpa_reduced_scratch,
)
from frenzy_slurm.marp.step_graph import SELF, Graph

RNG_STATE_BYTES = 5056  # torch.get_rng_state() of the CPU generator (at::CPUGeneratorImpl's state; measured)
FP32_STEP = StepDtypes()


def norm(g: Graph, w: Workload, x: str, tokens: int, e: float, threads: int) -> str:
    """RMSNorm as the CPU composite runs it (square, mean, rsqrt, x * rstd, * weight), or LayerNorm's kernel
    (output; mean and rstd saved); both save the input. `e`: the weight's bytes per element. RMSNorm's composite
    (`_fused_rms_norm`, torch 2.13) computes in fp32: a 16-bit input is upcast first (the copy is what it saves, not
    the input) and the fp32 result cast back to the input's dtype."""
    h = w.arch.hidden
    if w.arch.norm == "rmsnorm":
        n = 4 * h * tokens
        narrow = g.sizes[x] < n
        x = g.op("upcast", [x], n, grads=(x,)) if narrow else x
        # (pow's backward: x.pow(1), times 2, then times the gradient)
        sq = g.op("pow", [x], n, grads=(x,), saves=(x,), scratch=(0, n), bscratch=2)
        mean = g.op("mean", [sq], 4 * tokens, grads=(sq,))
        # (at::rms_norm's composite: the square and its mean are temporaries of one expression, freed after it)
        rstd = g.op("rsqrt", [mean], 4 * tokens, grads=(mean,), saves=(SELF,), holds=(sq,))
        xhat = g.op("xhat", [x, rstd], n, grads=(x, rstd), reduce=(rstd,), saves=(x, rstd))
        # (xhat is kept only for the weight's gradient: not where the weight is frozen)
        keep = (xhat,) if g.trainable else ()
        y = g.op("scale", [xhat], n, grads=(xhat,), saves=keep, params=(("norm", e * h),), elementwise=True)
        return g.op("downcast", [y], e * h * tokens, grads=(y,)) if narrow else y
    # (its backward, aten/src/ATen/native/cpu/layer_norm_kernel.cpp, torch 2.13: dX, dgamma and dbeta, then a
    # per-thread buffer of both parameters' partial sums)
    y = g.op(
        "layernorm",
        [x],
        e * h * tokens,
        grads=(x,),
        params=(("norm", e * h), ("norm.bias", e * h)),
        params_last=True,
        scratch=(0, threads * 2 * e * h),
        bscratch_last=True,
    )
    mean = g.op("mean", [y], 4 * tokens)  # (the kernel's fp32 row statistics, made with its output)
    rstd = g.op("rstd", [y], 4 * tokens)
    g.ops[-3] = replace(g.ops[-3], saves=(x, mean, rstd))
    return y


def linear(
    g: Graph, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, bias: bool, param: str = ""
) -> str:
    """nn.Linear (`param`: its weight's name where another op's, a tied head's); under autocast
    (`_autocast_linear`) on 16-bit casts of its weight and its fp32 input."""
    e = dt.param
    params = ((param or name, int(e * n_in * n_out)),) + (((name + ".bias", int(e * n_out)),) if bias else ())
    if dt.autocast:
        return _autocast_linear(g, name, x, n_in, n_out, tokens, dt, params)
    if not g.trainable:  # (a frozen weight: the product keeps only the weight, for its input's gradient)
        return g.op(name, [x], e * n_out * tokens, grads=(x,), view_grads=True)
    # (its input's gradient is mm's 2-d output viewed as 3-d: a second gradient is added out of place. Without a
    # bias MmBackward0 writes the weight's gradient first, with one AddmmBackward0 the input's: as the CPU step's
    # profile shows)
    return g.op(name, [x], e * n_out * tokens, grads=(x,), saves=(x,), params=params, view_grads=True, params_last=bias)


def _autocast_linear(
    g: Graph, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, params: Sequence[tuple[str, int]]
) -> str:
    """A linear under autocast (marp/step_dtypes.py): its weight cast to 16 bits (cached for the forward, the
    weight's gradient made by the cast's backward in fp32 from the product's 16-bit one), then its input where fp32
    (a new cast for every linear that reads it); the product saves both casts and makes the weight's gradient
    first (no bias), then the input's. (Biases under autocast are out of scope: `_check_scope`.)"""
    weight = g.op("wcast_" + name, [], dt.low * n_in * n_out, params=params)
    low = dt.low * n_in * tokens
    xc = x if g.sizes[g.storage(x)] <= low else g.op("xcast_" + name, [x], low, grads=(x,))
    # (the caller's argument `x` is bound until the linear returns)
    return g.op(
        name,
        [xc, weight],
        dt.low * n_out * tokens,
        grads=(weight, xc),
        saves=(weight, xc),
        view_grads=True,
        holds=(x,),
    )


def _rope(
    g: Graph, w: Workload, x: str, width: int, tokens: int, e: float, tag: str, holds: tuple[str, ...] = ()
) -> str:
    """The built-in model's `_rope`: cos/sin tables of seq x head_dim/2 built in every call (kept: the products
    save them), the halves' four products and their sum/difference (transients), stacked into the output."""
    a = w.arch
    table = a.head_dim // 2 * w.seq_len
    angles = g.op("angles" + tag, [], 4 * table)  # (fp32 outer product, freed when the call returns)
    # (`ang.cos().to(x.dtype)`: fp32, then a 16-bit copy where x is 16-bit)
    cos = g.op("cos" + tag, [angles], 4 * table)
    cos = g.op("cos16" + tag, [cos], e * table) if e < 4 else cos
    sin = g.op("sin" + tag, [angles], 4 * table, holds=(angles,))
    sin = g.op("sin16" + tag, [sin], e * table) if e < 4 else sin
    half = e * width / 2 * tokens
    # x1, x2 = x[..., 0::2], x[..., 1::2]: views, whose gradients are scattered into a zeroed full-size tensor
    x1 = g.op("even" + tag, [x], half, grads=(x,), view=True)
    x2 = g.op("odd" + tag, [x], half, grads=(x,), view=True)
    parts = []
    for k, (a1, a2) in enumerate(((cos, sin), (sin, cos))):  # x1 * cos - x2 * sin, x1 * sin + x2 * cos
        t1 = g.op(f"rot{k}a" + tag, [x1, a1], half, grads=(x1,), saves=(a1,))
        t2 = g.op(f"rot{k}b" + tag, [x2, a2], half, grads=(x2,), saves=(a2,))
        # (a difference negates its second input's gradient: a new tensor; a sum hands both on)
        parts.append(g.op(f"rot{k}" + tag, [t1, t2], half, grads=(t1, t2), passthrough=(t1,) if k == 0 else (t1, t2)))
    # torch.stack's backward unbinds: views of the gradient. (The angles live until the call returns; `holds`: the
    # projections the caller rebinds after it.)
    out = g.op("rope" + tag, parts, e * width * tokens, grads=tuple(parts), passthrough=tuple(parts))
    g.ops[-1] = replace(g.ops[-1], holds=(angles, cos, sin, *holds))  # (`_rope`'s locals ang, cos, sin)
    return out


def sdpa_scratch(w: Workload, threads: int, dt: StepDtypes = FP32_STEP) -> tuple[tuple[int, int], tuple[int, int]]:
    """(forward, backward) workspace of SDPA's CPU flash kernel (aten/src/ATen/native/cpu/FlashAttentionKernel.cpp,
    torch 2.13), per thread in fp32: forward the q-block x kv-block scores, a row max and sum per q row and the
    q-block's output accumulator; backward the block's probabilities and their gradient. The q block is 256 rows
    from 768 queries, 64 from 192, else 32; the kv block 512 keys, at most the sequence. Second: a 16-bit run's
    reduced-precision copies of the block (step_dtypes.sdpa_reduced_scratch). None on CUDA."""
    s, d = w.seq_len, w.arch.head_dim
    qs = 256 if s >= 768 else 64 if s >= 192 else 32
    kvs = min(512, s)
    if dt.device != "cpu":
        return (0, 0), (0, 0)
    fp32 = (threads * 4 * (qs * kvs + 2 * qs + qs * d), threads * 4 * 2 * qs * kvs)
    return fp32, sdpa_reduced_scratch(dt, qs, kvs, threads)


def _block(g: Graph, w: Workload, x: str, tokens: int, dt: StepDtypes, threads: int) -> str:
    """One of the built-in model's blocks (frenzy_slurm/models/gpt.py Block.forward). The residual stream is in the
    weights' dtype; the projections, RoPE, the attention and the MLP's activations in `dt.low` (under autocast the
    products make bf16, and an fp32 residual plus a bf16 projection is fp32)."""
    a = w.arch
    h, kvd, f = a.hidden, a.kv * a.head_dim, a.ffn
    e, lo = dt.param, dt.low
    qkv_bias, all_bias = a.bias in ("qkv", "all"), a.bias == "all"
    x0, y = x, norm(g, w, x, tokens, e, threads)
    q = adapted(g, w, "q", y, h, h, tokens, dt, qkv_bias)
    k = adapted(g, w, "k", y, h, kvd, tokens, dt, qkv_bias)
    v = adapted(g, w, "v", y, h, kvd, tokens, dt, qkv_bias)
    if a.position == "rope":
        # (the head-major views of the projections: RoPE's gradient comes back head-major, and viewing it as
        # (tokens, width) again copies it)
        qh = g.op("heads_q", [q], lo * h * tokens, grads=(q,), view=True)
        kh = g.op("heads_k", [k], lo * kvd * tokens, grads=(k,), view=True)
        # (`q, k = _rope(q), _rope(k)`: the projections are let go once both calls have returned)
        q, k = _rope(g, w, qh, h, tokens, lo, "q"), _rope(g, w, kh, kvd, tokens, lo, "k", holds=(k, q))
    # SDPA's CPU flash kernel: output and per-row log-sum-exp (fp32) saved, with q, k and v; its backward zeroes
    # the gradients of q, k and v, then takes its buffer (and in 16 bits its reduced copies)
    sdpa, reduced = sdpa_scratch(w, threads, dt)
    att = g.op(
        "sdpa",
        [q, k, v],
        lo * h * tokens,
        grads=(q, k, v),
        scratch=(0, sdpa[1]),
        bscratch_last=True,
        scratch2=(0, reduced[1]),
        all_grads=True,  # (the kernel zeroes q's, k's and v's gradients whichever are wanted)
    )
    # (the buffer after both outputs)
    lse = g.op("lse", [att], 4 * a.heads * tokens, scratch=(sdpa[0], 0), scratch2=(reduced[0], 0))
    g.ops[-2] = replace(g.ops[-2], saves=(q, k, v, att, lse))  # (the kernel makes both; its backward reads both)
    o_in = att
    if a.position == "rope" and w.activations.unfused_rope:
        # rotated q/k are new head-major tensors, so the kernel's output is head-major too and the transpose back
        # to (tokens, hidden) copies it (memory_activations' o_proj term); otherwise it is a view
        o_in = g.op("transpose", [att], lo * h * tokens, grads=(att,), passthrough=(att,))  # (its backward: a view)
    o = adapted(g, w, "o", o_in, h, h, tokens, dt, all_bias)
    x = _residual(g, "residual1", x, o, h * tokens, dt)
    y1, y = y, norm(g, w, x, tokens, e, threads)
    g.ops[-1] = replace(g.ops[-1], holds=(*g.ops[-1].holds, y1))  # (`h = self.norm2(x)` rebinds the first)
    if a.gated:
        gate = adapted(g, w, "gate", y, h, f, tokens, dt, False)
        act = g.op("silu", [gate], lo * f * tokens, grads=(gate,), saves=(gate,))
        up = adapted(g, w, "up", y, h, f, tokens, dt, all_bias)
        m = g.op("product", [act, up], lo * f * tokens, grads=(act, up), saves=(act, up))
    else:
        up = adapted(g, w, "up", y, h, f, tokens, dt, all_bias)
        m = g.op("gelu", [up], lo * f * tokens, grads=(up,), saves=(up,))
    d = adapted(g, w, "down", m, f, h, tokens, dt, all_bias)
    # (Block.forward's locals x, h, q, k, v, att, m, let go in that order when it returns: where the block is
    # checkpointed they are what keeps its tensors alive to its end; its input, the caller's `x`, goes after)
    return _residual(g, "residual2", x, d, h * tokens, dt, holds=(x, y, q, k, v, att, m, x0))


def adapted(
    g: Graph, w: Workload, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, bias: bool
) -> str:
    """A block's linear, with LoRA's adapter where model.yaml targets it (`_lora`)."""
    base = linear(g, name, x, n_in, n_out, tokens, dt, bias)
    if w.method != "lora" or name not in w.adapters.lora_targets:
        return base
    return _lora(g, w, name, x, base, n_in, n_out, tokens, dt)


def _lora(
    g: Graph, w: Workload, name: str, x: str, base: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes
) -> str:
    """LoRA's adapter beside a frozen linear (`base(x) + B(A(dropout(x))) * scaling`: peft 0.21's
    tuners/lora/layer.py Linear.forward, the CPU grid's PEFT-style adapter): dropout on the adapter's input, A
    (n_in -> rank) and B (rank -> n_out) trainable, each saving its input for its weight's gradient, the scaled B
    output added to the base's. Dropout (torch 2.13 aten/src/ATen/native/Dropout.cpp): on the CPU `_dropout_impl`
    draws a noise tensor of the input's dtype and multiplies (the product saves the noise); on CUDA the fused
    `native_dropout` makes a bool mask (1 byte per element)."""
    e, r = dt.low, w.adapters.lora_rank
    n = n_in * tokens
    if w.adapters.lora_dropout:
        noise = g.op(f"lora_noise_{name}", [], (e if dt.device == "cpu" else 1) * n)
        x = g.op(f"lora_drop_{name}", [x, noise], e * n, grads=(x,), saves=(noise,))
    a_params, b_params = ((f"{name}.lora_A", e * n_in * r),), ((f"{name}.lora_B", e * r * n_out),)
    a = g.op(f"lora_A_{name}", [x], e * r * tokens, grads=(x,), saves=(x,), params=a_params, trainable=True)
    b = g.op(f"lora_B_{name}", [a], e * n_out * tokens, grads=(a,), saves=(a,), params=b_params, trainable=True)
    scaled = g.op(f"lora_scale_{name}", [b], e * n_out * tokens, grads=(b,))
    return g.op(
        f"lora_sum_{name}", [base, scaled], e * n_out * tokens, grads=(base, scaled), passthrough=(base, scaled)
    )


def _residual(g: Graph, name: str, x: str, o: str, elements: int, dt: StepDtypes, holds: tuple[str, ...] = ()) -> str:
    """`x + o`: the sum in the wider dtype (on the CPU the narrower input copied to it first, a temporary). Its
    backward hands its gradient on, as it is, to an input of the sum's dtype, and as a new cast (autograd's engine,
    `validate_outputs`) to a narrower one."""
    a, b = g.sizes[x] / elements, g.sizes[o] / elements
    out = promoted(a, b)
    temporary = promotion_temporary(dt, a, b, elements)
    keep = tuple(k for k, n in ((x, a), (o, b)) if n == out)
    return g.op(name, [x, o], out * elements, grads=(x, o), passthrough=keep, scratch=(temporary, 0), holds=holds)


def frenzy_graph(
    w: Workload, plan: ParallelPlan, threads: int, dt: StepDtypes = FP32_STEP
) -> tuple[Graph, list[tuple[str, int]]]:
    """The step's forward ops, and the parameters (name, bytes) in the model's order. The embeddings run in the
    weights' dtype (autocast leaves them alone)."""
    a = w.arch
    tokens = plan.micro_batch * w.seq_len
    e = dt.param
    g = Graph(trainable=w.method == "full")
    x = g.op("embed", ["tokens"], e * a.hidden * tokens, params=(("embed", e * a.vocab * a.hidden),))
    if a.position == "learned":
        positions = g.op("positions", [], 8 * w.seq_len)  # (the arange of positions: int64)
        pos = g.op("pos", [positions], e * a.hidden * w.seq_len, params=(("pos", e * a.max_positions * a.hidden),))
        # (`x = x + self.pos(...)`: the position embedding is let go before the token embedding's output; it is
        # broadcast over the batch, so its gradient is a sum over the batch, a new tensor)
        x = g.op("embed_sum", [pos, x], e * a.hidden * tokens, grads=(x, pos), passthrough=(x,))
    for i in range(a.layers):
        if plan.recompute == "full":
            # torch.utils.checkpoint (non-reentrant, torch 2.13 torch/utils/checkpoint.py): `preserve_rng_state`
            # stashes the CPU generator's state (a byte tensor), and the frame keeps it and the block's input
            # until the block's backward is done (`_CheckpointFrame.save_inputs`)
            g.layer, g.checkpoint = -1, False
            g.op("rng_state", [x], RNG_STATE_BYTES, saves=(SELF, x))
        g.layer, g.checkpoint = i, plan.recompute == "full"
        x = _block(g, w, x, tokens, dt, threads)
    g.layer, g.phase, g.checkpoint = -1, "loss", False
    y = norm(g, w, x, tokens, e, threads)
    # (a tied head's weight gradient is the embedding's: named alike, it is added into it)
    head = ("embed@embed.L-1" if a.tied_embeddings else "head", e * a.vocab * a.hidden)
    if dt.autocast:
        logits = linear(g, "head", y, a.hidden, a.vocab, tokens, dt, False, param=head[0])
    else:
        # (a frozen head keeps no input)
        logits = g.op("head", [y], e * a.vocab * tokens, grads=(y,), saves=(y,) if g.trainable else (), params=(head,))
    g.ops[-1] = replace(g.ops[-1], holds=(x,))  # (GPT.forward's `x`, the last block's output, to its return)
    # (the loop binds the model's logits until after the loss; lm_loss's fp32 copy goes when the loss returns)
    raw = logits
    if dt.low != 4 or not w.loss.loss_fp32:
        logits = g.op("upcast", [logits], 4 * a.vocab * tokens, grads=(logits,))  # logits.float()
    lsm = g.op("log_softmax", [logits], 4 * a.vocab * tokens, grads=(logits,), saves=(SELF,))
    g.op("nll", [lsm], 4, grads=(lsm,), holds=(raw,))
    return g, list(dict.fromkeys(p for op in g.ops for p in op.params))
