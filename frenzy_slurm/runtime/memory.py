"""Measured peak memory of a training step, per rank.

GPU: torch.cuda.max_memory_allocated / max_memory_reserved, and NVML's device memory used. CPU: the
profiler's allocator events (profile_memory=True), each with its own timestamp, give the running total;
the tensors alive when recording began are its baseline. Recording starts a step before the measured one
(`CpuMemoryRecorder`): the profiler cannot see the free of a block allocated before it started, so a
recorder started at the measured step itself counted the previous step's freed gradients and buffers as
still alive. Process RSS is not used: it counts the interpreter, libraries and freed-but-cached pages.

The CPU allocator updates the running total the profiler reports only for threads being profiled, so a
block allocated here and freed on one of gloo's worker threads (the last reference to a collective's
buffer is often dropped there) stayed in the total for good, and multi-process runs seemed to grow from
step to step. `count_all_threads()` turns on c10's own accounting, which updates the total on every
thread; the next event on this thread then reports it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch

from frenzy_slurm.core.units import GiB


def count_all_threads() -> bool:
    """Make the CPU allocator's running total count allocations and frees on every thread (c10's
    `caffe2_report_cpu_memory_usage` flag; its per-allocation log is at INFO, below c10's default level).
    Returns False where this torch build does not export the flag (the total then misses other threads)."""
    import ctypes
    import os

    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libc10.so"))
        ctypes.c_bool.in_dll(lib, "FLAGS_caffe2_report_cpu_memory_usage").value = True
    except (OSError, ValueError):
        return False
    return True


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


class CpuMemoryRecorder:
    """Allocator events from `start()` on; `peak_of(step)` runs one step and returns (peak live bytes, result)."""

    def __init__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        self._baseline = 0
        self._label = 0

    def start(self) -> CpuMemoryRecorder:
        count_all_threads()
        self._baseline = live_tensor_bytes()
        self._prof.__enter__()
        return self

    def close(self) -> None:
        self._prof.__exit__(None, None, None)

    def peak_of(self, step: Callable[[], object]) -> tuple[float, object]:
        from torch.profiler import record_function

        self._label += 1
        label = f"frenzy-measured-step-{self._label}"
        with record_function(label):
            result = step()
        self._prof.__exit__(None, None, None)
        timeline, windows = trace_timeline(self._prof)
        a, b = windows[label]
        before = [v for t, v, _ in timeline if t < a]
        first = timeline[0][1] - timeline[0][2] if timeline else 0  # allocator total before the first event
        start = before[-1] if before else first
        peak = max([v for t, v, _ in timeline if a <= t <= b] + [start])
        return float(self._baseline + peak - first), result


def trace_events(prof: torch.profiler.profile) -> list[dict[str, Any]]:
    """The events of a finished profile, as its Chrome trace holds them (a profile exports once)."""
    import json
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            return json.load(fh)["traceEvents"]
    finally:
        os.unlink(path)


def trace_timeline(
    prof: torch.profiler.profile | None = None, events: list[dict[str, Any]] | None = None
) -> tuple[list[tuple[float, int, int]], dict[str, tuple[float, float]]]:
    """(time us, allocator's total allocated bytes, bytes of the event) for every CPU allocator event of a
    finished profile, and the (start, end) of every named range.

    The total is the allocator's own count, which includes frees done on threads the profiler does not
    record (gloo's worker threads drop the last reference to communication tensors): summing the events'
    sizes would miss those frees and count the tensors as live for the rest of the run.
    """
    if events is None:
        assert prof is not None, "trace_timeline needs a finished profile or its events"
        events = trace_events(prof)
    mem = sorted(
        (e["ts"], int(e["args"]["Total Allocated"]), int(e["args"]["Bytes"]))
        for e in events
        if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0
    )
    windows = {
        e["name"]: (e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation"
    }
    return mem, windows


# Names of the profiler's ranges that say which part of a step ran: the autograd engine runs each backward
# function under "autograd::engine::evaluate_function: XBackward0"; torch's optimizers wrap step() in
# "Optimizer.step#AdamW.step" (torch/optim/optimizer.py, profile_hook_step)
BACKWARD_MARK = "autograd::engine::evaluate_function"
OPTIMIZER_MARK = "Optimizer.step#"
# the loss's own ops, forward (aten::log_softmax, aten::nll_loss_forward, aten::cross_entropy_loss) and backward
# (LogSoftmaxBackward0, NllLossBackward0): the instant where the logits and the loss's tensors are alive
LOSS_MARKS = ("log_softmax", "nll_loss", "cross_entropy", "LogSoftmaxBackward", "NllLossBackward")
PEAK_TIMELINE_BUCKETS = 32


def part_of_step(ranges: list[str]) -> str:
    """forward, loss, backward or optimizer: the part of a step that the innermost of the open profiler `ranges`
    (outermost first) names. The innermost wins: Lightning runs forward and backward inside the optimizer's step
    (its closure), and a loss's backward runs inside the autograd engine."""
    for n in reversed(ranges):
        if any(m in n for m in LOSS_MARKS):
            return "loss"
        if BACKWARD_MARK in n:
            return "backward"
        if OPTIMIZER_MARK in n:
            return "optimizer"
    return "forward"


def peak_context(
    events: list[dict[str, Any]], timeline: list[tuple[float, int, int]], window: tuple[float, float]
) -> dict[str, object]:
    """Where in the step `window` its allocated peak fell: the time from the step's start, the profiler ranges
    open at that instant (outermost first), the part of the step the innermost of them names (forward, loss,
    backward or optimizer), and the allocated bytes over the step as PEAK_TIMELINE_BUCKETS maxima of equal time
    slices."""
    a, b = window
    inside = [(t, v) for t, v, _ in timeline if a <= t <= b]
    if not inside:
        return {"at_us": None, "step_us": b - a, "ranges": [], "part": None, "timeline": []}
    t_peak, _ = max(inside, key=lambda x: x[1])
    open_at = sorted(
        (e for e in events if e.get("ph") == "X" and e["ts"] <= t_peak <= e["ts"] + e.get("dur", 0)),
        key=lambda e: (e["ts"], -e.get("dur", 0)),
    )
    names = [e["name"] for e in open_at if not e["name"].startswith("grid-step-")]
    part = part_of_step(names)
    span = max(b - a, 1e-9)
    slices = [0] * PEAK_TIMELINE_BUCKETS
    for t, v in inside:
        k = min(PEAK_TIMELINE_BUCKETS - 1, int((t - a) / span * PEAK_TIMELINE_BUCKETS))
        slices[k] = max(slices[k], v)
    for k in range(1, PEAK_TIMELINE_BUCKETS):  # a slice without events holds what the one before ended with
        slices[k] = slices[k] or slices[k - 1]
    return {"at_us": t_peak - a, "step_us": b - a, "ranges": names[-6:], "part": part, "timeline": slices}


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
