"""A pure-Python replay of PyTorch's CUDA caching allocator: the same requests give the same segments, the same
reserved and allocated bytes, the same `torch.cuda.memory_stats()` figures, without a GPU.

Ported from `DeviceCachingAllocator` of `c10/cuda/CUDACachingAllocator.cpp` (torch 2.x; in 2.9+ the generic
`CachingDeviceAllocatorImpl` of `c10/core/CachingDeviceAllocator.h`, the same algorithm), and checked against the
figures of PyTorch's own allocator tests (`tests/test_marp_allocator_replay.py`). What it does, as torch does:

- a request is rounded (`allocator_settings.round_size`: 512 bytes, or roundup_power2_divisions) and served from
  the small pool (<= 1 MiB, kSmallSize) or the large pool, each keeping its free blocks per stream: a block freed
  is reused only by a request on its own stream;
- the smallest free block of the pool and stream that fits is taken (best fit, ties by address) and split when
  the rest is worth keeping: >= 512 bytes in the small pool or under expandable segments, > 1 MiB in the large
  pool and only for requests under max_split_size; blocks >= max_split_size serve only requests >= max_split_size
  that they exceed by less than max_non_split_rounding_mb (20 MiB);
- with no fitting block a segment is allocated: 2 MiB for the small pool, 20 MiB (kLargeBuffer) for a request
  under 10 MiB (kMinLargeAlloc), else the request rounded up to 2 MiB (kRoundLarge);
- if that fails (the device capacity, or the per-process memory fraction, is exceeded): with a memory fraction
  and a garbage_collection_threshold, cached unsplit large blocks older than average are released first; then
  oversize cached blocks (max_split_size set) just enough to fit; then every unsplit cached block (what
  `torch.cuda.empty_cache()` does), after waiting for blocks held by `record_stream` events; then it is an OOM;
- a freed block merges with free neighbours of its segment; segments are never merged;
- `expandable_segments:True`: one segment per stream and pool that grows by mapping physical pages at its end (or
  in a gap), 2 MiB pages for the small pool and 20 MiB pages (kLargeBuffer) for the large pool: the page is the
  segment size the pool would cudaMalloc (`find_expandable_block`); empty_cache unmaps only whole free pages.
  As in torch, mapped pages count in reserved bytes but not in the `segment` count.

What it does not model: CUDA graph private pools (replay a capture on a stream of its own), cudaMallocAsync, IPC,
memory the CUDA context, cuBLAS or NCCL take outside the allocator (`overheads.py`), and when a stream's work
completes: blocks freed after `record_stream` become reusable at the next `synchronize()` (or when an allocation
about to fail waits for them), not earlier.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from frenzy_slurm.marp.allocator_settings import (
    LARGE_BUFFER,
    MIN_BLOCK_SIZE,
    SIZE_MAX,
    AllocatorSettings,
    MiB,
    parse_settings,
    round_size,
)

SMALL_SIZE = 1 * MiB  # kSmallSize: the largest small-pool request
SMALL_BUFFER = 2 * MiB  # kSmallBuffer: the small pool's segment, and its expandable page
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own size
ROUND_LARGE = 2 * MiB  # kRoundLarge: a segment of its own is rounded up to this
EXPANDABLE_VA_DEFAULT = 1 << 40  # virtual space of an expandable segment when the device size is unknown

STAT_NAMES = (
    "allocation",
    "segment",
    "active",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "requested_bytes",
)
COUNTERS = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free", "num_sync_all_streams")


class AllocatorOutOfMemory(RuntimeError):
    """The replayed allocator could not serve a request (torch.OutOfMemoryError)."""


def allocation_size(size: int) -> int:
    """The segment a rounded request that no cached block fits makes (get_allocation_size)."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclass(eq=False)
class _Block:
    """A range of a segment, free or allocated (Block)."""

    stream: int
    size: int
    ptr: int
    small: bool
    mapped: bool = True
    segment: int | None = None  # the expandable segment it belongs to; None: a cudaMalloc'd segment
    allocated: bool = False
    requested: int = 0
    prev: _Block | None = None
    next: _Block | None = None
    stream_uses: set[int] = field(default_factory=set)
    event_count: int = 0
    gc_base: int = 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def key(self) -> tuple[int, int, int]:
        return (self.stream, self.size, self.ptr)


