"""DeepSpeed's shared-memory allreduce segments on the CPU: remove their names once every rank has them.

With DS_ACCELERATOR=cpu and LOCAL_SIZE equal to the world size (what DeepSpeed's own launcher sets on
one node), `deepspeed.init_distributed` creates one POSIX shared-memory segment per rank,
/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (about 64 MiB), maps every
peer's, and never unlinks any. /dev/shm is RAM: each finished run left 64 MiB per rank behind, and a day of
such runs filled the machine until the kernel killed processes. Each rank removes only its own name, after
a barrier (by then every peer has mapped it); the mappings stay valid until the processes exit, and the
name is gone even if a process is killed later.
"""

from __future__ import annotations

import os
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def segment_path(rank: int, env: dict[str, str] | None = None) -> Path:
    """This rank's segment name, as DeepSpeed's shm_initialize forms it from the uid and MASTER_ADDR/PORT."""
    e = os.environ if env is None else env
    return SHM_DIR / f"{PREFIX}_{os.getuid()}_{e.get('MASTER_ADDR', '')}_{e.get('MASTER_PORT', '')}_{rank}"


def release_allreduce_segment(rank: int) -> bool:
    """Barrier, then unlink this rank's segment. Call after `deepspeed.init_distributed` on every rank (the
    barrier is a collective). Returns whether there was a segment to remove."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
    try:
        segment_path(rank).unlink()
    except FileNotFoundError:
        return False
    return True
