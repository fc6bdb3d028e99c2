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
Llama on one process, fp32, no checkpointing, fully trained or with PEFT's LoRA (`hf-trainer-llama-1gpu`,
`hf-trainer-peft-lora-llama-1gpu`); and DeepSpeed ZeRO-0 on one rank
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
from dataclasses import dataclass, replace
from typing import Literal

from frenzy_slurm.marp.allocator_replay import Event, alloc, free, replay
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.step_dtypes import step_dtypes
from frenzy_slurm.marp.step_frenzy import FP32_STEP, RNG_STATE_BYTES, adapted, frenzy_graph, norm, sdpa_scratch
from frenzy_slurm.marp.step_graph import SELF, Graph, Op

PHASES = ("forward", "loss", "backward", "optimizer")


@dataclass(frozen=True)
class Request:
    """One allocator request of a step: `phase`, the block it belongs to (-1: outside the blocks), alloc or free of
    tensor `key` of `size` bytes (a free carries its tensor's size)."""

    phase: str
    layer: int
    action: Literal["alloc", "free"]
    key: str
    size: int


def _variant_reasons(w: Workload, plan: ParallelPlan, code: str) -> list[str]:
    """The 16-bit and LoRA steps the generator does not make: bf16 only for the built-in RMSNorm model without
    biases in a plain torch loop, without checkpointing; LoRA for that model or the Trainer's Llama, in fp32."""
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
    elif w.method == "lora" and not ((plain or code == "hf") and w.precision == "fp32"):
        reasons.append("method lora beyond the built-in RMSNorm model in a plain loop or the Trainer's Llama, fp32")
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


def _hf_rope(g: Graph, x: str, width: int, tokens: int, e: float, cos: str, sin: str, tag: str) -> str:
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


def _hf_block(g: Graph, w: Workload, x: str, tokens: int, e: float, threads: int, cos: str, sin: str) -> str:
    """transformers 5.17's LlamaDecoderLayer (models/llama/modeling_llama.py), fp32, SDPA: RMSNorm as the
    built-in model's composite (its `variance + eps` is one value per token, under the size floor), q/k/v
    projections viewed head-major, `apply_rotary_pos_emb` on q and k, SDPA with `enable_gqa` (no repeat_kv:
    integrations/sdpa_attention.py `use_gqa_in_sdpa`), whose sequence-major output o_proj reads as a view, the
    SwiGLU MLP."""
    a = w.arch
    h, kvd = a.hidden, a.kv * a.head_dim
    y = norm(g, w, x, tokens, e, threads)
    q = adapted(g, w, "q", y, h, h, tokens, FP32_STEP, False)
    k = adapted(g, w, "k", y, h, kvd, tokens, FP32_STEP, False)
    v = adapted(g, w, "v", y, h, kvd, tokens, FP32_STEP, False)
    qh = g.op("heads_q", [q], e * h * tokens, grads=(q,), view=True)
    kh = g.op("heads_k", [k], e * kvd * tokens, grads=(k,), view=True)
    qr = _hf_rope(g, qh, h, tokens, e, cos, sin, "q")
    kr = _hf_rope(g, kh, kvd, tokens, e, cos, sin, "k")
    g.ops[-1] = replace(g.ops[-1], holds=(q, k))  # (`q, k = apply_rotary_pos_emb(q, k, ...)` rebinds both)
    sdpa, _ = sdpa_scratch(w, threads)
    att = g.op(
        "sdpa",
        [qr, kr, v],
        e * h * tokens,
        grads=(qr, kr, v),
        scratch=(0, sdpa[1]),
        bscratch_last=True,
        all_grads=True,  # (the kernel zeroes q's, k's and v's gradients whichever are wanted)
    )
    lse = g.op("lse", [att], 4 * a.heads * tokens, scratch=(sdpa[0], 0))
    g.ops[-2] = replace(g.ops[-2], saves=(qr, kr, v, att, lse))
    o = adapted(g, w, "o", att, h, h, tokens, FP32_STEP, False)
    x = g.op("residual1", [x, o], e * h * tokens, grads=(x, o), passthrough=(x, o))
    y = norm(g, w, x, tokens, e, threads)
    gate = adapted(g, w, "gate", y, h, a.ffn, tokens, FP32_STEP, False)
    act = g.op("silu", [gate], e * a.ffn * tokens, grads=(gate,), saves=(gate,))
    up = adapted(g, w, "up", y, h, a.ffn, tokens, FP32_STEP, False)
    m = g.op("product", [act, up], e * a.ffn * tokens, grads=(act, up), saves=(act, up))
    d = adapted(g, w, "down", m, a.ffn, h, tokens, FP32_STEP, False)
    return g.op("residual2", [x, d], e * h * tokens, grads=(x, d), passthrough=(x, d))


