"""What is neither a model state nor an activation: communication buckets, gathered ZeRO-3/FSDP parameters,
dequantised and cast weights, pipeline buffers, the optimizer step's temporaries."""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.marp.framework_facts import FSDP_PP_REDUCE_BYTES
from frenzy_slurm.marp.memory_job import Job, nf4_bytes
from frenzy_slurm.marp.memory_states import States
from frenzy_slurm.marp.params import lora_params_per_layer


@dataclass
class Buffers:
    """What is not a model state nor an activation: communication buckets, gathered ZeRO-3/FSDP parameters,
    dequantised and cast weights, pipeline buffers."""

    fb: float = 0.0  # alive from forward through backward
    unit_grads: float = 0.0  # one FSDP/ZeRO-3 unit's unsharded gradients (from a block's backward on)
    resident: float = 0.0  # allocated once and kept (ZeRO-3's gradient partition and reduce bucket)
    bucket: float = 0.0  # gradient reduction buckets (allocated when backward starts)
    flat: float = 0.0  # DeepSpeed ZeRO-0's flattened gradients (after backward)
    keeps_grads: bool = False  # the buffers keep every gradient alive (ZeRO-3's optimizer)
    released_at_loss: float = 0.0  # part of `fb` not gathered while the loss runs (FSDP2 resharded the blocks)
    gathered: float = 0.0  # part of `fb`: the ZeRO-3/FSDP parameters gathered at a time (zero3_gathered)
    # the share of `unit_grads` alive beside the in-flight micro-batches' activations: under FSDP2 with pipeline
    # stages a rank's chunks make their unsharded gradients one chunk at a time (marp/pipeline_order.py)
    grad_share: float = 1.0


def zero3_gathered(j: Job, i: int, n_layers: int, st: States) -> tuple[float, float]:
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
        layer_gathered = (lin * nf4_bytes(w) + (layer_params - lin) * 2.0) / 2.0
    gathered = 2 * max(layer_gathered, st.largest)
    bk = w.comm.buckets
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
    pp_unsharded = w.comm.fsdp_pp_unsharded and plan.pp > 1
    if not w.comm.reshard_after_forward or pp_unsharded:  # FSDP reshard_after_forward=False / ZeRO++-style, or
        gathered = max(gathered, st.params)  # FSDP2 under pipeline stages: the stage's gathered weights stay
    # one unit's unsharded gradients before reduce-scatter: only its trainable (adapter) ones under LoRA
    unit_trainable = (
        (lora_params_per_layer(a, w.adapters.lora_rank, w.adapters.lora_targets) / tp)
        if w.method != "full"
        else layer_params
    )
    if pp_unsharded:  # every unit's gradient kept unsharded in the reduce dtype over the step's micro-batches
        return gathered * (2.0 if w.precision != "fp32" else 4.0), st.trainable * FSDP_PP_REDUCE_BYTES
    return gathered * (2.0 if w.precision != "fp32" else 4.0), unit_trainable * j.gb


def _gather_units(j: Job, i: int, n_layers: int, st: States, b: Buffers) -> None:
    """ZeRO-3/FSDP full sharding: the gathered parameters from forward through backward, one unit's unsharded
    gradients, and what FSDP2 has resharded while the loss runs."""
    w, a, pc = j.w, j.w.arch, j.pc
    last = i == j.plan.pp - 1
    gathered, b.unit_grads = zero3_gathered(j, i, n_layers, st)
    b.fb += gathered
    b.gathered = gathered
    if w.comm.fsdp_pp_unsharded and j.plan.pp > 1:
        pass  # FSDP2 under pipeline stages: nothing is resharded within the step (zero3_gathered)
    elif w.framework == "torch" and w.comm.fsdp_tail_unit and w.comm.reshard_after_forward:
        # FSDP2 with the output layer in a tail unit (accelerate): while the loss runs every block is resharded
        # and only the tail (final norm, output layer) is gathered; a block's backward peaks in its MLP, when
        # the output projection's gradient is the only unsharded gradient it has made (CPU grid:
        # hf-trainer-fsdp2-*; the tail is resharded after its own backward)
        tail = ((pc.final + (pc.head or a.vocab * a.hidden)) * j.scale / j.vtp) if last else 0.0
        b.released_at_loss = max(0.0, gathered - tail * (2.0 if w.precision != "fp32" else 4.0))
        b.unit_grads = min(b.unit_grads, pc.largest_linear * j.scale / j.plan.tp * j.gb)
    elif w.framework == "torch" and w.comm.reshard_after_forward and j.plan.pp == 1:
        # FSDP2 with the output layer in the root unit (fully_shard on every block, then on the model): the root is
        # never resharded after forward, so while the loss runs only it (embedding, final norm, output layer) is
        # gathered; every block was resharded after its forward
        root = (pc.embedding + pc.final + (pc.head or 0)) * j.scale / j.vtp
        b.released_at_loss = max(0.0, gathered - root * (2.0 if w.precision != "fp32" else 4.0))


