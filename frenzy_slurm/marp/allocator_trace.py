"""Replay a recorded PyTorch memory trace through the allocator replayer and compare it with what the GPU did.

    python -m frenzy_slurm.marp.allocator_trace SNAPSHOT.json [--capacity-gib 79.1] [--settings CONF]

SNAPSHOT.json is the dictionary `torch.cuda.memory._snapshot()` returns (what `torch.cuda.memory._dump_snapshot`
pickles) written as JSON, after `torch.cuda.memory._record_memory_history()` was on:

    python -c "import json, pickle, sys; json.dump(pickle.load(open(sys.argv[1], 'rb')), sys.stdout)" \\
        snapshot.pickle > SNAPSHOT.json

What is read: `device_traces`, one list per device of events `{"action", "addr", "size", "stream"}` where action
is `alloc` (size: the bytes requested), `free_requested` (the tensor died), `free_completed` (its block is
reusable: at once, or after the streams `record_stream` named), `segment_alloc`/`segment_free` (cudaMalloc,
cudaFree) and `segment_map`/`segment_unmap` (expandable segments' pages), `oom`, `snapshot` (ignored);
`segments`, each with `device` and `total_size` (what the allocator held when the snapshot was taken); and
`allocator_settings` (`expandable_segments`, `max_split_size`, `garbage_collection_threshold`,
`roundup_power2_divisions` as {"1": v, "2": v, ..., "32768": v} per interval of MiB): the settings in force
when the snapshot was taken, replayed for the whole trace (a program that changed them midway is replayed with
its last ones; `--settings` replaces them).

The replay sees only the requests: a run of segment frees that no allocation follows is an `empty_cache()` call,
and is repeated; a trace that starts mid-run (the history is a ring buffer, 100,000 events by default) frees
tensors it never saw allocated, which are skipped and counted. The printout puts the replay's reserved peak next
to the trace's own (from its segment events, relative to where the trace starts) and the snapshot's segments.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.allocator_replay import AllocatorOutOfMemory, CachingAllocator
from frenzy_slurm.marp.allocator_settings import (
    ROUNDUP_INTERVALS,
    SIZE_MAX,
    AllocatorSettings,
    MiB,
    parse_settings,
)

SEGMENT_GROWS = ("segment_alloc", "segment_map")
SEGMENT_SHRINKS = ("segment_free", "segment_unmap")
PENDING_STREAM = -1  # the stream a block freed with a delayed free_completed waits on in the replay


@dataclass
class _Addresses:
    """Trace addresses -> replay addresses: of live tensors, and of freed blocks waiting for free_completed."""

    live: dict[int, int] = field(default_factory=dict)
    waiting: dict[int, int] = field(default_factory=dict)


def settings_from_snapshot(snapshot: dict[str, Any]) -> AllocatorSettings:
    """The snapshot's `allocator_settings` as the replayer's settings (torch's defaults for what is missing)."""
    raw = snapshot.get("allocator_settings") or {}
    max_split = int(raw.get("max_split_size", -1))
    divisions_by_mb = raw.get("roundup_power2_divisions") or {}
    divisions = [int(v) for _, v in sorted(divisions_by_mb.items(), key=lambda kv: int(kv[0]))]
    divisions = (divisions + [0] * ROUNDUP_INTERVALS)[:ROUNDUP_INTERVALS]
    return AllocatorSettings(
        expandable_segments=bool(raw.get("expandable_segments", False)),
        # SIZE_MAX written as int64 reads -1
        max_split_size=SIZE_MAX if max_split <= 0 or max_split >= 2**63 - 1 else max_split,
        garbage_collection_threshold=float(raw.get("garbage_collection_threshold", 0.0)),
        roundup_power2_divisions=tuple(divisions),
    )


@dataclass
class TraceReplay:
    """One device's trace replayed: the replay's figures and the trace's own."""

    allocs: int = 0
    frees: int = 0
    unknown_frees: int = 0  # frees of tensors allocated before the trace starts
    empty_caches: int = 0
    trace_ooms: int = 0
    trace_reserved: int = 0  # from the trace's segment events, relative to its start
    trace_reserved_peak: int = 0
    replay_ooms: int = 0
    stats: dict[str, int] = field(default_factory=dict)


def _delayed_completion(entries: Sequence[dict[str, Any]], i: int) -> bool:
    """Whether the free_requested at `i` is not completed by the next event (its block waits for streams)."""
    following = entries[i + 1] if i + 1 < len(entries) else None
    return not (
        following is not None
        and following.get("action") == "free_completed"
        and following.get("addr") == entries[i].get("addr")
    )


def _empty_cache_here(entries: Sequence[dict[str, Any]], i: int) -> bool:
    """Whether the segment release at `i` ends a run of releases that no new segment or OOM follows: then no
    allocation made it (a retry or the GC would map or cudaMalloc next, or fail), so empty_cache() did."""
    following = entries[i + 1].get("action") if i + 1 < len(entries) else None
    return following not in (*SEGMENT_SHRINKS, *SEGMENT_GROWS, "oom")


def _apply_trace_event(
    allocator: CachingAllocator, entries: Sequence[dict[str, Any]], i: int, addresses: _Addresses, out: TraceReplay
) -> None:
    """One trace event applied to the replay."""
    entry = entries[i]
    action, addr = entry.get("action"), int(entry.get("addr", 0))
    if action == "alloc":
        out.allocs += 1
        try:
            addresses.live[addr] = allocator.malloc(int(entry["size"]), int(entry.get("stream", 0)))
        except AllocatorOutOfMemory:
            out.replay_ooms += 1
    elif action == "free_requested":
        replayed = addresses.live.pop(addr, None)
        if replayed is None:
            out.unknown_frees += 1
            return
        out.frees += 1
        if _delayed_completion(entries, i):
            allocator.record_stream(replayed, PENDING_STREAM)
            addresses.waiting[addr] = replayed
        allocator.free(replayed)
    elif action == "free_completed" and addr in addresses.waiting:
        allocator.free_completed(addresses.waiting.pop(addr))
    elif action in SEGMENT_GROWS or action in SEGMENT_SHRINKS:
        out.trace_reserved += int(entry["size"]) * (1 if action in SEGMENT_GROWS else -1)
        out.trace_reserved_peak = max(out.trace_reserved_peak, out.trace_reserved)
        if action in SEGMENT_SHRINKS and _empty_cache_here(entries, i):
            out.empty_caches += 1
            allocator.empty_cache()
    elif action == "oom":
        out.trace_ooms += 1


def replay_trace(
    entries: Sequence[dict[str, Any]], settings: AllocatorSettings, capacity: int | None = None
) -> TraceReplay:
    """Replay one device's trace events; what the replay and the trace each say."""
    allocator = CachingAllocator(settings, capacity)
    addresses = _Addresses()
    out = TraceReplay()
    for i in range(len(entries)):
        _apply_trace_event(allocator, entries, i, addresses, out)
    out.stats = allocator.memory_stats()
    return out


def _gib(n: int) -> str:
    return f"{n / GiB:.3f} GiB ({n / MiB:.1f} MiB)"


def report(snapshot: dict[str, Any], settings: AllocatorSettings, capacity: int | None = None) -> list[str]:
    """The printout's lines, one block per device with a trace."""
    lines = []
    for device, entries in enumerate(snapshot.get("device_traces") or []):
        if not entries:
            continue
        r = replay_trace(entries, settings, capacity)
        held = sum(int(s["total_size"]) for s in snapshot.get("segments") or [] if int(s.get("device", 0)) == device)
        lines += [
            f"device {device}: {len(entries)} events, {r.allocs} allocations, {r.frees} frees "
            f"({r.unknown_frees} of tensors allocated before the trace), {r.empty_caches} empty_cache calls",
            f"  replay  allocated peak {_gib(r.stats['allocated_bytes.all.peak'])}",
            f"  replay  reserved peak  {_gib(r.stats['reserved_bytes.all.peak'])}, "
            f"now {_gib(r.stats['reserved_bytes.all.current'])}, {r.replay_ooms} OOMs",
            f"  trace   reserved peak  {_gib(r.trace_reserved_peak)} above its start, {r.trace_ooms} OOMs",
            f"  snapshot segments      {_gib(held)} held when the snapshot was taken",
        ]
    return lines or ["no device trace in the snapshot: record it with torch.cuda.memory._record_memory_history()"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m frenzy_slurm.marp.allocator_trace", description=__doc__.split("\n")[0]
    )
    parser.add_argument("snapshot", type=Path, help="torch.cuda.memory._snapshot() written as JSON")
    parser.add_argument("--capacity-gib", type=float, help="bytes the allocator can take (default: unlimited)")
    parser.add_argument("--settings", help="PYTORCH_ALLOC_CONF to replay with instead of the snapshot's")
    args = parser.parse_args(argv)
    try:
        snapshot = json.loads(args.snapshot.read_text())
    except (OSError, ValueError) as exc:
        print(f"cannot read {args.snapshot}: {exc}", file=sys.stderr)
        return 2
    if not isinstance(snapshot, dict):
        print(f"{args.snapshot}: expected the dictionary torch.cuda.memory._snapshot() returns", file=sys.stderr)
        return 2
    settings = parse_settings(args.settings) if args.settings is not None else settings_from_snapshot(snapshot)
    capacity = int(args.capacity_gib * GiB) if args.capacity_gib else None
    print("\n".join(report(snapshot, settings, capacity)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
