"""What torch's CUDA caching allocator reserves beyond the bytes it hands out, from its documented behaviour.

`torch.cuda.max_memory_allocated` is the peak of the bytes of live tensors (each request rounded up, below);
`torch.cuda.max_memory_reserved` the peak of the segments the allocator holds from cudaMalloc, live or cached
(`memory_stats()["reserved_bytes.all.peak"]`; `allocated_bytes.all.peak` is the other). Reserved never shrinks
during training unless `torch.cuda.empty_cache()` runs, so its peak is the reserved bytes at the step's
allocated peak plus whatever freed blocks could not be reused there. nvidia-smi's "used" adds what is not the
allocator's: the CUDA context and NCCL's buffers (`overheads.py`).

The allocator's rules (PyTorch's CUDA memory-management notes and `c10/cuda/CUDACachingAllocator.cpp`, read
for torch 2.x; the rules have been stable since 1.x):

- every request is rounded up to a multiple of 512 bytes (kMinBlockSize);
- requests of at most 1 MiB (kSmallSize) come from the small pool, carved out of 2 MiB segments (kSmallBuffer);
- larger requests come from the large pool: a request under 10 MiB (kMinLargeAlloc) that no cached block fits
  makes a 20 MiB segment (kLargeBuffer), the rest of which later requests split off; a larger request makes a
  segment of its own size rounded up to 2 MiB (kRoundLarge);
- a request takes the smallest cached block that fits and splits it when the remainder is worth keeping;
  blocks are never merged across segments, so free bytes spread over segments may fit no request
  (fragmentation); `max_split_size_mb` stops blocks above that size from being split at all;
- `expandable_segments:True` (PYTORCH_CUDA_ALLOC_CONF) gives each stream one virtual segment per pool that the
  allocator grows by mapping 2 MiB pages, so the reserved bytes are close to the live bytes rounded up to a page.

What MARP models from these rules: the segment packing of the long-lived tensors (weights, gradients, optimizer
states, with their per-tensor sizes from the architecture; DeepSpeed and Megatron flatten them into a few large
buffers) and of the per-step tensors (activations, at the size of a hidden-wide tensor of the micro-batch),
and the cuBLAS workspaces, which torch allocates through the allocator. What the rules cannot say without
replaying the exact sequence of a framework's requests - how much of what one phase of the step frees the next
phase can reuse - stays a measured rate (`Overheads.step_fragmentation`), which expandable segments remove.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from frenzy_slurm.jobspec.arch import Architecture

MiB = 1024**2
MIN_BLOCK = 512  # kMinBlockSize: every request is rounded up to this
SMALL_SIZE = 1 * MiB  # kSmallSize: the largest small-pool request
SMALL_SEGMENT = 2 * MiB  # kSmallBuffer: the small pool's segment
LARGE_SEGMENT = 20 * MiB  # kLargeBuffer: the segment of a large-pool request under MIN_LARGE_ALLOC
MIN_LARGE_ALLOC = 10 * MiB  # kMinLargeAlloc: from here a request gets a segment of its own
ROUND_LARGE = 2 * MiB  # kRoundLarge: a segment of its own is rounded up to this
# expandable segments map physical memory in pages of the segment size the pool would cudaMalloc: 2 MiB
# (kSmallBuffer) for the small pool, 20 MiB (kLargeBuffer) for the large one (CUDACachingAllocator.cpp,
# find_expandable_block; PyTorch's test_graph_memory_stats_and_use_result_after_destroy_graph: three
# 10 MiB + 512 B tensors reserve 40 MiB; tests/test_marp_allocator_replay.py)
SMALL_PAGE = 2 * MiB
LARGE_PAGE = 20 * MiB

# cuBLAS workspace per (handle, stream) that torch allocates through the caching allocator, when
# CUBLAS_WORKSPACE_CONFIG is unset (aten/src/ATen/cuda/CublasHandlePool.cpp): ":4096:8" = 8 chunks of 4096 KiB on
# Hopper (sm90), ":4096:2:16:8" = 2 x 4096 KiB + 8 x 16 KiB before it. A training step uses two pairs: the
# Python thread's forward and the autograd engine's device thread's backward (handles are per thread).
CUBLAS_WORKSPACE_HOPPER_MIB = 32.0
CUBLAS_WORKSPACE_PRE_HOPPER_MIB = 8.125
CUBLAS_HANDLES_PER_STEP = 2


@dataclass(frozen=True)
class AllocatorConfig:
    """The PYTORCH_CUDA_ALLOC_CONF settings that change what is reserved (the others change no byte count)."""

    expandable_segments: bool = False


def parse_alloc_conf(text: str) -> AllocatorConfig:
    """`expandable_segments:True,max_split_size_mb:512` -> AllocatorConfig; ValueError saying what is wrong.

    Keys other than expandable_segments are accepted and ignored: max_split_size_mb, garbage_collection_threshold
    and roundup_power2_divisions change which cached blocks are reused, not a byte count MARP can derive."""
    expandable = False
    for item in text.replace(";", ",").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"{item!r} is not key:value (e.g. expandable_segments:True)")
        if key.strip() == "expandable_segments":
            v = value.strip()
            if v not in ("True", "False", "true", "false", "1", "0"):
                raise ValueError(f"expandable_segments:{v} must be True or False")
            expandable = v in ("True", "true", "1")
    return AllocatorConfig(expandable_segments=expandable)


def request_bytes(n: float) -> int:
    """What a request of `n` bytes counts for in allocated bytes: rounded up to 512 (at least 512)."""
    return max(MIN_BLOCK, math.ceil(n / MIN_BLOCK) * MIN_BLOCK)


def segment_bytes(n: float) -> int:
    """The segment a request of `n` bytes makes when no cached block fits it (without expandable segments)."""
    r = request_bytes(n)
    if r <= SMALL_SIZE:
        return SMALL_SEGMENT
    if r < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return math.ceil(r / ROUND_LARGE) * ROUND_LARGE


def reserved_for(tensors: Iterable[tuple[float, float]], config: AllocatorConfig = AllocatorConfig()) -> float:
    """Bytes reserved to hold `tensors` - (bytes, count) pairs - allocated one after another and kept.

    Small-pool and sub-10 MiB requests are packed into their pool's segments, largest first, each segment filled
    before the next is made (what best-fit splitting does when nothing is freed in between); larger requests
    each own a segment rounded up to 2 MiB. With expandable segments each pool is one segment of whole pages
    (2 MiB in the small pool, 20 MiB in the large).
    A fractional count (a per-rank share of a sharded set) packs as that many tensors."""
    small: list[tuple[int, float]] = []
    mid: list[tuple[int, float]] = []
    total = 0.0
    for n, count in tensors:
        if count <= 0 or n <= 0:
            continue
        r = request_bytes(n)
        if config.expandable_segments:
            (small if r <= SMALL_SIZE else mid).append((r, count))
            continue
        if r <= SMALL_SIZE:
            small.append((r, count))
        elif r < MIN_LARGE_ALLOC:
            mid.append((r, count))
        else:
            total += segment_bytes(r) * count
    if config.expandable_segments:
        return sum(
            math.ceil(sum(r * c for r, c in pool) / page) * page
            for pool, page in ((small, SMALL_PAGE), (mid, LARGE_PAGE))
        )
    return total + _packed(small, SMALL_SEGMENT) + _packed(mid, LARGE_SEGMENT)


def _packed(requests: list[tuple[int, float]], segment: int) -> float:
    """Bytes of `segment`-sized segments that hold `requests`, largest first, the last segment's free tail used
    by the next (smaller) size."""
    reserved = 0.0
    free = 0.0  # the free tail of the last segment made
    for r, count in sorted(requests, reverse=True):
        fit = min(count, float(int(free // r)))  # into the tail first
        free -= fit * r
        left = count - fit
        if left <= 0:
            continue
        per_segment = segment // r
        segments = math.ceil(left / per_segment)
        reserved += segments * segment
        free = segments * segment - left * r  # (what the new segments leave)
    return reserved


def reserved_excess(tensors: Iterable[tuple[float, float]], config: AllocatorConfig = AllocatorConfig()) -> float:
    """Reserved minus allocated bytes for `tensors` held at once: segment packing and 2 MiB rounding."""
    ts = list(tensors)
    return max(0.0, reserved_for(ts, config) - sum(request_bytes(n) * c for n, c in ts))


def step_excess(total: float, size: float, config: AllocatorConfig = AllocatorConfig()) -> float:
    """Reserved minus allocated bytes for a step's `total` bytes of tensors, known only by one typical `size` (a
    hidden-wide tensor of the micro-batch). The step's tensors come in many sizes, so the free tails of 20 MiB
    segments go to the smaller ones: only a segment of its own (>= 10 MiB) keeps its 2 MiB rounding; with
    expandable segments the step's bytes are pages of the one segment (counted with the long-lived tensors)."""
    if total <= 0 or size <= 0 or config.expandable_segments or request_bytes(size) < MIN_LARGE_ALLOC:
        return 0.0
    return total / size * (segment_bytes(size) - size)


