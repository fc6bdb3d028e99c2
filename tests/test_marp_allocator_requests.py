"""One transformer layer's requests (frenzy_slurm/marp/allocator_requests.py) replayed through the allocator
replayer: it replays, and its allocated peak is MARP's own saved-activation estimate for the layer."""

from __future__ import annotations

import pytest

from frenzy_slurm.jobspec import presets
from frenzy_slurm.marp import Workload
from frenzy_slurm.marp.allocator_requests import layer_step_requests, replay_layer
from frenzy_slurm.marp.memory_activations import layer_activation_bytes

LLAMA7 = presets()["llama-2-7b"].arch


@pytest.mark.parametrize("recompute", ["none", "selective"])
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_the_layer_replays_to_marps_estimate(recompute, attention):
    """Llama-2-7B, one micro-batch of 2 x 4096 tokens, 16-bit: three steps replay, every request is freed, and the
    allocated peak is layer_activation_bytes x tokens within 1% (the differences: 512-byte rounding, and a
    large-pool block's rest of 1 MiB or less, which is not split off and counts as allocated, as in torch)."""
    w = Workload.of(arch=LLAMA7, seq_len=4096, attention=attention)
    tokens = 2 * 4096
    result = replay_layer(w, tp=1, sp=False, recompute=recompute, tokens=tokens, steps=3)
    estimate = layer_activation_bytes(w, 1, False, recompute) * tokens
    assert result.allocated_peak == pytest.approx(estimate, rel=0.01)
    assert result.allocated_current == 0
    # the second and third steps reuse the first step's segments: nothing more is reserved
    one_step = replay_layer(w, tp=1, sp=False, recompute=recompute, tokens=tokens, steps=1)
    assert result.reserved_peak == one_step.reserved_peak >= result.allocated_peak


def test_the_requests_are_the_saved_tensors_in_forward_order_freed_in_reverse():
    w = Workload.of(arch=LLAMA7, seq_len=1024, attention="flash")
    events = layer_step_requests(w, tp=1, sp=False, recompute="none", tokens=1024)
    allocs = [e.key for e in events if e.action == "alloc"]
    frees = [e.key for e in events if e.action == "free"]
    assert allocs and frees == list(reversed(allocs))
    assert events[: len(allocs)] == [e for e in events if e.action == "alloc"]
