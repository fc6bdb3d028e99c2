"""`PYTORCH_ALLOC_CONF` (formerly `PYTORCH_CUDA_ALLOC_CONF`) read as PyTorch's caching allocator reads it, and the
request rounding those settings decide. Used by the allocator replayer (`allocator_replay.py`).

Ported from `c10/core/AllocatorConfig.{h,cpp}` (AcceleratorAllocatorConfig, torch 2.8+; the same rules were
`c10/cuda/CUDAAllocatorConfig.cpp` before) and `round_size` of `c10/cuda/CUDACachingAllocator.cpp`:

- every call of `torch.cuda.memory._set_allocator_settings` (and the environment variable, read once) resets
  `max_split_size_mb`, `roundup_power2_divisions` and `garbage_collection_threshold` to their defaults unless it
  names them again; `expandable_segments` and `max_non_split_rounding_mb` keep their last value;
- `roundup_power2_divisions` is either one power of 2 for every size or a list `[64:8,256:4,>:1]` over 16
  intervals of powers of 2 from 1 MiB (index 0: below 2 MiB) to 32 GiB and above (index 15): a boundary `B:v`
  sets interval log2(B) (B in MiB); the first one also fills the intervals below it, `>:v` the ones above the
  last boundary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

MiB = 1024**2
MIN_BLOCK_SIZE = 512  # kMinBlockSize: every request is rounded up to a multiple of this
LARGE_BUFFER = 20 * MiB  # kLargeBuffer: also the smallest max_split_size_mb and max_non_split_rounding_mb
SIZE_MAX = 2**64 - 1  # max_split_size when unset: no block is too large to split
ROUNDUP_INTERVALS = 16  # kRoundUpPowerOfTwoIntervals: 1 MiB .. 64 GiB
ROUNDUP_START_LOG2 = 20  # the first interval starts at 1 MiB

# Keys torch accepts that change no byte count the replayer counts (locking, pinned host memory, the backend).
_NO_BYTE_KEYS = frozenset(
    {
        "release_lock_on_cudamalloc",
        "release_lock_on_device_malloc",
        "pinned_use_cuda_host_register",
        "pinned_use_device_host_register",
        "pinned_num_register_threads",
        "pinned_use_background_threads",
        "pinned_reserve_segment_size_mb",
        "graph_capture_record_stream_reuse",
    }
)


@dataclass(frozen=True)
class AllocatorSettings:
    """The allocator settings that change what is allocated or reserved, with torch's defaults."""

    expandable_segments: bool = False
    max_split_size: int = SIZE_MAX  # bytes; blocks this large are never split (max_split_size_mb)
    max_non_split_rounding: int = LARGE_BUFFER  # bytes an oversize cached block may exceed a request by
    roundup_power2_divisions: tuple[int, ...] = (0,) * ROUNDUP_INTERVALS
    garbage_collection_threshold: float = 0.0  # acts only under a memory fraction (set_per_process_memory_fraction)
    memory_fraction: float | None = None  # per_process_memory_fraction, when the settings name it


def _tokens(text: str) -> list[str]:
    """`a:1,b:[x:2,>:4]` -> ['a', ':', '1', ',', 'b', ':', '[', 'x', ':', '2', ',', '>', ':', '4', ']'] (as
    ConfigTokenizer; whitespace dropped)."""
    out: list[str] = []
    word = ""
    for ch in text:
        if ch in ",:[]":
            if word:
                out.append(word)
                word = ""
            out.append(ch)
        elif not ch.isspace():
            word += ch
    if word:
        out.append(word)
    return out


def _is_power_of_2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


def _divisions_value(token: str) -> int:
    value = int(token)
    if value != 0 and not _is_power_of_2(value):
        raise ValueError(f"roundup_power2_divisions: {value} is not a power of 2 (or 0 to turn rounding off)")
    return value


def _divisions_list(pairs: list[tuple[str, str]]) -> tuple[int, ...]:
    """`[(B, v), ..., ('>', v)]` -> the 16 intervals' divisions, as parseRoundUpPower2Divisions fills them."""
    divisions = [0] * ROUNDUP_INTERVALS
    last_index, first = 0, True
    for boundary, raw in pairs:
        value = _divisions_value(raw)
        if boundary == ">":
            divisions[last_index + 1 :] = [value] * (ROUNDUP_INTERVALS - last_index - 1)
            continue
        size_mb = int(boundary)
        if not _is_power_of_2(size_mb):
            raise ValueError(f"roundup_power2_divisions: the interval {size_mb} (MiB) is not a power of 2")
        index = min(max(size_mb.bit_length() - 1, 0), ROUNDUP_INTERVALS - 1)
        if first:
            divisions[:index] = [value] * index
            first = False
        divisions[index] = value
        last_index = index
    return tuple(divisions)


