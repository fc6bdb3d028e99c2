"""DeepSpeed's shared-memory allreduce segments on the CPU: remove their names once every rank has them.

With DS_ACCELERATOR=cpu and LOCAL_SIZE equal to the world size (what DeepSpeed's own launcher sets on
one node), `deepspeed.init_distributed` creates one POSIX shared-memory segment per rank,
/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (about 64 MiB), maps every
peer's, and never unlinks any. /dev/shm is RAM: each finished run left 64 MiB per rank behind, and a day of
such runs filled the machine until the kernel killed processes. Each rank removes only its own name, after
a barrier (by then every peer has mapped it); the mappings stay valid until the processes exit, and the
name is gone even if a process is killed later.

The names are predictable (the uid, the rendezvous address and port, the rank), and DeepSpeed opens them
with O_CREAT but without O_EXCL: a segment another user made first under this name (world-writable) would
be used as is, and the job's buffers read and written by that user. So before DeepSpeed starts, each rank
makes its own segment itself (`claim_allreduce_segment`: O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600, in the sticky
/dev/shm no one else can then remove or replace it), removing a leftover of its own; a segment of someone
else's stops the job, with the name to report. Every rank claims its name before the rendezvous, which
every rank must reach before any maps a peer's, so the peers' names are the job's own too.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from frenzy_slurm.errors import FrenzyError

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"


def segment_path(rank: int, env: dict[str, str] | None = None) -> Path:
    """This rank's segment name, as DeepSpeed's shm_initialize forms it from the uid and MASTER_ADDR/PORT."""
    e = os.environ if env is None else env
    return SHM_DIR / f"{PREFIX}_{os.getuid()}_{e.get('MASTER_ADDR', '')}_{e.get('MASTER_PORT', '')}_{rank}"


def uses_shm_allreduce(world_size: int, env: dict[str, str] | None = None) -> bool:
    """Whether DeepSpeed's CPU communication will make shared-memory segments: only where LOCAL_SIZE says that
    every rank is on this node (DeepSpeed's own launcher sets it; Slurm and the runtime do not)."""
    e = os.environ if env is None else env
    return e.get("LOCAL_SIZE", "").strip() == str(world_size) and world_size >= 1


def claim_allreduce_segment(rank: int, env: dict[str, str] | None = None) -> Path:
    """Create this rank's segment name empty, O_EXCL and 0600, before DeepSpeed opens it; a leftover of this
    user's is removed first. Raises FrenzyError (the job stops) when the name is someone else's."""
    path = segment_path(rank, env)
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            st = os.lstat(path)
            if st.st_uid != os.geteuid() or not stat.S_ISREG(st.st_mode):
                raise FrenzyError(
                    f"{path}, DeepSpeed's shared-memory buffer for rank {rank}, already exists and is not this "
                    f"job's (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): it would read and write this "
                    "job's buffers. The job stops; report it to the cluster's administrators, or drop LOCAL_SIZE "
                    "from entry.env so that DeepSpeed does not use shared memory."
                ) from None
            path.unlink()  # ours, from an earlier run killed before it removed it
            continue
        os.fchmod(fd, 0o600)  # whatever the umask
        os.close(fd)
        return path
    raise FrenzyError(f"{path}: could not create DeepSpeed's shared-memory buffer for rank {rank} afresh.")


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