def _splice(block: _Block, before: _Block | None, after: _Block | None) -> None:
    block.prev, block.next = before, after
    if before is not None:
        before.next = block
    if after is not None:
        after.prev = block


def _state(block: _Block) -> Literal["active_allocated", "active_pending_free", "inactive"]:
    """A block's state as memory_snapshot() names it: pending free while streams it was used on have not finished."""
    if block.allocated:
        return "active_allocated"
    return "active_pending_free" if block.event_count else "inactive"


class _Pool:
    """The free mapped blocks of one pool ordered by (stream, size, address), and its unmapped expandable ranges
    ordered by (stream, address) (BlockPool)."""

    def __init__(self, small: bool) -> None:
        self.small = small
        self.keys: list[tuple[int, int, int]] = []
        self.blocks: dict[tuple[int, int, int], _Block] = {}
        self.unmapped_keys: list[tuple[int, int]] = []
        self.unmapped: dict[tuple[int, int], _Block] = {}
        self.get_free_calls = 0  # get_free_blocks_call_count: the age of a cached block for the GC

    def insert(self, block: _Block) -> None:
        key = block.key()
        bisect.insort(self.keys, key)
        self.blocks[key] = block
        block.gc_base = self.get_free_calls

    def remove(self, block: _Block) -> None:
        key = block.key()
        del self.blocks[key]
        del self.keys[bisect.bisect_left(self.keys, key)]

    def insert_unmapped(self, block: _Block) -> None:
        key = (block.stream, block.ptr)
        bisect.insort(self.unmapped_keys, key)
        self.unmapped[key] = block

    def remove_unmapped(self, block: _Block) -> None:
        key = (block.stream, block.ptr)
        del self.unmapped[key]
        del self.unmapped_keys[bisect.bisect_left(self.unmapped_keys, key)]

    def at(self, i: int) -> _Block:
        return self.blocks[self.keys[i]]

    def lower_bound(self, stream: int, size: int) -> int:
        """The index of the first free block of `stream` at least `size` large (or past the stream's blocks)."""
        return bisect.bisect_left(self.keys, (stream, size, -1))


@dataclass
class _Expandable:
    """The physical pages mapped into one expandable segment's virtual range (ExpandableSegment)."""

    base: int
    page: int
    pages: int
    mapped: set[int] = field(default_factory=set)


@dataclass
class _Stat:
    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0


@dataclass(frozen=True)
class _Request:
    size: int  # rounded
    stream: int
    pool: _Pool
    alloc_size: int


@dataclass(frozen=True)
class BlockView:
    """One block of a segment as `torch.cuda.memory_snapshot()` lists it."""

    address: int
    size: int
    requested_size: int
    state: Literal["active_allocated", "active_pending_free", "inactive"]


@dataclass(frozen=True)
class SegmentView:
    """One segment (for an expandable segment: one contiguous mapped range) as memory_snapshot() lists it."""

    address: int
    total_size: int
    stream: int
    segment_type: Literal["small", "large"]
    is_expandable: bool
    blocks: tuple[BlockView, ...]