def stage_buffers(j: Job, i: int, n_layers: int, st: States) -> Buffers:
    """Communication and conversion buffers by framework: ZeRO-3/FSDP gathers, DeepSpeed's reduce bucket and
    flattened gradients, DDP's gradient buckets, QLoRA's dequantised weight, autocast's and fp8's weight casts,
    ring attention's K/V blocks."""
    w, a, pc, plan = j.w, j.w.arch, j.pc, j.plan
    tp, dp, cp = plan.tp, plan.dp, plan.cp
    last = i == plan.pp - 1
    bk = w.comm.buckets
    b = Buffers()
    if plan.zero == 3:
        _gather_units(j, i, n_layers, st, b)
    if i == 0 and w.method == "qlora" and w.adapters.bnb_stable_embedding:
        # bitsandbytes' StableEmbedding trains outside the optimizer: its gradient, made by the first backward, is
        # never zeroed nor freed
        b.resident += a.vocab * a.hidden * j.scale / j.vtp * j.gb
    if w.framework == "deepspeed" and plan.zero == 3 and st.trainable > 0:
        # ZeRO-3's optimizer allocates once and keeps: the gradient partition of every parameter (in the
        # gradient-accumulation dtype, the model's) and, with contiguous gradients, the reduce bucket
        b.resident = bk.reduce_bucket_size * j.gb
        b.keeps_grads = not w.states.optimizer_in_backward
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
        if last and w.adapters.qlora_quantized_head and pc.head:
            deq = max(deq, a.vocab * a.hidden * j.scale / j.vtp)
        # torchao's NF4Tensor.get_original_weight runs in eager ops: each element's 4-bit code as an int64 index
        # (8 bytes for a pair), the looked-up and scaled halves and their stack (2 bytes each per element), alive
        # together (measured on the CPU grid: torchtune-qlora-*); compiled, one kernel writes the 16-bit weight
        eager_nf4 = w.adapters.nf4_torchao and not w.activations.compile
        b.fb += deq * (12.0 if eager_nf4 else 2.0)
    if j.amp and w.method == "full":
        b.fb += st.linear * 2.0  # autocast's 16-bit weight copies, saved for backward (not under FSDP)
    if w.activations.fp8:
        b.fb += (st.linear / j.weight_div) * 1.0 + st.largest * 1.0  # fp8 weight casts (+ one being made)
    if cp > 1:
        # ring attention: the K/V block being received and the one being sent (double buffer), 16-bit
        kvd = a.kv * a.head_dim / tp
        b.fb += 2 * 2 * kvd * j.tokens * (4.0 if w.precision == "fp32" else 2.0)
    return b


def optimizer_step_buffers(j: Job, st: States) -> float:
    """The optimizer step's temporaries: torch's foreach Adam makes a state-sized sqrt(v) temporary, a fused or
    per-tensor step one tensor's; DeepSpeed's mixed-precision ZeRO hands the optimizer an fp32 gradient partition
    and all-gathers the updated weights through its bucket."""
    w, plan = j.w, j.plan
    out = 0.0
    if w.states.optimizer_in_backward or plan.offload_optimizer:
        return out
    local_states = st.trainable / j.opt_div
    if j.mixed_ds and plan.zero >= 1:
        out += local_states * 4.0  # fp32 gradient partition handed to the optimizer
    if w.states.optimizer in ("adam", "adamw") and not w.states.fused_optimizer:
        out += local_states * j.sdt  # foreach Adam: sqrt(v) temporary
    else:
        out += min(st.largest, local_states) * j.sdt
    if w.framework == "deepspeed" and plan.zero in (1, 2) and plan.dp > 1:
        out += min(w.comm.buckets.allgather_bucket_size, st.params) * j.wb
    return out


def pipeline_buffers(j: Job, i: int, inflight: float) -> float:
    """DeepSpeed's PipelineEngine keeps each micro-batch's stage output (the logits, on the last stage) in its pipe
    buffers, max(2, in-flight) of them, until the buffer is reused; and one more hidden-sized tensor per micro-batch
    in flight (the p2p copy of what is sent/received), plus its persistent receive buffers: activations (all but the
    first stage) and gradients (all but the last). Sequential stages (naive model parallelism) have no engine: a
    stage's output moves to the next GPU with `.to()`, which keeps nothing for backward."""
    w, a, plan = j.w, j.w.arch, j.plan
    if not (w.framework == "deepspeed" and plan.pp > 1) or plan.schedule == "sequential":
        return 0.0
    first, last = i == 0, i == plan.pp - 1
    nbuf = max(2, min(plan.pp - i, max(plan.grad_accum, 1)))
    out = (a.vocab / plan.tp if (last and a.head != "classification") else a.hidden) * j.e_act * j.tokens
    return nbuf * out + (inflight + (not first) + (not last)) * a.hidden * j.e_act * j.tokens
