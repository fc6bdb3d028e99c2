"""A pipeline rank's order of forwards and backwards per schedule, replayed for what is alive at each instant.

Owns the schedules' op order as torch.distributed.pipelining writes it (torch 2.13 `distributed/pipelining/
schedules.py`; earlier versions of the file, read for the Dec 2024 benchmark's torch 1963fc8, order them the
same where the micro-batches are a multiple of the pipeline degree) and `grad_moments`: the instants of a step at
which a rank holds the most micro-batches' activations beside unsharded gradients that grow chunk by chunk.
FSDP2 under torch's `PipelineStage` (torchtitan) keeps every unit's gradient unsharded from its first backward to
the step's last one, so a stage's gradients appear as its model chunks run their first backward, and interleaved
1F1B, whose rank runs its last chunk's backwards before its first chunk's, has half of them while it holds the most
activations.
"""

from __future__ import annotations

from frenzy_slurm.marp.plan import ParallelPlan

Op = tuple[str, int]  # ("F" or "B", the rank's local model chunk)


def rank_ops(schedule: str, pp: int, rank: int, n_mb: int, v: int = 1) -> list[Op]:
    """The order of a rank's forwards and backwards in one step of `n_mb` micro-batches (`v` chunks per rank)."""
    if schedule == "gpipe":  # ScheduleGPipe: every forward, then every backward
        return [("F", 0)] * n_mb + [("B", 0)] * n_mb
    if schedule == "interleaved" and v > 1:
        return _interleaved_ops(pp, rank, n_mb, v)
    # Schedule1F1B: min(n_mb, pp - rank) forwards of warm-up, then one backward before each remaining forward
    # ("1B1F"), then the remaining backwards
    warmup = min(n_mb, pp - rank)
    return [("F", 0)] * warmup + [("B", 0), ("F", 0)] * (n_mb - warmup) + [("B", 0)] * warmup


def _interleaved_ops(pp: int, rank: int, n_mb: int, v: int) -> list[Op]:
    """ScheduleInterleaved1F1B (`_get_warmup_ops`, `_get_1f1b_rank_ops`): forwards run chunk by chunk in rounds of
    `microbatches_per_round`, backwards from the last chunk back; the warm-up holds
    (v - 1) * per_round + 2 * (pp - 1 - rank) forwards (at most all of them), then each forward is followed by a
    backward. Earlier versions (List-typed, 2024) used `pp` for `per_round`: the same when `n_mb` is a multiple of
    `pp`."""
    rounds = max(1, n_mb // pp)
    per_round = n_mb // rounds
    total = n_mb * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)

    def fwd_chunk(step: int) -> int:
        return (step // per_round) % v

    def bwd_chunk(step: int) -> int:
        return v - 1 - ((step - warmup) // per_round) % v

    ops: list[Op] = [("F", fwd_chunk(s)) for s in range(warmup)]
    for s in range(warmup, total):
        ops += [("F", fwd_chunk(s)), ("B", bwd_chunk(s))]
    ops += [("B", bwd_chunk(s)) for s in range(total, total + warmup)]
    return ops


def replay(ops: list[Op], v: int) -> list[tuple[float, float]]:
    """(micro-batches alive in units of the whole stage, share of the stage's gradients alive) after each op:
    a forward keeps one chunk-micro-batch (1/v of the stage's layers), a backward frees one, and a chunk's first
    backward makes that chunk's gradients (1/v of the stage's). Within a backward the two change layer by layer,
    so the largest sum lies at one of these instants."""
    alive, done, states = 0, set[int](), []
    for kind, chunk in ops:
        if kind == "F":
            alive += 1
        else:
            alive -= 1
            done.add(chunk)
        states.append((alive / v, len(done) / v))
    return states


def grad_moments(plan: ParallelPlan, i: int) -> list[tuple[float, float]]:
    """The instants of stage `i`'s step that no other instant exceeds in both activations and gradients: (micro-
    batches alive in stage units, share of the stage's unsharded gradients alive). 1F1B's first stage (warm-up over
    every micro-batch) has (pp, 0) and (pp - 1, 1); a stage whose first backward is followed by a forward has
    (pp - i, 1); interleaved 1F1B's first ranks hold every chunk-micro-batch with only the last chunk's
    gradients, and all the gradients once that chunk's activations are gone."""
    v = plan.virtual_stages if plan.schedule == "interleaved" else 1
    states = replay(rank_ops(plan.schedule, plan.pp, i, max(plan.grad_accum, 1), v), v)
    return [s for s in set(states) if not any(o != s and o[0] >= s[0] and o[1] >= s[1] for o in states)]
