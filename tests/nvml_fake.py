"""A small fake of the nvidia-ml-py calls frenzy-slurm uses, answering from recorded fixtures (tests/data/nvml).

Implements exactly nvml_probe.NVML_CALLS and nvml_sampler.SAMPLER_CALLS; a query a GPU does not
support raises NVMLError_NotSupported, as pynvml does.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

DATA = Path(__file__).resolve().parent / "data" / "nvml"


class NVMLError(Exception):
    pass


class NVMLError_NotSupported(NVMLError):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    pass


class FakeNvml:
    def __init__(
        self,
        fixture: str | dict,
        processes: dict[int, list[tuple[int, int]]] | None = None,
        utilisation: dict[int, int] | None = None,
    ):
        self.data = json.loads((DATA / fixture).read_text()) if isinstance(fixture, str) else fixture
        self.processes = processes or {}  # device index -> [(pid, bytes)]
        self.utilisation = utilisation or {}
        self.initialised = False

    def nvmlInit(self):
        err = self.data.get("init_error")
        if err:
            raise {"NVMLError_LibraryNotFound": NVMLError_LibraryNotFound}.get(err, NVMLError)(
                "NVML Shared Library Not Found"
            )
        self.initialised = True

    def nvmlShutdown(self):
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        return self.data["driver_version"]

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return self.data["cuda_driver_version"]

    def nvmlDeviceGetCount(self):
        return len(self.data["devices"])

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def _dev(self, h):
        return self.data["devices"][h]

    def nvmlDeviceGetName(self, h):
        return self._dev(h)["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._dev(h)["uuid"]

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self._dev(h)
        used = d.get("memory_used", 0) + sum(b for _, b in self.processes.get(h, []))
        return SimpleNamespace(total=d["memory_total"], used=used, free=d["memory_total"] - used)

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._dev(h)["pci_bus_id"].encode())

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._dev(h)["pcie_max_gen"]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._dev(h)["pcie_max_width"]

    def _link(self, h, link):
        links = self._dev(h).get("nvlinks")
        if links is None or link >= len(links):
            raise NVMLError_NotSupported("Not Supported")
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._link(h, link)["state"]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._link(h, link)["version"]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._link(h, link)["remote_bus"])

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.data["topology"][a][b]

    def nvmlDeviceGetMigMode(self, h):
        mig = self._dev(h).get("mig")
        if mig is None:
            raise NVMLError_NotSupported("Not Supported")
        return [mig, mig]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self.utilisation.get(h, 0), memory=0)

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in self.processes.get(h, [])]