def parameter_shapes(
    a: Architecture, n_layers: int, first: bool, last: bool, tp: int, vtp: int
) -> list[tuple[float, float]]:
    """(elements, count) of each parameter tensor one rank of a pipeline stage holds: every block's matrices, biases
    and norms (matrices split over tp), the embedding on the first stage, the final norm and untied head on the
    last (split over the vocab-parallel degree). The shapes give the per-tensor sizes the allocator sees; the bytes
    per element come from the memory model's totals."""
    h, f, kvd = a.hidden, a.ffn, a.kv * a.head_dim
    norm_tensors = 2 if a.norm == "layernorm" else 1  # weight (+ bias)
    mlp = [(h * f / tp, 3 if a.gated else 2)]
    block: list[tuple[float, float]] = [(h * a.inner / tp, 2), (h * kvd / tp, 2), *mlp, (h, 2 * norm_tensors)]
    if a.bias in ("qkv", "all"):
        block += [(h / tp, 1), (kvd / tp, 2)]
    if a.bias == "all":
        block += [(h, 2), (f / tp, 2 if a.gated else 1)]
    out = [(n, c * n_layers) for n, c in block]
    if a.encoder_decoder:
        # a decoder block's cross-attention (q, k, v, o and its norm); the encoder's blocks and final norm (its
        # plans have one stage)
        out += [(h * a.inner / tp, 2 * n_layers), (h * kvd / tp, 2 * n_layers), (h, norm_tensors * n_layers)]
        out += [(n, c * a.encoder_layers) for n, c in block] + [(h, norm_tensors)]
    if first:
        out.append((a.vocab * h / vtp, 1))
        if a.position == "learned":
            out.append((a.max_positions * h, 2 if a.encoder_decoder else 1))
    if last:
        out.append((h, norm_tensors))
        if not a.tied_embeddings and a.head == "lm":
            out.append((a.vocab * h / vtp, 1))
    return out


