"""Predicted step time of a plan on a GPU type: compute at a utilisation factor, the memory-bound operations at the
memory bandwidth, plus exposed communication.

    compute   = flops_per_token * tokens_per_step / world / (peak_tflops * efficiency)
              + elementwise_bytes / mem_bw                           (norms, residual adds, activation, RoPE, loss)
    bubble    = compute * (pp - 1) / grad_accum                      (1F1B pipeline fill and drain)
              = compute * (pp - 1)                                   (sequential stages: one GPU active at a time)
    dp_comm   = 2 (dp-1)/dp * grad_bytes / bw   (x1.5 for ZeRO-3)    (ring all-reduce / reduce-scatter+gather)
    tp_comm   = 4 * layers/pp * grad_accum * 2 (tp-1)/tp * b*s*h*2 bytes / intra_bw
    pp_comm   = 2 * (pp-1) * grad_accum * b*s*h*2 bytes / inter_bw
    step      = compute + bubble + optimizer_bytes / mem_bw + (1 - overlap) * dp_comm + tp_comm + pp_comm + offload
              + step_overhead + microbatch_overhead * (grad_accum + pp - 1)   (sequential: grad_accum * pp)

The two fixed overheads come from the GPU spec (0 in the catalog; a site calibration sets them): per-op
dispatch, collective latency and optimizer bookkeeping dominate small models' steps, not FLOPs.

Small micro-batches run GEMMs below the GPU's sustained rate: compute is scaled by
(t + HALF_RATE_TOKENS) / t for t tokens per micro-batch (about 6% at 4,096 tokens, 2x at 256), which is
what makes `micro_batch: auto` prefer the largest micro-batch that fits.

The memory-bound operations (`elementwise_bytes`, docs/marp.md "Step time") move the bytes of the workload's own
tensors: per token and layer one forward reads and writes 10 h elements (two norms, two residual adds), the MLP
activation 2 f (3 f gated) and RoPE 2 (q + k) widths; backward twice the forward, a recomputed forward once more; the
loss 3 e + 16 bytes per logit; AdamW 30 bytes per trainable parameter a step (sharded by ZeRO). The GEMMs' FLOPs stay
at `efficiency` (now the utilisation of the matmuls alone, read per GPU type from published runs).

flops_per_token = 6 N + 12 L h s for full training (Kaplan et al. / Megatron), 4 N + ... for LoRA (no
weight gradients), plus one more forward (2 N + 4 L h s) with full recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from frenzy_slurm.core.gpus import GpuSpec
from frenzy_slurm.marp.params import count_params, lora_encoder_params, lora_head_params, lora_params_per_layer
from frenzy_slurm.marp.plan import ParallelPlan, Workload

DP_OVERLAP = 0.5  # share of the gradient all-reduce hidden behind backward compute
HALF_RATE_TOKENS = 256  # tokens per micro-batch at which kernels reach half their large-batch utilisation
PCIE_GBS = 25.0  # host <-> device, for offloaded optimizer states
CPU_ADAM_GBS = 20.0  # bytes of optimizer state a CPU Adam step streams per second
# AdamW's step per trainable parameter: reads the fp32 weight, gradient, m and v (16), writes weight, m and v (12) and
# the 16-bit working copy (2); torch's foreach/fused AdamW and DeepSpeed's FusedAdam stream each tensor once.
ADAM_BYTES_PER_PARAM = 30.0
# the loss per logit: the 16-bit logits written and read (2 e), the fp32 log-probabilities written and read in backward
# (8), their fp32 gradient written and read (8) and the gradient cast back to the logits' dtype (e)
LOSS_FP32_BYTES_PER_LOGIT = 16.0


def elementwise_bytes_per_token(w: Workload, recompute: str, tp: int = 1) -> tuple[float, float]:
    """(bytes per token per layer, bytes per token of the loss) that the memory-bound operations of one training step
    move on one tensor-parallel rank: what the memory bandwidth, not the tensor cores, paces.

    One forward reads and writes, per token and layer, 10 h elements for the two norms (read h, write h each) and
    the two residual adds (read 2 h, write h each), which every tp rank runs on the whole width; the MLP activation
    (read f, write f; gated: read 2 f, write f) and RoPE on q and k (read and write each) on the rank's 1/tp share.
    Backward reads the saved input and the incoming gradient and writes the input's gradient (the norms also their
    weight gradients): twice the forward. Full and per-op recomputation run the forward's element-wise ops again;
    selective recomputation reruns only the attention core, which is one fused kernel (its FLOPs are counted).
    Attention itself (flash or fused softmax) and the GEMMs' epilogues (bias) are not counted here."""
    a = w.arch
    e = 4.0 if w.precision == "fp32" else 2.0
    act = (3.0 if a.activation in ("swiglu", "geglu") else 2.0) * a.ffn
    rope = 2.0 * (a.inner + a.kv * a.head_dim) if a.position == "rope" else 0.0
    forward = 10.0 * a.hidden + (act + rope) / tp
    passes = 3.0 + (1.0 if recompute in ("full", "op") else 0.0)
    loss = a.vocab / tp * (3.0 * e + LOSS_FP32_BYTES_PER_LOGIT)
    return passes * forward * e, loss


