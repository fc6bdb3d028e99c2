"""model.yaml's `data:` block: variable sequence lengths. The longest step sets the memory; the reserved reading adds
what a median-length step before it leaves cached in the caching allocator (replayed), and that cache decides no fit,
since the allocator frees it before it reports out of memory."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from pydantic import ValidationError

from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.allocator_replay import replay
from frenzy_slurm.marp.allocator_requests import layer_step_requests, length_change_fraction
from frenzy_slurm.marp.allocator_steps import variable_length_excess
from frenzy_slurm.marp.candidates import GpuOption, search
from frenzy_slurm.marp.frameworks import profile_lines
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import make_spec


def _spec(data: dict | None = None, **over):
    over.setdefault("model", {"preset": "llama-3.2-1b"})
    over.setdefault("entry", {"trainer": "script", "script": "train.py", "framework": "hf-trainer"})
    over.setdefault("training__seq_len", 2048)
    over.setdefault("training__global_batch", 16)
    if data is not None:
        over["data"] = data
    return make_spec(**over)


def _workload(spec):
    return workload_from_spec(spec, resolve_model(spec, Path(".")))


def test_the_data_block_is_checked_with_a_fix_named():
    with pytest.raises(ValidationError, match="data.longest: 4096 is longer than training.seq_len 2048"):
        _spec({"lengths": "variable", "longest": 4096})
    with pytest.raises(ValidationError, match="median 900 is longer than longest 800; swap them"):
        _spec({"lengths": "variable", "longest": 800, "median": 900})
    with pytest.raises(ValidationError, match="longest describe variable lengths; set lengths: variable"):
        _spec({"longest": 800})
    with pytest.raises(ValidationError, match="mean, sd describe variable lengths; set lengths: variable"):
        _spec({"mean": 800, "sd": 10})
    with pytest.raises(ValidationError, match="data.mean needs data.sd"):
        _spec({"lengths": "variable", "mean": 800})
    with pytest.raises(ValidationError, match="data.sd needs data.mean"):
        _spec({"lengths": "variable", "sd": 80})
    with pytest.raises(ValidationError, match="greater than 0"):
        _spec({"lengths": "variable", "mean": 0, "sd": 80})
    with pytest.raises(ValidationError, match="built-in trainer packs"):
        make_spec(data={"lengths": "variable"})


def test_the_longest_sets_the_workload_and_the_median_defaults_to_half_of_it():
    fixed = _workload(_spec())
    assert (fixed.seq_len, fixed.median_seq_len) == (2048, None)
    w = _workload(_spec({"lengths": "variable", "longest": 1500}))
    assert (w.seq_len, w.median_seq_len) == (1500, 750)
    w = _workload(_spec({"lengths": "variable", "median": 300}))
    assert (w.seq_len, w.median_seq_len) == (2048, 300)


def test_the_fraction_is_the_replayed_difference_of_reserved_peaks():
    w = _workload(_spec({"lengths": "variable", "median": 600}))
    mb, short, long = 4, 600, 2048

    def peak(first_len: int) -> int:
        first = dataclasses.replace(w, seq_len=first_len)
        events = layer_step_requests(first, 1, False, "none", mb * first_len, step=0)
        events += layer_step_requests(w, 1, False, "none", mb * long, step=1)
        return replay(events).reserved_peak

    saved = sum(e.size for e in layer_step_requests(w, 1, False, "none", mb * long) if e.action == "alloc")
    got = length_change_fraction(w, 1, False, "none", mb, 1, short)
    assert got == pytest.approx((peak(short) - peak(long)) / saved)
    assert 0.0 < got < 1.0  # some of the long step's tensors fit in the short step's cached blocks, not all
    assert length_change_fraction(w, 1, False, "none", mb, 1, long) == 0.0


def test_reserved_carries_the_cache_and_fits_are_decided_without_it():
    plan = ParallelPlan(dp=1, micro_batch=4, grad_accum=4)
    fixed = _workload(_spec())
    varied = _workload(_spec({"lengths": "variable", "median": 600}))
    for metric in ("allocated", "reserved", "device"):
        a, b = estimate_memory(fixed, plan, metric), estimate_memory(varied, plan, metric)
        stage = b.stages[0]
        assert stage.needed == pytest.approx(a.stages[0].peak)  # the longest step: a fixed run at 2048 tokens
        if metric == "allocated":
            assert stage.cached == 0.0
        else:
            # (autocast: bf16-mixed)
            fraction, loss = variable_length_excess(varied, 1, False, "none", 4, 1, True)
            assert stage.cached == pytest.approx(fraction * stage.activations + loss)
            assert stage.cached > 0.1 * GiB
            assert b.peak == pytest.approx(a.peak + stage.cached)
    # the same plans are chosen: the cache is freed before an out-of-memory, so it takes no GPU type away
    opts = [GpuOption("a100", catalog()["A100-40GB"], 8), GpuOption("l4", catalog()["L4"], 8)]
    got = search(varied, opts, global_batch=16, steps=10)
    want = search(fixed, opts, global_batch=16, steps=10)
    assert {k: [c.plan for c in v] for k, v in got.items()} == {k: [c.plan for c in v] for k, v in want.items()}
    assert any(c.memory.peak > c.memory.needed for cands in got.values() for c in cands)


def test_explain_says_what_variable_lengths_do():
    lines = profile_lines(_spec({"lengths": "variable", "longest": 1800, "median": 400}))
    assert lines[-1].startswith("data: variable lengths, longest 1800 tokens, median 400: memory is that of")
    assert not any(line.startswith("data:") for line in profile_lines(_spec()))
