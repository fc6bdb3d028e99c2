"""Device memory that is not a training tensor: CUDA context, NCCL buffers, cuBLAS workspaces, and what the caching
allocator reserves beyond its model (`allocator.py`).

One model, shared by the site file (`pools[].overheads`, measured by the site admin on a compute node)
and MARP (which adds it to the predicted peak per metric); its defaults are written only here.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.allocator import CUBLAS_HANDLES_PER_STEP, CUBLAS_WORKSPACE_HOPPER_MIB, MiB

# The CUDA context when every kernel of the loaded libraries is loaded at initialisation: no lazy module loading
# (torch before 1.13, which set CUDA_MODULE_LOADING=LAZY when unset, or CUDA before 11.7; CUDA >= 12.2 loads lazily
# by default). Published nvidia-smi readings of such stacks are 1.2-1.4 GiB; lazy loading takes about 0.3-0.5 GiB:
# kernels are loaded on first launch, so a training process's context grows over its first step and then stays.
EAGER_LOADING_CONTEXT_GIB = 1.3
LAZY_LOADING_CONTEXT_GIB = 0.5

# NCCL's buffers, allocated by NCCL itself (cudaMalloc / cuMem, not torch's allocator: in nvidia-smi's figure, not in
# reserved): per channel and per connected peer, one buffer per protocol - Simple (NCCL_BUFFSIZE, 4 MiB by
# default), LL128 (about the same) and LL (a few hundred KiB). Ring and tree connect each channel to about two
# peers; NVLink/InfiniBand-class links run 16 channels or more (NCCL_MIN_NCHANNELS/NCCL_MAX_NCHANNELS bound them).
# nccl = channels x peers x (Simple + LL128) = 16 x 2 x (4 + 4) MiB = 256 MiB for one communicator.
NCCL_BUFFSIZE_MIB = 4.0
NCCL_PROTOCOL_BUFFERS = 2  # Simple + LL128 (LL's is small)
NCCL_CHANNELS = 16
NCCL_PEERS_PER_CHANNEL = 2
NCCL_DEFAULT_GIB = NCCL_CHANNELS * NCCL_PEERS_PER_CHANNEL * NCCL_PROTOCOL_BUFFERS * NCCL_BUFFSIZE_MIB * MiB / GiB
# No GPU holds 1 TiB (a B200 has 180 GiB): a per-GPU overhead past it is a typo, and an infinite one (`1e999`,
# which YAML reads as a string and pydantic as inf) would silently drop its pool from every plan.
MAX_OVERHEAD_GIB = 1024.0


class Overheads(BaseModel):
    """What the driver and the framework add on top of tensors, per GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    context_gib: float = Field(
        LAZY_LOADING_CONTEXT_GIB,
        ge=0,
        le=MAX_OVERHEAD_GIB,
        json_schema_extra={"unit": "GiB"},
        description="CUDA context and loaded kernels, GiB, of a job that loads CUDA modules lazily (torch >= 1.13, "
        "the default; measure with nvidia-smi on a process after its first training step).",
    )
    eager_context_gib: float = Field(
        EAGER_LOADING_CONTEXT_GIB,
        ge=0,
        le=MAX_OVERHEAD_GIB,
        json_schema_extra={"unit": "GiB"},
        description="CUDA context of a job that loads every kernel at start, GiB: model.yaml's entry.torch_version "
        "before 1.13, or entry.env CUDA_MODULE_LOADING: EAGER (measure as context_gib, with that variable set).",
    )
    nccl_gib: float = Field(
        NCCL_DEFAULT_GIB,
        ge=0,
        le=MAX_OVERHEAD_GIB,
        json_schema_extra={"unit": "GiB"},
        description="NCCL communicator buffers, GiB, on multi-GPU jobs (default: 16 channels x 2 peers x "
        "(Simple + LL128) x NCCL_BUFFSIZE 4 MiB).",
    )
    cublas_workspace_mib: float = Field(
        CUBLAS_HANDLES_PER_STEP * CUBLAS_WORKSPACE_HOPPER_MIB,
        ge=0,
        le=MAX_OVERHEAD_GIB * 1024,
        json_schema_extra={"unit": "MiB"},
        description="cuBLAS workspaces torch allocates through its caching allocator, MiB: 2 (forward and "
        "backward thread) x 32 MiB on Hopper; 2 x 8.125 MiB on earlier GPUs (CUBLAS_WORKSPACE_CONFIG unset).",
    )
    fragmentation: float = Field(
        0.0,
        ge=0,
        le=1,
        json_schema_extra={"unit": "(a fraction)"},
        description="Caching allocator's reserved/allocated excess over long-lived tensors (weights, optimizer "
        "states, kept gradients) beyond the allocator model's segment packing, as a fraction of their bytes "
        "(measured: reserved minus MARP's reserved, over the long-lived bytes).",
    )
    step_fragmentation: float = Field(
        0.25,
        ge=0,
        le=1,
        json_schema_extra={"unit": "(a fraction)"},
        description="Caching allocator's reserved/allocated excess "
        "over what each step allocates and frees (activations, logits, per-step "
        "gradients, casts and temporaries), as a fraction of those bytes at the peak: freed blocks "
        "the next phase's requests cannot reuse. Not counted with expandable_segments.",
    )

    def device_bytes(self, world: int) -> float:
        """Fixed bytes per GPU of a job with `world` ranks, beside the tensors: the CUDA context and NCCL's buffers
        (outside the caching allocator) and the cuBLAS workspaces (inside it, in max_memory_reserved; counted here
        so that the pool's measured overheads carry every fixed per-GPU term, and a CPU pool can set them to 0)."""
        return self.driver_bytes(world) + self.cublas_workspace_mib * MiB

    def driver_bytes(self, world: int) -> float:
        """The fixed bytes per GPU outside any framework's allocations: the CUDA context and, with `world` > 1,
        NCCL's buffers (a program that brings its own cuBLAS workspace, llm.c, counts that among its buffers)."""
        return (self.context_gib + (self.nccl_gib if world > 1 else 0.0)) * GiB

    def for_module_loading(self, eager: bool) -> Overheads:
        """These overheads for a job that loads CUDA modules eagerly (`eager`: the larger context) or lazily."""
        return self.model_copy(update={"context_gib": self.eager_context_gib}) if eager else self