def _split_list(tokens: list[str], i: int) -> tuple[list[tuple[str, str]], int]:
    """The `B:v` pairs of the list opening at tokens[i] ('['), and the index of its ']'."""
    pairs: list[tuple[str, str]] = []
    i += 1
    while i < len(tokens) and tokens[i] != "]":
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError(f"roundup_power2_divisions: expected B:v in the list, got {tokens[i : i + 3]}")
        pairs.append((tokens[i], tokens[i + 2]))
        i += 3
        if i < len(tokens) and tokens[i] == ",":
            i += 1
    if i >= len(tokens):
        raise ValueError("roundup_power2_divisions: the list has no closing ']'")
    return pairs, i


def _size_mb(key: str, value: str) -> int:
    mb = int(value)
    if mb < LARGE_BUFFER // MiB:
        raise ValueError(f"{key} too small: {mb}, must be >= {LARGE_BUFFER // MiB}")
    return mb * MiB


def _apply(settings: AllocatorSettings, key: str, value: str) -> AllocatorSettings:
    """One `key:value` on top of `settings`; ValueError naming the key for a value torch refuses."""
    if key == "expandable_segments":
        if value not in ("True", "False"):
            raise ValueError(f"expandable_segments: expected True or False, got {value!r}")
        return replace(settings, expandable_segments=value == "True")
    if key == "max_split_size_mb":
        return replace(settings, max_split_size=_size_mb(key, value))
    if key == "max_non_split_rounding_mb":
        return replace(settings, max_non_split_rounding=_size_mb(key, value))
    if key == "garbage_collection_threshold":
        threshold = float(value)
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"garbage_collection_threshold {threshold} is invalid, set it in (0.0, 1.0)")
        return replace(settings, garbage_collection_threshold=threshold)
    if key == "roundup_power2_divisions":
        return replace(settings, roundup_power2_divisions=(_divisions_value(value),) * ROUNDUP_INTERVALS)
    if key == "per_process_memory_fraction":
        fraction = float(value)
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"per_process_memory_fraction {fraction} is invalid, set it in [0.0, 1.0]")
        return replace(settings, memory_fraction=fraction)
    if key == "backend" and value == "native":
        return settings
    if key in _NO_BYTE_KEYS:
        return settings
    raise ValueError(
        f"allocator setting {key}:{value} is not modelled by the replayer (backend:cudaMallocAsync is another "
        "allocator; large_segment_size_mb changes the large-pool segment); known: expandable_segments, "
        "max_split_size_mb, max_non_split_rounding_mb, garbage_collection_threshold, roundup_power2_divisions"
    )


def parse_settings(text: str, previous: AllocatorSettings | None = None) -> AllocatorSettings:
    """`expandable_segments:True,max_split_size_mb:512` on top of `previous` (the settings in force), resetting
    what torch's parseArgs resets on every call."""
    settings = replace(
        previous or AllocatorSettings(),
        max_split_size=SIZE_MAX,
        roundup_power2_divisions=(0,) * ROUNDUP_INTERVALS,
        garbage_collection_threshold=0.0,
        memory_fraction=None,
    )
    tokens = _tokens(text)
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if i + 2 >= len(tokens) or tokens[i + 1] != ":":
            raise ValueError(f"{key!r} is not key:value (e.g. expandable_segments:True)")
        if tokens[i + 2] == "[":
            if key != "roundup_power2_divisions":
                raise ValueError(f"{key}: a list is accepted only by roundup_power2_divisions")
            pairs, i = _split_list(tokens, i + 2)
            settings = replace(settings, roundup_power2_divisions=_divisions_list(pairs))
        else:
            settings = _apply(settings, key, tokens[i + 2])
            i += 2
        i += 1
        if i < len(tokens):
            if tokens[i] != ",":
                raise ValueError(f"expected ',' after {key}, got {tokens[i]!r}")
            i += 1
    return settings


def divisions_for(size: int, settings: AllocatorSettings) -> int:
    """The roundup_power2_divisions of the interval `size` falls in (AcceleratorAllocatorConfig::
    roundup_power2_divisions(size))."""
    log_size = size.bit_length() - 1
    index = log_size - ROUNDUP_START_LOG2 if log_size > ROUNDUP_START_LOG2 else 0
    return settings.roundup_power2_divisions[min(index, ROUNDUP_INTERVALS - 1)]


def roundup_power2_next_division(size: int, divisions: int) -> int:
    """1200 with 4 divisions: 1024, 1280, 1536, 1792 between 1024 and 2048 -> 1280."""
    if _is_power_of_2(size):
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> int(math.log2(divisions))
    if step == 0:
        return floor << 1
    rounded = size & ~(step - 1)
    return size if rounded == size else rounded + step


def round_size(size: int, settings: AllocatorSettings) -> int:
    """The bytes a request of `size` takes from the allocator (round_size): at least 512, a multiple of 512, or
    the next power-of-2 division where roundup_power2_divisions applies to the size."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    divisions = divisions_for(size, settings)
    if divisions > 1 and size > MIN_BLOCK_SIZE * divisions:
        return roundup_power2_next_division(size, divisions)
    return MIN_BLOCK_SIZE * ((size + MIN_BLOCK_SIZE - 1) // MIN_BLOCK_SIZE)
