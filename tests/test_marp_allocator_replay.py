"""The allocator replayer (frenzy_slurm/marp/allocator_replay.py) against the figures of PyTorch's own allocator
tests in test/test_cuda.py (pytorch/pytorch, main as of torch 2.10-2.13): one test here per test there, its name in
the docstring. Where the PyTorch test states no figure (it only checks that nothing crashes, or compares
pointers), the figure the algorithm gives is derived by hand in a comment and asserted."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.allocator_replay import (
    LARGE_BUFFER,
    MIN_LARGE_ALLOC,
    ROUND_LARGE,
    SMALL_BUFFER,
    SMALL_SIZE,
    AllocatorOutOfMemory,
    CachingAllocator,
    alloc,
    allocation_size,
    free,
    replay,
)
from frenzy_slurm.marp.allocator_settings import (
    AllocatorSettings,
    parse_settings,
    round_size,
    roundup_power2_next_division,
)

MiB = 1024**2
ELEM = 4  # float32


def power2_div(size: int, div_factor: int) -> float:
    """test_allocator_settings' own helper, verbatim in effect: the next of `div_factor` equal steps between the
    powers of 2 around `size`."""
    pow2 = 1
    while pow2 < size:
        pow2 = pow2 * 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret = ret + step
    return ret


def test_memory_stats():
    """test_memory_stats: torch.randn(256) makes active_bytes.all.current 1024 bytes higher; after del and
    empty_cache active_bytes.all.freed is 1024 and reserved is back where it was."""
    a = CachingAllocator()
    tmp = a.malloc(256 * ELEM)
    assert a.stat("active_bytes") == 1024
    assert a.stat("active_bytes", kind="freed") == 0
    assert a.stat("reserved_bytes") == SMALL_BUFFER  # the small pool's 2 MiB segment
    a.free(tmp)
    a.empty_cache()
    assert a.stat("active_bytes") == 0
    assert a.stat("active_bytes", kind="freed") == 1024
    assert a.stat("reserved_bytes") == 0
    a.reset_peak_stats()
    assert a.stat("reserved_bytes", kind="peak") == 0


# test_graph_memory_stats_and_use_result_after_destroy_graph's cases: (numel, segments, reserved bytes after the
# capture, reserved bytes once the graph is deleted and the cache emptied, pool), verbatim.
GRAPH_CASES = (
    (512 // ELEM, 1, SMALL_BUFFER, SMALL_BUFFER, "small_pool"),
    (SMALL_SIZE // ELEM, 2, 2 * SMALL_BUFFER, SMALL_BUFFER, "small_pool"),
    ((SMALL_SIZE + 512) // ELEM, 1, LARGE_BUFFER, LARGE_BUFFER, "large_pool"),
    ((MIN_LARGE_ALLOC - 512) // ELEM, 2, 2 * LARGE_BUFFER, LARGE_BUFFER, "large_pool"),
    (
        (MIN_LARGE_ALLOC + 512) // ELEM,
        3,
        3 * (ROUND_LARGE * ((MIN_LARGE_ALLOC + 512 + ROUND_LARGE - 1) // ROUND_LARGE)),
        ROUND_LARGE * ((MIN_LARGE_ALLOC + 512 + ROUND_LARGE - 1) // ROUND_LARGE),
        "large_pool",
    ),
)


def graph_capture(settings: str, numel: int, pool: str) -> tuple[dict[str, int], dict[str, int]]:
    """The test's capture, replayed: `a` on the side stream (2), then in the graph's private pool (stream 1 here:
    its blocks serve only its own requests) `b = a.clone()` and five times `b = b.clone() + 1` (the clone is freed
    before the old b). The deltas of segment/reserved/active/active_bytes after the capture and after the graph is
    deleted (b alone alive) and the cache emptied."""
    a = CachingAllocator(settings)
    a.malloc(numel * ELEM, stream=2)
    before = a.memory_stats()
    b = a.malloc(numel * ELEM, stream=1)
    for _ in range(5):
        clone = a.malloc(numel * ELEM, stream=1)
        result = a.malloc(numel * ELEM, stream=1)
        a.free(clone)
        a.free(b)
        b = result
    captured = a.memory_stats()
    a.empty_cache()
    deleted = a.memory_stats()
    names = ("segment", "reserved_bytes", "active", "active_bytes")

    def delta(stats: dict[str, int]) -> dict[str, int]:
        return {n: stats[f"{n}.{pool}.current"] - before[f"{n}.{pool}.current"] for n in names}

    return delta(captured), delta(deleted)


@pytest.mark.parametrize("numel,segments,reserved,reserved_after_del,pool", GRAPH_CASES)
def test_graph_memory_stats_and_use_result_after_destroy_graph(numel, segments, reserved, reserved_after_del, pool):
    """test_graph_memory_stats_and_use_result_after_destroy_graph (the default allocator): segments, reserved
    bytes and the one active block of each case, during the graph's life and after it is deleted. The small
    cases' extra two active blocks are CUDAGraph's RNG seed holders, not replayed."""
    captured, deleted = graph_capture("", numel, pool)
    assert captured == {"segment": segments, "reserved_bytes": reserved, "active": 1, "active_bytes": numel * ELEM}
    assert deleted == {"segment": 1, "reserved_bytes": reserved_after_del, "active": 1, "active_bytes": numel * ELEM}


@pytest.mark.parametrize("numel,segments,reserved,reserved_after_del,pool", GRAPH_CASES)
def test_graph_memory_stats_and_use_result_after_destroy_graph_expandable(
    numel, segments, reserved, reserved_after_del, pool
):
    """test_graph_memory_stats_and_use_result_after_destroy_graph under expandable segments (its
    `self.expandable_segments` branches): no segment is ever counted; cases 3 and 4 reserve 2 * kLargeBuffer
    while the graph lives, and after its deletion case 3 keeps 2 * kLargeBuffer, case 4 kLargeBuffer. These
    figures fix the large pool's page at 20 MiB: with 2 MiB pages case 4's three 10 MiB + 512 B tensors would map
    32 MiB, not 40."""
    captured, deleted = graph_capture("expandable_segments:True", numel, pool)
    if numel == GRAPH_CASES[3][0]:
        reserved, reserved_after_del = 2 * LARGE_BUFFER, 2 * LARGE_BUFFER
    if numel == GRAPH_CASES[4][0]:
        reserved, reserved_after_del = 2 * LARGE_BUFFER, LARGE_BUFFER
    assert captured == {"segment": 0, "reserved_bytes": reserved, "active": 1, "active_bytes": numel * ELEM}
    assert deleted == {"segment": 0, "reserved_bytes": reserved_after_del, "active": 1, "active_bytes": numel * ELEM}


def test_allocator_settings():
    """test_allocator_settings: active_bytes.all.allocated grows by the request (84 MiB) with no rounding, by
    power2_div(84 MiB, 4) = 96 MiB under roundup_power2_divisions:4 (requested_bytes still 84 MiB), by 84 MiB again
    once a later setting resets the divisions, by power2_div(84 MiB, 8) = 88 MiB and power2_div(400 MiB, 2) =
    512 MiB under the list [64:8,128:2,256:2,512:2,1024:1,>:1]; max_split_size_mb:2 is refused."""
    nbytes, nbytes_big = 4 * 21 * MiB, 4 * 100 * MiB
    a = CachingAllocator()

    def grows_by(size: int, key: str = "active_bytes") -> int:
        start = a.stat(key, kind="allocated")
        a.malloc(size)
        return a.stat(key, kind="allocated") - start

    assert grows_by(nbytes) == nbytes
    a.set_settings("roundup_power2_divisions:4")
    requested_start = a.stat("requested_bytes", kind="allocated")
    assert grows_by(nbytes) == power2_div(nbytes, 4) == 96 * MiB
    assert a.stat("requested_bytes", kind="allocated") - requested_start == nbytes
    a.set_settings("garbage_collection_threshold:0.5")
    a.set_settings("garbage_collection_threshold:0.5,max_split_size_mb:40")
    a.empty_cache()
    assert grows_by(nbytes) == nbytes
    a.empty_cache()
    a.set_settings("garbage_collection_threshold:0.5,roundup_power2_divisions:[64:8,128:2,256:2,512:2,1024:1,>:1]")
    assert grows_by(nbytes) == power2_div(nbytes, 8) == 88 * MiB
    a.empty_cache()
    assert grows_by(nbytes_big) == power2_div(nbytes_big, 2) == 512 * MiB
    a.empty_cache()
    a.set_settings("release_lock_on_cudamalloc:True")
    assert grows_by(nbytes) == nbytes
    for bad in ("foo:1,bar:2", "garbage_collection_threshold:1.2", "max_split_size_mb:2"):
        with pytest.raises(ValueError):
            a.set_settings(bad)


def test_allocator_config_roundup_intervals():
    """c10/test/core/AllocatorConfig_test.cpp (allocator_config_test): with
    roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1] the divisions at 32, 64, 128, 256, 512, 1024, 2048,
    4096 MiB are 8, 8, 2, 4, 2, 4, 1, 1; max_split_size_mb:40 and max_non_split_rounding_mb:30 are 40 and 30 MiB;
    expandable_segments:True is kept by a later call that does not name it, max_split_size is reset by it."""
    from frenzy_slurm.marp.allocator_settings import divisions_for

    s = parse_settings(
        "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
        "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True"
    )
    assert [divisions_for(mb * MiB, s) for mb in (32, 64, 128, 256, 512, 1024, 2048, 4096)] == [8, 8, 2, 4, 2, 4, 1, 1]
    assert (s.max_split_size, s.max_non_split_rounding, s.garbage_collection_threshold) == (40 * MiB, 30 * MiB, 0.5)
    later = parse_settings("garbage_collection_threshold:0.4", s)
    assert later.expandable_segments and later.max_split_size == AllocatorSettings().max_split_size


def test_round_size_and_segment_sizes():
    """CUDACachingAllocator.cpp's own examples: round_size gives at least 512 bytes, a multiple of 512; 1200 with
    4 divisions is 1280; a request of at most 1 MiB makes a 2 MiB segment, under 10 MiB a 20 MiB one, above that
    its own size rounded up to 2 MiB."""
    plain = AllocatorSettings()
    assert [round_size(n, plain) for n in (1, 512, 513, 1024 * 1024 + 1)] == [512, 512, 1024, 1024 * 1024 + 512]
    assert roundup_power2_next_division(1200, 4) == 1280
    assert roundup_power2_next_division(1024, 4) == 1024
    assert [allocation_size(n) for n in (SMALL_SIZE, SMALL_SIZE + 512, MIN_LARGE_ALLOC - 512)] == [
        SMALL_BUFFER,
        LARGE_BUFFER,
        LARGE_BUFFER,
    ]
    assert allocation_size(MIN_LARGE_ALLOC + 512) == 12 * MiB


def fraction_of(a: CachingAllocator, total_allowed: int) -> None:
    assert a.device_total is not None
    a.set_memory_fraction(total_allowed / a.device_total)
    assert a.allowed == total_allowed


def test_max_split_expandable():
    """test_max_split_expandable: 120 MiB allowed (a memory fraction), max_split_size_mb:40; 40 MiB as a segment,
    40 MiB expandable, 40 MiB as a segment; a fourth 40 MiB is an OOM; then, all three freed, 120 MiB succeeds.

    The test checks only that; by hand: the fourth request finds no cached block and 120 + 40 MiB exceeds what
    is allowed, release_available_cached_blocks finds no oversize cached block, the retry fails: one OOM, 120 MiB
    reserved. For 120 MiB, release_available_cached_blocks frees the two 40 MiB segments (80 MiB, not enough:
    the expandable block is skipped), release_cached_blocks unmaps the expandable pages, and the retry makes one
    120 MiB segment: 120 MiB reserved in 1 segment, 4 device allocations (2 pages mapped at once), 3 frees, 2
    retries."""
    a = CachingAllocator(capacity=int(80 * GiB))
    fraction_of(a, 120 * MiB)
    a.set_settings("expandable_segments:False,max_split_size_mb:40")
    first = a.malloc(40 * MiB)
    a.set_settings("expandable_segments:True,max_split_size_mb:40")
    second = a.malloc(40 * MiB)
    a.set_settings("expandable_segments:False,max_split_size_mb:40")
    third = a.malloc(40 * MiB)
    with pytest.raises(AllocatorOutOfMemory):
        a.malloc(40 * MiB)
    assert (a.stat("reserved_bytes"), a.counters["num_ooms"]) == (120 * MiB, 1)
    for address in (first, second, third):
        a.free(address)
    a.malloc(120 * MiB)
    assert (a.stat("reserved_bytes"), a.stat("segment"), len(a.segments())) == (120 * MiB, 1, 1)
    assert (a.counters["num_device_alloc"], a.counters["num_device_free"], a.counters["num_alloc_retries"]) == (4, 3, 2)


def test_garbage_collect_expandable():
    """test_garbage_collect_expandable: 120 MiB allowed, garbage_collection_threshold:0.5; 40 MiB as a segment,
    then (expandable segments on from here) 40 MiB expandable; both freed; 80 MiB "causes GC to run".

    By hand: no cached block fits 80 MiB; 80 MiB mapped > 0.5 * 120 MiB, so the GC frees the cached unsplit blocks
    at least as old as the average: the 40 MiB segment (the expandable block is split from its unmapped rest, as
    the test's comment says, so it stays). The request, still under expandable segments, grows the expandable
    segment after its free 40 MiB block by two 20 MiB pages: 80 MiB reserved, no counted segment, one
    contiguous 80 MiB range, one device free."""
    a = CachingAllocator(capacity=int(80 * GiB))
    fraction_of(a, 120 * MiB)
    a.set_settings("expandable_segments:False,garbage_collection_threshold:0.5")
    first = a.malloc(40 * MiB)
    a.set_settings("expandable_segments:True,garbage_collection_threshold:0.5")
    second = a.malloc(40 * MiB)
    a.free(first)
    a.free(second)
    a.malloc(80 * MiB)
    assert (a.stat("reserved_bytes"), a.stat("segment"), a.counters["num_device_free"]) == (80 * MiB, 0, 1)
    assert [(s.total_size, s.is_expandable) for s in a.segments()] == [(80 * MiB, True)]


def test_garbage_collection_needs_a_memory_fraction():
    """CUDACachingAllocator.cpp: garbage_collection_threshold acts only under set_per_process_memory_fraction
    (`set_fraction && garbage_collection_threshold() > 0`). The same sequence without a fraction but with the
    device full keeps the 40 MiB segment until the last-resort release: a control for the test above."""
    a = CachingAllocator("expandable_segments:False,garbage_collection_threshold:0.5", capacity=100 * MiB)
    first = a.malloc(40 * MiB)
    a.free(first)
    a.malloc(30 * MiB)  # the cached 40 MiB block fits: reused and split, no GC
    assert (a.stat("reserved_bytes"), a.counters["num_device_free"]) == (40 * MiB, 0)


def test_set_per_process_memory_fraction():
    """test_set_per_process_memory_fraction: with a fraction of 0.5, int(total * 0.499) less what is already
    reserved is allocated; int(total * 0.5) is an OOM (a 1024-float tensor already holds a 2 MiB segment)."""
    total = int(80 * GiB)
    a = CachingAllocator(capacity=total - 500 * MiB, device_total=total)
    a.malloc(1024 * ELEM)
    a.empty_cache()
    a.set_memory_fraction(0.5)
    application = int(total * 0.499) - a.stat("reserved_bytes", kind="peak")
    tmp = a.malloc(application)
    a.free(tmp)
    a.empty_cache()
    with pytest.raises(AllocatorOutOfMemory):
        a.malloc(int(total * 0.5))
    assert a.stat("reserved_bytes") == SMALL_BUFFER


def test_out_of_memory_retry():
    """test_out_of_memory_retry: half the GPU's memory is allocated; a second half is an OOM (the CUDA context
    holds some of the device); once the first is freed the second succeeds, from the cached block: no new
    segment. By hand: reserved stays at half the memory rounded up to 2 MiB, one segment."""
    total = int(80 * GiB)
    size = int(total * 0.5)
    a = CachingAllocator(capacity=total - 500 * MiB, device_total=total)
    first = a.malloc(size)
    with pytest.raises(AllocatorOutOfMemory):
        a.malloc(size)
    a.free(first)
    second = a.malloc(size)
    assert second == first
    assert (a.stat("reserved_bytes"), a.stat("segment"), a.counters["num_device_alloc"]) == (size, 1, 1)


def test_caching_allocator_record_stream_oom():
    """test_caching_allocator_record_stream_oom: y (160 MiB) on a side stream, then 100 times a 160 MiB x on the
    default stream, used on the side stream (record_stream) and deleted. Its blocks wait for the side stream's
    events, so they are not reused; when the device is full the retry waits for them and frees them (issue
    #19219) and every allocation succeeds. By hand, on a device whose allocator can take 1 GiB: y and five x fill
    960 MiB, the sixth x fails, release_cached_blocks waits, frees the five cached x segments; then the pattern
    repeats: 100 allocations, 19 retries (after x 6, 11, ..., 96), no OOM, peak reserved 960 MiB."""
    a = CachingAllocator(capacity=int(GiB))
    a.malloc(40 * MiB * ELEM, stream=1)
    for _ in range(100):
        x = a.malloc(40 * MiB * ELEM, stream=0)
        a.record_stream(x, 1)
        a.free(x)
    assert a.counters["num_ooms"] == 0
    assert a.counters["num_alloc_retries"] == 19
    assert a.stat("reserved_bytes", kind="peak") == 960 * MiB
    a.empty_cache()
    assert a.stat("reserved_bytes") == 160 * MiB


def test_record_stream():
    """test_record_stream: tmp, allocated on a side stream and used on the default one (record_stream), is freed;
    the side stream's next allocation does not reuse its block ("allocation reused too soon"); after the
    default stream synchronizes, the next one does ("allocation not reused")."""
    a = CachingAllocator()
    a.malloc(4 * ELEM, stream=0)  # result
    tmp = a.malloc(4 * ELEM, stream=1)
    a.record_stream(tmp, 0)
    a.free(tmp)
    tmp2 = a.malloc(4 * ELEM, stream=1)
    assert tmp2 != tmp
    a.synchronize()
    tmp3 = a.malloc(4 * ELEM, stream=1)
    assert tmp3 == tmp


def test_record_stream_on_shifted_view():
    """test_record_stream_on_shifted_view: a block freed while recorded on another stream is not reallocated,
    even after its own stream synchronizes, while the other stream's work is pending. The replay makes a block
    reusable only at a device-wide synchronize, so the same holds."""
    a = CachingAllocator()
    base = a.malloc(2 * ELEM, stream=1)
    a.record_stream(base, 2)
    a.free(base)
    assert a.malloc(2 * ELEM, stream=1) != base


def test_memory_snapshot_block_layout():
    """test_memory_snapshot: rand(2 * 311, 411) (freed at once), rand(310, 410), rand(311, 411) "make x the second
    block in a segment"; 1000 tensors of 512 B tile the same segment; after del and empty_cache the last trace
    event frees a segment. By hand: all three are small-pool requests (under 1 MiB) in one 2 MiB segment; x starts
    at 508,416 bytes (310 * 410 * 4 rounded to 512) from its start; after del and empty_cache nothing is
    reserved."""
    a = CachingAllocator()
    a.free(a.malloc(2 * 311 * 411 * ELEM))
    unused = a.malloc(310 * 410 * ELEM)
    x = a.malloc(311 * 411 * ELEM)
    (segment,) = a.segments()
    assert segment.segment_type == "small" and segment.total_size == SMALL_BUFFER
    assert [b.address - segment.address for b in segment.blocks[:2]] == [0, 508_416]
    assert segment.blocks[1].address == x and segment.blocks[1].requested_size == 311 * 411 * ELEM
    tensors = [a.malloc(128 * ELEM) for _ in range(1000)]
    assert len(a.segments()) == 1
    for t in tensors:
        a.free(t)
    a.malloc(128 * 5 * ELEM)
    a.free(unused)
    a.free(x)
    a.empty_cache()
    assert a.stat("reserved_bytes") == SMALL_BUFFER  # the 640 floats still live
    assert a.counters["num_device_free"] == 0


def test_streams_keep_their_blocks():
    """The per-stream pools (CUDACachingAllocator.cpp: "Once freed, blocks can be re-allocated on the same
    stream, but not on any other stream"): a 30 MiB block freed on stream 0 is not reused on stream 1, which
    makes its own segment; on stream 0 it is."""
    result = replay([alloc("a", 30 * MiB, 0), free("a"), alloc("b", 30 * MiB, 1), alloc("c", 30 * MiB, 0)])
    assert (result.reserved_peak, result.segment_count) == (60 * MiB, 2)


def test_max_split_size_keeps_oversize_blocks_whole():
    """The max_split_size rules of get_free_block and should_split: under max_split_size_mb:40 a cached 100 MiB
    block serves neither a 30 MiB request nor an 50 MiB one it exceeds by 20 MiB (max_non_split_rounding) or more,
    but serves 85 MiB whole (no split: allocated 100 MiB)."""
    events = [alloc("big", 100 * MiB), free("big"), alloc("small", 30 * MiB), alloc("mid", 50 * MiB)]
    result = replay(events, "max_split_size_mb:40")
    assert result.reserved_peak == 180 * MiB  # 100 cached + 30 + 50, each a segment of its own
    result = replay([alloc("big", 100 * MiB), free("big"), alloc("close", 85 * MiB)], "max_split_size_mb:40")
    assert (result.reserved_peak, result.allocated_peak) == (100 * MiB, 100 * MiB)
    result = replay([alloc("big", 100 * MiB), free("big"), alloc("close", 85 * MiB)])
    assert (result.reserved_peak, result.allocated_current) == (100 * MiB, 85 * MiB)  # split without the limit


def test_an_unknown_free_and_a_double_alloc_are_refused():
    with pytest.raises(KeyError):
        replay([free("never")])
    with pytest.raises(ValueError, match="still live"):
        replay([alloc("a", 512), alloc("a", 512)])


def check_invariants(a: CachingAllocator, live_sizes: list[int]) -> None:
    """What must hold after any sequence: allocated bytes are the live blocks', reserved bytes the segments',
    blocks tile their segments without overlap."""
    segments = a.segments()
    assert a.stat("reserved_bytes") == sum(s.total_size for s in segments)
    live = [b for s in segments for b in s.blocks if b.state == "active_allocated"]
    assert sorted(b.requested_size for b in live) == sorted(live_sizes)
    assert a.stat("allocated_bytes") == sum(b.size for b in live)
    for s in segments:
        assert [b.address for b in s.blocks] == [
            s.address + sum(b.size for b in s.blocks[:i]) for i in range(len(s.blocks))
        ]


@pytest.mark.parametrize(
    "settings", ["", "expandable_segments:True", "max_split_size_mb:40,roundup_power2_divisions:4"]
)
def test_allocator_fuzz(settings):
    """test_allocator_fuzz: 10,000 random steps (seed 123, the test's own calls to `random`, so the same sequence)
    of allocating 2-20 MiB int32 tensors, freeing a random one and, one time in 21, empty_cache, keeping under
    100 MiB of elements alive. The PyTorch test checks the tensors' contents; here, that the replay's books
    balance at every empty_cache and at the end, and that freeing everything and emptying the cache leaves
    nothing reserved."""
    import random

    state = random.getstate()
    random.seed(123)
    a = CachingAllocator(settings)
    mem: list[tuple[int, int]] = []
    total = 0
    try:
        for _ in range(10_000):
            while total >= 1024 * 1024 * 1024 / (4 * 10):
                address, n = mem.pop(random.randrange(0, len(mem)))
                a.free(address)
                total -= n
            (action,) = random.choices(["alloc", "free", "empty_cache"], weights=[1, 1 if mem else 0, 0.1])
            if action == "alloc":
                n = random.randrange(2 * 1024 * 1024 // 4, 20 * 1024 * 1024 // 4)
                mem.append((a.malloc(n * 4), n))
                total += n
            elif action == "free":
                address, n = mem.pop(random.randrange(0, len(mem)))
                a.free(address)
                total -= n
            else:
                a.empty_cache()
                check_invariants(a, [n * 4 for _, n in mem])
    finally:
        random.setstate(state)
    check_invariants(a, [n * 4 for _, n in mem])
    for address, _ in mem:
        a.free(address)
    a.empty_cache()
    assert (a.stat("reserved_bytes"), a.stat("allocated_bytes"), a.segments()) == (0, 0, [])
