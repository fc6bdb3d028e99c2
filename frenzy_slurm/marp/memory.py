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

from dataclasses import dataclass
from functools import cached_property, lru_cache

from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.params import count_params, lora_head_params, lora_params_per_layer
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
    w: Workload, tp: int, sp: bool, recompute: Recompute, amp: bool = False, cp: int = 1
) -> float:
    """Bytes saved for backward by one transformer block, per token (Korthikanti et al. 2022, generalised).

    With context parallelism each rank holds seq/cp tokens and attends over the whole sequence in blocks
    (ring attention): per token the saved tensors are the same, the eager score matrix is s/cp wide."""
    a = w.arch
    h, f, heads, s = a.hidden, a.ffn, a.heads, w.seq_len // cp
    kvd = a.kv * a.head_dim
    e = 4.0 if w.precision == "fp32" else 2.0  # matmul outputs / inputs
    li = 1.0 if w.fp8 else e  # float8 linears save their inputs as fp8 casts
    r = 4.0 if amp else e  # residual stream and norm inputs (fp32 under autocast)
    rep = tp if sp else 1  # tensors outside TP regions are split only with sequence parallelism
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
    drop_bytes = e + 1 if (lora and w.lora_dropout) else 0.0  # dropped copy + mask of an adapter's input

    def lora_drop(names: set[str]) -> float:
        return drop_bytes if adapters & names else 0.0

    # A norm keeps its input; an eager fp32-upcast norm keeps the fp32 copy and the normalised 16-bit value instead.
    # (A composite norm - CPU kernels, or an eager fp32 upcast - also keeps its normalised output for the weight's
    # gradient: fp32 copy and normalised value; a fused kernel keeps only its input and per-row statistics.)
    # (the normalised output is kept for the norm weight's gradient only: not under LoRA, where norms are frozen)
    norm = (
        (
            (4.0 if w.norm_upcast and not w.compile else r)
            + (e if (w.norm_upcast and not w.compile and not lora) else 0.0)
        )
        * h
        / rep
    )
    total = norm  # norm1
    # Under autocast each linear casts its fp32 input to 16 bits on its own (autocast caches only the casts of leaf
    # tensors, the weights), so separate q/k/v projections save one copy each; a fused projection saves one.
    casts_qkv = len(tg & {"q", "k", "v"}) if (amp and not w.fused_projections) else 1
    if tg & {"q", "k", "v"}:
        total += (casts_qkv * li + lora_drop({"q", "k", "v"})) * h / rep  # QKV input (norm1 output)
    total += e * (h + 2 * (h if w.gqa_expand else kvd)) / tp  # q, k, v (k, v at full width if expanded)
    if w.attention == "eager":
        if recompute != "selective":
            soft = 4.0 if amp else e  # softmax runs in fp32 under autocast
            if w.softmax_fp32 and not amp and e == 2.0:
                soft = 4.0 + e  # softmax(..., dtype=float32).to(dtype): the fp32 output and its 16-bit copy
            total += heads * s * (soft + ((1 + e) if drop else 0)) / tp
        total += li * h / tp  # context (o_proj input)
    else:
        total += e * h / tp + 4.0 * heads / tp  # kernel output (also o_proj input) + log-sum-exp
        if w.fp8:
            total += li * h / tp  # o_proj's fp8 copy of its input
        elif w.unfused_rope and a.position == "rope" and "o" in tg:  # (a frozen o_proj keeps no input)
            # rotated q/k are new head-major tensors, so the kernel's output is head-major too and the
            # transpose back to (tokens, hidden) copies it: o_proj saves that copy as well
            total += e * h / tp
    total += lora_drop({"o"}) * h / tp
    if drop:
        total += h / rep  # residual dropout mask
    total += norm  # norm2
    if "mlp" in tg:
        # (SwiGLU's gate and up projections each cast the input under autocast, unless fused)
        casts_mlp = 2 if (amp and not w.fused_projections and a.activation == "swiglu") else 1
        total += (casts_mlp * li + lora_drop({"mlp"})) * h / rep  # FFN input
    down_in = li if "mlp" in tg else 0.0  # the product / activation output, saved by the down projection
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
        total += h / rep  # MLP dropout mask
    return total


