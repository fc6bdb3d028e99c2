"""Saying why a job hangs at start-up on a PyTorch extension build's lock left by a killed build.

DeepSpeed compiles its ops (on the CPU: the shared-memory allreduce op) with torch.utils.cpp_extension on first
use. torch's `_jit_compile` (torch 2.13, torch/utils/cpp_extension.py) takes a `FileBaton`: the first process
creates `<build dir>/lock` with O_CREAT|O_EXCL, builds and removes it; every other process polls
(`FileBaton.wait`, every 0.1 s) until the file is gone, with no time limit and, as DeepSpeed calls it, no message.
A build killed mid-way (out of memory, a cancelled job, a time limit) never removes the file, so every later job
of the user that loads the op waits silently until its own time limit.

The file records no process, and the build directory is usually on a home file system that other nodes share, so
from one node nothing can tell a stale lock from a build running elsewhere: the runtime never removes one. It
arms a timer around DeepSpeed's start; if start-up is still under way after `AFTER_S` and a lock older than that
is present, rank 0 of each node writes one line to the job's error log naming the file, its age and the fix.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TextIO

AFTER_S = 300.0  # a CPU build of DeepSpeed's op takes about a minute, a CUDA op a few; five is past both
LOCK_NAME = "lock"  # torch.utils.cpp_extension: FileBaton(os.path.join(build_directory, "lock"))


def extensions_root(env: Mapping[str, str] | None = None) -> Path:
    """Where torch builds extensions: $TORCH_EXTENSIONS_DIR, else its user cache (torch._appdirs'
    user_cache_dir: $XDG_CACHE_HOME or ~/.cache, then torch_extensions; below it a pyXY_cpu/cuXYZ folder)."""
    e = os.environ if env is None else env
    if e.get("TORCH_EXTENSIONS_DIR"):
        return Path(e["TORCH_EXTENSIONS_DIR"])
    cache = e.get("XDG_CACHE_HOME") or str(Path(e.get("HOME") or Path.home()) / ".cache")
    return Path(cache) / "torch_extensions"


def old_locks(root: Path, older_than_s: float, now: float | None = None) -> list[tuple[Path, float]]:
    """(lock file, age in seconds) of each extension build lock under `root` (an op's folder, directly or one
    pyXY_* level down) created more than `older_than_s` ago, oldest first. Bounded: two directory levels."""
    t = time.time() if now is None else now
    found: list[tuple[Path, float]] = []
    for pattern in (f"*/{LOCK_NAME}", f"*/*/{LOCK_NAME}"):
        for path in root.glob(pattern):
            try:
                age = t - path.lstat().st_mtime  # FileBaton never writes it: its mtime is when the build began
            except OSError:  # removed meanwhile: a build just ended
                continue
            if age > older_than_s:
                found.append((path, age))
    return sorted(found, key=lambda pa: -pa[1])


def lock_note(path: Path, age_s: float) -> str:
    """The job log's line for one lock: what waits, since when, and how to free it."""
    return (
        f"frenzy-slurm: start-up waits on {path}, a PyTorch extension build's lock made {age_s / 60:.0f} min ago "
        f"(op {path.parent.name}); torch waits until it is removed. If no build of that op is running on any "
        f"node that shares this directory, the build that made it was killed: remove the file (rm '{path}') "
        "and the job goes on."
    )


@contextmanager
def watch_start(
    speaks: bool,
    after_s: float = AFTER_S,
    root: Path | None = None,
    out: TextIO | None = None,
    timer: Callable[[float, Callable[[], None]], threading.Timer] = threading.Timer,
) -> Iterator[None]:
    """Within the block (DeepSpeed's start: its comm and ops), note once on `out` (stderr) every build lock older
    than `after_s` if the block is still running `after_s` from its start. `speaks`: this rank writes (rank 0
    of its node); the others do nothing."""
    if not speaks:
        yield
        return

    def note() -> None:
        stream = out or sys.stderr
        for path, age in old_locks(root or extensions_root(), after_s):
            print(lock_note(path, age), file=stream, flush=True)

    t = timer(after_s, note)
    t.daemon = True
    t.start()
    try:
        yield
    finally:
        t.cancel()
