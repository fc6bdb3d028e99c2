"""Steps of variable length through the caching-allocator replayer: the lengths model.yaml's `data:` block implies,
one step's representative requests at a length (two layers' saved tensors and the loss's vocabulary-sized
tensors), and what replaying a run of such steps reserves beyond a run at the longest length (issue 29,
docs/marp.md "Variable sequence lengths").

The lengths: with a stated mean and standard deviation of the samples' lengths before truncation, step `i` of `n`
is the quantile, at the `i`-th point of the base-2 van der Corput sequence, of the longest of a micro-batch of
samples drawn from that normal distribution (conditioned on at least one token) and truncated at the longest. The
sequence visits the distribution evenly at every prefix (no seed: the same lengths on every machine) in an order
that jumps between short and long steps as a shuffled dataset does; the replayed reserved peak converges within
a few dozen steps (benchmarks/varlen_steps.py). With only a median, a median step and then a longest one.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from statistics import NormalDist

from frenzy_slurm.marp.allocator_replay import CachingAllocator, Event, alloc, apply_event, free
from frenzy_slurm.marp.allocator_requests import layer_step_requests
from frenzy_slurm.marp.memory_activations import layer_activation_terms
from frenzy_slurm.marp.memory_loss import loss_requests
from frenzy_slurm.marp.plan import Recompute, Workload

STEPS = 64  # replayed steps of a stated distribution: the reserved peak has converged (benchmarks/varlen_steps.py)
LAYERS = 1  # representative layers per step: every layer makes the same requests


def van_der_corput(i: int) -> float:
    """The `i`-th point (i >= 1) of the base-2 van der Corput sequence in (0, 1): 1/2, 1/4, 3/4, 1/8, ..."""
    x, f = 0.0, 0.5
    while i:
        x += f * (i & 1)
        i >>= 1
        f /= 2
    return x


def step_lengths(
    longest: int, median: int | None, mean: float | None, sd: float | None, micro_batch: int, steps: int = STEPS
) -> tuple[int, ...]:
    """The tokens per sequence of the replayed steps (module docstring). A micro-batch padded to its longest sample
    is as long as the longest of `micro_batch` draws: the quantile at u ** (1 / micro_batch)."""
    if mean is None or sd is None:
        return (median, longest) if median is not None and median < longest else (longest,)
    if sd <= 0:
        return (max(1, min(longest, round(mean))),)
    dist = NormalDist(mean, sd)
    low = dist.cdf(1.0)  # the lengths are conditioned on at least one token
    out = []
    for i in range(1, steps + 1):
        u = van_der_corput(i) ** (1.0 / max(1, micro_batch))
        out.append(max(1, min(longest, round(dist.inv_cdf(low + (1.0 - low) * u)))))
    return tuple(out)


def step_requests(
    w: Workload, tp: int, sp: bool, recompute: Recompute, tokens: int, amp: bool, loss: bool, step: int
) -> list[Event]:
    """One step at `tokens` tokens per micro-batch (`w.seq_len` per sequence, for the terms that depend on it): the
    saved tensors of `LAYERS` layers in forward order, the loss's forward and backward (`loss`: the last stage),
    the layers' saved tensors freed in reverse."""
    forward: list[Event] = []
    backward: list[Event] = []
    for layer in range(LAYERS):
        events = layer_step_requests(w, tp, sp, recompute, tokens, amp, step=step * LAYERS + layer)
        half = len(events) // 2
        forward += events[:half]
        backward = events[half:] + backward
    if loss:
        fwd, bwd = loss_requests(w, tp, tokens)
        forward += [alloc(f"step{step}.{k}", n) if a else free(f"step{step}.{k}") for a, k, n in fwd]
        backward = [alloc(f"step{step}.{k}", n) if a else free(f"step{step}.{k}") for a, k, n in bwd] + backward
    return forward + backward


