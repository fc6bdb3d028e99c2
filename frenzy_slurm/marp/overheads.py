"""Device memory that is not a training tensor: CUDA context, NCCL buffers, allocator fragmentation.

One model, shared by the site file (`pools[].overheads`, measured by the site admin on a compute node)
and MARP (which adds it to the predicted peak per metric); its defaults are written only here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.units import GiB

# The CUDA context when every kernel of the loaded libraries is loaded at initialisation: no lazy module loading
# (torch before 1.13, which set CUDA_MODULE_LOADING=LAZY when unset, or CUDA before 11.7; CUDA >= 12.2 loads lazily
# by default). Published nvidia-smi readings of such stacks are 1.2-1.4 GiB; lazy loading takes about 0.3-0.5 GiB.
EAGER_LOADING_CONTEXT_GIB = 1.3


class Overheads(BaseModel):
    """What the driver and the framework add on top of tensors, per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_gib: float = Field(
        0.5,
        ge=0,
        description="CUDA context and loaded kernels, GiB (lazy module loading, "
        "torch >= 2.0; measure with nvidia-smi on an idle process that touched the GPU).",
    )
    nccl_gib: float = Field(0.25, ge=0, description="NCCL communicator buffers, GiB, on multi-GPU jobs.")
    fragmentation: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Caching allocator's reserved/allocated excess over "
        "long-lived tensors (weights, optimizer states, kept gradients), as a fraction of "
        "their bytes: they are allocated once, in whole segments.",
    )
    step_fragmentation: float = Field(
        0.25,
        ge=0,
        le=1,
        description="Caching allocator's reserved/allocated excess "
        "over what each step allocates and frees (activations, logits, per-step "
        "gradients, casts and temporaries), as a fraction of those bytes at the peak.",
    )

    def device_bytes(self, world: int) -> float:
        """Bytes outside the caching allocator on one GPU of a job with `world` ranks."""
        return (self.context_gib + (self.nccl_gib if world > 1 else 0.0)) * GiB


def for_torch(version: tuple[int, int] | None) -> Overheads:
    """Overheads of a stack whose torch version is `version`; None (not stated) assumes the larger, eager-loading
    context, since under-predicting the context is an out-of-memory error on the GPU."""
    if version is not None and version >= (1, 13):
        return Overheads()
    return Overheads(context_gib=EAGER_LOADING_CONTEXT_GIB)
