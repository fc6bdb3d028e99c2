"""What NVML says about this node's GPUs: `frenzy-slurm site detect` runs this on one node per pool.

    srun --chdir=/ -p PART --gres=gpu:TYPE:1 ... python -P -m frenzy_slurm.runtime.nvml_probe    # one JSON object

Always with -P, from /: an admin runs it as root, and without -P the working directory comes first on sys.path
(a planted pynvml.py would run as root).

Reads, through nvidia-ml-py: driver and CUDA driver versions, each visible GPU's product name, total
memory, PCI bus id and PCIe generation/width, its active NVLinks (count, version, peers), and the
pairwise topology (NVML's common ancestor: same board, PCIe switch, host bridge, CPU socket or across
sockets). It never fails: without a driver or nvidia-ml-py it prints `"nvml": false` and the reason,
so the caller can report it per partition. Only the calls listed in NVML_CALLS are used (the tests'
fake implements exactly those).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

NVML_CALLS = (
    "nvmlInit",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPciInfo",
    "nvmlDeviceGetMaxPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkWidth",
    "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetNvLinkVersion",
    "nvmlDeviceGetNvLinkRemotePciInfo",
    "nvmlDeviceGetTopologyCommonAncestor",
    "nvmlDeviceGetMigMode",
)
MAX_LINKS = 18  # NVLink ports per GPU up to Blackwell (H100: 18, A100: 12, V100: 6)

# NVML_NVLINK_VERSION_* -> the NVLink generation the site file names (nvlinkN)
NVLINK_GENERATION = {1: 1, 2: 2, 3: 2, 4: 3, 5: 3, 6: 4, 7: 5, 8: 6}
# NVML_TOPOLOGY_* -> words
TOPOLOGY = {
    0: "same-board",
    10: "pcie-switch",
    20: "pcie-switches",
    30: "host-bridge",
    40: "cpu-socket",
    50: "cross-socket",
}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _try(fn: Callable[..., Any], *args: Any, default: Any = None) -> Any:
    """An optional NVML query: NotSupported (or any NVML error) means 'not known', not failure."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - pynvml.NVMLError subclasses; older drivers lack some calls
        return default


def probe(nvml: Any) -> dict[str, Any]:
    """The node's GPUs as NVML reports them; `nvml` is the pynvml module (or the tests' fake)."""
    out: dict[str, Any] = {"host": socket.gethostname(), "nvml": False}
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound / DriverNotLoaded / ...
        out["error"] = f"nvmlInit failed: {exc.__class__.__name__}: {exc}"
        return out
    try:
        out["nvml"] = True
        out["driver_version"] = _text(_try(nvml.nvmlSystemGetDriverVersion, default=""))
        cuda = _try(nvml.nvmlSystemGetCudaDriverVersion_v2)
        out["cuda_version"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        bus_to_index: dict[str, int] = {}
        gpus = []
        for i, h in enumerate(handles):
            pci = _try(nvml.nvmlDeviceGetPciInfo, h)
            bus = _text(pci.busId).lower() if pci is not None else f"gpu{i}"
            bus_to_index[_norm_bus(bus)] = i
            gpus.append(
                {
                    "index": i,
                    "name": _text(nvml.nvmlDeviceGetName(h)),
                    "uuid": _text(_try(nvml.nvmlDeviceGetUUID, h, default="")),
                    "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                    "pci_bus_id": bus,
                    "pcie_generation": _try(nvml.nvmlDeviceGetMaxPcieLinkGeneration, h),
                    "pcie_width": _try(nvml.nvmlDeviceGetMaxPcieLinkWidth, h),
                    # [current, pending]; NotSupported on GPUs without MIG
                    "mig_enabled": bool((_try(nvml.nvmlDeviceGetMigMode, h) or [0])[0]),
                }
            )
        for i, h in enumerate(handles):
            links, versions, peers = 0, set(), set()
            for link in range(MAX_LINKS):
                state = _try(nvml.nvmlDeviceGetNvLinkState, h, link)
                if state is None:
                    break  # past the GPU's last link (or no NVLink at all)
                if not state:
                    continue
                links += 1
                v = _try(nvml.nvmlDeviceGetNvLinkVersion, h, link)
                if v:
                    versions.add(int(v))
                remote = _try(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                if remote is not None:
                    peer = bus_to_index.get(_norm_bus(_text(remote.busId).lower()))
                    peers.add(peer if peer is not None else "nvswitch")
            gen = max((NVLINK_GENERATION.get(v, 0) for v in versions), default=0)
            gpus[i]["nvlink"] = {"active_links": links, "generation": gen or None, "peers": sorted(peers, key=str)}
        topo = []
        for i in range(len(handles)):
            row = []
            for j in range(len(handles)):
                level = None if i == j else _try(nvml.nvmlDeviceGetTopologyCommonAncestor, handles[i], handles[j])
                row.append(TOPOLOGY.get(level, None) if level is not None else None)
            topo.append(row)
        out["gpus"] = gpus
        out["topology"] = topo
    except Exception as exc:  # noqa: BLE001 - report, do not crash the probe step
        out["error"] = f"NVML query failed: {exc.__class__.__name__}: {exc}"
    finally:
        _try(nvml.nvmlShutdown)
    return out


def _norm_bus(bus: str) -> str:
    """PCI bus ids come as 00000000:07:00.0 or 0000:07:00.0: compare the last three parts."""
    return ":".join(bus.split(":")[-2:])


def main() -> int:
    # A second guard beside `python -P` (site detect always passes it): never take pynvml from the working
    # directory or an empty PYTHONPATH entry, even when someone starts the probe by hand with `python -m`.
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]
    try:
        import pynvml
    except ImportError:
        print(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "nvml": False,
                    "error": "nvidia-ml-py is not installed in this Python (pip install 'frenzy-slurm[nvml]')",
                }
            )
        )
        return 0
    print(json.dumps(probe(pynvml)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