class CachingAllocator:
    """One device's caching allocator, driven by malloc/free calls as torch's is.

    `capacity`: the bytes cudaMalloc can hand the allocator (the GPU's memory less the CUDA context, NCCL and
    other processes); None: unlimited. `device_total`: the GPU's memory, which a memory fraction is a fraction of
    (defaults to `capacity`). `malloc` returns the block's address, which `free` and `record_stream` take."""

    def __init__(
        self, settings: str | AllocatorSettings = "", capacity: int | None = None, device_total: int | None = None
    ) -> None:
        self.settings = settings if isinstance(settings, AllocatorSettings) else parse_settings(settings)
        self.capacity = capacity
        self.device_total = device_total if device_total is not None else capacity
        self.allowed: int | None = None  # allowed_memory_maximum, set by a memory fraction
        self.total_mapped = 0  # total_allocated_memory: bytes taken from the device
        self.stats = {(n, p): _Stat() for n in STAT_NAMES for p in ("all", "small_pool", "large_pool")}
        self.counters = dict.fromkeys(COUNTERS, 0)
        self._small, self._large = _Pool(small=True), _Pool(small=False)
        self._live: dict[int, _Block] = {}
        self._pending: list[_Block] = []  # freed, waiting for the streams record_stream named
        self._done: list[_Block] = []  # their streams have synchronized: reusable at the next malloc
        self._expandable: dict[int, _Expandable] = {}
        self._next_address = 1 << 32
        self._segment_ids = itertools.count(1)
        if self.settings.memory_fraction is not None:
            self.set_memory_fraction(self.settings.memory_fraction)

    # --- what a program calls -------------------------------------------------------------------------------

    def set_settings(self, text: str) -> None:
        """torch.cuda.memory._set_allocator_settings(text)."""
        self.settings = parse_settings(text, self.settings)
        if self.settings.memory_fraction is not None:
            self.set_memory_fraction(self.settings.memory_fraction)

    def set_memory_fraction(self, fraction: float) -> None:
        """torch.cuda.set_per_process_memory_fraction(fraction): allocations beyond fraction * device_total
        fail, and garbage_collection_threshold starts acting."""
        if self.device_total is None:
            raise ValueError("a memory fraction needs the device's total memory (device_total or capacity)")
        self.allowed = int(fraction * self.device_total)

    def malloc(self, size: int, stream: int = 0) -> int:
        """Allocate `size` bytes on `stream`; the block's address. AllocatorOutOfMemory as torch would raise."""
        self._process_events()
        rounded = round_size(size, self.settings)
        pool = self._small if rounded <= SMALL_SIZE else self._large
        req = _Request(rounded, stream, pool, allocation_size(rounded))
        block = self._get_free_block(req)
        if block is None:
            if self.allowed is not None and self.settings.garbage_collection_threshold > 0.0:
                self._garbage_collect()
            block = self._allocate_segment(req)
        if block is None:
            self.counters["num_ooms"] += 1
            raise AllocatorOutOfMemory(
                f"CUDA out of memory (replayed). Tried to allocate {req.alloc_size} bytes: "
                f"{self.total_mapped} reserved of a capacity {self.capacity}, "
                f"allowed {self.allowed}, {self.stat('allocated_bytes')} allocated"
            )
        return self._alloc_found_block(block, req, size)

    def free(self, address: int) -> None:
        """Free the block at `address` (its tensor's storage died)."""
        block = self._live.pop(address, None)
        if block is None:
            raise ValueError(f"free of {address:#x}, which is not a live allocation")
        block.allocated = False
        self._count(block.small, "allocation", -1)
        self._count(block.small, "allocated_bytes", -block.size)
        if block.stream_uses:
            block.event_count += len(block.stream_uses)  # insert_events: one event per stream used
            block.stream_uses.clear()
            self._pending.append(block)
        else:
            self._free_block(block)

    def record_stream(self, address: int, stream: int) -> None:
        """tensor.record_stream(stream): the block is not reused until `stream`'s work on it is done."""
        block = self._live[address]
        if stream != block.stream:
            block.stream_uses.add(stream)

    def free_completed(self, address: int) -> None:
        """The streams a freed block was recorded on have finished with it: it is reusable from the next malloc
        (a `free_completed` trace event after `free_requested`)."""
        for block in self._pending:
            if block.ptr == address:
                self._pending.remove(block)
                self._done.append(block)
                return
        raise ValueError(f"free_completed of {address:#x}, which is not waiting for a stream")

    def synchronize(self) -> None:
        """torch.cuda.synchronize(): every stream's work is done, so blocks held by events become reusable."""
        self._done.extend(self._pending)
        self._pending.clear()

    def empty_cache(self) -> None:
        """torch.cuda.empty_cache(): release every unsplit cached block, unmap every free expandable page."""
        self._release_cached_blocks()

    def stat(self, name: str, pool: str = "all", kind: str = "current") -> int:
        """One figure of memory_stats(), e.g. stat('reserved_bytes', 'all', 'peak')."""
        value: int = getattr(self.stats[(name, pool)], kind)
        return value

    def memory_stats(self) -> dict[str, int]:
        """The figures `torch.cuda.memory_stats()` names the same (`reserved_bytes.all.peak`, `num_ooms`, ...)."""
        out = {
            f"{name}.{pool}.{kind}": getattr(st, kind)
            for (name, pool), st in self.stats.items()
            for kind in ("current", "peak", "allocated", "freed")
        }
        out.update(self.counters)
        return out

    def reset_peak_stats(self) -> None:
        """torch.cuda.reset_peak_memory_stats()."""
        for st in self.stats.values():
            st.peak = st.current

    def segments(self) -> list[SegmentView]:
        """The segments as `torch.cuda.memory_snapshot()` lists them, by address (snapshot())."""
        blocks = [b for pool in (self._small, self._large) for b in pool.blocks.values()]
        blocks += list(self._live.values()) + self._pending + self._done
        views = []
        for head in blocks:
            if head.prev is not None and head.prev.mapped:
                continue
            members: list[BlockView] = []
            block: _Block | None = head
            while block is not None and block.mapped:
                members.append(BlockView(block.ptr, block.size, block.requested, _state(block)))
                block = block.next
            views.append(
                SegmentView(
                    address=head.ptr,
                    total_size=sum(m.size for m in members),
                    stream=head.stream,
                    segment_type="small" if head.small else "large",
                    is_expandable=head.segment is not None,
                    blocks=tuple(members),
                )
            )
        return sorted(views, key=lambda v: v.address)

    # --- statistics -------------------------------------------------------------------------------------------

    def _count(self, small: bool, name: str, amount: int) -> None:
        """Add `amount` (negative: subtract) to a statistic of the pool and of 'all' (increase/decrease_stat)."""
        for pool in ("all", "small_pool" if small else "large_pool"):
            st = self.stats[(name, pool)]
            st.current += amount
            if amount >= 0:
                st.allocated += amount
                st.peak = max(st.peak, st.current)
            else:
                st.freed -= amount

    # --- finding and splitting a cached block -------------------------------------------------------------

    def _get_free_block(self, req: _Request) -> _Block | None:
        """The best-fitting cached block of the request's pool and stream, removed from the pool (get_free_block)."""
        pool = req.pool
        if self.allowed is not None and self.settings.garbage_collection_threshold > 0.0:
            pool.get_free_calls += 1
        i = pool.lower_bound(req.stream, req.size)
        if i >= len(pool.keys) or pool.keys[i][0] != req.stream:
            return None
        block = pool.at(i)
        if block.segment is not None:
            found = self._expandable_fit(pool, i, req.stream)
            if found is None:
                return None
            block = found
        limit = self.settings.max_split_size
        if req.size < limit <= block.size:
            return None  # an oversize block never serves a request under max_split_size
        if req.size >= limit and block.size >= req.size + self.settings.max_non_split_rounding:
            return None  # nor one it exceeds by max_non_split_rounding_mb or more
        pool.remove(block)
        return block

    def _expandable_fit(self, pool: _Pool, i: int, stream: int) -> _Block | None:
        """Among blocks at least as large, the expandable one that can grow least (best fit by the size it could
        expand to); with expandable segments turned off, the first block that is not expandable."""

        def expandable_size(b: _Block) -> int:
            return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)

        if self.settings.expandable_segments:
            block = pool.at(i)
            j = i + 1
            while block.segment is not None and j < len(pool.keys) and pool.keys[j][0] == stream:
                if expandable_size(pool.at(j)) >= expandable_size(block):
                    break
                block = pool.at(j)
                j += 1
            return block
        i += 1
        while i < len(pool.keys) and pool.keys[i][0] == stream and pool.at(i).segment is not None:
            i += 1
        if i >= len(pool.keys) or pool.keys[i][0] != stream:
            return None
        return pool.at(i)

    def _should_split(self, block: _Block, size: int) -> bool:
        remaining = block.size - size
        if block.small or self.settings.expandable_segments:
            return remaining >= MIN_BLOCK_SIZE
        return size < self.settings.max_split_size and remaining > SMALL_SIZE

    def _alloc_found_block(self, block: _Block, req: _Request, orig_size: int) -> int:
        """Hand out `block`, splitting off the rest when worth keeping (alloc_found_block)."""
        if self._should_split(block, req.size):
            remaining = block
            block = _Block(req.stream, req.size, remaining.ptr, remaining.small, segment=remaining.segment)
            _splice(block, remaining.prev, remaining)
            remaining.ptr += req.size
            remaining.size -= req.size
            req.pool.insert(remaining)
        block.allocated = True
        block.requested = orig_size
        self._live[block.ptr] = block
        self._count(block.small, "allocation", 1)
        self._count(block.small, "allocated_bytes", block.size)
        self._count(block.small, "active", 1)
        self._count(block.small, "active_bytes", block.size)
        self._count(block.small, "requested_bytes", orig_size)
        return block.ptr

    def _free_block(self, block: _Block) -> None:
        """Return a block to its pool, merged with its free neighbours (free_block)."""
        pool = self._small if block.small else self._large
        size, requested = block.size, block.requested
        for neighbour in (block.prev, block.next):
            self._try_merge(block, neighbour, pool)
        pool.insert(block)
        self._count(block.small, "active", -1)
        self._count(block.small, "active_bytes", -size)
        self._count(block.small, "requested_bytes", -requested)

    def _try_merge(self, dst: _Block, src: _Block | None, pool: _Pool) -> int:
        """Absorb the free neighbour `src` into `dst`; the bytes absorbed (try_merge_blocks)."""
        if src is None or src.allocated or src.event_count > 0 or src.stream_uses or dst.mapped != src.mapped:
            return 0
        if src.mapped:
            pool.remove(src)
        else:
            pool.remove_unmapped(src)
        if dst.prev is src:
            dst.ptr = src.ptr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _process_events(self) -> None:
        """Blocks whose recorded streams have finished go back to their pools (process_events)."""
        for block in self._done:
            block.event_count = 0
            self._free_block(block)
        self._done.clear()

    # --- new segments, and the retries when the device is full -------------------------------------------

    def _allocate_segment(self, req: _Request) -> _Block | None:
        """cudaMalloc a segment; failing that, release oversize cached blocks and retry; failing that, release
        every unsplit cached block and retry (the tail of malloc)."""
        block = self._alloc_block(req, retry=False)
        if block is None and self._release_available_cached_blocks(req):
            block = self._alloc_block(req, retry=False)
        if block is None:
            self._release_cached_blocks()
            block = self._alloc_block(req, retry=True)
        return block

    def _alloc_block(self, req: _Request, retry: bool) -> _Block | None:
        """A new segment for the request, or a grown expandable one; None when the device says no (alloc_block)."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        size = req.alloc_size
        if self.allowed is not None and self.total_mapped + size > self.allowed:
            return None
        if self.settings.expandable_segments:
            return self._try_allocate_expandable(req)
        if self.capacity is not None and self.total_mapped + size > self.capacity:
            return None  # cudaMalloc: out of memory
        block = _Block(req.stream, size, self._reserve_address(size), req.pool.small)
        self.total_mapped += size
        self._count(block.small, "segment", 1)
        self._count(block.small, "reserved_bytes", size)
        self.counters["num_device_alloc"] += 1
        return block

    def _reserve_address(self, size: int) -> int:
        """A fresh virtual address range (addresses only order blocks; they are never reused)."""
        address = self._next_address
        self._next_address += -(-size // SMALL_BUFFER) * SMALL_BUFFER + SMALL_BUFFER
        return address

    def _release_block(self, block: _Block) -> None:
        """cudaFree a whole cached segment (release_block)."""
        pool = self._small if block.small else self._large
        pool.remove(block)
        self.total_mapped -= block.size
        self._count(block.small, "segment", -1)
        self._count(block.small, "reserved_bytes", -block.size)
        self.counters["num_device_free"] += 1

    def _release_available_cached_blocks(self, req: _Request) -> bool:
        """With max_split_size set, cudaFree the oversize cached block that fits the request, or the largest
        ones until as many bytes are freed; whether enough was (release_available_cached_blocks)."""
        limit = self.settings.max_split_size
        if limit == SIZE_MAX:
            return False
        pool = req.pool
        key_size = max(req.size, limit)
        i = pool.lower_bound(req.stream, key_size)
        if i < len(pool.keys) and pool.keys[i][0] == req.stream and pool.at(i).segment is None:
            self._release_block(pool.at(i))
            return True
        if i == 0:
            return False
        released = 0
        i -= 1
        while released < key_size and pool.at(i).size >= limit and pool.keys[i][0] == req.stream:
            current, first = pool.at(i), i == 0
            if not first:
                i -= 1
            if current.segment is None:
                self._release_block(current)
                released += current.size
            if first:
                break
        return released >= key_size

    def _release_cached_blocks(self) -> bool:
        """Wait for every stream, then cudaFree every unsplit cached block and unmap every free expandable page
        (release_cached_blocks; what empty_cache does)."""
        self.counters["num_sync_all_streams"] += 1
        self.synchronize()
        self._process_events()
        for pool in (self._large, self._small):
            to_unmap = []
            for block in [pool.blocks[k] for k in list(pool.keys)]:
                if block.segment is not None:
                    to_unmap.append(block)
                elif not block.is_split():
                    self._release_block(block)
            for block in to_unmap:
                self._unmap_block(block, pool)
                if not block.is_split():
                    self._release_expandable_segment(block, pool)
        return True

    def _garbage_collect(self) -> None:
        """Release cached unsplit large blocks, oldest (least recently passed over) first, until the mapped bytes
        are under garbage_collection_threshold of the allowed memory (garbage_collect_cached_blocks)."""
        assert self.allowed is not None
        threshold = int(self.settings.garbage_collection_threshold * self.allowed)
        if self.total_mapped <= threshold:
            return
        target, reclaimed = self.total_mapped - threshold, 0
        pool = self._large

        def age(b: _Block) -> int:
            return pool.get_free_calls - b.gc_base

        freeable = [b for b in pool.blocks.values() if not b.is_split()]
        total_age, count = sum(age(b) for b in freeable), len(freeable)
        freed = True
        while reclaimed < target and freed and count > 0:
            age_threshold, freed = total_age / count, False
            for block in [pool.blocks[k] for k in list(pool.keys)]:
                if not block.is_split() and block.segment is None and age(block) >= age_threshold:
                    freed = True
                    reclaimed += block.size
                    total_age -= age(block)
                    count -= 1
                    self._release_block(block)

    # --- expandable segments --------------------------------------------------------------------------------

    def _find_expandable_block(self, req: _Request) -> _Block:
        """The lowest-addressed free-or-unmapped run of the stream's segments with room for the request, or a new
        segment's whole unmapped range (find_expandable_block)."""
        pool = req.pool

        def allocatable(b: _Block | None) -> bool:
            return b is not None and not b.allocated and b.event_count == 0 and not b.stream_uses

        def has_room(b: _Block | None) -> bool:
            room = 0
            while room < req.size and b is not None and allocatable(b):
                room += b.size
                b = b.next
            return room >= req.size

        start = bisect.bisect_left(pool.unmapped_keys, (req.stream, -1))
        for key in pool.unmapped_keys[start:]:
            if key[0] != req.stream:
                break
            candidate = pool.unmapped[key]
            if candidate.prev is not None and allocatable(candidate.prev):
                candidate = candidate.prev
            if has_room(candidate):
                return candidate
        page = SMALL_BUFFER if pool.small else LARGE_BUFFER
        space = self.device_total + self.device_total // 8 if self.device_total else EXPANDABLE_VA_DEFAULT
        pages = -(-space // page)
        segment_id = next(self._segment_ids)
        base = self._reserve_address(pages * page)
        self._expandable[segment_id] = _Expandable(base, page, pages)
        candidate = _Block(req.stream, pages * page, base, pool.small, mapped=False, segment=segment_id)
        pool.insert_unmapped(candidate)
        return candidate

    def _try_allocate_expandable(self, req: _Request) -> _Block | None:
        """Map pages into the found range until its first free block holds the request (try_allocate_expandable_
        block); None when the device has no page left."""
        candidate = self._find_expandable_block(req)
        if not candidate.mapped and not self._map_block(candidate, min(candidate.size, req.size), req.pool):
            return None
        while candidate.size < req.size:
            following = candidate.next
            assert following is not None
            if not self._map_block(following, min(req.size - candidate.size, following.size), req.pool):
                return None
            candidate = following
        req.pool.remove(candidate)
        return candidate

    def _map_block(self, block: _Block, size: int, pool: _Pool) -> bool:
        """Map the pages covering the first `size` bytes of the unmapped `block` and merge it with its free mapped
        neighbours; False when the device cannot hold the pages (map_block)."""
        assert block.segment is not None
        seg = self._expandable[block.segment]
        first = (block.ptr - seg.base) // seg.page
        last = -(-(block.ptr + size - seg.base) // seg.page)
        nbytes = (last - first) * seg.page
        if nbytes == 0 or (self.capacity is not None and self.total_mapped + nbytes > self.capacity):
            return False
        seg.mapped.update(range(first, last))
        pool.remove_unmapped(block)
        block.mapped = True
        if nbytes < block.size:
            rest = _Block(block.stream, block.size - nbytes, block.ptr + nbytes, block.small, False, block.segment)
            _splice(rest, block, block.next)
            pool.insert_unmapped(rest)
            block.size = nbytes
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert(block)
        self.total_mapped += nbytes
        self._count(block.small, "reserved_bytes", nbytes)
        self.counters["num_device_alloc"] += 1
        return True

    def _unmap_block(self, block: _Block, pool: _Pool) -> None:
        """Unmap the whole pages inside the free `block`, keeping its partial pages as free blocks (unmap_block)."""
        assert block.segment is not None
        seg = self._expandable[block.segment]
        first = -(-(block.ptr - seg.base) // seg.page)
        last = (block.ptr + block.size - seg.base) // seg.page
        if first >= last:
            return
        pool.remove(block)
        start, nbytes = seg.base + first * seg.page, (last - first) * seg.page
        before = start - block.ptr
        if before > 0:
            head = _Block(block.stream, before, block.ptr, block.small, segment=block.segment)
            _splice(head, block.prev, block)
            pool.insert(head)
        after = block.size - before - nbytes
        if after > 0:
            tail = _Block(block.stream, after, start + nbytes, block.small, segment=block.segment)
            _splice(tail, block, block.next)
            pool.insert(tail)
        block.ptr, block.size, block.mapped = start, nbytes, False
        self._try_merge(block, block.prev, pool)
        self._try_merge(block, block.next, pool)
        pool.insert_unmapped(block)
        seg.mapped.difference_update(range(first, last))
        self.total_mapped -= nbytes
        self._count(block.small, "reserved_bytes", -nbytes)
        self.counters["num_device_free"] += 1

    def _release_expandable_segment(self, block: _Block, pool: _Pool) -> None:
        """Drop a segment whose whole range is unmapped again (release_expandable_segment)."""
        assert block.segment is not None and not block.mapped
        pool.remove_unmapped(block)
        del self._expandable[block.segment]


# --- replaying a sequence of events -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    """One step of a replay. `alloc`: a tensor `key` of `size` bytes on `stream`; `free`: tensor `key` dies;
    `record_stream`: tensor `key` is used on `stream`; `synchronize`, `empty_cache`; `settings`:
    torch.cuda.memory._set_allocator_settings(`text`)."""

    action: Literal["alloc", "free", "record_stream", "synchronize", "empty_cache", "settings"]
    key: str | int = ""
    size: int = 0
    stream: int = 0
    text: str = ""


def alloc(key: str | int, size: int, stream: int = 0) -> Event:
    return Event("alloc", key, size, stream)


def free(key: str | int) -> Event:
    return Event("free", key)


@dataclass(frozen=True)
class ReplayResult:
    """What a replay ends with: torch's memory_stats() figures and the segments left."""

    stats: dict[str, int]
    segments: tuple[SegmentView, ...]

    @property
    def allocated_peak(self) -> int:
        return self.stats["allocated_bytes.all.peak"]

    @property
    def reserved_peak(self) -> int:
        return self.stats["reserved_bytes.all.peak"]

    @property
    def allocated_current(self) -> int:
        return self.stats["allocated_bytes.all.current"]

    @property
    def segment_count(self) -> int:
        """Segments as memory_snapshot() counts them (an expandable segment's mapped ranges included)."""
        return len(self.segments)


def apply_event(allocator: CachingAllocator, event: Event, addresses: dict[str | int, int]) -> None:
    """Apply one event; `addresses` maps the live tensors' keys to their blocks' addresses."""
    if event.action == "alloc":
        if event.key in addresses:
            raise ValueError(f"alloc of {event.key!r}, which is still live")
        addresses[event.key] = allocator.malloc(event.size, event.stream)
    elif event.action == "free":
        allocator.free(addresses.pop(event.key))
    elif event.action == "record_stream":
        allocator.record_stream(addresses[event.key], event.stream)
    elif event.action == "synchronize":
        allocator.synchronize()
    elif event.action == "empty_cache":
        allocator.empty_cache()
    else:
        allocator.set_settings(event.text)


def replay(events: Iterable[Event], settings: str = "", capacity: int | None = None) -> ReplayResult:
    """Run `events` through a fresh allocator with `settings` (PYTORCH_ALLOC_CONF) on a device whose allocator can
    take `capacity` bytes (None: unlimited). AllocatorOutOfMemory where torch would raise it."""
    allocator = CachingAllocator(settings, capacity)
    addresses: dict[str | int, int] = {}
    for event in events:
        apply_event(allocator, event, addresses)
    return ReplayResult(allocator.memory_stats(), tuple(allocator.segments()))
