"""The allocation requests of one transformer layer's forward and backward, built from MARP's per-term functions
and replayed through the caching-allocator replayer: the start of "reserved peak = the replay's, not a rate"
(issue 29), exposed for a later step and not used by predictions yet.

What a step of the layer requests here: in the forward, each tensor the block saves for backward
(`memory_activations.layer_activation_terms`, per token, times the micro-batch's tokens), in the order the block
makes them; in the backward, their frees in reverse order. A term that stands for several tensors made together
(q, k and v; SwiGLU's gate, up and product) is one request of their summed size, which changes the packing but
not the allocated bytes. Not yet requested: the forward's transient tensors that the block frees before its end,
the backward's gradient tensors and workspaces, the weights and optimizer states (allocated once, before the
steps), the loss.
"""

from __future__ import annotations

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
