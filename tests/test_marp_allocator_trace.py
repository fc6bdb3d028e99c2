"""`python -m frenzy_slurm.marp.allocator_trace`: a torch.cuda.memory._snapshot() (as JSON) replayed through the
allocator replayer, on tests/data/allocator_trace_small.json, a snapshot written by hand in the format torch
writes (torch/csrc/cuda/Module.cpp, _memory_snapshot): its trace is what the real allocator would record for

    a = 1000 B; b = 3 MiB; c = 18 MiB  (a 2 MiB small segment, a 20 MiB segment, c too large for b's 17 MiB rest)
    del b; d = 4 MiB                    (d takes b's block again)
    del c; empty_cache()                (c's 18 MiB segment freed)
    a free of x, allocated before the trace started (the history is a ring buffer)
    e = 512 B; e.record_stream(s); del e (free_completed comes later); f = 1 MiB on stream 7; e = 300 B

so the reserved peak is 2 + 20 + 18 = 40 MiB and 24 MiB are held at the end (2 + 20 + stream 7's 2 MiB)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from frenzy_slurm.marp.allocator_settings import SIZE_MAX
from frenzy_slurm.marp.allocator_trace import main, replay_trace, settings_from_snapshot

ROOT = Path(__file__).resolve().parent.parent
SNAPSHOT = ROOT / "tests" / "data" / "allocator_trace_small.json"
MiB = 1024**2


def load() -> dict:
    return json.loads(SNAPSHOT.read_text())


def test_the_replay_matches_the_trace_and_the_snapshot():
    snapshot = load()
    result = replay_trace(snapshot["device_traces"][0], settings_from_snapshot(snapshot))
    held = sum(s["total_size"] for s in snapshot["segments"])
    assert result.stats["reserved_bytes.all.peak"] == result.trace_reserved_peak == 40 * MiB
    assert result.stats["reserved_bytes.all.current"] == held == 24 * MiB
    assert result.stats["segment.all.current"] == len(snapshot["segments"]) == 3
    # a (1024) + d (4 MiB) + f (1 MiB) + e (512): the same blocks the snapshot lists as allocated
    allocated = sum(b["size"] for s in snapshot["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert result.stats["allocated_bytes.all.current"] == allocated == 5 * MiB + 1536
    assert (result.allocs, result.frees, result.unknown_frees, result.empty_caches) == (7, 3, 1, 1)


def test_a_block_waiting_for_free_completed_is_not_reused():
    """A free_requested that its free_completed does not follow at once (the block was used on another stream)
    keeps the block until then: a second 30 MiB request makes a second segment; completed at once, it does
    not."""
    settings = settings_from_snapshot({})

    def event(action: str, addr: int) -> dict:
        return {"action": action, "addr": addr, "size": 30 * MiB, "stream": 0}

    waiting = [event("alloc", 1), event("free_requested", 1), event("alloc", 2), event("free_completed", 1)]
    at_once = [event("alloc", 1), event("free_requested", 1), event("free_completed", 1), event("alloc", 2)]
    assert replay_trace(waiting, settings).stats["reserved_bytes.all.peak"] == 60 * MiB
    assert replay_trace(at_once, settings).stats["reserved_bytes.all.peak"] == 30 * MiB


def test_settings_are_read_from_the_snapshot():
    """allocator_settings as torch writes them: max_split_size SIZE_MAX as int64 (-1), roundup_power2_divisions
    keyed by the interval's MiB."""
    raw = {
        "max_split_size": -1,
        "expandable_segments": True,
        "garbage_collection_threshold": 0.6,
        "roundup_power2_divisions": {str(1 << i): (4 if i == 2 else 0) for i in range(16)},
    }
    s = settings_from_snapshot({"allocator_settings": raw})
    assert s.max_split_size == SIZE_MAX and s.expandable_segments and s.garbage_collection_threshold == 0.6
    assert s.roundup_power2_divisions[2] == 4 and sum(s.roundup_power2_divisions) == 4
    raw["max_split_size"] = 200 * MiB
    assert settings_from_snapshot({"allocator_settings": raw}).max_split_size == 200 * MiB


def test_the_printout_puts_the_replay_next_to_the_trace(capsys):
    assert main([str(SNAPSHOT)]) == 0
    out = capsys.readouterr().out
    assert "replay  reserved peak  0.039 GiB (40.0 MiB)" in out
    assert "trace   reserved peak  0.039 GiB (40.0 MiB)" in out
    assert "snapshot segments      0.023 GiB (24.0 MiB)" in out
    # replayed with expandable segments instead, by hand: b maps one 20 MiB page (17 MiB left after it); c (18 MiB)
    # grows that free rest by a second page: 2 + 40 = 42 MiB at the peak; after del c and empty_cache the first
    # page, wholly free again, is unmapped: 2 + 20, and stream 7's 2 MiB: 24 MiB now
    assert main([str(SNAPSHOT), "--settings", "expandable_segments:True"]) == 0
    out = capsys.readouterr().out
    assert "replay  reserved peak  0.041 GiB (42.0 MiB), now 0.023 GiB (24.0 MiB)" in out


def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path, capsys):
    bad = tmp_path / "list.json"
    bad.write_text("[]")
    assert main([str(bad)]) == 2
    assert "expected the dictionary" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.json")]) == 2


def test_it_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "frenzy_slurm.marp.allocator_trace", str(SNAPSHOT)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "device 0: 20 events, 7 allocations" in done.stdout
