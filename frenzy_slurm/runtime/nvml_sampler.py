"""A light NVML sampler beside a user's training script: GPU memory and utilisation of this job.

The launcher (`python -P -m frenzy_slurm.runtime --script ...`) starts one per node, on the task with
SLURM_LOCALID 0, before it execs the script:

    python -P -m frenzy_slurm.runtime.nvml_sampler --job-dir DIR --watch-pid PID [--interval 2]

Every interval it reads, for each GPU NVML can open: device memory used, utilisation, and the memory
of this job's own processes on it (nvmlDeviceGetComputeRunningProcesses, filtered to processes whose
environment carries this SLURM_JOB_ID). It keeps peaks, rewrites `nvml-<host>.json` atomically (a job
killed at its time limit still leaves its last sample), and when the watched process ends merges every
node's file into `metrics.json` in the format the built-in trainer writes (`ranks[].peak_gib`, metric
"device (nvml)", with MARP's prediction beside it), unless the trainer already wrote one.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from frenzy_slurm.core.units import GiB

SAMPLER_CALLS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetComputeRunningProcesses",
)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _job_of(pid: int) -> str | None:
    """SLURM_JOB_ID in a process's environment (readable for our own processes), else None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        if item.startswith(b"SLURM_JOB_ID="):
            return item.split(b"=", 1)[1].decode()
    return None


class Sampler:
    """Peaks per GPU over the samples taken so far."""

    def __init__(self, nvml: Any, job_id: str | None, job_of: Callable[[int], str | None] = _job_of):
        self.nvml, self.job_id, self.job_of = nvml, job_id, job_of
        self.samples = 0
        self.devices: dict[int, dict] = {}
        nvml.nvmlInit()
        self.handles = []
        for i in range(nvml.nvmlDeviceGetCount()):
            try:
                self.handles.append((i, nvml.nvmlDeviceGetHandleByIndex(i)))
            except Exception:  # noqa: BLE001 - a GPU of another job behind the cgroup: not ours
                continue

    def sample(self) -> None:
        self.samples += 1
        for i, h in self.handles:
            try:
                mem = self.nvml.nvmlDeviceGetMemoryInfo(h)
                util = self.nvml.nvmlDeviceGetUtilizationRates(h)
                procs = self.nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception:  # noqa: BLE001 - a transient NVML error skips one sample
                continue
            ours = [p for p in procs if self.job_id is None or self.job_of(p.pid) == self.job_id]
            d = self.devices.setdefault(
                i,
                {
                    "index": i,
                    "name": _text(self.nvml.nvmlDeviceGetName(h)),
                    "uuid": _text(self.nvml.nvmlDeviceGetUUID(h)),
                    "peak_used_gib": 0.0,
                    "peak_process_gib": 0.0,
                    "max_util_pct": 0,
                    "util_sum": 0,
                    "busy_samples": 0,
                    "ours": False,
                },
            )
            d["peak_used_gib"] = max(d["peak_used_gib"], mem.used / GiB)
            own = sum((p.usedGpuMemory or 0) for p in ours)
            d["peak_process_gib"] = max(d["peak_process_gib"], own / GiB)
            if ours:
                d["ours"] = True
                d["busy_samples"] += 1
                d["util_sum"] += util.gpu
                d["max_util_pct"] = max(d["max_util_pct"], util.gpu)

    def report(self, host: str, interval: float) -> dict[str, Any]:
        devices = []
        for d in self.devices.values():
            if not d["ours"]:
                continue  # a GPU this job never ran on
            out = {k: v for k, v in d.items() if k not in ("util_sum", "busy_samples", "ours")}
            out["mean_util_pct"] = d["util_sum"] / d["busy_samples"] if d["busy_samples"] else None
            devices.append(out)
        return {
            "host": host,
            "interval_s": interval,
            "samples": self.samples,
            "devices": devices,
            "written_at": time.time(),
        }


def _atomic_json(path: Path, data: dict) -> None:
    # not at import: the sampler runs beside a user's script and stays light (tests/test_names.py)
    from frenzy_slurm.core.records import write_atomic

    write_atomic(path, json.dumps(data, indent=2) + "\n")  # O_EXCL temporary + rename: never through a link