def _adapter_params(w: Workload) -> float:
    """The adapters' parameters, all stages together: what AdamW steps under LoRA/QLoRA (marp/params.py's counts,
    as the optimizer-state term counts them)."""
    a, r, t = w.arch, w.adapters.lora_rank, w.adapters.lora_targets
    return float(lora_params_per_layer(a, r, t) * a.layers + lora_head_params(a, r, t) + lora_encoder_params(a, r, t))


def ring_gbs(ranks: int, intra_gbs: float, inter_gbs: float, gpus_per_node: int, tp: int = 1) -> float:
    """The bus bandwidth, GB/s, of a ring collective (all-reduce, reduce-scatter, all-gather) over `ranks` data-parallel
    ranks, each a tensor-parallel group of `tp` GPUs inside one node. Within a node: the node's GPU link. Over
    several nodes NCCL splits the collective into channels, one ring each, and lays them so that each ring crosses
    between nodes through another GPU's network card (nccl src/graph/search.cc, rings per NIC on rail-aligned
    nodes): each card carries 1/k of the bytes for a node's k ranks, so the node's cards together pace the ring, never
    faster than the link inside the node. `inter_gbs` is per GPU (the site file's meaning): a node with one card for
    8 GPUs states an eighth of the card's bandwidth."""
    if ranks * tp <= gpus_per_node:
        return intra_gbs
    return min(intra_gbs, inter_gbs * max(1, gpus_per_node // tp))


@dataclass(frozen=True)
class Links:
    """Bandwidths between GPUs, GB/s per GPU."""

    intra_node_gbs: float
    inter_node_gbs: float = 25.0  # 200 Gb/s InfiniBand HDR
    gpus_per_node: int = 8


def _encdec_forward(w: Workload) -> tuple[float, float]:
    """(matmul FLOPs of the weights, of attention) in one forward of one sample of an encoder-decoder model: the
    encoder's blocks over the source, the decoder's over the target, except its cross-attention's k and v, which
    project the encoder's output (source tokens); the LM head over the target; attention scores and their product
    with v for the encoder (source x source), the decoder (target x target) and the cross-attention (target x
    source). Embedding look-ups are not matmuls."""
    a = w.arch
    pc = count_params(a)
    s, t, kv_w = w.seq_len, w.decoder_len, 2 * a.hidden * a.kv * a.head_dim
    linear = 2.0 * pc.encoder * s + 2.0 * (pc.per_layer - kv_w) * a.layers * t + 2.0 * kv_w * a.layers * s
    linear += 2.0 * (pc.head or a.vocab * a.hidden) * t
    attn = 4.0 * a.inner * (a.encoder_layers * s * s + a.layers * t * t + a.layers * t * s)
    if w.exact_params:  # a traced factory: its exact count scales the weights' FLOPs
        linear *= w.exact_params / pc.total(a.layers)
    return linear, attn


def flops_per_token(w: Workload, recompute: str = "none") -> float:
    """FLOPs per token of `w.seq_len` (an encoder-decoder model's per sample, over its source length: the step's
    tokens are counted as global_batch x seq_len)."""
    a = w.arch
    if a.encoder_decoder:
        lin, attn = _encdec_forward(w)
        fwd = lin + attn
        bwd = 2.0 * fwd if w.method == "full" else (lin + 2.0 * attn)
        extra = {"full": fwd, "selective": attn, "op": lin / 2 + attn}.get(recompute, 0.0)
        return (fwd + bwd + extra) / w.seq_len
    n = w.exact_params or count_params(a).total(a.layers)
    attn = 4.0 * a.layers * a.hidden * w.seq_len  # forward QK^T and AV, multiply-adds x 2
    fwd = 2.0 * n + attn
    bwd = 2.0 * fwd if w.method == "full" else (2.0 * n + 2.0 * attn)
    # op (torchtitan's per-op policy): the matmuls not saved (about half of them) and every element-wise op run again
    extra = {"full": fwd, "selective": attn, "op": n + attn}.get(recompute, 0.0)
    return fwd + bwd + extra


@dataclass(frozen=True)
class PlanCosts:
    """The GPU-independent work of one step under a plan; `seconds_on` prices it for a GPU type."""

    flops_per_gpu: float
    bubble_fraction: float
    dp_bytes: float  # on the ring, per GPU (already x 2(dp-1)/dp, x1.5 for ZeRO-3)
    tp_bytes: float
    pp_bytes: float
    offload_s: float
    dp_span: int  # GPUs one data-parallel group spans (tp * dp)
    world: int
    precision: str
    micro_slots: int = 1  # micro-batch slots on the critical path: grad_accum + pp - 1
    elementwise_bytes: float = 0.0  # moved by the micro-batches' memory-bound operations on one GPU (elementwise_bytes)
    optimizer_bytes: float = 0.0  # moved by the optimizer step on one GPU
    tp: int = 1  # tensor-parallel degree: a data-parallel group has gpus_per_node / tp ranks on each node

    def compute_s(self, gpu: GpuSpec) -> float:
        """The micro-batches' work on one GPU: the GEMMs at the sustained matmul rate, the element-wise operations
        at the memory bandwidth (one after the other: PyTorch runs them as separate kernels on one stream)."""
        rate = gpu.peak_tflops(self.precision) * 1e12 * gpu.efficiency
        return self.flops_per_gpu / rate + self.elementwise_bytes / (gpu.mem_bw_gbs * 1e9)

    def seconds_on(self, gpu: GpuSpec, links: Links) -> float:
        fixed = gpu.step_overhead_s + gpu.microbatch_overhead_s * self.micro_slots
        optimizer = self.optimizer_bytes / (gpu.mem_bw_gbs * 1e9)  # once a step, outside the pipeline's bubble
        comm = self._comm_s(links) + self.offload_s
        return self.compute_s(gpu) * (1.0 + self.bubble_fraction) + optimizer + comm + fixed

    def _comm_s(self, links: Links) -> float:
        dp_bw = ring_gbs(
            self.dp_span // self.tp, links.intra_node_gbs, links.inter_node_gbs, links.gpus_per_node, self.tp
        )
        pp_bw = links.inter_node_gbs if self.world > links.gpus_per_node else links.intra_node_gbs
        comm = (1.0 - DP_OVERLAP) * self.dp_bytes / (dp_bw * 1e9) + self.tp_bytes / (links.intra_node_gbs * 1e9)
        comm += self.pp_bytes / (pp_bw * 1e9)
        return comm


def seconds_floor(smallest: PlanCosts, largest: PlanCosts, gpu: GpuSpec, links: Links) -> float:
    """A lower bound of `seconds_on` over plans that differ only in micro-batch (same dp, tp, pp, ZeRO,
    recomputation), from the costs of the smallest and the largest micro-batch among them.

    With the global batch fixed, compute shrinks as the micro-batch grows (small_batch_penalty), the bubble
    fraction and micro-batch slots move with grad_accum, and every other term stays the same (tp and pp
    bytes depend on grad_accum x micro_batch only): each term is taken at its own best end. It agrees with
    `seconds_on` up to rounding (the candidate search allows for that)."""
    # the element-wise bytes and the optimizer's do not depend on the micro-batch: equal at both ends
    compute = largest.compute_s(gpu) * (1.0 + min(smallest.bubble_fraction, largest.bubble_fraction))
    compute += largest.optimizer_bytes / (gpu.mem_bw_gbs * 1e9)
    comm = min(smallest._comm_s(links), largest._comm_s(links))
    fixed = gpu.step_overhead_s + min(
        gpu.microbatch_overhead_s * smallest.micro_slots, gpu.microbatch_overhead_s * largest.micro_slots
    )
    return compute + comm + min(smallest.offload_s, largest.offload_s) + fixed


def small_batch_penalty(tokens_per_micro_batch: float) -> float:
    return (tokens_per_micro_batch + HALF_RATE_TOKENS) / tokens_per_micro_batch


class PlanShape(NamedTuple):
    """The fields of a ParallelPlan that its costs depend on (the candidate search prices whole groups of
    plans before it builds any)."""

    dp: int
    tp: int
    pp: int
    zero: int
    micro_batch: int
    grad_accum: int
    recompute: str
    offload_optimizer: bool = False
    schedule: str = "1f1b"  # sequential stages (naive model parallelism) run one at a time

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp


class PlanPricer:
    """`plan_costs` for many plans of one workload and global batch: the parameter count and FLOPs per token
    (per recomputation setting) are computed once. The arithmetic is plan_costs', so the results are equal."""

    def __init__(self, w: Workload, global_batch: int):
        a = w.arch
        self.w, self.global_batch = w, global_batch
        self.n = w.exact_params or count_params(a).total(a.layers)
        self._flops: dict[str, float] = {}
        self._bytes: dict[tuple[str, int], tuple[float, float]] = {}

    def elementwise(self, recompute: str, tp: int) -> tuple[float, float]:
        if (recompute, tp) not in self._bytes:
            self._bytes[(recompute, tp)] = elementwise_bytes_per_token(self.w, recompute, tp)
        return self._bytes[(recompute, tp)]

    def flops_per_token(self, recompute: str) -> float:
        if recompute not in self._flops:  # at most one entry per recomputation setting
            self._flops[recompute] = flops_per_token(self.w, recompute)
        return self._flops[recompute]

    def costs(self, plan: ParallelPlan | PlanShape) -> PlanCosts:
        w, global_batch, n = self.w, self.global_batch, self.n
        a = w.arch
        tokens = global_batch * w.seq_len
        grad_bytes = (
            (n if w.method == "full" else n * 0.01) * (4.0 if w.precision == "fp32" else 2.0) / (plan.tp * plan.pp)
        )
        dp_bytes = 0.0
        if plan.dp > 1:
            dp_bytes = 2.0 * (plan.dp - 1) / plan.dp * grad_bytes * (1.5 if plan.zero == 3 else 1.0)
        act_bytes = plan.micro_batch * w.seq_len * a.hidden * 2.0
        tp_bytes = (
            4.0 * (a.layers + a.encoder_layers) / plan.pp * plan.grad_accum * 2.0 * (plan.tp - 1) / plan.tp * act_bytes
            if plan.tp > 1
            else 0.0
        )
        pp_bytes = 2.0 * (plan.pp - 1) * plan.grad_accum * act_bytes
        offload = 0.0
        world = plan.world
        per_layer, loss = self.elementwise(plan.recompute, plan.tp)
        replica_tokens = tokens / max(world // (plan.tp * plan.pp), 1)  # a data-parallel replica's tokens
        layers = (a.layers + a.encoder_layers) / plan.pp
        trainable = n if w.method == "full" else _adapter_params(w)
        optimizer_bytes = ADAM_BYTES_PER_PARAM * trainable / (plan.tp * plan.pp) / (plan.dp if plan.zero >= 1 else 1)
        sequential = plan.schedule == "sequential"
        if plan.offload_optimizer:
            local = n / world
            offload = local * 4.0 / (PCIE_GBS * 1e9) + local * 16.0 / (CPU_ADAM_GBS * 1e9)
        return PlanCosts(
            flops_per_gpu=self.flops_per_token(plan.recompute)
            * tokens
            / world
            * small_batch_penalty(plan.micro_batch * w.seq_len),
            # sequential stages never overlap: each GPU idles while the pp - 1 others compute
            bubble_fraction=(plan.pp - 1) / (1 if sequential else max(plan.grad_accum, 1)),
            dp_bytes=dp_bytes,
            tp_bytes=tp_bytes,
            pp_bytes=pp_bytes,
            offload_s=offload,
            dp_span=plan.dp * plan.tp,
            tp=plan.tp,
            world=world,
            precision=w.precision,
            micro_slots=plan.grad_accum * plan.pp if sequential else plan.grad_accum + plan.pp - 1,
            # the last stage holds the loss; the slowest stage paces the pipeline
            elementwise_bytes=replica_tokens * (layers * per_layer + loss),
            optimizer_bytes=optimizer_bytes,
        )


def plan_costs(w: Workload, plan: ParallelPlan, global_batch: int) -> PlanCosts:
    return PlanPricer(w, global_batch).costs(plan)


def step_time(w: Workload, plan: ParallelPlan, gpu: GpuSpec, global_batch: int, links: Links) -> float:
    """Seconds per optimizer step."""
    return plan_costs(w, plan, global_batch).seconds_on(gpu, links)
