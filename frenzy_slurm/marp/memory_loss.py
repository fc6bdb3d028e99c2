"""The output layer's logits and the loss's tensors on the last stage, and what the training loop keeps of the
previous step's output."""

from __future__ import annotations

import math

from frenzy_slurm.marp.memory_job import Job
from frenzy_slurm.marp.memory_states import States
from frenzy_slurm.marp.plan import Workload


def logit_bytes_per_token(w: Workload, tp: int) -> float:
    """Output-layer logits and cross-entropy tensors alive at once, per token."""
    a = w.arch
    if a.head == "classification":
        return 0.0
    e = 4.0 if w.precision == "fp32" else 2.0
    v = a.vocab / (tp if w.comm.vocab_parallel else 1)
    f32 = 4.0 if w.loss.loss_fp32 else e
    out = 4.0 if w.loss.output_fp32 else e  # the logits the loop holds: the model's, or the framework's fp32 copy
    if w.loss.ce_in_place:  # the kernel keeps the logits as they are and overwrites them with their gradient
        return v * out
    if w.loss.loss_chunks > 1:
        c = w.loss.loss_chunks
        if w.activations.compile and w.loss.compile_loss:
            # the compiled per-chunk loss saves its 16-bit chunk (and a per-row log-sum-exp) and writes the chunk's
            # 16-bit gradient in one kernel (measured on the CPU: 2.26 bytes x vocab per token for 8 chunks)
            return v * e * (1.0 + 1.0 / c)
        # eager: the loss's forward ends with every 16-bit chunk still alive (the model's output list), every
        # chunk's fp32 log-softmax output saved and the last chunk's upcast (measured on the CPU: 6.5 bytes x vocab
        # per token for 8 chunks); its backward holds the saved outputs and one chunk's two fp32 gradients and
        # 16-bit gradient
        # (logits the framework hands back in fp32, `out`, need no upcast for the loss)
        upcast = f32 / c if out != f32 else 0.0
        return v * max(out + f32 + upcast, (out if w.loss.hold_logits else 0.0) + f32 + (2 * f32 + out) / c)
    if w.activations.compile and w.loss.compile_loss:
        # compiled, the upcast is inside the loss's graph: it saves its input, the logits as the model returns them
        # (the tensor the loop may hold), and its backward writes their gradient in that dtype in one kernel (measured
        # on the CPU for torchtitan's `cross_entropy(pred.flatten(0, 1).float(), labels)`: 2 + 2 bytes per logit in
        # bf16, benchmarks/float8_sac_cpu.py)
        return v * 2 * out
    # fp32 log-softmax output (saved) and, in backward, the gradients at both ends of log_softmax; plus the 16-bit
    # logits where the loop keeps the model output alive. A 16-bit loss (no upcast) keeps the same three tensors at
    # 2 bytes. DTensor's loss_parallel over the vocabulary shards fuses the two backwards
    # (torch/distributed/tensor/parallel/loss.py `_nll_loss_and_log_softmax_backward`, torch 2.13: `grad_input =
    # zeros_like(x)`, then `(grad_input + torch.exp(x)) * grad_output`): beside the saved log-softmax output it holds
    # the zeros, their sum with exp(x) and the product at once, four tensors.
    held = 4 if (w.loss.dtensor_loss_parallel and w.comm.vocab_parallel and tp > 1) else 3
    return v * ((out if w.loss.hold_logits else 0.0) + held * f32)


def fused_linear_loss_bytes(j: Job, head_grads: float) -> tuple[float, float]:
    """(tensors, gradients) Liger's fused linear cross-entropy holds on the last stage, from its forward to the
    backward (liger_kernel/ops/fused_linear_cross_entropy.py): the hidden states' gradient (`grad_input`, the
    input's size and dtype) and the output layer's weight gradient (`grad_weight`, made in the forward) are kept
    for backward; one chunk of 16-bit logits exists at a time, its gradient written in place by the cross-entropy
    kernel. The chunk has next_power_of_2(ceil(tokens / ceil(vocab / hidden))) rows, so about as many elements
    as the hidden states (up to twice). No logits leave the function."""
    a, tokens = j.w.arch, j.tokens
    v = a.vocab / j.vtp
    target = j.w.loss.fused_chunk_fp32_bytes
    if target is None:
        chunk = fused_chunk_rows(tokens, v, a.hidden) * v * j.e_act
    elif target == 0.0:  # Cut Cross-Entropy: its logits never leave on-chip memory
        chunk = 0.0
    else:  # Unsloth's: the chunk's logits and their gradient, both 16-bit (see compiled_chunk_bytes)
        chunk = target_chunk_rows(tokens, v, target) * v * compiled_chunk_bytes(j.e_act)
    grad_input = a.hidden * j.e_act * tokens
    return chunk + grad_input, head_grads