def merge_metrics(job_dir: Path) -> dict[str, Any] | None:
    """metrics.json from every node's nvml-*.json, with MARP's device-memory prediction per GPU model.

    Returns None (and writes nothing) when the built-in trainer already wrote metrics.json.
    """
    # not at import: the sampler runs beside a user's script and stays light (tests/test_names.py)
    from frenzy_slurm.core.gpus import match_gpu

    target = job_dir / "metrics.json"
    # O_NOFOLLOW, no O_TRUNC: a link planted at the lock's name is refused, never followed and truncated
    fd = os.open(job_dir / ".metrics.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "r+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists() and json.loads(target.read_text()).get("source") != "nvml-sampler":
            return None
        components = []
        try:
            components = json.loads((job_dir / "plan.json").read_text())["decision"]["chosen"]["components"]
        except (OSError, KeyError, json.JSONDecodeError):
            pass
        ranks = []
        for f in sorted(job_dir.glob("nvml-*.json")):
            node = json.loads(f.read_text())
            for d in node["devices"]:
                spec = match_gpu(d["name"])
                comp = next(
                    (c for c in components if spec and c.get("gpu_model") == spec.name),
                    components[0] if len(components) == 1 else None,
                )
                ranks.append(
                    {
                        "rank": None,
                        "host": node["host"],
                        "gpu_index": d["index"],
                        "device": "cuda",
                        "gpu_model": comp.get("gpu_model") if comp else (spec.name if spec else d["name"]),
                        "gpu_type": comp.get("gpu_type") if comp else None,
                        "partition": comp.get("partition") if comp else None,
                        "peak_gib": d["peak_used_gib"],
                        "peak_process_gib": d["peak_process_gib"],
                        "metric": "device (nvml)",
                        "max_util_pct": d["max_util_pct"],
                        "mean_util_pct": d["mean_util_pct"],
                        "predicted_gib": comp.get("peak_gib") if comp else None,
                    }
                )
        metrics = {
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "source": "nvml-sampler",
            "ranks": ranks,
            "step_times_s": [],
            "step_time_s": None,
            "written_at": time.time(),
        }
        _atomic_json(target, metrics)
        return metrics


class _Stopped(Exception):
    pass


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited script its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def run(job_dir: Path, watch_pid: int, interval: float, nvml: Any) -> int:
    host = socket.gethostname()
    try:
        sampler = Sampler(nvml, os.environ.get("SLURM_JOB_ID"))
    except Exception as exc:  # noqa: BLE001 - no driver: say so once, never disturb the job
        print(f"frenzy-slurm sampler: no NVML on {host} ({exc.__class__.__name__}); not sampling", file=sys.stderr)
        return 0

    def _stop(*_: object) -> NoReturn:
        raise _Stopped  # interrupts the sleep: the step's end leaves only KillWait seconds to write

    signal.signal(signal.SIGTERM, _stop)
    out = job_dir / f"nvml-{host}.json"
    last_write = 0.0
    try:
        while _alive(watch_pid):
            sampler.sample()
            if time.time() - last_write > 5 * interval:
                _atomic_json(out, sampler.report(host, interval))
                last_write = time.time()
            time.sleep(interval)
    except _Stopped:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _atomic_json(out, sampler.report(host, interval))
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass
    merge_metrics(job_dir)
    return 0


def start_beside(job_dir: Path, interval: float = 2.0) -> None:
    """Start the sampler for this process (called by the launcher before it execs the user's script)."""
    import subprocess

    # -P and cwd="/": the job's working directory (and an empty PYTHONPATH entry, which means it) never
    # reaches sys.path, so a pynvml.py or frenzy_slurm/ planted there is not imported (docs/security.md).
    # Its output goes to its own file, never to the step's stdout/stderr: slurmstepd forwards those to srun
    # until every holder has closed them, so a sampler outliving the script by a sample would hold the step open.
    job_dir = Path(job_dir).absolute()
    log = os.open(
        job_dir / f"nvml-{socket.gethostname()}.log",
        os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
    )
    try:
        subprocess.Popen(
            sampler_argv(job_dir, os.getpid(), interval),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            close_fds=True,
            cwd="/",
        )
    finally:
        os.close(log)


def sampler_argv(job_dir: Path, watch_pid: int, interval: float) -> list[str]:
    """The sampler's command line: frenzy-slurm's own module, never one found in the working directory."""
    return [
        sys.executable,
        "-P",
        "-m",
        "frenzy_slurm.runtime.nvml_sampler",
        "--job-dir",
        str(job_dir),
        "--watch-pid",
        str(watch_pid),
        "--interval",
        str(interval),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="frenzy_slurm.runtime.nvml_sampler", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-dir", type=Path, required=True)
    ap.add_argument("--watch-pid", type=int, required=True)
    ap.add_argument("--interval", type=float, default=2.0)
    ns = ap.parse_args(argv)
    # beside -P: an empty PYTHONPATH entry ('' is the working directory) must not supply pynvml either
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    try:
        import pynvml
    except ImportError:
        print("frenzy-slurm sampler: nvidia-ml-py is not installed; not sampling", file=sys.stderr)
        return 0
    return run(ns.job_dir, ns.watch_pid, ns.interval, pynvml)


if __name__ == "__main__":
    sys.exit(main())