def _hf_graph(w: Workload, plan: ParallelPlan, threads: int) -> Graph:
    """transformers 5.17's LlamaForCausalLM as the Trainer runs it (fp32, no cache, no attention mask), its
    forward and loss ops."""
    a = w.arch
    b, s = plan.micro_batch, w.seq_len
    tokens, e = b * s, 4.0
    g = Graph(trainable=w.method == "full")  # (PEFT freezes the base model)
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
    embeds = x  # (LlamaModel.forward's `inputs_embeds`, bound to its return: what keeps it under LoRA)
    for i in range(a.layers):
        g.layer = i
        x = _hf_block(g, w, x, tokens, e, threads, cos, sin)
    g.layer, g.phase = -1, "loss"
    y = norm(g, w, x, tokens, e, threads)
    g.ops[-1] = replace(g.ops[-1], holds=(*g.ops[-1].holds, position_ids, embeds))  # (LlamaModel.forward returns)
    head = ("embed@embed.L-1" if a.tied_embeddings else "head", e * a.vocab * a.hidden)
    logits = g.op("head", [y], e * a.vocab * tokens, grads=(y,), saves=(y,) if g.trainable else (), params=(head,))
    # loss/loss_utils.py ForCausalLMLoss: `labels = pad(labels, (0, 1), value=-100)`, `labels[..., 1:].contiguous()`
    # (int64), fp32 logits used as they are; cross-entropy's log-softmax, nll saves the shifted labels. The
    # padded labels go when the loss function returns; the model's output (the logits) when the Trainer's
    # compute_loss does, after the forward; the final norm's output (the model output's `last_hidden_state`: kept
    # only by it where the head is frozen) when LlamaForCausalLM.forward returns
    pad = g.op("labels_pad", [], 8 * b * (s + 1))
    # (with one sequence the shifted slice is contiguous already: `.contiguous()` returns it, a view)
    shift = g.op("labels_shift", [pad], 8 * b * s, view=b == 1)
    lsm = g.op("log_softmax", [logits], 4 * a.vocab * tokens, grads=(logits,), saves=(SELF,))
    g.op("nll", [lsm, shift], 4, grads=(lsm,), saves=(shift,), holds=(pad, y))
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


def _forward(g: Graph, em: _Emitter) -> None:
    """Each op's output and scratch; a tensor is freed after its last reader unless a backward function saves
    it. A checkpointed block's ops save nothing: their saved tensors are packed into placeholders
    (`_checkpoint_hook`), so only the block's input stays, kept by its checkpoint."""
    saved = {g.storage(k) for op in g.ops if op.out not in g.checkpointed for k in op.saves}
    _run(g, em, range(len(g.ops)), saved | set(g.held), "forward")


def _run(g: Graph, em: _Emitter, ops: Sequence[int], saved: set[str], phase: str) -> None:
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


def _recompute(g: Graph, em: _Emitter, block: int) -> None:
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
    g: Graph, em: _Emitter, gr: _Grads, op: Op, grad_of: dict[str, str], unpacked: Sequence[str] = ()
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


def _param_grads(em: _Emitter, op: Op, layer: int, grad_of: dict[str, str]) -> None:
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


def _saved_frees(g: Graph) -> dict[int, list[str]]:
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


def _backward(g: Graph, em: _Emitter) -> dict[str, str]:
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


def _optimizer(
    params: list[tuple[str, int]], em: _Emitter, grad_of: dict[str, str], fused: bool, foreach: bool = False
) -> None:
    """torch's single-tensor AdamW (CPU): per parameter, sqrt(exp_avg_sq) and the denominator; the loop's `denom`
    keeps each denominator until the next parameter's is assigned (the last one until the step returns); then
    zero_grad. The fused AdamW (`fused=True`, aten/src/ATen/native/cpu/FusedAdamKernel.cpp) updates in place,
    element by element: nothing but zero_grad. The foreach AdamW (`foreach`, what torch picks for CUDA tensors:
    torch 2.13 torch/optim/optimizer.py `_default_to_fused_or_foreach`; adam.py `_multi_tensor_adam`) makes
    `exp_avg_sq_sqrt = torch._foreach_sqrt(exp_avg_sqs)`, one tensor per parameter, updated in place and let go
    together when the step returns."""
    if foreach and not fused:
        for p, size in params:
            em.alloc("optimizer", -1, f"sqrt.{p}", size)
        for p, _ in params:
            em.free("optimizer", -1, f"sqrt.{p}")
    elif not fused:
        previous = ""
        for p, size in params:
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
    workspaces, TensorIterator's promotion copies; AdamW is foreach). ValueError outside the module's scope."""
    _check_scope(w, plan, code)
    if code == "hf":
        g = _hf_graph(w, plan, threads)
        params = list(dict.fromkeys(p for op in g.ops for p in op.params))
    else:
        g, params = frenzy_graph(w, plan, threads, step_dtypes(w.precision, device))
    em = _Emitter(step)
    _forward(g, em)
    grad_of = _backward(g, em)
    if w.framework == "deepspeed":
        _allreduce_buckets(params, em)
    _optimizer(params, em, grad_of, fused_adamw, foreach=device == "cuda")
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
