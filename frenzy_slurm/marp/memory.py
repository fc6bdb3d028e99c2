"""Per-rank peak training memory for one workload under one parallel plan.

The peak is the largest of three moments of a training step, each the sum of
what is alive then (docs/marp.md derives every term):

- ``backward-start``: weights, optimizer states, persistent gradients, every
  saved activation of the micro-batches in flight, and the logits/loss tensors;
- ``backward-end``: all local gradients exist, activations are gone;
- ``optimizer-step``: gradients, states and the optimizer's temporaries.

The breakdown reported is the one of the peak moment, so its parts add up.

Each term has a module of its own: `memory_job` (what every stage shares: byte widths, sharding divisors),
`memory_states` (weights, gradients, optimizer states), `memory_activations` (what a block saves for backward),
`memory_loss` (logits and loss), `memory_buffers` (communication and conversion buffers, the optimizer step's
temporaries), `memory_moments` (the moments and the peak) and `memory_reserved` (the allocator's and the
device's overheads, by metric). This module sums them per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.llmc import breakdown, parameter_count
from frenzy_slurm.marp.memory_activations import in_flight, layer_activation_bytes
from frenzy_slurm.marp.memory_buffers import optimizer_step_buffers, pipeline_buffers, stage_buffers
from frenzy_slurm.marp.memory_encdec import encdec_saved_activations
from frenzy_slurm.marp.memory_job import NF4_PLAIN_BYTES_PER_PARAM, QLORA_BYTES_PER_PARAM, Job, job
from frenzy_slurm.marp.memory_loss import (
    fused_linear_loss_bytes,
    logit_bytes_per_token,
    logits_and_loss,
    loss_forward_bytes,
    previous_output,
)
from frenzy_slurm.marp.memory_memo import TermMemo
from frenzy_slurm.marp.memory_moments import ActivationTerms, LossTerms, StageTerms, peak_moment
from frenzy_slurm.marp.memory_reserved import allocator_overhead, length_change_cache
from frenzy_slurm.marp.memory_saved import saved_activations
from frenzy_slurm.marp.memory_states import States, gradients_persist, model_states
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.pipeline_order import grad_moments
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Workload

__all__ = [
    "COMPONENTS",
    "NF4_PLAIN_BYTES_PER_PARAM",
    "QLORA_BYTES_PER_PARAM",
    "MemoryEstimate",
    "Overheads",
    "StageMemory",
    "estimate_memory",
    "stage_terms",
]

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
    # of the overhead: what shorter steps' blocks keep cached under variable lengths, freed before an out-of-memory
    cached: float = 0.0
    # what the allocator gave back of that cache to stay within the GPU (`MemoryEstimate.within`), no longer counted
    released: float = 0.0

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

    @property
    def needed(self) -> float:
        """What the rank must be able to hold: the peak less the cache the allocator frees before it fails."""
        return self.peak - self.cached

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

    @cached_property
    def needed(self) -> float:
        """The largest per-rank need over stages (StageMemory.needed): what decides whether a GPU type fits."""
        return max(s.needed for s in self.stages)

    @property
    def peak_gib(self) -> float:
        return self.peak / GiB

    @property
    def released(self) -> float:
        """Bytes of the variable-length cache left out to stay within the GPU (`within`), over stages."""
        return max((s.released for s in self.stages), default=0.0)

    def on_gpu(self, memory: float, overheads: Overheads) -> MemoryEstimate:
        """This estimate on a GPU of `memory` bytes (the catalog's `memory_gib`) with the job's `overheads`: the
        device metric reads at most all of it; the reserved one at most what the device terms (the CUDA context,
        NCCL's buffers, the cuBLAS workspaces: `Overheads.device_bytes`, which that metric leaves out) leave of
        it. `within` says what gives way."""
        if self.metric == "allocated":  # nothing cached is counted: the allocated reading never exceeds the need
            return self
        outside = 0.0 if self.metric == "device" else overheads.device_bytes(self.plan.world)
        return self.within(memory - outside)

    def within(self, limit: float) -> MemoryEstimate:
        """This estimate on a GPU whose memory lets the metric read at most `limit` bytes per rank (`gpu_limit`).

        When cudaMalloc fails, PyTorch's caching allocator frees its cached blocks and retries before it reports
        out of memory (c10/cuda/CUDACachingAllocator.cpp, `alloc_block` -> `release_cached_blocks`; the replayer's
        `capacity`), so a run's reserved peak never exceeds what the device can map, and the variable-length cache
        (`cached`) is what gives way first. Each stage keeps at most `limit`, down to its `needed`, which is
        unchanged: a need past the GPU is an out of memory, not a smaller reading. The replayer itself is not
        given the capacity: it replays one representative layer and the loss, not the step's other tensors, so it
        does not know how much of the device they leave (docs/marp.md, "Variable sequence lengths")."""
        stages = []
        for s in self.stages:
            cut = min(s.cached, max(0.0, s.peak - limit))
            if cut > 0:
                s = replace(s, overhead=s.overhead - cut, cached=s.cached - cut, released=s.released + cut)
            stages.append(s)
        return replace(self, stages=tuple(stages))


def estimate_memory(
    w: Workload,
    plan: ParallelPlan,
    metric: Metric = "allocated",
    overheads: Overheads = Overheads(),
    peak_stages_only: bool = False,
    memo: TermMemo | None = None,
    cache: bool = True,
) -> MemoryEstimate:
    """Per-stage peak bytes per rank: each term (model states, buffers, saved activations, logits and loss, the
    optimizer step's temporaries, the allocator's and the device's overheads) from its own function, summed at
    each moment of the step (the module docstring); the breakdown is that of the largest.

    `peak_stages_only` computes only the first and last pipeline stages. With the default front split (earlier
    stages get the extra layers) every middle stage holds no more layers, no more in-flight micro-batches
    and no embedding, so one of those two is the peak; the candidate search uses this to stay fast.

    `memo` (the candidate search's, for `w`): terms shared with other plans of `w` are looked up there
    (marp/memory_memo.py says which, and why the estimate is the same as without it).

    `cache=False` leaves out what variable lengths keep cached (`cached`, a replay of the run's steps): `needed`,
    which decides fits, is the same either way, so the candidate search decides without it and adds it to the
    plans it keeps.
    """
    if w.llmc is not None:  # llm.c: its buffers, allocated once at start-up, are alive at every moment
        parts = breakdown(w.arch, w.llmc, plan, w.seq_len, metric, overheads)
        stage = StageMemory(
            stage=0, layers=w.arch.layers, params=parameter_count(w.arch, w.llmc), phase="start-up", **parts
        )
        return MemoryEstimate(plan=plan, metric=metric, stages=(stage,))
    j = job(w, plan, memo)
    stages = []
    for i, n_layers in enumerate(plan.stage_layers(w.arch.layers)):
        if peak_stages_only and plan.layer_split is None and plan.layer_balance == "front" and 0 < i < plan.pp - 1:
            continue
        t = stage_terms(j, i, n_layers)
        peak = peak_moment(t)
        cached = length_change_cache(j, peak, metric, last=i == plan.pp - 1) if cache else 0.0
        overhead = allocator_overhead(j, i, n_layers, t, peak, metric, overheads) + cached
        stages.append(
            StageMemory(
                stage=i,
                layers=n_layers,
                params=t.st.params,
                overhead=overhead,
                phase=peak.phase,
                cached=cached,
                **peak.parts(),
            )
        )
    return MemoryEstimate(plan=plan, metric=metric, stages=tuple(stages))


def stage_terms(j: Job, i: int, n_layers: int) -> StageTerms:
    """What stage `i` (of `n_layers` blocks) holds, term by term: model states, buffers, activations, the loss's."""
    w, last = j.w, i == j.plan.pp - 1
    st = model_states(j, i, n_layers) if j.memo is None else _memo_states(j, i, n_layers, j.memo)
    b = stage_buffers(j, i, n_layers, st)
    persistent = (gradients_persist(j, i) and not w.states.optimizer_in_backward) or b.keeps_grads
    inflight = in_flight(j.plan, i)
    if w.comm.fsdp_pp_unsharded and j.plan.pp > 1 and j.plan.schedule != "sequential" and not w.arch.encoder_decoder:
        inflight, b.grad_share = _unsharded_grads_peak(j, i, n_layers, b.unit_grads)
    if w.arch.encoder_decoder:
        saved, recomputed, work, block = encdec_saved_activations(j, n_layers, inflight)
    else:
        saved, recomputed, work = saved_activations(j, i, n_layers, inflight)
        block = j.per_layer_act * j.tokens
    logits = loss_grads = 0.0
    if last:
        logits, loss_grads, head_inputs = logits_and_loss(j, st, persistent)
        saved += head_inputs
    out16, prev_logits, prev_inputs = previous_output(j, i, n_layers, inflight)
    fwd_grads = 0.0
    if w.states.zero_grad_after_forward and not persistent and not w.states.optimizer_in_backward:
        # the end of the forward with the previous step's gradients still alive (zero_grad runs after it):
        # this step's output and the loss's forward tensors beside them
        fwd_grads = st.grads_all
        out16 = loss_forward_bytes(j) if last else 0.0
    return StageTerms(
        st=st,
        b=b,
        persistent=persistent,
        fb_buffers=b.fb + pipeline_buffers(j, i, inflight),
        step_buffers=optimizer_step_buffers(j, st),
        acts=ActivationTerms(saved, recomputed, work, block=block),
        loss=LossTerms(logits, loss_grads, out16, prev_logits, prev_inputs, fwd_grads),
    )


def _unsharded_grads_peak(j: Job, i: int, n_layers: int, grads: float) -> tuple[float, float]:
    """(micro-batches in flight, share of the stage's unsharded gradients) at the instant of the schedule's replay
    (marp/pipeline_order.py) where their saved activations and those gradients sum highest: FSDP2 under torch's
    PipelineStage makes each chunk's unsharded gradients at its first backward and keeps them to the step's end."""
    moments = grad_moments(j.plan, i)
    return max(moments, key=lambda m: saved_activations(j, i, n_layers, m[0])[0] + m[1] * grads)


def _memo_states(j: Job, i: int, n_layers: int, memo: TermMemo) -> States:
    """`model_states(j, i, n_layers)` through the search's memo. It reads of the plan only the fields in the key
    (the degrees, the ZeRO stage and shard group, offloading): the same stage's states at every micro-batch and
    gradient accumulation, computed once."""
    p = j.plan
    key = (p.dp, p.tp, p.pp, p.cp, p.zero, p.shard_group, p.offload_optimizer, p.offload_params, i, n_layers)
    return memo.get("states", key, lambda: model_states(j, i, n_layers))


# the terms' functions under the names tests and benchmarks import them by (from before each term had its module)
_layer_activation_bytes = layer_activation_bytes
_logit_bytes_per_token = logit_bytes_per_token
_fused_linear_loss_bytes = fused_linear_loss_bytes
_job = job
