"""The MARP workload: a few fields every memory term reads, the rest in frozen groups by the term that reads them."""

from __future__ import annotations

import dataclasses

import pytest

from frenzy_slurm.jobspec import presets
from frenzy_slurm.marp import Workload
from frenzy_slurm.marp.workload import ActivationPolicy, LossPolicy

ARCH = presets()["llama-3.2-1b"].arch


def test_flat_settings_go_to_their_groups():
    w = Workload.of(ARCH, 2048, method="lora", loss_chunks=8, attention="eager", lora_rank=8, caching_allocator=False)
    assert (w.method, w.seq_len) == ("lora", 2048)
    assert w.loss.loss_chunks == 8 and w.activations.attention == "eager"
    assert w.adapters.lora_rank == 8 and not w.alloc.caching_allocator
    assert w.states == Workload(ARCH, 2048).states  # untouched groups keep their defaults


def test_with_changes_one_setting_and_keeps_the_rest():
    w = Workload.of(ARCH, 2048, loss_chunks=8, hold_logits=True)
    v = w.with_(loss_chunks=4)
    assert v.loss == LossPolicy(loss_chunks=4, hold_logits=True) and w.loss.loss_chunks == 8
    # a whole group, then settings of it on top
    u = w.with_(activations=ActivationPolicy(compile=True), attention="eager")
    assert u.activations == ActivationPolicy(compile=True, attention="eager")
    with pytest.raises(TypeError):
        w.with_(no_such_setting=1)


def test_a_workload_is_frozen_and_compared_by_value():
    """The memory terms' caches and HAS's kept searches are keyed by the workload's value."""
    a, b = Workload.of(ARCH, 1024, fp8=True), Workload.of(ARCH, 1024, fp8=True)
    assert a == b and hash(a) == hash(b) and a != a.with_(fp8=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.loss.loss_chunks = 2  # type: ignore[misc]
