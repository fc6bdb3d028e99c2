"""What a deciding process keeps between HAS decisions, keyed by what decides it, and for how long.

`Kept` holds MARP's candidate searches per job shape (`SearchKey`: the workload, the GPU options, the batch,
the GPU limit and the search space, compared by value) and the last decision's `ReleaseIndex`. A search's
answer depends on the job's steps only through `Candidate.steps` (marp/candidates.py builds each candidate
with them and uses them for nothing else), so a job of the same shape with other steps gets the kept
candidates with its steps. The index is extended to the next view where that gives the index a new one would
(`ReleaseIndex.extend` checks it): on a deep queue each decision then reserves only the jobs queued since.

Lifetime: `has.decide` takes a `Kept` from its caller; without one it uses `PROCESS_KEPT`, which lives as long
as the process. fsbatch decides once per process; the simulator and the Python API decide many jobs in one
and reuse it. A caller deciding in several threads passes one `Kept` per thread; `forget()` drops what is kept
(a benchmark timing decisions from cold). Bounded: `SEARCH_CACHE_SIZE` searches, oldest dropped first, one index.
`memo(w)`: the memory terms and estimates MARP's searches of one workload share (marp/memory_memo.py): fsbatch's
fallback plans search the job's workload again over other usable memory (`MEMO_WORKLOADS` workloads kept).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, fields, replace

from frenzy_slurm.marp.candidates import Candidate, GpuOption, SearchSpace
from frenzy_slurm.marp.memory_memo import TermMemo
from frenzy_slurm.marp.plan import Workload
from frenzy_slurm.slurm.releases import ReleaseIndex
from frenzy_slurm.slurm.view import ClusterView

# Jobs of one shape recur in a queue (the simulator's Philly jobs: a few models, batches and sequence lengths):
# this many searches are kept, oldest dropped first.
SEARCH_CACHE_SIZE = 512
# Memos of MARP's memory terms and estimates (marp/memory_memo.py), one per workload, this many kept: fsbatch
# searches one workload up to 5 times (its decision and the fallback plans, has/fallback.py), over other usable
# memory and the same plans (about 0.2 MB each after a 2,048-GPU decision of llama2-7b and its fallbacks)
MEMO_WORKLOADS = 16

Searched = dict[Hashable, list[Candidate]]  # marp.candidates.search's answer: candidates per GPU option


@dataclass(frozen=True)
class SearchKey:
    """What a MARP candidate search's answer depends on, apart from the steps (compared by value)."""

    workload: Workload
    options: tuple[GpuOption, ...]
    global_batch: int
    max_gpus: int | None
    space: tuple[tuple[str, Hashable], ...]  # SearchSpace's fields in order; its pinned settings as sorted pairs

    @classmethod
    def of(
        cls, w: Workload, options: list[GpuOption], global_batch: int, max_gpus: int | None, space: SearchSpace
    ) -> SearchKey:
        settings = tuple(
            (f.name, tuple(sorted(space.pinned.items())) if f.name == "pinned" else getattr(space, f.name))
            for f in fields(space)
        )
        return cls(w, tuple(options), global_batch, max_gpus, settings)


@dataclass
class Kept:
    """MARP's searches per job shape and the last release index, kept between one caller's decisions."""

    searches: dict[SearchKey, Searched] = field(default_factory=dict)  # insertion order: oldest first
    index: ReleaseIndex | None = None
    memos: dict[Workload, TermMemo] = field(default_factory=dict)  # by workload (by value), oldest first

    def memo(self, w: Workload) -> TermMemo:
        """The memo of `w`'s memory terms and plan estimates that this caller's searches share (a new one the
        first time). An equal workload shares it: the estimates read nothing of a workload but its fields."""
        found = self.memos.get(w)
        if found is None:
            found = self.memos[w] = TermMemo(w)
            while len(self.memos) > MEMO_WORKLOADS:
                del self.memos[next(iter(self.memos))]
        return found

    def search(self, key: SearchKey, steps: int, run: Callable[[], Searched]) -> Searched:
        """The candidates of `key`'s shape with `steps` steps: kept ones, else `run()`'s (then kept)."""
        found = self.searches.get(key)
        if found is None:
            found = self.searches[key] = run()
            while len(self.searches) > SEARCH_CACHE_SIZE:
                del self.searches[next(iter(self.searches))]
        return {k: [c if c.steps == steps else replace(c, steps=steps) for c in cs] for k, cs in found.items()}

    def release_index(self, view: ClusterView, now: float) -> ReleaseIndex:
        """The release index of `view` at `now`: the kept one extended where it can be, else a new one."""
        if self.index is not None and self.index.extend(view, now):
            return self.index
        self.index = ReleaseIndex(view, now)
        return self.index

    def forget(self, searches: bool = True) -> None:
        """Drop the release index, and the searches unless `searches` is False (they depend on the job's shape
        and the pools, not on the cluster's state)."""
        if searches:
            self.searches.clear()
            self.memos.clear()
        self.index = None


PROCESS_KEPT = Kept()  # the default of has.decide: lives as long as the process (module docstring)
