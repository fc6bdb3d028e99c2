"""A run that ran out of memory: how a task says so (`oom-RANK.json` in the job directory), and how it is read.

The built-in runtime writes the record when the run ends in torch's `torch.OutOfMemoryError` (CUDA's allocator
failing; `torch.cuda.OutOfMemoryError` is the same class since torch 2.5; the live test's hook that raises one on
the CPU is runtime/oom_hook.py); a script's process does
when it imports `frenzy_slurm.in_job` (its exception hook, standard library only). Each record holds the
rank, host, torch's message and the measured peak: the allocator's reserved bytes at the failure plus the
allocation that failed, the least the plan needed, which calibration takes as the run's measured peak
(calibration/observe.py). The job's epilogue (frenzy_slurm/runtime/oom_retry.py) reads the records, or torch's and
Slurm's messages in the job's output, to decide whether the run ran out of memory.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Any

from frenzy_slurm.core.units import GiB  # (imports nothing: in_job stays standard library only)

RECORD_GLOB = "oom-*.json"
MAX_MESSAGE = 2000  # torch's message is a few hundred characters; a record stays small
# torch's message for a failed CUDA allocation ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a
# total capacity of 79.1 GiB of which ..."; c10/cuda/CUDACachingAllocator.cpp), and the amount it names
TORCH_MESSAGE = re.compile(r"CUDA out of memory\. Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)")
_UNITS = {"B": 1.0, "KiB": 1024.0, "MiB": 1024.0**2, "GiB": GiB, "TiB": 1024.0**4}


def is_cuda_oom(exc: BaseException) -> bool:
    """Whether `exc` is torch's out-of-memory error (by its class, whatever torch's version names it)."""
    torch = sys.modules.get("torch")
    kind = getattr(torch, "OutOfMemoryError", None) or getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return isinstance(kind, type) and isinstance(exc, kind)


def requested_bytes(message: str) -> float | None:
    """The allocation torch's message says failed, in bytes; None where the message names none."""
    m = TORCH_MESSAGE.search(message)
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def _reserved_bytes() -> float | None:
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return float(torch.cuda.max_memory_reserved())
    except Exception:  # noqa: BLE001 - a broken CUDA state: the peak is simply not known
        return None
    return None


def record(job_dir: Path, exc: BaseException, planned_gib: float | None = None) -> Path:
    """Write this rank's record of the failure; the measured peak is the reserved bytes plus the failed request
    (on the CPU, under the test hook, the plan's peak it could not have)."""
    message = str(exc)[:MAX_MESSAGE]
    asked = requested_bytes(message)
    reserved = _reserved_bytes()
    peak = (reserved or 0.0) + (asked or 0.0) if reserved is not None else planned_gib and planned_gib * GiB
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "0"
    data: dict[str, Any] = {
        "rank": int(rank) if rank.isdigit() else 0,
        "host": socket.gethostname(),
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "kind": "cuda",
        "message": message,
        "peak_gib": peak / GiB if peak else None,
        "at": time.time(),
    }
    path = job_dir / f"oom-{data['rank']}.json"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)
    return path


def read_records(job_dir: Path) -> list[dict[str, Any]]:
    """The ranks' records of a job directory: regular files only, each small; unreadable ones are skipped."""
    out = []
    for path in sorted(job_dir.glob(RECORD_GLOB)):
        try:
            if path.is_symlink() or not path.is_file() or path.stat().st_size > 64 * 1024:
                continue
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            out.append(data)
    return out