def _logit_bytes_per_token(w: Workload, tp: int) -> float:
    """Output-layer logits and cross-entropy tensors alive at once, per token."""
    a = w.arch
    if a.head == "classification":
        return 0.0
    e = 4.0 if w.precision == "fp32" else 2.0
    v = a.vocab / (tp if w.vocab_parallel else 1)
    f32 = 4.0 if w.loss_fp32 else e
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
        return v * max(e + f32 + f32 / c, (e if w.hold_logits else 0.0) + f32 + (2 * f32 + e) / c)
    # fp32 log-softmax output (saved) and, in backward, the gradients at both ends of log_softmax (a compiled loss
    # fuses them into one kernel); plus the 16-bit logits where the loop keeps the model output alive. A 16-bit
    # loss (no upcast) keeps the same three tensors at 2 bytes.
    return v * ((e if w.hold_logits else 0.0) + (2 if (w.compile and w.compile_loss) else 3) * f32)


def estimate_memory(
    w: Workload,
    plan: ParallelPlan,
    metric: Metric = "allocated",
    overheads: Overheads = Overheads(),
    peak_stages_only: bool = False,
) -> MemoryEstimate:
    """Per-stage peak bytes per rank; see the module docstring for the phases.

    `peak_stages_only` computes only the first and last pipeline stages. With the default split (earlier
    stages get the extra layers) every middle stage holds no more layers, no more in-flight micro-batches
    and no embedding, so one of those two is the peak; the candidate search uses this to stay fast.
    """
    a = w.arch
    pc = count_params(a)
    scale = (w.exact_params / pc.total(a.layers)) if w.exact_params else 1.0
    wb, gb, sb, mb_, sdt = _bytes(w)
    tp, dp, pp, cp = plan.tp, plan.dp, plan.pp, plan.cp
    tokens = plan.micro_batch * w.seq_len // cp  # context parallelism: each rank holds seq/cp of every sequence
    lora = w.method != "full"
    # ZeRO/FSDP shard over the data-parallel ranks (times cp: context-parallel ranks hold the same weights), or
    # over one shard group of HSDP/MiCS, replicated across groups
    shard = plan.shard_group or dp * cp
    opt_div = shard if plan.zero >= 1 else 1
    grad_div = shard if plan.zero >= 2 else 1
    weight_div = shard if plan.zero >= 3 else 1
    amp = _autocast(w, plan)
    per_layer_act = _layer_activation_bytes(w, tp, plan.sequence_parallel, plan.recompute, amp, cp)
    r = 4.0 if (amp or w.precision == "fp32") else 2.0
    rep = tp if plan.sequence_parallel else 1
    layer_input = r * a.hidden / rep
    mixed_ds = w.framework == "deepspeed" and w.precision in ("bf16-mixed", "fp16-mixed")
    if w.framework == "deepspeed" and plan.zero >= 1:
        mb_ = 4.0  # the ZeRO optimizer keeps its own fp32 partition of the weights, in fp32 training too
    splits = plan.stage_layers(a.layers)

    stages = []
    for i, n_layers in enumerate(splits):
        if peak_stages_only and plan.layer_split is None and 0 < i < pp - 1:
            continue
        first, last = i == 0, i == pp - 1
        params = pc.per_layer * n_layers / tp
        # Megatron splits the embedding and the output layer over tp (vocab-parallel); a replicated head holds
        # them whole
        vtp = tp if w.vocab_parallel else 1
        if first:
            params += pc.embedding / vtp
        if last:
            # a tied head on another stage than the embedding is its own copy of the token embedding
            tied_copy = a.vocab * a.hidden if (pp > 1 and a.tied_embeddings and a.head != "classification") else 0
            params += (pc.final + pc.head + tied_copy) / vtp
        params = int(params * scale)
        linear = pc.linear_per_layer * n_layers * scale / tp

        if lora:
            trainable = (
                lora_params_per_layer(a, w.lora_rank, w.lora_targets) * n_layers
                + (lora_head_params(a, w.lora_rank, w.lora_targets) if last else 0)
            ) / tp
            base_bytes = 4.0 if w.precision == "fp32" else 2.0
            if w.method == "qlora":
                # (litgpt's plugin quantises every nn.Linear, the untied output layer too)
                q_head = a.vocab * a.hidden * scale / vtp if (last and w.qlora_quantized_head and pc.head) else 0.0
                frozen = (linear + q_head) * _nf4_bytes(w) + (params - linear - q_head) * base_bytes
            else:
                frozen = params * base_bytes
            weights = frozen / weight_div + trainable * wb
        else:
            trainable = float(params)
            weights = params * wb / weight_div
        if plan.offload_params:
            weights = 0.0
        grads_all = trainable * gb / grad_div
        optimizer = 0.0 if (plan.offload_optimizer or w.paged_optimizer) else trainable * (sb + mb_) / opt_div
        if mixed_ds and plan.zero == 0:
            optimizer += trainable * 4.0  # BF16/FP16 optimizer's fp32 gradient accumulation buffer

        # Gradients that persist through the forward pass: DeepSpeed's buffers, accumulation, pipelines.
        # (DeepSpeed and torch both free .grad after the step; ZeRO/BF16 optimizers' own fp32 buffers are counted
        # with the optimizer.)
        # Megatron's main_grad buffer is allocated once and kept. A pipeline stage peaks at its first backward
        # with the most micro-batches in flight; its gradients exist then only if a forward follows a backward
        # at that depth (grad_accum > pp - stage), since the previous step's were freed.
        accumulating = plan.grad_accum > (pp - i if pp > 1 else 1)
        persistent = accumulating or not w.zero_grad_to_none or w.framework == "megatron"
        if w.optimizer_in_backward:
            persistent, grads_all = False, 0.0
        largest = pc.largest_matrix * scale / tp
        head_grads = (
            (a.vocab * a.hidden * scale / (tp if w.vocab_parallel else 1)) * gb / grad_div
            if (last and not lora and a.head != "classification")
            else 0.0
        )

        # Buffers: communication buckets, gathered ZeRO-3 parameters, dequantised QLoRA weights.
        bk = w.buckets
        fb_buffers = unit_grads = 0.0
        if plan.zero == 3:
            layer_params = pc.per_layer * scale / tp
            # QLoRA gathers its blocks in NF4 (torchao's NF4 tensor and bitsandbytes' 4-bit params all-gather their
            # quantised storage): as 16-bit-equivalent elements, a block is far smaller than its parameter count
            layer_gathered = layer_params
            if w.method == "qlora":
                lin = pc.linear_per_layer * scale / tp
                layer_gathered = (lin * _nf4_bytes(w) + (layer_params - lin) * 2.0) / 2.0
            gathered = 2 * max(layer_gathered, largest)
            if w.framework == "deepspeed":
                gathered = min(gathered + bk.stage3_prefetch_bucket_size, bk.stage3_max_live_parameters)
                # DeepSpeed releases a module's gathered parameters after its forward only if their next use lies
                # more than stage3_max_reuse_distance parameter elements further along the trace: the output layer
                # (used again at once by backward) and the last blocks, whose forward and backward uses are
                # separated by 2 x the parameters after them, stay gathered until their backward
                vtp3 = tp if w.vocab_parallel else 1
                head_el = (
                    ((pc.final + (pc.head or (a.vocab * a.hidden if a.head != "classification" else 0))) * scale / vtp3)
                    if last
                    else 0.0
                )
                blocks_el = layer_gathered * n_layers
                reuse = bk.stage3_max_reuse_distance
                kept = head_el + min(blocks_el, max(0.0, reuse / 2 - head_el))
                if first and 2 * (blocks_el + head_el) < reuse:  # a model this small stays gathered whole
                    tied_head = last and a.tied_embeddings and a.head != "classification"  # (counted as the head)
                    kept += (pc.embedding - (a.vocab * a.hidden if tied_head else 0)) * scale / vtp3
                gathered = max(gathered, kept)
            if not w.reshard_after_forward:  # FSDP reshard_after_forward=False / ZeRO++-style: the stage's
                gathered = max(gathered, params)  # gathered weights stay from forward until backward
            fb_buffers += gathered * (2.0 if w.precision != "fp32" else 4.0)
            # one unit's unsharded gradients before reduce-scatter: only its trainable (adapter) ones under LoRA
            unit_trainable = (lora_params_per_layer(a, w.lora_rank, w.lora_targets) / tp) if lora else layer_params
            unit_grads = unit_trainable * gb  # (from a block's backward on: none while the loss runs)
        resident = 0.0
        if w.framework == "deepspeed" and plan.zero == 3 and trainable > 0:
            # ZeRO-3's optimizer allocates once and keeps: the gradient partition of every parameter (in the
            # gradient-accumulation dtype, the model's) and, with contiguous gradients, the reduce bucket
            resident = bk.reduce_bucket_size * gb
            if not w.optimizer_in_backward:
                persistent = True
        # Gradient reduction buffers (allocated when backward starts).
        bucket = 0.0
        if w.framework == "deepspeed" and plan.zero in (1, 2) and dp > 1 and trainable > 0:
            # contiguous_gradients: ZeRO-1/2 allocate the whole reduce bucket, whatever the model's size
            # (ZeRO-1 under mixed precision stages its fp32 gradient accumulator in the bucket)
            bucket += (
                bk.reduce_bucket_size * (4.0 if mixed_ds and plan.zero == 1 else gb) * (2 if bk.overlap_comm else 1)
            )
        flat = 0.0
        if w.framework == "deepspeed" and plan.zero == 0 and trainable > 0:
            flat = trainable * gb  # DeepSpeed flattens all gradients for the all-reduce after backward (even on 1 GPU)
        if w.framework == "torch" and dp > 1 and plan.zero == 0 and trainable > 0:
            fb_buffers += trainable * gb  # DDP's gradient buckets: a second copy of the gradients, kept for the run
        if w.method == "qlora":
            # the 4-bit matmul dequantises one linear weight to 16 bits at a time (forward, and again in backward);
            # the embedding, and the output layer unless it is quantised too, stay 16-bit and are never dequantised
            deq = pc.largest_linear * scale / tp
            if last and w.qlora_quantized_head and pc.head:
                deq = max(deq, a.vocab * a.hidden * scale / (tp if w.vocab_parallel else 1))
            fb_buffers += deq * 2.0
        if amp and not lora:
            fb_buffers += linear * 2.0  # autocast's 16-bit weight copies, saved for backward (not under FSDP)
        if w.fp8:
            fb_buffers += (linear / weight_div) * 1.0 + largest * 1.0  # fp8 weight casts (+ one being made)
        if cp > 1:
            # ring attention: the K/V block being received and the one being sent (double buffer), 16-bit
            kvd = a.kv * a.head_dim / tp
            fb_buffers += 2 * 2 * kvd * tokens * (4.0 if w.precision == "fp32" else 2.0)

        step_buffers = 0.0
        if not w.optimizer_in_backward and not plan.offload_optimizer:
            local_states = trainable / opt_div
            if mixed_ds and plan.zero >= 1:
                step_buffers += local_states * 4.0  # fp32 gradient partition handed to the optimizer
            if w.optimizer in ("adam", "adamw") and not w.fused_optimizer:
                step_buffers += local_states * sdt  # foreach Adam: sqrt(v) temporary
            else:
                step_buffers += min(largest, local_states) * sdt
            if w.framework == "deepspeed" and plan.zero in (1, 2) and dp > 1:
                step_buffers += min(bk.allgather_bucket_size, params) * wb

        # Activations of the micro-batches in flight: 1F1B keeps pp - stage of them on stage `stage`, GPipe all
        # of them; interleaved 1F1B with v model chunks per rank keeps (pp - stage - 1) * 2 + (v - 1) * pp + 1
        # chunk-micro-batches in warm-up (Megatron's schedule), each 1/v of the stage's layers.
        ga = max(plan.grad_accum, 1)
        recomputed = 0.0
        if pp == 1:
            inflight = 1.0
        elif plan.schedule == "gpipe":
            inflight = float(ga)
        elif plan.schedule == "interleaved" and plan.virtual_stages > 1:
            v = plan.virtual_stages
            inflight = min(ga * v, (pp - i - 1) * 2 + (v - 1) * pp + 1) / v
        else:
            inflight = float(min(pp - i, ga))
        if plan.recompute == "full":
            # every checkpointed block keeps only its input; recompute_layers < all: the rest keep everything
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
        e_act = 4.0 if w.precision == "fp32" else 2.0
        work = 2 * max(a.ffn, a.hidden) * e_act * tokens / tp  # gradient working set of one block's backward
        if w.attention == "eager":
            # eager attention's backward holds two score-sized gradients (probs', scores') beside the saved
            # probabilities; selective recomputation rebuilds those probabilities first (one more)
            units = 3 if plan.recompute == "selective" else 2
            # (under autocast the softmax and its backward run in fp32, as its saved output is)
            score = 4.0 if amp else e_act
            work = max(work, units * a.heads * (w.seq_len // cp) * score * tokens / tp)
        if first and a.dropout > 0:
            acts += tokens  # embedding dropout mask (the embedding's output is the first block's saved input)
        if w.unfused_rope and a.position == "rope" and w.rope_tables_per_layer:
            acts += n_layers * inflight * 2 * w.seq_len * a.head_dim * e_act  # cos/sin of q and k, built per block
        logits = 0.0
        if w.framework == "deepspeed" and pp > 1:
            # DeepSpeed's PipelineEngine keeps each micro-batch's stage output (the logits, on the last stage) in
            # its pipe buffers, max(2, in-flight) of them, until the buffer is reused
            nbuf = max(2, min(pp - i, ga))
            out = (a.vocab / tp if (last and a.head != "classification") else a.hidden) * e_act * tokens
            fb_buffers += nbuf * out
            # and one more hidden-sized tensor per micro-batch in flight (the p2p copy of what is sent/received),
            # plus the engine's persistent receive buffers: activations (all but the first stage) and
            # gradients (all but the last)
            fb_buffers += (inflight + (not first) + (not last)) * a.hidden * e_act * tokens
        loss_grads = 0.0
        if last:
            logits = _logit_bytes_per_token(w, tp) * tokens
            if w.loss_chunks > 1 and head_grads > 0:
                # a chunked output layer's backward: the autograd engine sums the chunks' weight gradients in one
                # buffer (the sum and the contribution being added) while the chunks' 16-bit logit gradients wait
                # (measured on the CPU: + 2 x the head's gradient over the compiled loss's peak)
                v_local = a.vocab / (tp if w.vocab_parallel else 1)
                k = 1.0 if persistent else 2.0
                chunk_phase = v_local * e_act * (1.0 + 1.0 / w.loss_chunks) * tokens + k * head_grads
                if chunk_phase > logits:
                    loss_grads = k * head_grads
                    logits = chunk_phase - loss_grads
            final_norm = (4.0 + e_act) if (w.norm_upcast and not w.compile) else r
            acts += (
                final_norm * a.hidden / rep + e_act * a.hidden / tp
            ) * tokens  # final norm's saved input, head input

        # The previous step's output, where the loop keeps it until the next forward returns: at the end of that
        # forward both outputs are alive, and with them what the old graph's custom functions hold outside its
        # saved tensors (bitsandbytes' 4-bit matmul stored its input on ctx: q/k/v, o_proj, MLP and down inputs)
        out16 = (
            e_act * a.vocab / (tp if w.vocab_parallel else 1) * tokens if (last and a.head != "classification") else 0.0
        )
        prev_logits = prev_inputs = 0.0
        if w.keeps_previous_output:
            prev_logits = out16
            if w.method == "qlora" and w.nf4_saves_inputs:
                prev_inputs = n_layers * inflight * e_act * (3 * a.hidden + a.ffn) / tp * tokens
                if last and w.qlora_quantized_head and pc.head:
                    prev_inputs += e_act * a.hidden / rep * tokens  # lm_head's input (the final norm's output)

        # The three moments of a step (module docstring); only the largest is kept.
        const = weights + optimizer + resident
        # backward-start is the larger of two instants: the loss's backward (logits and their gradients alive)
        # and the last block's backward (logits freed, the head's gradients and the block's working set alive)
        early = bucket
        start_loss = const + (grads_all if persistent else 0.0) + loss_grads + acts + logits + fb_buffers + early
        start_block = (
            const
            + (grads_all if persistent else head_grads)
            + acts
            + recomputed
            + work
            + fb_buffers
            + unit_grads
            + early
        )
        # (the end of the forward with the previous step's output still bound: this step's 16-bit output beside it)
        start_fwd = 0.0
        if prev_logits or prev_inputs:
            start_fwd = (
                const + (grads_all if persistent else 0.0) + acts + prev_inputs + out16 + prev_logits + fb_buffers
            )
        start = max(start_loss, start_block, start_fwd)
        # the first block's backward: every other gradient exists, its own saved tensors are still alive
        end_acts = work + per_layer_act * tokens
        end = const + grads_all + max(end_acts + bucket, flat) + fb_buffers + unit_grads
        step = const + grads_all + step_buffers
        if start >= end and start >= step:
            phase = "backward-start"
            if start_fwd >= max(start_loss, start_block):
                parts = dict(
                    weights=weights,
                    gradients=grads_all if persistent else 0.0,
                    optimizer=optimizer,
                    activations=acts + prev_inputs,
                    logits=out16 + prev_logits,
                    buffers=fb_buffers + resident,
                )
            elif start_loss >= start_block:
                parts = dict(
                    weights=weights,
                    gradients=(grads_all if persistent else 0.0) + loss_grads,
                    optimizer=optimizer,
                    activations=acts,
                    logits=logits,
                    buffers=fb_buffers + early + resident,
                )
            else:
                parts = dict(
                    weights=weights,
                    gradients=grads_all if persistent else head_grads,
                    optimizer=optimizer,
                    activations=acts + recomputed + work,
                    logits=0.0,
                    buffers=fb_buffers + unit_grads + early + resident,
                )
        elif end >= step:
            phase = "backward-end"
            tail = end_acts + bucket >= flat
            parts = dict(
                weights=weights,
                gradients=grads_all,
                optimizer=optimizer,
                activations=end_acts if tail else 0.0,
                logits=0.0,
                buffers=fb_buffers + unit_grads + resident + (bucket if tail else flat),
            )
        else:
            phase = "optimizer-step"
            parts = dict(
                weights=weights,
                gradients=grads_all,
                optimizer=optimizer,
                activations=0.0,
                logits=0.0,
                buffers=step_buffers + resident,
            )
        allocated = max(start, end, step)
        overhead = 0.0
        if metric in ("reserved", "device"):
            # long-lived tensors are allocated once, in whole segments; what each step allocates and frees
            # (activations, logits, per-step gradients and casts, temporaries) leaves the caching allocator holding
            # blocks it cannot reuse for the next request's size
            long_lived = parts["weights"] + parts["optimizer"] + (grads_all if persistent else 0.0) + resident
            overhead += long_lived * overheads.fragmentation + (allocated - long_lived) * overheads.step_fragmentation
            if phase == "backward-start" and not persistent and grads_all > head_grads:
                # the caching allocator keeps the blocks of the gradients freed after the previous step; the
                # forward's activations (other sizes, other segments) rarely fit them, so the reserved peak holds both
                overhead += grads_all - parts["gradients"]
        if metric == "device":
            overhead += overheads.device_bytes(plan.world)
        stages.append(StageMemory(stage=i, layers=n_layers, params=params, overhead=overhead, phase=phase, **parts))
    return MemoryEstimate(plan=plan, metric=metric, stages=tuple(stages))