def loss_forward_bytes(j: Job) -> float:
    """What the loss's forward holds at once on the last stage: the 16-bit logits, their fp32 upcast (none when
    they are fp32 already) and the log-softmax output (chunked: one chunk's upcast)."""
    w, a = j.w, j.w.arch
    if a.head == "classification":
        return 0.0
    if w.loss.fused_linear_loss:
        return sum(fused_linear_loss_bytes(j, 0.0))
    v = a.vocab / j.vtp
    if w.loss.ce_in_place:
        return v * j.e_act * j.tokens
    f32 = 4.0 if w.loss.loss_fp32 else j.e_act
    upcast = f32 if f32 != j.e_act else 0.0
    if w.loss.loss_chunks > 1:
        return v * (j.e_act + f32 + upcast / w.loss.loss_chunks) * j.tokens
    return v * (j.e_act + upcast + f32) * j.tokens


def logits_and_loss(j: Job, st: States, persistent: bool) -> tuple[float, float, float]:
    """(logits and loss tensors, gradients the loss phase adds, the final norm's and head's saved inputs) on the
    last stage. A chunked output layer's backward sums the chunks' weight gradients in one buffer (the sum and the
    contribution being added) while the chunks' 16-bit logit gradients wait (measured on the CPU: + 2 x the head's
    gradient over the compiled loss's peak)."""
    w, a = j.w, j.w.arch
    tokens = j.tokens
    fused = w.loss.fused_linear_loss and a.head != "classification"
    if fused:  # no logits and no saved head input (the final norm still keeps its own)
        logits, loss_grads = fused_linear_loss_bytes(j, st.head_grads)
    else:
        logits, loss_grads = logit_bytes_per_token(w, j.plan.tp) * tokens, 0.0
    if w.loss.loss_chunks > 1 and st.head_grads > 0 and not fused:
        v_local = a.vocab / j.vtp
        k = 1.0 if persistent else 2.0
        chunk_phase = v_local * j.e_act * (1.0 + 1.0 / w.loss.loss_chunks) * tokens + k * st.head_grads
        if chunk_phase > logits:
            loss_grads = k * st.head_grads
            logits = chunk_phase - loss_grads
    if w.loss.loss_detaches_hidden and a.head != "classification" and not fused:
        # the loop's detached copies of the hidden states and their fp32 gradient accumulator (the hidden states are
        # replicated over TP before chunking: whole on every rank)
        logits += (j.e_act + 4.0) * a.hidden * tokens
    # (under LoRA the final norm's weight is frozen, so its normalised value is not kept; a frozen output layer keeps
    # no input either, unless it is bitsandbytes' 4-bit one or carries an adapter)
    lora = w.method != "full"
    normalised = 0.0 if lora else (4.0 if w.activations.norm_fp32_normalized else j.e_act)
    final_norm = (4.0 + normalised) if (w.activations.norm_upcast and not w.activations.compile) else j.r
    head_saves = not fused and (
        not lora
        or "head" in w.adapters.lora_targets
        or (w.method == "qlora" and w.adapters.nf4_saves_inputs and w.adapters.qlora_quantized_head and j.pc.head > 0)
    )
    head_in = (
        a.hidden if w.activations.tp_saves_gathered_inputs else a.hidden / j.plan.tp
    )  # (DTensor TP: the replicated input)
    head_inputs = (final_norm * a.hidden / j.rep + (j.e_act * head_in if head_saves else 0.0)) * tokens
    return logits, loss_grads, head_inputs


