"""Distributed environment of one task inside the allocation, derived from Slurm's variables.

In a heterogeneous step (`srun --het-group=0,1`) SLURM_PROCID and SLURM_NTASKS are global across
components, SLURM_LOCALID is per node, and CUDA_VISIBLE_DEVICES lists the node's GPUs for the step
(SLURM_JOB_GPUS is inherited from group 0 and wrong elsewhere), so the task's GPU is
CUDA_VISIBLE_DEVICES[SLURM_LOCALID]. Ranks are in component order, which is pipeline-stage order.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    visible_gpus: tuple[str, ...]

    @property
    def gpu_index(self) -> str | None:
        """This task's physical GPU (index into the node's visible GPUs), or None without GPUs."""
        if not self.visible_gpus:
            return None
        return self.visible_gpus[self.local_rank % len(self.visible_gpus)]

    def export(self) -> None:
        """The variables torch.distributed / DeepSpeed read without a launcher."""
        os.environ.update(RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank),
                          MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))


def from_environ(env: dict[str, str] | None = None) -> DistEnv:
    e = os.environ if env is None else env
    if "SLURM_PROCID" in e:
        rank, world, local = int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e.get("SLURM_LOCALID", "0"))
    else:  # not under srun: a single process (or an explicit torchrun-style environment)
        rank, world, local = int(e.get("RANK", "0")), int(e.get("WORLD_SIZE", "1")), int(e.get("LOCAL_RANK", "0"))
    gpus = tuple(g for g in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip() not in ("", "NoDevFiles"))
    return DistEnv(rank=rank, world_size=world, local_rank=local, master_addr=e.get("MASTER_ADDR", "127.0.0.1"),
                   master_port=int(e.get("MASTER_PORT", "29500")),
                   visible_gpus=gpus)
