"""The GPU catalog: memory, peak TFLOP/s per precision, bandwidths (data in data/gpus.yaml, with sources)."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

import yaml
from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.core.yamlfile import SHIPPED_DATA_LOADER


class GpuSpec(BaseModel):
    """One GPU model's public specifications."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = Field(description="Catalog name, e.g. A100-80GB.")
    memory_gib: float = Field(gt=0, description="Device memory as CUDA reports it, GiB.")
    fp32: float = Field(gt=0, description="Peak dense FP32 TFLOP/s.")
    tf32: float = Field(gt=0, description="Peak dense TF32 tensor TFLOP/s.")
    bf16: float = Field(gt=0, description="Peak dense BF16 tensor TFLOP/s (FP32 rate where BF16 is emulated).")
    fp16: float = Field(gt=0, description="Peak dense FP16 tensor TFLOP/s.")
    mem_bw_gbs: float = Field(gt=0, description="Memory bandwidth, GB/s.")
    link_gbs: float = Field(gt=0, description="Per-GPU intra-node bandwidth (NVLink or PCIe), GB/s.")
    efficiency: float = Field(gt=0, le=1, description="Model-FLOPs utilisation assumed for training.")
    # Fixed costs of a training step that do not scale with FLOPs (0 in the catalog; a site calibration
    # or the site file sets them): they dominate small models' steps.
    step_overhead_s: float = Field(0.0, ge=0, description="Fixed seconds per optimizer step.")
    microbatch_overhead_s: float = Field(0.0, ge=0, description="Fixed seconds per micro-batch slot of a step.")

    def peak_tflops(self, precision: str) -> float:
        if precision in ("bf16-mixed", "bf16-pure"):
            return self.bf16
        if precision == "fp16-mixed":
            return self.fp16
        return self.fp32


@cache
def catalog() -> dict[str, GpuSpec]:
    raw = yaml.load(resources.files("frenzy_slurm").joinpath("data/gpus.yaml").read_text(), Loader=SHIPPED_DATA_LOADER)
    return {name: GpuSpec(name=name, **values) for name, values in raw.items()}


def _parts(text: str) -> tuple[str, int | None, str | None]:
    """(family, memory GB, form factor) of a GPU name: 'NVIDIA A100-SXM4-80GB' -> ('a100', 80, 'sxm')."""
    t = text.lower().replace("nvidia", "").replace("tesla", "").replace("geforce", "")
    mem = re.search(r"(\d+)\s*g[bi]?b?\b", t)
    form = "sxm" if "sxm" in t else ("pcie" if "pcie" in t else None)
    t = re.sub(r"(\d+)\s*g[bi]?b?\b", " ", t)
    t = re.sub(r"sxm\d*|pcie", " ", t)
    family = re.sub(r"[^a-z0-9]", "", t)
    return family, int(mem.group(1)) if mem else None, form


def gpu_candidates(name: str) -> list[GpuSpec]:
    """Every catalog entry a GRES type or product name may stand for: 'a100' is A100-40GB or A100-80GB,
    'a100_40g' only the first, 't4' only T4; none where the family is unknown."""
    family, mem, form = _parts(name)
    hits = [spec for spec in catalog().values() if _parts(spec.name)[0] == family]
    if mem is not None:
        hits = [s for s in hits if _parts(s.name)[1] in (None, mem)] or hits
    if form is not None:
        hits = [s for s in hits if _parts(s.name)[2] in (None, form)] or hits
    return hits


def match_gpu(name: str) -> GpuSpec | None:
    """Catalog entry for a GRES type or product name ('a100', 'A100-SXM4-80GB', 'h100_sxm'), or None.

    A bare family name picks its largest-memory variant (SXM before PCIe): a suggestion for a typo, never
    a site file's value (`gpu_candidates` says whether the name pins one model down).
    """
    hits = gpu_candidates(name)
    return max(hits, key=lambda s: (s.memory_gib, _parts(s.name)[2] == "sxm")) if hits else None