def previous_output(j: Job, i: int, n_layers: int, inflight: float) -> tuple[float, float, float]:
    """(this step's 16-bit output, the previous step's output, what the previous graph's custom functions hold)
    where the loop keeps the previous step's output bound until the next forward returns (litgpt): at the end of
    that forward both outputs are alive, and with them what the old graph's custom functions stored outside its
    saved tensors (bitsandbytes' 4-bit matmul stored its input on ctx: q/k/v, o_proj, MLP and down inputs)."""
    w, a, pc, plan = j.w, j.w.arch, j.pc, j.plan
    last = i == plan.pp - 1
    out_bytes = 4.0 if w.loss.output_fp32 else j.e_act  # (Lightning Fabric hands the output back in fp32)
    has_logits = last and a.head != "classification" and not w.loss.fused_linear_loss  # (a fused loss returns none)
    out16 = out_bytes * a.vocab / j.vtp * j.tokens if has_logits else 0.0
    prev_logits = prev_inputs = 0.0
    if w.loss.keeps_previous_output:
        prev_logits = out16
        if w.method == "qlora" and w.adapters.nf4_saves_inputs:
            prev_inputs = n_layers * inflight * j.e_act * (3 * a.hidden + a.ffn) / plan.tp * j.tokens
            if last and w.adapters.qlora_quantized_head and pc.head:
                prev_inputs += j.e_act * a.hidden / j.rep * j.tokens  # lm_head's input (the final norm's output)
    return out16, prev_logits, prev_inputs


# one request of the loss phase: (allocate, else free; the tensor's name; bytes)
LossRequest = tuple[bool, str, int]


def fused_chunk_rows(tokens: int, vocab: float, hidden: int) -> int:
    """Rows of one chunk of Liger's fused linear cross-entropy: next_power_of_2(ceil(tokens / ceil(vocab / hidden)))
    (liger_kernel/ops/fused_linear_cross_entropy.py), at most the tokens."""
    rows = 1 << max(0, math.ceil(math.log2(max(1.0, math.ceil(tokens / math.ceil(vocab / hidden))))))
    return min(rows, tokens)


def compiled_chunk_bytes(e: float) -> float:
    """Bytes per logit one chunk of Unsloth's fused loss holds: unsloth-zoo compiles the chunk's step
    (UnslothFusedLoss `torch.compile(accumulate_chunk)`, torch_compile=True as models/llama.py calls it), so its
    `.float()` upcast and cross-entropy fuse, as torch.compile fuses torchtitan's `cross_entropy(pred.float(), ...)`:
    the chunk's logits and their gradient in the logits' dtype (measured on the CPU for torchtitan: 2 + 2 bytes per
    logit in bf16, benchmarks/float8_sac_cpu.py). Read from the source, not measured for Unsloth's own loss."""
    return 2 * e


def target_chunk_rows(tokens: int, vocab: float, fp32_bytes: float) -> int:
    """Rows of one chunk of Unsloth's fused loss: unsloth-zoo's get_chunk_size splits the tokens into one chunk when
    their fp32 logits fit `fp32_bytes`, else into the next multiple of 4 of chunks that keeps each within it
    (fused_losses/cross_entropy_loss.py), and torch.chunk makes chunks of ceil(tokens / n) rows."""
    exact = tokens * vocab * 4.0 / fp32_bytes
    n = 1 if exact <= 1.0 + 1e-9 else math.ceil(exact / 4 - 1e-9) * 4
    return min(tokens, math.ceil(tokens / n))