def adapter_shapes(
    a: Architecture, n_layers: int, rank: int, targets: Iterable[str], tp: int
) -> list[tuple[float, float]]:
    """(elements, count) of the LoRA adapters of one stage's blocks: A (rank x in) and B (out x rank) per matrix."""
    h, f, kvd = a.hidden, a.ffn, a.kv * a.head_dim
    mats = {"q": [(h, a.inner)], "k": [(h, kvd)], "v": [(h, kvd)], "o": [(a.inner, h)]}
    mats["mlp"] = [(h, f), (h, f), (f, h)] if a.gated else [(h, f), (f, h)]
    # an encoder-decoder model: a decoder block's two attentions, and the encoder's blocks (params.py)
    attn = n_layers * (2 if a.encoder_decoder else 1) + a.encoder_layers
    out: list[tuple[float, float]] = []
    for t in targets:
        n = n_layers + a.encoder_layers if t == "mlp" else attn
        for i, o in mats.get(t, []):
            out += [(rank * i / tp, n), (rank * o, n)]
    return out


def spread(
    total: float, shapes: list[tuple[float, float]], element: float, copies: int = 1
) -> list[tuple[float, float]]:
    """`total` bytes laid out as `copies` tensors of each of `shapes` with `element` bytes per element: the tensors
    keep their dtype's sizes and their counts scale to the total (an exact parameter count from a traced factory,
    NF4-quantised matrices, ZeRO's share of a rank)."""
    whole = sum(n * c for n, c in shapes) * copies * element
    if total <= 0 or whole <= 0:
        return []
    k = total / whole
    return [(n * element, c * copies * k) for n, c in shapes]
