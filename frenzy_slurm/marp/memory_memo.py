"""A memo of memory terms for the many estimates of one workload that the candidate search makes (`TermMemo`).

The search (marp/candidates.py) estimates about 150 plans of one workload (llama2-7b over 8 GPU types); many of
them share terms that depend on the workload and a few plan fields only: the model states of a stage do not
depend on the micro-batch, a block's saved bytes per token only on tp, sequence parallelism, recomputation,
autocast and cp, and the allocator's packing of the long-lived tensors (the bulk of its cost) only on their
sizes. `estimate_memory(..., memo=TermMemo(w))` looks those up here instead of computing them again.

Why a hit returns exactly what the call would have: each table is keyed by every input of the function it stands
for other than the workload, and a memo belongs to one workload (`job` refuses another). The functions are pure
(their results are frozen dataclasses and floats, never changed after), so the results stay bit-identical;
tests/test_marp_memory_memo.py compares every estimate of a search with and without the memo. A memo lives for
one search, or for the searches of one workload that one caller makes together (has/kept.py `Kept.memo`:
fsbatch's fallback plans search the job's workload again over other usable memory, and find each plan's whole
estimate here); never a process-wide cache keyed by a workload's repr, which would grow and cost a hash a lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

T = TypeVar("T")


class TermMemo:
    """Memory terms of one workload already computed, by table and by the inputs they depend on."""

    def __init__(self, workload: object):
        self.workload = workload  # the one workload every entry is of (or of an equal one)
        self._tables: dict[str, dict[Hashable, Any]] = {}
        self.hits = 0
        self.misses = 0

    def get(self, table: str, key: Hashable, compute: Callable[[], T]) -> T:
        """The entry of `table` at `key`, computed by `compute()` the first time (the key must hold every input of
        `compute` besides the workload)."""
        entries = self._tables.get(table)
        if entries is None:
            entries = self._tables[table] = {}
        elif key in entries:
            self.hits += 1
            hit: T = entries[key]  # what compute() returned for this key
            return hit
        value = entries[key] = compute()
        self.misses += 1
        return value
