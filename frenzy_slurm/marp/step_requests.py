"""The allocation requests of one whole training step, by phase, for the allocator replay (issue 29): generated
from the model's op sequence, checked against MARP's terms and the sequence a real step makes on the CPU
(benchmarks/step_requests_cpu.py, tests/test_marp_step_requests.py). Not used by predictions yet.

What this module owns: the step's tensors, each allocated when an op makes it and freed when nothing needs it
any more, as torch's autograd does it, phase by phase:

- `forward`: per block, in order, every op's output; a tensor no later op reads and no backward function saves
  is freed after its last reader, a view keeps its base alive (the transients: the norm's square and mean,
  RoPE's products, the attention output before the residual add, SDPA's workspace). What stays alive is the
  block's saved tensors: their bytes are `memory_activations.layer_activation_bytes` (plus the built-in
  model's per-block RoPE tables, `memory_saved`), which tests/test_marp_step_requests.py asserts, so the
  sequence agrees with MARP's totals.
- `loss`: the final norm, the output layer's logits, their fp32 copy where the loss upcasts 16-bit logits, and
  the log-softmax output the loss saves (`memory_loss.logit_bytes_per_token`'s tensors).
- `backward`: the ops in reverse, as torch/csrc/autograd/engine.cpp runs them. Each function allocates its
  workspaces, its parameters' gradients (kept for the optimizer) and its inputs' gradients, and lets go of its
  output's gradient, then its saved tensors no earlier function reads. Only then are its gradients added into
  the ones pending (autograd's InputBuffer): in place where the pending one is neither a view (a linear's
  input gradient is mm's output viewed as 3-d) nor shared, else into a new sum. An add hands its output's
  gradient on unallocated; a tied head's second weight gradient is summed out of place.
- `optimizer`: torch's single-tensor AdamW on the CPU (AdamW is Adam with decoupled decay: torch 2.13's
  torch/optim/adam.py `_single_tensor_adam`, what `foreach=None` picks for CPU tensors): per parameter in model
  order, `denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)` makes two parameter-sized tensors, alive
  together for an instant (MARP's `optimizer_step_buffers` counts one); then `zero_grad(set_to_none=True)` frees
  every gradient in parameter order.

With full activation checkpointing (`recompute: full`, torch.utils.checkpoint non-reentrant per block, as the
built-in model does it), the forward's blocks save nothing: each block's tensors go with their last reader or
Block.forward's locals, and its checkpoint keeps the block's input and a stash of the CPU generator's state. In
backward, the first function of a block that unpacks a saved tensor recomputes the block up to the last op that
saves one (early stop), under a second stash; each recomputed tensor then goes with the function that unpacks it,
before that function lets go of its output's gradient, and the block's input and stash with its first op.

transformers' Llama under its Trainer (`code="hf"`, MODEL_CODES' "hf" profile; transformers 5.17) has its own op
list (`_hf_graph`): the position ids and the packed-sequence probe of its mask code, the rotary tables made once
per forward and saved by every block, `apply_rotary_pos_emb` (`x * cos + cat(-x2, x1) * sin`), SDPA with
`enable_gqa` whose output o_proj reads as a view, and a loss that pads and shifts the labels. The Trainer holds the
logits until its `compute_loss` returns (the backward's first free), clips the gradients (per-parameter norms:
scalars) and steps the fused AdamW, which allocates nothing (`fused_adamw`).

DeepSpeed ZeRO-0 on one rank (the built-in model in its engine, torch's AdamW as `torch_adam` configures it) adds
one request pair to the end of the backward: `engine.backward` all-reduces the gradients through flat buckets
(`_allreduce_buckets`), even on one rank.

In 16 bits (marp/step_dtypes.py owns the dtypes): under bf16 autocast over fp32 weights each linear's weight is
cast to bf16 (cached for the forward, saved by the product; its backward makes the fp32 gradient from the product's
bf16 one) and its fp32 input cast afresh for every linear that reads it; the residual stream stays fp32 (an fp32
residual plus a bf16 projection, on the CPU through an fp32 copy of the projection) and hands the backward's
gradient to the projection as a new bf16 cast. With bf16 weights everything is bf16 but RMSNorm's composite, which
upcasts its input (saving the fp32 copy, not the input) and casts its result back. RoPE's tables are made in fp32
and cast; SDPA's CPU kernel adds its reduced-precision block copies; the loss upcasts the logits.

With LoRA (`method: lora`: the frozen base, adapters on the targeted linears, `_lora`) only what requires grad
makes a graph: an op none of whose inputs requires grad and with no trainable weight saves nothing and has no
backward; a frozen linear keeps no input, a frozen norm weight no normalised value; the adapters' dropout saves its
noise (CPU) and A and B their inputs; AdamW steps the adapters only.

Scope: the built-in model's blocks (frenzy_slurm/models/gpt.py: RMSNorm or LayerNorm, q/k/v projections, RoPE
or learned positions, SDPA, SwiGLU or GELU MLP, biases as the architecture says, a tied or untied head) under a
plain torch loop on one rank, fp32, no or full checkpointing (of every block), no dropout, full training: the CPU
grid's `torch` points, and those with full recomputation; in bf16 (autocast or bf16 weights), or with LoRA in fp32
(`lora-llama-1gpu`), the built-in RMSNorm model without biases, no checkpointing; and the Trainer's transformers
Llama on one process, fp32, no checkpointing (`hf-trainer-llama-1gpu`); and DeepSpeed ZeRO-0 on one rank
(`ds-llama-1gpu`, `ds-gpt2-1gpu`, `ds-llama-1gpu-full`).
Anything else is refused by name (`ValueError`), not approximated. Requests of a few bytes that no size of the
model scales (scalars, index vectors) are not generated: `compare` leaves out requests of at most 4 bytes per
token.

Why an op sequence and not MARP's terms cut into requests (allocator_requests.py does that for one layer): a term
stands for several tensors made and freed at different times (a norm's input and normalised value; q, k and v),
and the transients and gradients have no term at all. The sequence is checked against the terms instead: what
the forward still holds at its end is `memory_saved.saved_activations` (tests/test_marp_step_requests.py).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from frenzy_slurm.marp.allocator_replay import Event, alloc, free, replay
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.step_dtypes import (
    StepDtypes,
    promoted,
    promotion_temporary,
    sdpa_reduced_scratch,
    step_dtypes,
)

PHASES = ("forward", "loss", "backward", "optimizer")
RNG_STATE_BYTES = 5056  # torch.get_rng_state() of the CPU generator (at::CPUGeneratorImpl's state; measured)
SELF = "@out"  # in an op's `saves`: its own output
FP32_STEP = StepDtypes()


@dataclass(frozen=True)
class Request:
    """One allocator request of a step: `phase`, the block it belongs to (-1: outside the blocks), alloc or free of
    tensor `key` of `size` bytes (a free carries its tensor's size)."""

    phase: str
    layer: int
    action: Literal["alloc", "free"]
    key: str
    size: int


@dataclass(frozen=True)
class _Op:
    """One forward op: reads `inputs`, makes `out` (`size` bytes). `saves`: what its backward function keeps;
    `grads`: the inputs it gives a gradient to; `reduce`: inputs broadcast into the output, whose gradient is an
    output-sized product summed down (a temporary); `params`: the parameter gradients it makes (bytes); `scratch`:
    a workspace it allocates and frees while it runs (forward, backward)."""

    name: str
    inputs: tuple[str, ...]
    out: str
    size: int
    saves: tuple[str, ...] = ()
    grads: tuple[str, ...] = ()
    reduce: tuple[str, ...] = ()
    params: tuple[tuple[str, int], ...] = ()
    scratch: tuple[int, int] = (0, 0)
    holds: tuple[str, ...] = ()  # tensors the Python code still binds until this op has run (e.g. `logits`)
    elementwise: bool = False  # its parameter gradients are reductions of output-sized products, after its input's
    params_last: bool = False  # its parameter gradients are made after its input's
    passthrough: tuple[str, ...] = ()  # inputs its backward hands the output's gradient to as it is (an add)
    view: bool = False  # its output shares its first input's storage: nothing is allocated, the input stays alive
    view_grads: bool = False  # the input gradients it makes are views (a linear on 3-d input: mm on a flattening)
    bscratch: int = 1  # how many backward workspaces of `scratch[1]` bytes it makes
    bscratch_last: bool = False  # its backward makes its workspace after its input gradients (a kernel's buffer)
    scratch2: tuple[int, int] = (0, 0)  # a second workspace (forward, backward), made after the first, gone before it
    unwanted: tuple[str, ...] = ()  # inputs not requiring grad whose gradient its kernel makes anyway, then drops


@dataclass
class _Graph:
    """The step's forward ops with each tensor's size and block."""

    ops: list[_Op] = field(default_factory=list)
    sizes: dict[str, int] = field(default_factory=dict)
    layer_of: dict[str, int] = field(default_factory=dict)
    phase_of: dict[str, str] = field(default_factory=dict)  # op name -> forward phase
    base: dict[str, str] = field(default_factory=dict)  # view -> the tensor whose storage it shares
    checkpointed: dict[str, int] = field(default_factory=dict)  # op -> its block, where the block is recomputed
    checkpoint: bool = False  # the blocks' ops made now are recomputed in backward
    held: tuple[str, ...] = ()  # what the training loop holds from the forward into the backward's start
    layer: int = -1
    phase: str = "forward"
    trainable: bool = True  # the parameters of the ops made now get gradients (False: LoRA's frozen base)
    rg: set[str] = field(default_factory=set)  # the tensors that require grad

    def storage(self, k: str) -> str:
        """The tensor whose storage `k` is (itself, or a view's base)."""
        return self.base.get(k, k)

    def op(
        self,
        name: str,
        inputs: Sequence[str],
        size: float,
        *,
        saves: Sequence[str] = (),
        grads: Sequence[str] = (),
        reduce: Sequence[str] = (),
        params: Sequence[tuple[str, float]] = (),
        scratch: tuple[float, float] = (0, 0),
        holds: Sequence[str] = (),
        elementwise: bool = False,
        params_last: bool = False,
        passthrough: Sequence[str] = (),
        view: bool = False,
        view_grads: bool = False,
        bscratch: int = 1,
        bscratch_last: bool = False,
        scratch2: tuple[float, float] = (0, 0),
        trainable: bool | None = None,
        all_grads: bool = False,
    ) -> str:
        """Appends an op of the current block and phase; returns its output's key (`SELF` in `saves` names it).
        Parameter names are made the op's own (`name@op`), unless they name another op's already. `trainable`
        (default the graph's): its parameters get gradients. An op none of whose inputs requires grad and which has
        no trainable parameter is not recorded by autograd: it saves nothing and has no backward; one that is
        gives gradients only to its inputs that require grad; `all_grads`: its backward kernel makes every input's
        gradient, wanted or not. (What an op saves only for its parameters' gradients the caller leaves out where
        they are frozen.)"""
        out = f"{name}.L{self.layer}"
        while out in self.sizes:  # (a second norm in the block)
            out += "'"
        params = params if (self.trainable if trainable is None else trainable) else ()
        if any(k in self.rg for k in inputs) or params:
            self.rg.add(out)
        else:
            saves, reduce, passthrough = (), (), ()
        unwanted = tuple(k for k in grads if k not in self.rg) if all_grads else ()
        grads = [k for k in grads if k in self.rg or k in unwanted]
        self.sizes[out] = int(size)
        self.layer_of[out] = self.layer
        self.phase_of[out] = self.phase
        op = _Op(
            name=out,
            inputs=tuple(inputs),
            out=out,
            size=int(size),
            saves=tuple(out if k == SELF else k for k in saves),
            grads=tuple(grads),
            reduce=tuple(reduce),
            params=tuple((p if "@" in p else f"{p}@{out}", int(b)) for p, b in params),
            scratch=(int(scratch[0]), int(scratch[1])),
            holds=tuple(holds),
            elementwise=elementwise,
            params_last=params_last or elementwise,
            passthrough=tuple(passthrough),
            view=view,
            view_grads=view_grads,
            bscratch=bscratch,
            bscratch_last=bscratch_last,
            scratch2=(int(scratch2[0]), int(scratch2[1])),
            unwanted=unwanted,
        )
        self.ops.append(op)
        if self.checkpoint:
            self.checkpointed[out] = self.layer
        if view:
            self.base[out] = self.storage(inputs[0])
        return out


def _variant_reasons(w: Workload, plan: ParallelPlan, code: str) -> list[str]:
    """The 16-bit and LoRA steps the generator does not make: both only for the built-in RMSNorm model without
    biases in a plain torch loop, without checkpointing; LoRA in fp32."""
    plain = (
        code == "frenzy"
        and w.framework == "torch"
        and plan.recompute == "none"
        and w.arch.norm == "rmsnorm"
        and w.arch.bias == "none"
    )
    reasons = []
    if w.precision not in ("fp32", "bf16-mixed", "bf16-pure"):
        reasons.append(f"precision {w.precision}")
    elif w.precision != "fp32" and not plain:
        reasons.append(f"precision {w.precision} beyond the built-in RMSNorm model without biases in a plain loop")
    if w.method not in ("full", "lora"):
        reasons.append(f"method {w.method}")
    elif w.method == "lora" and not (plain and w.precision == "fp32"):
        reasons.append("method lora beyond the built-in RMSNorm model without biases in a plain loop, fp32")
    return reasons


def _check_scope(w: Workload, plan: ParallelPlan, code: str) -> None:
    reasons = []
    a = w.arch
    if code not in ("frenzy", "hf"):
        reasons.append(f"model code {code}")
    elif code == "hf" and (
        a.norm != "rmsnorm"
        or a.position != "rope"
        or a.activation != "swiglu"
        or a.bias != "none"
        or plan.recompute != "none"
    ):
        reasons.append("transformers' Llama only (RMSNorm, RoPE, SwiGLU, no biases), without checkpointing")
    if w.framework not in ("torch", "deepspeed") or (w.framework == "deepspeed" and (plan.zero or plan.pp > 1)):
        reasons.append(
            f"framework {w.framework}" + (f" ZeRO-{plan.zero}, pp {plan.pp}" if plan.zero or plan.pp > 1 else "")
        )
    reasons += _variant_reasons(w, plan, code)
    if plan.recompute not in ("none", "full"):
        reasons.append(f"recompute {plan.recompute}")
    elif plan.recompute == "full" and plan.recompute_layers not in (None, w.arch.layers):
        reasons.append(f"recompute full of {plan.recompute_layers} of {w.arch.layers} blocks")
    if plan.world > 1:
        reasons.append(f"{plan.world} ranks")
    if w.activations.attention not in ("sdpa", "flash"):
        reasons.append(f"attention {w.activations.attention}")
    if w.arch.head == "classification" or w.loss.loss_chunks > 1 or w.loss.fused_linear_loss:
        reasons.append("a loss other than one cross-entropy over the whole logits")
    if w.arch.dropout > 0:
        reasons.append(f"dropout {w.arch.dropout}")
    if reasons:
        raise ValueError(
            "step_requests generates the built-in model's step under a plain torch loop or DeepSpeed ZeRO-0, or "
            "transformers' Llama under its Trainer, on one rank (fp32, full training, SDPA, no dropout; the built-in "
            "model with no or full checkpointing, and in bf16 autocast, bf16 weights or LoRA without checkpointing); "
            f"not yet: {', '.join(reasons)}"
        )


def _norm(g: _Graph, w: Workload, x: str, tokens: int, e: float, threads: int) -> str:
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


def _linear(
    g: _Graph, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, bias: bool, param: str = ""
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
    g: _Graph, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, params: Sequence[tuple[str, int]]
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
    g: _Graph, w: Workload, x: str, width: int, tokens: int, e: float, tag: str, holds: tuple[str, ...] = ()
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


def _sdpa_scratch(w: Workload, threads: int, dt: StepDtypes = FP32_STEP) -> tuple[tuple[int, int], tuple[int, int]]:
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


def _block(g: _Graph, w: Workload, x: str, tokens: int, dt: StepDtypes, threads: int) -> str:
    """One of the built-in model's blocks (frenzy_slurm/models/gpt.py Block.forward). The residual stream is in the
    weights' dtype; the projections, RoPE, the attention and the MLP's activations in `dt.low` (under autocast the
    products make bf16, and an fp32 residual plus a bf16 projection is fp32)."""
    a = w.arch
    h, kvd, f = a.hidden, a.kv * a.head_dim, a.ffn
    e, lo = dt.param, dt.low
    qkv_bias, all_bias = a.bias in ("qkv", "all"), a.bias == "all"
    x0, y = x, _norm(g, w, x, tokens, e, threads)
    q = _adapted(g, w, "q", y, h, h, tokens, dt, qkv_bias)
    k = _adapted(g, w, "k", y, h, kvd, tokens, dt, qkv_bias)
    v = _adapted(g, w, "v", y, h, kvd, tokens, dt, qkv_bias)
    if a.position == "rope":
        # (the head-major views of the projections: RoPE's gradient comes back head-major, and viewing it as
        # (tokens, width) again copies it)
        qh = g.op("heads_q", [q], lo * h * tokens, grads=(q,), view=True)
        kh = g.op("heads_k", [k], lo * kvd * tokens, grads=(k,), view=True)
        # (`q, k = _rope(q), _rope(k)`: the projections are let go once both calls have returned)
        q, k = _rope(g, w, qh, h, tokens, lo, "q"), _rope(g, w, kh, kvd, tokens, lo, "k", holds=(k, q))
    # SDPA's CPU flash kernel: output and per-row log-sum-exp (fp32) saved, with q, k and v; its backward zeroes
    # the gradients of q, k and v, then takes its buffer (and in 16 bits its reduced copies)
    sdpa, reduced = _sdpa_scratch(w, threads, dt)
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
    o = _adapted(g, w, "o", o_in, h, h, tokens, dt, all_bias)
    x = _residual(g, "residual1", x, o, h * tokens, dt)
    y1, y = y, _norm(g, w, x, tokens, e, threads)
    g.ops[-1] = replace(g.ops[-1], holds=(*g.ops[-1].holds, y1))  # (`h = self.norm2(x)` rebinds the first)
    if a.gated:
        gate = _adapted(g, w, "gate", y, h, f, tokens, dt, False)
        act = g.op("silu", [gate], lo * f * tokens, grads=(gate,), saves=(gate,))
        up = _adapted(g, w, "up", y, h, f, tokens, dt, all_bias)
        m = g.op("product", [act, up], lo * f * tokens, grads=(act, up), saves=(act, up))
    else:
        up = _adapted(g, w, "up", y, h, f, tokens, dt, all_bias)
        m = g.op("gelu", [up], lo * f * tokens, grads=(up,), saves=(up,))
    d = _adapted(g, w, "down", m, f, h, tokens, dt, all_bias)
    # (Block.forward's locals x, h, q, k, v, att, m, let go in that order when it returns: where the block is
    # checkpointed they are what keeps its tensors alive to its end; its input, the caller's `x`, goes after)
    return _residual(g, "residual2", x, d, h * tokens, dt, holds=(x, y, q, k, v, att, m, x0))


def _adapted(
    g: _Graph, w: Workload, name: str, x: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes, bias: bool
) -> str:
    """A block's linear, with LoRA's adapter where model.yaml targets it (`_lora`)."""
    base = _linear(g, name, x, n_in, n_out, tokens, dt, bias)
    if w.method != "lora" or name not in w.adapters.lora_targets:
        return base
    return _lora(g, w, name, x, base, n_in, n_out, tokens, dt)


def _lora(
    g: _Graph, w: Workload, name: str, x: str, base: str, n_in: int, n_out: int, tokens: int, dt: StepDtypes
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


def _residual(g: _Graph, name: str, x: str, o: str, elements: int, dt: StepDtypes, holds: tuple[str, ...] = ()) -> str:
    """`x + o`: the sum in the wider dtype (on the CPU the narrower input copied to it first, a temporary). Its
    backward hands its gradient on, as it is, to an input of the sum's dtype, and as a new cast (autograd's engine,
    `validate_outputs`) to a narrower one."""
    a, b = g.sizes[x] / elements, g.sizes[o] / elements
    out = promoted(a, b)
    temporary = promotion_temporary(dt, a, b, elements)
    keep = tuple(k for k, n in ((x, a), (o, b)) if n == out)
    return g.op(name, [x, o], out * elements, grads=(x, o), passthrough=keep, scratch=(temporary, 0), holds=holds)


def _graph(
    w: Workload, plan: ParallelPlan, threads: int, dt: StepDtypes = FP32_STEP
) -> tuple[_Graph, list[tuple[str, int]]]:
    """The step's forward ops, and the parameters (name, bytes) in the model's order. The embeddings run in the
    weights' dtype (autocast leaves them alone)."""
    a = w.arch
    tokens = plan.micro_batch * w.seq_len
    e = dt.param
    g = _Graph(trainable=w.method == "full")
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
    y = _norm(g, w, x, tokens, e, threads)
    # (a tied head's weight gradient is the embedding's: named alike, it is added into it)
    head = ("embed@embed.L-1" if a.tied_embeddings else "head", e * a.vocab * a.hidden)
    if dt.autocast:
        logits = _linear(g, "head", y, a.hidden, a.vocab, tokens, dt, False, param=head[0])
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


def _hf_rope(g: _Graph, x: str, width: int, tokens: int, e: float, cos: str, sin: str, tag: str) -> str:
    """transformers' `apply_rotary_pos_emb` on one of q, k (head-major views): `x * cos + rotate_half(x) * sin`,
    `rotate_half` = `cat((-x2, x1))` of the halves (views, whose gradients are scattered into full-size zeros);
    the cos/sin tables are the model's, made once per forward."""
    full, half = e * width * tokens, e * width / 2 * tokens
    xc = g.op("xcos" + tag, [x], full, grads=(x,), saves=(cos,))
    x1 = g.op("first" + tag, [x], half, grads=(x,), view=True)
    x2 = g.op("second" + tag, [x], half, grads=(x,), view=True)
    neg = g.op("neg" + tag, [x2], half, grads=(x2,))
    # (cat's backward hands each input a slice of its gradient: views)
    rot = g.op("cat" + tag, [neg, x1], full, grads=(neg, x1), passthrough=(neg, x1))
    rs = g.op("rsin" + tag, [rot], full, grads=(rot,), saves=(sin,))
    return g.op("rope" + tag, [xc, rs], full, grads=(xc, rs), passthrough=(xc, rs))


def _hf_block(g: _Graph, w: Workload, x: str, tokens: int, e: float, threads: int, cos: str, sin: str) -> str:
    """transformers 5.17's LlamaDecoderLayer (models/llama/modeling_llama.py), fp32, SDPA: RMSNorm as the
    built-in model's composite (its `variance + eps` is one value per token, under the size floor), q/k/v
    projections viewed head-major, `apply_rotary_pos_emb` on q and k, SDPA with `enable_gqa` (no repeat_kv:
    integrations/sdpa_attention.py `use_gqa_in_sdpa`), whose sequence-major output o_proj reads as a view, the
    SwiGLU MLP."""
    a = w.arch
    h, kvd = a.hidden, a.kv * a.head_dim
    y = _norm(g, w, x, tokens, e, threads)
    q = _linear(g, "q", y, h, h, tokens, FP32_STEP, False)
    k = _linear(g, "k", y, h, kvd, tokens, FP32_STEP, False)
    v = _linear(g, "v", y, h, kvd, tokens, FP32_STEP, False)
    qh = g.op("heads_q", [q], e * h * tokens, grads=(q,), view=True)
    kh = g.op("heads_k", [k], e * kvd * tokens, grads=(k,), view=True)
    qr = _hf_rope(g, qh, h, tokens, e, cos, sin, "q")
    kr = _hf_rope(g, kh, kvd, tokens, e, cos, sin, "k")
    g.ops[-1] = replace(g.ops[-1], holds=(q, k))  # (`q, k = apply_rotary_pos_emb(q, k, ...)` rebinds both)
    sdpa, _ = _sdpa_scratch(w, threads)
    att = g.op("sdpa", [qr, kr, v], e * h * tokens, grads=(qr, kr, v), scratch=(0, sdpa[1]), bscratch_last=True)
    lse = g.op("lse", [att], 4 * a.heads * tokens, scratch=(sdpa[0], 0))
    g.ops[-2] = replace(g.ops[-2], saves=(qr, kr, v, att, lse))
    o = _linear(g, "o", att, h, h, tokens, FP32_STEP, False)
    x = g.op("residual1", [x, o], e * h * tokens, grads=(x, o), passthrough=(x, o))
    y = _norm(g, w, x, tokens, e, threads)
    gate = _linear(g, "gate", y, h, a.ffn, tokens, FP32_STEP, False)
    act = g.op("silu", [gate], e * a.ffn * tokens, grads=(gate,), saves=(gate,))
    up = _linear(g, "up", y, h, a.ffn, tokens, FP32_STEP, False)
    m = g.op("product", [act, up], e * a.ffn * tokens, grads=(act, up), saves=(act, up))
    d = _linear(g, "down", m, a.ffn, h, tokens, FP32_STEP, False)
    return g.op("residual2", [x, d], e * h * tokens, grads=(x, d), passthrough=(x, d))


def _hf_graph(w: Workload, plan: ParallelPlan, threads: int) -> _Graph:
    """transformers 5.17's LlamaForCausalLM as the Trainer runs it (fp32, no cache, no attention mask), its
    forward and loss ops."""
    a = w.arch
    b, s = plan.micro_batch, w.seq_len
    tokens, e = b * s, 4.0
    g = _Graph()
    x = g.op("embed", ["tokens"], e * a.hidden * tokens, params=(("embed", e * a.vocab * a.hidden),))
    # LlamaModel.forward: `position_ids = torch.arange(s) + past_seen_tokens` (int64), kept to its return
    position_ids = g.op("position_ids", [g.op("positions_arange", [], 8 * s)], 8 * s)
    # masking_utils.find_packed_sequence_indices (no cache, no mask): the position ids (1 x s, expanded over the
    # batch) diffed with a prepended column (cat, then the difference) and `(diff != 1).cumsum(-1)` (its bool
    # operand made int64 first, the result made before that copy): int64 per token, freed when it returns
    cat = g.op("positions_cat", [], 8 * b * (s + 1))
    diff = g.op("positions_diff", [cat], 8 * b * s)
    cum = g.op("positions_cumsum", [], 8 * b * s)
    g.op("positions_found", [g.op("positions_long", [], 8 * b * s)], 0, holds=(diff, cum))
    # LlamaRotaryEmbedding: `freqs` (s x head_dim/2), `emb = cat((freqs, freqs))`, cos and sin of it each times
    # `attention_scaling` (a new tensor): the two tables every block's rotation saves
    freqs = g.op("freqs", [], 4 * s * a.head_dim // 2)
    emb = g.op("emb", [freqs], 4 * s * a.head_dim)
    cos = g.op("cos", [g.op("cos_raw", [emb], 4 * s * a.head_dim)], 4 * s * a.head_dim)
    sin = g.op("sin", [g.op("sin_raw", [emb], 4 * s * a.head_dim)], 4 * s * a.head_dim, holds=(freqs, emb))
    for i in range(a.layers):
        g.layer = i
        x = _hf_block(g, w, x, tokens, e, threads, cos, sin)
    g.layer, g.phase = -1, "loss"
    y = _norm(g, w, x, tokens, e, threads)
    g.ops[-1] = replace(g.ops[-1], holds=(*g.ops[-1].holds, position_ids))  # (LlamaModel.forward returns)
    head = ("embed@embed.L-1" if a.tied_embeddings else "head", e * a.vocab * a.hidden)
    logits = g.op("head", [y], e * a.vocab * tokens, grads=(y,), saves=(y,), params=(head,))
    # loss/loss_utils.py ForCausalLMLoss: `labels = pad(labels, (0, 1), value=-100)`, `labels[..., 1:].contiguous()`
    # (int64), fp32 logits used as they are; cross-entropy's log-softmax, nll saves the shifted labels. The
    # padded labels go when the loss function returns; the model's output (the logits) when the Trainer's
    # compute_loss does, after the forward
    pad = g.op("labels_pad", [], 8 * b * (s + 1))
    # (with one sequence the shifted slice is contiguous already: `.contiguous()` returns it, a view)
    shift = g.op("labels_shift", [pad], 8 * b * s, view=b == 1)
    lsm = g.op("log_softmax", [logits], 4 * a.vocab * tokens, grads=(logits,), saves=(SELF,))
    g.op("nll", [lsm, shift], 4, grads=(lsm,), saves=(shift,), holds=(pad,))
    g.held = (logits,)
    return g


class _Emitter:
    """Appends requests and keeps the live tensors' sizes."""

    def __init__(self, step: int) -> None:
        self.out: list[Request] = []
        self.live: dict[str, int] = {}
        self.step = step

    def alloc(self, phase: str, layer: int, key: str, size: int) -> None:
        if size <= 0:
            return
        self.live[key] = size
        self.out.append(Request(phase, layer, "alloc", f"s{self.step}.{key}", size))

    def free(self, phase: str, layer: int, key: str) -> None:
        if key in self.live:
            self.out.append(Request(phase, layer, "free", f"s{self.step}.{key}", self.live.pop(key)))


def _forward(g: _Graph, em: _Emitter) -> None:
    """Each op's output and scratch; a tensor is freed after its last reader unless a backward function saves
    it. A checkpointed block's ops save nothing: their saved tensors are packed into placeholders
    (`_checkpoint_hook`), so only the block's input stays, kept by its checkpoint."""
    saved = {g.storage(k) for op in g.ops if op.out not in g.checkpointed for k in op.saves}
    _run(g, em, range(len(g.ops)), saved | set(g.held), "forward")


def _run(g: _Graph, em: _Emitter, ops: Sequence[int], saved: set[str], phase: str) -> None:
    """Ops `ops` of the forward, in order (phase `phase`, else the op's own): outputs and scratch, each tensor freed
    after its last reader among them unless in `saved`."""
    last_read: dict[str, int] = {}
    for n in ops:
        for k in (*g.ops[n].inputs, *g.ops[n].holds):
            last_read[g.storage(k)] = n  # (reading a view reads its base's storage)
    for n in ops:
        op = g.ops[n]
        where, layer = g.phase_of[op.out] if phase == "forward" else phase, g.layer_of[op.out]
        if not op.view:
            em.alloc(where, layer, op.out, op.size)
        em.alloc(where, layer, op.out + ".scratch", op.scratch[0])
        em.alloc(where, layer, op.out + ".scratch2", op.scratch2[0])
        em.free(where, layer, op.out + ".scratch2")
        em.free(where, layer, op.out + ".scratch")
        # (the temporaries first, then what the Python code binds)
        for k in dict.fromkeys(g.storage(k) for k in (*(k for k in op.inputs if k not in op.holds), *op.holds, op.out)):
            if last_read.get(k, n) <= n and k not in saved:
                em.free(where, layer, k)


def _recompute(g: _Graph, em: _Emitter, block: int) -> None:
    """The checkpointed block's forward again, when its backward first unpacks a saved tensor
    (`_checkpoint_hook.unpack_hook`): under `torch.random.fork_rng` (a second stash of the generator's state,
    freed when the recomputation ends), the block's ops up to the last one that saves a tensor, which keep what
    they save (`_recomputation_hook`). There the recomputation stops (`_StopRecomputationError`, early stop: after
    packing the last op's inputs, before its output unless it saves that), and whatever else it still holds is let
    go."""
    ops = [n for n, op in enumerate(g.ops) if g.checkpointed.get(op.out) == block]
    last = max(n for n in ops if g.ops[n].saves)
    ops = [n for n in ops if n <= last]
    saved = {g.storage(k) for n in ops for k in g.ops[n].saves}
    stop = g.ops[last]
    if stop.out not in stop.saves:  # (its output is never made: the inputs were packed first)
        ops.pop()
    key = f"rng_state.recompute.L{block}"
    em.alloc("backward", -1, key, RNG_STATE_BYTES)
    _run(g, em, ops, saved, "backward")
    for n in ops:
        k = g.storage(g.ops[n].out)
        if k not in saved:
            em.free("backward", block, k)
    em.free("backward", -1, key)


class _Grads:
    """The pending gradients of the backward: tensor -> its gradient's key, each gradient with the number of
    tensors it is pending for (a residual add hands its output's gradient to both inputs, unallocated)."""

    def __init__(self, em: _Emitter) -> None:
        self.em = em
        self.of: dict[str, str] = {}
        self.refs: Counter[str] = Counter()
        self.views: set[str] = set()

    def give(self, layer: int, k: str, key: str, view: bool = False) -> None:
        """Tensor `k` receives gradient `key` (`view`: a view of another tensor; the caller counted the reference):
        its first, or added into the one pending: in place where that one is no view and nothing else holds it
        (autograd's InputBuffer::accumulate), else into a new sum."""
        if view:
            self.views.add(key)
        if k not in self.of:
            self.of[k] = key
            return
        old = self.of[k]
        if self.refs[old] > 1 or old in self.views:
            total = f"{key}.sum"
            self.em.alloc("backward", layer, total, self.em.live.get(old, 0))
            self.refs[total] += 1
            self.of[k] = total
            self.release(layer, old)
        self.release(layer, key)

    def release(self, layer: int, key: str) -> None:
        self.refs[key] -= 1
        if self.refs[key] <= 0:
            self.em.free("backward", layer, key)


def _backward_op(
    g: _Graph, em: _Emitter, gr: _Grads, op: _Op, grad_of: dict[str, str], unpacked: Sequence[str] = ()
) -> list[tuple[str, str, bool]]:
    """One op's backward as autograd's engine runs it (torch/csrc/autograd/engine.cpp `evaluate_function`): the
    function makes its scratch, parameter and input gradients (in the op's order), lets go of `unpacked` (a
    checkpointed op's saved tensors: only the function's locals still hold them), and of its output's gradient;
    returns the input gradients (tensor, gradient, is a view), which the engine adds into the pending ones only
    after the function's saved tensors are released."""
    layer = g.layer_of[op.out]
    scratch = [f"{op.out}.bscratch{n}" for n in range(op.bscratch if op.scratch[1] else 0)]
    for key in [] if op.bscratch_last else scratch:
        em.alloc("backward", layer, key, op.scratch[1])
    if not op.params_last:
        _param_grads(em, op, layer, grad_of)
    out_grad = gr.of.pop(op.out)
    made = []
    for k in dict.fromkeys(op.grads):
        if k in op.passthrough:  # (the output's gradient itself, held one more time)
            gr.refs[out_grad] += 1
            made.append((k, out_grad, False))
            continue
        if k in op.reduce:  # an output-sized product summed down to the broadcast input
            em.alloc("backward", layer, f"{op.out}.reduce.{k}", op.size)
            em.free("backward", layer, f"{op.out}.reduce.{k}")
        key = f"grad.{k}.from.{op.out}"
        em.alloc("backward", layer, key, g.sizes.get(k, 0))
        if key in em.live and k not in op.unwanted:
            gr.refs[key] += 1
            made.append((k, key, op.view_grads))
    if op.params_last:
        _param_grads(em, op, layer, grad_of)
    for key in scratch if op.bscratch_last else []:
        em.alloc("backward", layer, key, op.scratch[1])
    em.alloc("backward", layer, f"{op.out}.bscratch2", op.scratch2[1])  # (its reduced-precision copies)
    em.free("backward", layer, f"{op.out}.bscratch2")
    for key in scratch:
        em.free("backward", layer, key)
    for k in op.unwanted:  # (dropped as the function returns)
        em.free("backward", layer, f"grad.{k}.from.{op.out}")
    for k in unpacked:
        em.free("backward", layer, k)
    gr.release(layer, out_grad)
    return made


def _param_grads(em: _Emitter, op: _Op, layer: int, grad_of: dict[str, str]) -> None:
    """The parameters' gradients of `op`, kept for the optimizer (`grad_of`: each parameter's .grad). A tied
    weight's second gradient is added to the first into a new tensor (AccumulateGrad's `grad + new_grad`, as the
    CPU step's profile shows). An elementwise op's (a norm's scale) is an output-sized product summed down to the
    parameter's shape."""
    for p, size in op.params:
        if op.elementwise:
            em.alloc("backward", layer, f"{op.out}.reduce.{p}", op.size)
        key = f"grad.{p}.from.{op.out}"
        em.alloc("backward", layer, key, size)
        if p in grad_of:
            em.alloc("backward", layer, key + ".sum", size)
            em.free("backward", layer, grad_of[p])
            em.free("backward", layer, key)
            key += ".sum"
        grad_of[p] = key
        if op.elementwise:
            em.free("backward", layer, f"{op.out}.reduce.{p}")


def _saved_frees(g: _Graph) -> dict[int, list[str]]:
    """Per op, the saved tensors (storage) let go after its backward: those no op before it saves (the earliest
    saver runs last in backward). A checkpointed block's frame (its stashed generator state and its input) dies
    with the block's first op, the last of its graph to run."""
    out: dict[int, list[str]] = {}
    seen: set[str] = set()
    first: dict[int, int] = {}
    for n, op in enumerate(g.ops):
        block = g.checkpointed.get(op.out)
        if block is not None:
            first.setdefault(block, n)
        for k in op.saves:
            if k not in seen:
                seen.add(k)
                out.setdefault(n, []).append(g.storage(k))
    for n, op in enumerate(g.ops):
        if op.name.startswith("rng_state"):  # (the frame of the block that follows it)
            out.setdefault(first[g.checkpointed[g.ops[n + 1].out]], []).extend(out.pop(n, []))
    return out


def _backward(g: _Graph, em: _Emitter) -> dict[str, str]:
    """The ops in reverse from the loss's gradient (`_backward_op`); after each, the saved tensors no op before
    it reads. Returns each parameter's .grad key."""
    frees = _saved_frees(g)
    for k in g.held:
        em.free("backward", -1, k)
    gr = _Grads(em)
    loss_grad = "grad." + g.ops[-1].out
    em.alloc("backward", -1, loss_grad, 4)
    gr.refs[loss_grad] += 1
    gr.give(-1, g.ops[-1].out, loss_grad)
    grad_of: dict[str, str] = {}  # parameter -> its .grad's key
    recomputed: set[int] = set()
    for n in range(len(g.ops) - 1, -1, -1):
        op = g.ops[n]
        block = g.checkpointed.get(op.out)
        if block is not None and block not in recomputed and op.saves and op.out in gr.of:
            recomputed.add(block)
            _recompute(g, em, block)
        # (a checkpointed op's saved tensors are the recomputed ones it unpacked: they go with its locals)
        ran = op.out in gr.of
        unpacked = frees.pop(n, []) if block is not None and ran else []
        made = _backward_op(g, em, gr, op, grad_of, unpacked) if ran else []
        for k in frees.pop(n, []):
            em.free("backward", g.layer_of.get(k, g.layer_of[op.out]), k)
        for k, key, view in made:
            gr.give(g.layer_of[op.out], k, key, view)
    return grad_of


def _optimizer(params: list[tuple[str, int]], em: _Emitter, grad_of: dict[str, str], fused: bool) -> None:
    """torch's single-tensor AdamW (CPU): per parameter, sqrt(exp_avg_sq) and the denominator; the loop's `denom`
    keeps each denominator until the next parameter's is assigned (the last one until the step returns); then
    zero_grad. The fused AdamW (`fused=True`, aten/src/ATen/native/cpu/FusedAdamKernel.cpp) updates in place,
    element by element: nothing but zero_grad."""
    previous = ""
    for p, size in [] if fused else params:
        em.alloc("optimizer", -1, f"sqrt.{p}", size)
        em.alloc("optimizer", -1, f"denom.{p}", size)
        em.free("optimizer", -1, f"sqrt.{p}")
        em.free("optimizer", -1, previous)
        previous = f"denom.{p}"
    em.free("optimizer", -1, previous)
    for p, _ in params:
        em.free("optimizer", -1, grad_of[p])


def step_requests(
    w: Workload,
    plan: ParallelPlan,
    step: int = 0,
    threads: int = 1,
    code: str = "frenzy",
    fused_adamw: bool = False,
    device: str = "cpu",
) -> list[Request]:
    """One training step's requests, phase by phase (the module docstring); keys carry `step`, so that several
    steps can be replayed one after another; `threads`: the CPU threads SDPA's kernel takes a workspace for;
    `code`: the model code profile (marp/frameworks.py MODEL_CODES: "frenzy", the built-in model; "hf",
    transformers' Llama); `fused_adamw`: the optimizer is torch's fused AdamW (the Trainer's default from
    transformers 4.54 with torch 2.8: framework_facts.hf_trainer_fused_adamw), else its single-tensor loop;
    `device`: whose kernels ("cpu", as recorded; "cuda" leaves out the CPU kernels' own buffers: SDPA's
    workspaces, TensorIterator's promotion copies). ValueError outside the module's scope."""
    _check_scope(w, plan, code)
    if code == "hf":
        g = _hf_graph(w, plan, threads)
        params = list(dict.fromkeys(p for op in g.ops for p in op.params))
    else:
        g, params = _graph(w, plan, threads, step_dtypes(w.precision, device))
    em = _Emitter(step)
    _forward(g, em)
    grad_of = _backward(g, em)
    if w.framework == "deepspeed":
        _allreduce_buckets(params, em)
    _optimizer(params, em, grad_of, fused_adamw)
    return em.out


DS_ALLREDUCE_ELEMENTS = 500_000_000  # deepspeed/runtime/engine.py MEMORY_OPT_ALLREDUCE_SIZE (DeepSpeed 0.19)


def _allreduce_buckets(params: list[tuple[str, int]], em: _Emitter) -> None:
    """DeepSpeed's ZeRO-0 gradient all-reduce at the end of `engine.backward` (engine.py `allreduce_no_retain`,
    even on one rank): the gradients in parameter order, a bucket closed once it holds more than
    `DS_ALLREDUCE_ELEMENTS`; each bucket flattened into one new tensor (`_flatten_dense_tensors`: torch.cat),
    reduced in place, copied back into the gradients and let go."""
    buckets: list[int] = [0]
    for _, size in params:
        buckets[-1] += size
        if buckets[-1] / 4 > DS_ALLREDUCE_ELEMENTS:  # (fp32 gradients)
            buckets.append(0)
    for n, size in enumerate(b for b in buckets if b):
        em.alloc("backward", -1, f"allreduce.bucket{n}", size)
        em.free("backward", -1, f"allreduce.bucket{n}")


@dataclass(frozen=True)
class PhaseMatch:
    """How one phase's generated requests match the recorded ones (requests above the size floor only)."""

    recorded_bytes: int  # allocated in the phase
    generated_bytes: int
    matched_bytes: int  # of the recorded, by a generated request of the same size (each used once)
    recorded_requests: int
    matched_requests: int
    free_order: float  # longest common subsequence of the two phases' free sizes / the longer's length (1: none)
    alloc_order: float  # the same of their allocation sizes

    @property
    def bytes_error(self) -> float:
        return (self.generated_bytes - self.recorded_bytes) / max(self.recorded_bytes, 1)

    @property
    def matched_fraction(self) -> float:
        """Of the recorded bytes, the part a generated request of the same size stands for."""
        return self.matched_bytes / max(self.recorded_bytes, 1)

    def __str__(self) -> str:
        return (
            f"bytes {self.recorded_bytes} recorded, {self.generated_bytes} generated ({self.bytes_error:+.1%}); "
            f"{self.matched_fraction:.1%} of the bytes and {self.matched_requests}/{self.recorded_requests} requests "
            f"matched by size; order of allocations {self.alloc_order:.1%}, of frees {self.free_order:.1%}"
        )


def _lcs(a: Sequence[int], b: Sequence[int]) -> int:
    row = [0] * (len(b) + 1)
    for x in a:
        prev = 0
        for j, y in enumerate(b):
            cur = row[j + 1]
            row[j + 1] = prev + 1 if x == y else max(row[j + 1], row[j])
            prev = cur
    return row[-1]


def compare(recorded: Iterable[Request], generated: Iterable[Request], tokens: int) -> dict[str, PhaseMatch]:
    """Per phase: allocated bytes, the multiset of allocation sizes matched exactly, and the order of the
    allocations' and the frees' sizes, over requests larger than 4 bytes per token (smaller ones are scalars and
    index vectors no size of the model scales, which the generator does not make)."""
    floor = 4 * tokens
    rec, gen = list(recorded), list(generated)
    out = {}
    for phase in PHASES:
        ra = [r.size for r in rec if r.phase == phase and r.action == "alloc" and r.size > floor]
        ga = [r.size for r in gen if r.phase == phase and r.action == "alloc" and r.size > floor]
        common = Counter(ra) & Counter(ga)
        rf = [r.size for r in rec if r.phase == phase and r.action == "free" and r.size > floor]
        gf = [r.size for r in gen if r.phase == phase and r.action == "free" and r.size > floor]
        out[phase] = PhaseMatch(
            recorded_bytes=sum(ra),
            generated_bytes=sum(ga),
            matched_bytes=sum(size * n for size, n in common.items()),
            recorded_requests=len(ra),
            matched_requests=sum(common.values()),
            free_order=_lcs(rf, gf) / max(len(rf), len(gf)) if rf or gf else 1.0,
            alloc_order=_lcs(ra, ga) / max(len(ra), len(ga)) if ra or ga else 1.0,
        )
    return out


def events_of(requests: Iterable[Request], repeat: int = 1) -> list[Event]:
    """Allocator events of `requests`, `repeat` times over (keys made distinct per repetition); a free of a tensor
    allocated before the requests began (a recorded step's free of an older block) is left out."""
    reqs = list(requests)
    out: list[Event] = []
    for n in range(repeat):
        live: set[str] = set()
        for r in reqs:
            key = f"{n}.{r.key}"
            if r.action == "alloc":
                live.add(key)
                out.append(alloc(key, r.size))
            elif key in live:
                live.discard(key)
                out.append(free(key))
    return out


def replay_peaks(requests: Iterable[Request], repeat: int = 2, settings: str = "") -> tuple[int, int]:
    """(allocated peak, reserved peak) of `requests` replayed `repeat` times through a fresh caching allocator."""
    result = replay(events_of(requests, repeat), settings)
    return result.allocated_peak, result.reserved_peak


def alive_at_forward_end(requests: Iterable[Request]) -> int:
    """Bytes the step's forward allocated and still holds when it ends: the saved activations (and the last
    block's output), what MARP's `saved_activations` counts for the blocks."""
    live: dict[str, int] = {}
    for r in requests:
        if r.phase != "forward":
            break
        if r.action == "alloc":
            live[r.key] = r.size
        else:
            live.pop(r.key, None)
    return sum(live.values())
