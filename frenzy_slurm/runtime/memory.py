"""Measured peak memory of a training step, per rank.

GPU: torch.cuda.max_memory_allocated / max_memory_reserved, and NVML's device memory used. CPU: the
profiler's allocator events (profile_memory=True) give the running total during the step; the
tensors alive before it (parameters, states, buffers) are its baseline. Process RSS is not used: it
counts the interpreter, libraries and freed-but-cached pages.
"""

from __future__ import annotations

import gc
from typing import Callable

import torch

GiB = float(1 << 30)


def live_tensor_bytes() -> int:
    seen, total = set(), 0
    for obj in gc.get_objects():
        try:
            if torch.is_tensor(obj) and obj.device.type == "cpu":
                st = obj.untyped_storage()
                key = st.data_ptr()
                if key and key not in seen:
                    seen.add(key)
                    total += st.nbytes()
        except Exception:  # noqa: BLE001 - some tensor subclasses refuse storage access
            continue
    return total


def cpu_step_peak(step: Callable[[], object]) -> tuple[float, object]:
    """Run `step` under the profiler; return (peak bytes, step's result)."""
    from torch.profiler import ProfilerActivity, profile

    baseline = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        result = step()
    # allocations are attributed to the op that made them (self usage, so nested ops count once); frees
    # outside an op are "[memory]" events with negative usage
    events = sorted((e for e in prof.events() if e.self_cpu_memory_usage), key=lambda e: e.time_range.start)
    running = peak = 0
    for e in events:
        running += e.self_cpu_memory_usage
        peak = max(peak, running)
    return baseline + peak, result


def gpu_peaks(device: torch.device) -> dict[str, float | None]:
    out: dict[str, float | None] = {
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / GiB,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / GiB,
        "nvml_used_gib": None,
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        idx = device.index if device.index is not None else torch.cuda.current_device()
        handle = pynvml.nvmlDeviceGetHandleByIndex(idx)
        out["nvml_used_gib"] = pynvml.nvmlDeviceGetMemoryInfo(handle).used / GiB
    except Exception:  # noqa: BLE001 - pynvml.NVMLError or no pynvml: the torch figures stand
        pass
    return out
