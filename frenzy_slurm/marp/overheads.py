"""Device memory that is not a training tensor: CUDA context, NCCL buffers, allocator fragmentation.

One model, shared by the site file (`pools[].overheads`, measured by the site admin on a compute node)
and MARP (which adds it to the predicted peak per metric); its defaults are written only here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

GiB = float(1 << 30)


class Overheads(BaseModel):
    """What the driver and the framework add on top of tensors, per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_gib: float = Field(0.5, ge=0, description="CUDA context and loaded kernels, GiB (lazy module loading, "
                               "torch >= 2.0; measure with nvidia-smi on an idle process that touched the GPU).")
    nccl_gib: float = Field(0.25, ge=0, description="NCCL communicator buffers, GiB, on multi-GPU jobs.")
    fragmentation: float = Field(0.08, ge=0, le=1, description="Caching allocator's reserved/allocated excess, "
                                 "as a fraction of allocated bytes.")

    def device_bytes(self, world: int) -> float:
        """Bytes outside the caching allocator on one GPU of a job with `world` ranks."""
        return (self.context_gib + (self.nccl_gib if world > 1 else 0.0)) * GiB