def replayed_peak(
    w: Workload, lengths: tuple[int, ...], tp: int, sp: bool, recompute: Recompute, mb: int, cp: int, amp: bool,
    loss: bool, settings: str,
) -> int:  # fmt: skip
    """The reserved peak of steps at `lengths` (tokens per sequence) replayed through a fresh allocator.

    A step frees every tensor it makes, so between steps each segment is one free block and the allocator's state
    is its set of segments, which only a step that makes a segment changes (nothing here releases one). A step at
    a length already replayed from the same state makes the same requests from the same state, so it makes no
    segment and leaves the state as it was: it is skipped. Most of a truncated distribution's steps are at the
    longest, so a replay of 64 steps runs only a few of them."""
    allocator = CachingAllocator(settings)
    addresses: dict[str | int, int] = {}
    done: set[tuple[int, int]] = set()  # (bytes reserved before the step, its length): steps that made no segment
    for length in lengths:
        before = allocator.total_mapped
        if (before, length) in done:
            continue
        # (every step frees its tensors by its end, so each step can reuse the keys of the one before)
        for event in step_at(w, length, tp, sp, recompute, mb, cp, amp, loss):
            apply_event(allocator, event, addresses)
        if allocator.total_mapped == before:
            done.add((before, length))
    return allocator.memory_stats()["reserved_bytes.all.peak"]


@lru_cache(maxsize=256)  # a replay asks for a few distinct lengths many times
def step_at(
    w: Workload, length: int, tp: int, sp: bool, recompute: Recompute, mb: int, cp: int, amp: bool, loss: bool
) -> tuple[Event, ...]:
    ws = w if length == w.seq_len else replace(w, seq_len=length)  # (eager attention's scores are seq wide)
    return tuple(step_requests(ws, tp, sp, recompute, max(1, mb * length // cp), amp, loss, 0))


@lru_cache(maxsize=1024)  # bounded: a search asks for few (workload, plan) pairs; the replays are the cost
def variable_length_excess(
    w: Workload,
    tp: int,
    sp: bool,
    recompute: Recompute,
    micro_batch: int,
    cp: int,
    amp: bool = False,
    settings: str = "",
) -> tuple[float, float]:
    """(fraction of the stage's saved activations, bytes on the last stage) that a run of steps at the lengths
    `step_lengths` gives reserves beyond a run at the longest (`w.seq_len`).

    The first: the replay of the layers' requests alone, its excess over two longest steps divided by the
    layers' saved bytes at the longest (every layer makes the same requests and any layer's request can take any
    cached block, so the fraction holds for the stage). The second: the loss's tensors replayed after the layers',
    the excess beyond what the layers alone gave; it can be negative, where the loss's large freed blocks hold the
    next step's layers. The caching allocator frees its cache and retries before it reports out of memory, so
    neither decides a fit."""
    lengths = step_lengths(w.seq_len, w.median_seq_len, w.length_mean, w.length_sd, micro_batch)
    if min(lengths) >= w.seq_len:
        return 0.0, 0.0
    args = (tp, sp, recompute, micro_batch, cp, amp)
    fixed = (w.seq_len, w.seq_len)
    layers = replayed_peak(w, lengths, *args, False, settings) - replayed_peak(w, fixed, *args, False, settings)
    both = replayed_peak(w, lengths, *args, True, settings) - replayed_peak(w, fixed, *args, True, settings)
    long_bytes = LAYERS * sum(layer_activation_terms(w, tp, sp, recompute, amp)) * max(1, micro_batch * w.seq_len // cp)
    fraction = max(0, layers) / long_bytes if long_bytes > 0 else 0.0
    return fraction, float(both - max(0, layers))


def convergence(w: Workload, tp: int, sp: bool, recompute: Recompute, micro_batch: int, cp: int, amp: bool,
                counts: tuple[int, ...]) -> list[tuple[int, int]]:  # fmt: skip
    """(steps, reserved peak of the layers and the loss) for each count of replayed steps: what STEPS rests on."""
    out = []
    for n in counts:
        lengths = step_lengths(w.seq_len, w.median_seq_len, w.length_mean, w.length_sd, micro_batch, n)
        out.append((n, replayed_peak(w, lengths, tp, sp, recompute, micro_batch, cp, amp, True, "")))
    return out
