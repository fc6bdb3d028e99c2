"""Model states of one stage's rank: weights, gradients and optimizer states by precision, method and ZeRO/FSDP
stage, and whether gradients are alive through the forward; and the bytes of a job's training checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.marp.memory_job import Job, job, nf4_bytes
from frenzy_slurm.marp.params import lora_encoder_params, lora_head_params, lora_params_per_layer
from frenzy_slurm.marp.plan import ParallelPlan, Workload

NF4_STORAGE_BYTES = 0.5  # a 4-bit weight's packed storage, the part of nf4_bytes that is the parameter itself


@dataclass(frozen=True)
class States:
    """Model states of one stage's rank: what the parameters, their gradients and the optimizer hold."""

    params: int
    linear: float  # parameters in the blocks' linear layers
    trainable: float
    weights: float
    grads_all: float  # every local gradient, once backward has produced them all
    optimizer: float
    largest: float  # the largest matrix (per-tensor temporaries)
    head_grads: float  # the output layer's gradient (the first produced by backward)


def model_states(j: Job, i: int, n_layers: int) -> States:
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
        params += pc.embedding / j.vtp + pc.encoder / tp  # (an encoder-decoder model's encoder: its plans have pp 1)
    if last:
        # a tied head on another stage than the embedding is its own copy of the token embedding
        tied_copy = a.vocab * a.hidden if (pp > 1 and a.tied_embeddings and a.head != "classification") else 0
        params += (pc.final + pc.head + tied_copy) / j.vtp
    params = int(params * j.scale)
    linear = (pc.linear_per_layer * n_layers + (pc.encoder_linear if first else 0)) * j.scale / tp
    if lora:
        trainable = (
            lora_params_per_layer(a, w.adapters.lora_rank, w.adapters.lora_targets) * n_layers
            + (lora_head_params(a, w.adapters.lora_rank, w.adapters.lora_targets) if last else 0)
            + (lora_encoder_params(a, w.adapters.lora_rank, w.adapters.lora_targets) if first else 0)
        ) / tp
        base_bytes = 4.0 if w.precision == "fp32" else 2.0
        if w.method == "qlora":
            # (litgpt's plugin quantises every nn.Linear, the untied output layer too)
            q_head = (
                a.vocab * a.hidden * j.scale / j.vtp if (last and w.adapters.qlora_quantized_head and pc.head) else 0.0
            )
            frozen = (linear + q_head) * nf4_bytes(w) + (params - linear - q_head) * base_bytes
        else:
            frozen = params * base_bytes
        # (ZeRO-3/FSDP shard the adapters with the frozen weights: a unit's flat parameter holds both)
        weights = (frozen + trainable * j.wb) / j.weight_div
        if first and w.method == "qlora" and w.adapters.bnb_stable_embedding:
            weights += a.vocab * a.hidden * j.scale / j.vtp * base_bytes  # the swapped-out embedding, still referenced
    else:
        trainable = float(params)
        weights = params * j.wb / j.weight_div
    if plan.offload_params:
        weights = _resident_quant_states(j, linear, last)
    optimizer = 0.0 if (plan.offload_optimizer or w.states.paged_optimizer) else trainable * (j.sb + j.mb_) / j.opt_div
    if j.mixed_ds and plan.zero == 0:
        optimizer += trainable * 4.0  # BF16/FP16 optimizer's fp32 gradient accumulation buffer
    head_grads = (
        (a.vocab * a.hidden * j.scale / j.vtp) * j.gb / j.grad_div
        if (last and not lora and a.head != "classification")
        else 0.0
    )
    return States(
        params=params,
        linear=linear,
        trainable=trainable,
        weights=weights,
        # (stepped in backward, one parameter at a time: no full set of gradients is ever held)
        grads_all=0.0 if w.states.optimizer_in_backward else trainable * j.gb / j.grad_div,
        optimizer=optimizer,
        largest=pc.largest_matrix * j.scale / tp,
        head_grads=head_grads,
    )


def _resident_quant_states(j: Job, linear: float, last: bool) -> float:
    """What stays on the GPU of a stage's weights when FSDP's CPU offload moves the parameters to the host:
    bitsandbytes' quantization states (absmax and the double quantization's constants) are attributes of
    `Params4bit`, neither parameters nor buffers, so FSDP neither shards nor offloads them (torch FSDP1
    `_flat_param.py` flattens parameters only; fsdp_qlora `train.py` at 3afe102 l. 198-207 quantizes each weight on
    the GPU, `.cuda(device)`, and moves only its `.data` to the host or meta device): every rank keeps them whole.
    torchao's NF4 tensor carries its scales inside the tensor, sharded and offloaded with it: nothing stays."""
    w, a = j.w, j.w.arch
    if w.method != "qlora" or w.adapters.nf4_torchao:
        return 0.0
    q_head = a.vocab * a.hidden * j.scale / j.vtp if (last and w.adapters.qlora_quantized_head and j.pc.head) else 0.0
    return (linear + q_head) * (nf4_bytes(w) - NF4_STORAGE_BYTES)


def gradients_persist(j: Job, i: int) -> bool:
    """Whether gradients are alive through the forward pass: with accumulation (a pipeline stage peaks at its
    first backward with the most micro-batches in flight; its gradients exist then only if a forward follows a
    backward at that depth, grad_accum > pp - stage), when zero_grad keeps zeroed buffers (torch < 2.0), or in
    Megatron (its main_grad buffer is allocated once and kept). DeepSpeed and torch free .grad after the step.
    Sequential stages (naive model parallelism) finish a micro-batch's backward before the next forward, as one
    GPU does: gradients live through every forward after the first."""
    w, plan = j.w, j.plan
    accumulating = plan.grad_accum > (plan.pp - i if plan.pp > 1 and plan.schedule != "sequential" else 1)
    return accumulating or not w.states.zero_grad_to_none or w.framework == "megatron"


def checkpoint_bytes(w: Workload) -> float:
    """Bytes of the job's training checkpoint, whatever its layout: the weights it trains (a LoRA or QLoRA job's
    adapters only; its frozen weights come from the base model at every start), their master copy and their
    optimizer states, as one unsharded rank holds them. What a move writes and reads (has/moves.move_cost_s)."""
    j = job(w, ParallelPlan())
    s = model_states(j, 0, w.arch.layers)
    trained = s.weights if w.method == "full" else s.trainable * j.wb
    return trained + s.trainable * (j.sb + j.mb_)