def loss_requests(w: Workload, tp: int, tokens: int) -> tuple[list[LossRequest], list[LossRequest]]:
    """(forward, backward): the loss phase's vocabulary-sized tensors at `tokens` tokens, in the order the
    framework makes and frees them, from the same policy as `logit_bytes_per_token` and `loss_forward_bytes`
    (tests/test_marp_allocator_steps.py replays them and checks their live peaks against those two terms). Only what
    scales with the tokens: the head's weight gradient and the scalars are left out.

    Forward: the model's 16-bit logits; the loss's fp32 upcast (none on fp32 logits), its log-softmax output (saved)
    and the upcast freed; the loop's fp32 copy of the output where it gets one; the logits freed before backward
    unless the loop holds them. Backward: the gradients at both ends of log-softmax (a compiled loss writes one),
    the saved output freed, the gradient cast back to the logits' dtype, which the output layer's backward
    consumes. Chunked: each chunk so, forward over all chunks and backward chunk by chunk in reverse."""
    a = w.arch
    if a.head == "classification":
        return [], []
    e = 4.0 if w.precision == "fp32" else 2.0
    v = a.vocab / (tp if w.comm.vocab_parallel else 1)
    f32 = 4.0 if w.loss.loss_fp32 else e
    out = 4.0 if w.loss.output_fp32 else e

    def n(per_token: float, share: int = 1) -> int:
        return round(per_token * v * tokens / share)

    fwd: list[LossRequest] = []
    bwd: list[LossRequest] = []
    if w.loss.loss_detaches_hidden:  # torchtitan's detached hidden states and their fp32 gradient accumulator
        hidden = a.hidden * tokens
        fwd += [(True, "hidden.detached", round(e * hidden)), (True, "hidden.grad", round(4 * hidden))]
    if w.loss.fused_linear_loss:
        target = w.loss.fused_chunk_fp32_bytes
        if target is None:
            rows = fused_chunk_rows(tokens, v, a.hidden)
        else:  # (Cut Cross-Entropy stores no logits)
            rows = 0 if target == 0.0 else target_chunk_rows(tokens, v, target)
        width = e if target is None else compiled_chunk_bytes(e)
        fwd.append((True, "grad_input", round(a.hidden * e * tokens)))
        for c in range(math.ceil(tokens / rows) if rows else 0):
            fwd += [(True, f"chunk{c}", round(min(rows, tokens - c * rows) * v * width)), (False, f"chunk{c}", 0)]
        bwd.append((False, "grad_input", 0))
    elif w.loss.ce_in_place:  # the logits, saved by the kernel and overwritten by their gradient, freed after it
        fwd.append((True, "logits", n(out)))
        bwd.append((False, "logits", 0))
    else:
        compiled = w.activations.compile and w.loss.compile_loss
        chunks = max(1, w.loss.loss_chunks)
        if compiled and chunks > 1:  # the compiled per-chunk loss saves its 16-bit chunk, its gradient 16-bit
            f32 = out
        upcast = out != f32
        # the logits outlive the loss's forward where the loop holds them or the loss saves them as they are
        held = w.loss.hold_logits or (compiled and not upcast)
        for c in range(chunks):
            fwd += _chunk_forward(f"c{c}.", n(out, chunks), n(f32, chunks), compiled, upcast)
        for c in reversed(range(chunks)):
            bwd += _chunk_backward(f"c{c}.", n(out, chunks), n(f32, chunks), compiled, upcast)
        logits_freed = [(False, f"c{c}.logits", 0) for c in range(chunks)]
        if held:
            bwd += logits_freed
        else:  # freed when the loss returns, before backward
            fwd += logits_freed
    if w.loss.loss_detaches_hidden:
        bwd += [(False, "hidden.detached", 0), (False, "hidden.grad", 0)]
    return fwd, bwd


def _chunk_forward(p: str, out: int, f32: int, compiled: bool, upcast: bool) -> list[LossRequest]:
    """One chunk's forward: its logits, and what the loss saves of them (the fp32 input, compiled; the log-softmax
    output, eager, made from an upcast freed at once)."""
    reqs: list[LossRequest] = [(True, f"{p}logits", out)]
    if compiled:
        return reqs + ([(True, f"{p}saved", f32)] if upcast else [])
    if upcast:
        reqs.append((True, f"{p}upcast", f32))
    reqs.append((True, f"{p}saved", f32))
    return reqs + ([(False, f"{p}upcast", 0)] if upcast else [])


def _chunk_backward(p: str, out: int, f32: int, compiled: bool, upcast: bool) -> list[LossRequest]:
    """One chunk's backward: the gradient(s) of the loss in fp32, the saved tensor freed, the gradient in the
    logits' dtype for the output layer, which consumes it."""
    saved: list[LossRequest] = [(False, f"{p}saved", 0)] if (upcast or not compiled) else []
    if compiled:
        reqs: list[LossRequest] = [(True, f"{p}grad", f32), *saved]
    else:
        reqs = [(True, f"{p}grad.out", f32), (True, f"{p}grad", f32), (False, f"{p}grad.out", 0), *saved]
    if upcast:
        reqs += [(True, f"{p}grad.logits", out), (False, f"{p}grad", 0), (False, f"{p}grad.logits", 0)]
    else:
        reqs.append((False, f"{p}grad", 0))
    return reqs
