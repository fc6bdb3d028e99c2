"""The allocation requests of one transformer layer's forward and backward, built from MARP's per-term functions
and replayed through the caching-allocator replayer: the start of "reserved peak = the replay's, not a rate"
(issue 29), exposed for a later step and used by predictions for variable sequence lengths (`length_change_fraction`).

What a step of the layer requests here: in the forward, each tensor the block saves for backward
(`memory_activations.layer_activation_terms`, per token, times the micro-batch's tokens), in the order the block
makes them; in the backward, their frees in reverse order. A term that stands for several tensors made together
(q, k and v; SwiGLU's gate, up and product) is one request of their summed size, which changes the packing but
not the allocated bytes. Not yet requested: the forward's transient tensors that the block frees before its end,
the backward's gradient tensors and workspaces, the weights and optimizer states (allocated once, before the
steps), the loss.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from frenzy_slurm.marp.allocator_replay import Event, ReplayResult, alloc, free, replay
from frenzy_slurm.marp.memory_activations import layer_activation_terms
from frenzy_slurm.marp.plan import Recompute, Workload


def layer_step_requests(
    w: Workload,
    tp: int,
    sp: bool,
    recompute: Recompute,
    tokens: int,
    amp: bool = False,
    step: int = 0,
    stream: int = 0,
) -> list[Event]:
    """One step of one layer: the saved tensors allocated in forward order, then freed in reverse (backward)."""
    sizes = [round(t * tokens) for t in layer_activation_terms(w, tp, sp, recompute, amp)]
    keys = [f"step{step}.saved{i}" for i, size in enumerate(sizes) if size > 0]
    forward = [alloc(key, size, stream) for key, size in zip(keys, (s for s in sizes if s > 0), strict=True)]
    backward = [free(key) for key in reversed(keys)]
    return forward + backward


def replay_layer(
    w: Workload,
    tp: int,
    sp: bool,
    recompute: Recompute,
    tokens: int,
    steps: int = 3,
    amp: bool = False,
    settings: str = "",
) -> ReplayResult:
    """`steps` steps of one layer through a fresh allocator with `settings` (PYTORCH_ALLOC_CONF)."""
    events = [e for s in range(steps) for e in layer_step_requests(w, tp, sp, recompute, tokens, amp, step=s)]
    return replay(events, settings)


@lru_cache(maxsize=1024)  # bounded: a search asks for few (workload, plan) pairs; the replay is the cost
def length_change_fraction(
    w: Workload,
    tp: int,
    sp: bool,
    recompute: Recompute,
    micro_batch: int,
    cp: int,
    short_len: int,
    amp: bool = False,
    settings: str = "",
) -> float:
    """What a step at the longest length (`w.seq_len`) reserves beyond a fixed-length run when a shorter step
    (`short_len` tokens per sequence) came before it, as a fraction of that step's saved-tensor bytes.

    The caching allocator keeps the short step's freed blocks cached; the long step's tensors are larger, so only
    those a cached block can hold (split) reuse it, and the rest are new segments beside the cache. One layer's
    requests are replayed for a short step then a long one, and for two long ones: the difference in reserved peaks
    over the long step's bytes. Every layer makes the same requests and any layer's request can take any cached
    block, so the fraction holds for a stage of layers. (The allocator frees its cache before it reports out of
    memory, so this shows in the reserved reading, not as a failure.)"""
    long_len = w.seq_len
    if short_len >= long_len:
        return 0.0
    short_w = replace(w, seq_len=short_len)  # (eager attention's score matrix is as wide as the step's sequence)

    def tokens(length: int) -> int:
        return max(1, micro_batch * length // cp)

    def reserved_peak(first: Workload, first_len: int) -> int:
        events = layer_step_requests(first, tp, sp, recompute, tokens(first_len), amp, step=0)
        events += layer_step_requests(w, tp, sp, recompute, tokens(long_len), amp, step=1)
        return replay(events, settings).reserved_peak

    long_bytes = sum(layer_activation_terms(w, tp, sp, recompute, amp)) * tokens(long_len)
    if long_bytes <= 0:
        return 0.0
    return max(0, reserved_peak(short_w, short_len) - reserved_peak(w, long_len)) / long_bytes
