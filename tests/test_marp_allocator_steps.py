"""Variable-length steps through the caching-allocator replayer (marp/allocator_steps.py): the loss phase's requests
agree with the loss terms MARP sums, the lengths follow the stated distribution, skipping repeated steps changes
no replayed peak, the replayed peak has converged at STEPS, and a real tiny model's recorded run of those lengths,
replayed, leaves a cache of the size the generated steps give."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import NormalDist

import pytest

from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import allocator_steps as steps
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.allocator_replay import replay
from frenzy_slurm.marp.allocator_steps import step_lengths, van_der_corput, variable_length_excess
from frenzy_slurm.marp.memory_loss import LossRequest, logit_bytes_per_token, loss_requests
from frenzy_slurm.marp.workload import LossPolicy

from .helpers import load_benchmark
from .test_marp_variable_lengths import _spec

ROOT = Path(__file__).resolve().parent.parent
QWEN_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008, "vocab": 151936}


def _workload(data: dict | None = None, **over):
    spec = _spec(data, **over)
    return workload_from_spec(spec, resolve_model(spec, Path(".")))


def _live_peaks(reqs: list[LossRequest]) -> tuple[int, int]:
    """(peak live bytes, live bytes at the end) of a request list; every free names a live tensor."""
    live: dict[str, int] = {}
    peak = 0
    for is_alloc, key, n in reqs:
        if is_alloc:
            assert key not in live
            live[key] = n
            peak = max(peak, sum(live.values()))
        else:
            live.pop(key)
    return peak, sum(live.values())


@pytest.mark.parametrize(
    "policy",
    [
        LossPolicy(),  # torch's cross-entropy on an fp32 upcast of 16-bit logits, the logits gone before backward
        LossPolicy(hold_logits=True),
        LossPolicy(loss_fp32=False),
        LossPolicy(output_fp32=True, hold_logits=True),
        LossPolicy(loss_chunks=8),
    ],
)
def test_the_loss_requests_hold_what_the_loss_terms_sum(policy):
    w = dataclasses.replace(_workload(training__precision="bf16-mixed"), loss=policy)
    tokens = 2048
    fwd, bwd = loss_requests(w, 1, tokens)
    peak, end = _live_peaks(fwd + bwd)
    assert end == 0  # every tensor of the loss phase is freed by its end
    want = logit_bytes_per_token(w, 1) * tokens
    # unchunked: the same tensors at the same instants; chunked: the term also counts one chunk's 16-bit gradient
    # beside its two fp32 ones (measured on the CPU), which the requests free before it is made
    assert peak == pytest.approx(want, rel=0.03 if policy.loss_chunks > 1 else 1e-6)


def test_a_classification_head_has_no_loss_requests():
    w = _workload()
    w = dataclasses.replace(w, arch=w.arch.model_copy(update={"head": "classification"}))
    assert loss_requests(w, 1, 512) == ([], [])


def test_the_lengths_visit_the_stated_distribution_evenly():
    assert [van_der_corput(i) for i in range(1, 8)] == [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]
    lengths = step_lengths(8192, None, 3234.0, 2548.0, 1, 64)
    assert len(lengths) == 64 and max(lengths) <= 8192 and min(lengths) >= 1
    # the first is the median of the lengths, which are conditioned on at least one token
    d = NormalDist(3234.0, 2548.0)
    assert lengths[0] == round(d.inv_cdf(d.cdf(1.0) + (1 - d.cdf(1.0)) / 2)) == 3561
    # the records (each a new longest) fall at the quantiles 1 - 2^-k, as a shuffled dataset's do on average
    records = [i + 1 for i, n in enumerate(lengths) if n > max(lengths[:i], default=0)]
    assert records == [1, 3, 7, 15, 31, 63]
    # truncation: at 512 all but the shortest ~4.5 % of the samples (of those of at least one token) are cut
    short = step_lengths(512, None, 3234.0, 2548.0, 1, 64)
    assert sum(n < 512 for n in short) == 3
    # a padded micro-batch is as long as its longest sample: longer steps
    assert sum(step_lengths(4096, None, 2000.0, 1000.0, 4, 64)) > sum(step_lengths(4096, None, 2000.0, 1000.0, 1, 64))
    # only a median: a median step, then a longest one; no spread: one length
    assert step_lengths(2048, 700, None, None, 1) == (700, 2048)
    assert step_lengths(2048, 700, 900.0, 0.0, 1) == (900,)


def test_skipping_a_repeated_step_changes_no_peak():
    w = _workload({"lengths": "variable", "mean": 1200.0, "sd": 900.0})
    args = (1, False, "none", 2, 1, True)
    lengths = step_lengths(w.seq_len, None, 1200.0, 900.0, 2, 40)
    events = [e for n in lengths for e in steps.step_at(w, n, *args, True)]
    assert steps.replayed_peak(w, lengths, *args, True, "") == replay(events).reserved_peak


def test_the_replayed_peak_has_converged_at_the_steps_replayed():
    w = dataclasses.replace(
        _workload({"lengths": "variable", "mean": 3234.0, "sd": 2548.0}, training__seq_len=8192),
        arch=_workload().arch.model_copy(update=QWEN_7B),
    )
    conv = dict(steps.convergence(w, 1, False, "full", 1, 1, True, (steps.STEPS, 2 * steps.STEPS, 4 * steps.STEPS)))
    assert conv[steps.STEPS] == pytest.approx(conv[4 * steps.STEPS], rel=0.01)


def test_no_excess_when_every_step_is_the_longest_and_some_when_steps_vary():
    assert variable_length_excess(_workload({"lengths": "variable", "median": 2048}), 1, False, "none", 1, 1) == (0, 0)
    w = _workload({"lengths": "variable", "mean": 1200.0, "sd": 900.0})
    fraction, loss = variable_length_excess(w, 1, False, "none", 1, 1, True)
    assert fraction > 0 and loss > 0


@pytest.mark.slow
def test_a_recorded_variable_length_run_replays_to_the_generated_cache():
    """benchmarks/varlen_recorded_cpu.py: a tiny transformers Llama (vocabulary 32000) over 16 steps of 150 +- 100
    tokens truncated at 256, recorded with the profiler and replayed, against MARP's generated steps. Measured
    (torch 2.13 CPU, transformers 5.17): 112 MiB recorded, 144 MiB generated at the same lengths; the generated
    steps leave out the weights' gradients and AdamW's states, made during the first (shorter) step, which take
    some of its freed loss blocks (docs/marp.md)."""
    bench = load_benchmark("varlen_recorded_cpu")
    r = bench.compare(16, 256, 150.0, 100.0)
    assert r["recorded_excess"] > 0
    assert r["generated_excess"] == pytest.approx(r["recorded_excess"], rel=0.35)
