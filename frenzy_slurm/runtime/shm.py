"""DeepSpeed's shared-memory allreduce segments on the CPU: names no one else can guess, made by the job first.

With DS_ACCELERATOR=cpu and LOCAL_SIZE equal to the world size (what DeepSpeed's own launcher sets on one node),
DeepSpeed's shm_initialize (ops/csrc/cpu/comm/shm.cpp) creates one POSIX shared-memory segment per rank,
/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank> (about 64 MiB), reading
MASTER_ADDR and MASTER_PORT from the environment when DeepSpeed's comm starts (after the rendezvous), opens it
with O_CREAT but without O_EXCL, maps every peer's, and never unlinks any.

- Predictable names were a denial of service and worse: another user made one empty world-writable file per
  possible port and rank (25,536 files), and every shared-memory job of the victim on the node failed (or, had
  the job used such a file, that user read and wrote its buffers). So the runtime starts the process group
  itself, rank 0 draws a random token (64 bits from `secrets`) and sends it to every rank over the group, and
  DeepSpeed's comm is started with MASTER_PORT set to `<port>-<token>` for that moment only: the names carry
  the token, which no one outside the job sees.
- Each rank makes its name first, O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600 (in the sticky /dev/shm no one else
  can then remove or replace it), before DeepSpeed opens it. A name that exists already (a collision, or a
  guess) is never used: every rank reports, and if any name was taken a new token is drawn; after
  `TRIES` draws the job goes on without shared memory (LOCAL_SIZE dropped: DeepSpeed then reduces over gloo),
  with a note, instead of failing.
- /dev/shm is RAM: each finished run left 64 MiB per rank behind, and a day of such runs filled the machine
  until the kernel killed processes. Each rank removes its own name after a barrier (by then every peer has
  mapped it); the mappings stay valid until the processes exit, and the name is gone even if a process is
  killed later.
"""

from __future__ import annotations

import os
import secrets
import sys
from collections.abc import Callable
from pathlib import Path

SHM_DIR = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer"
TRIES = 3  # tokens drawn before the job goes on without shared memory (one taken by chance is ~2^-64)


def segment_path(rank: int, env: dict[str, str] | None = None) -> Path:
    """This rank's segment name, as DeepSpeed's shm_initialize forms it from the uid and MASTER_ADDR/PORT."""
    e = os.environ if env is None else env
    return SHM_DIR / f"{PREFIX}_{os.getuid()}_{e.get('MASTER_ADDR', '')}_{e.get('MASTER_PORT', '')}_{rank}"


def uses_shm_allreduce(world_size: int, env: dict[str, str] | None = None) -> bool:
    """Whether DeepSpeed's CPU communication will make shared-memory segments: only where LOCAL_SIZE says that
    every rank is on this node (DeepSpeed's own launcher sets it; Slurm and the runtime do not)."""
    e = os.environ if env is None else env
    return e.get("LOCAL_SIZE", "").strip() == str(world_size) and world_size >= 1


def claim_allreduce_segment(rank: int, env: dict[str, str] | None = None) -> Path | None:
    """Create this rank's segment name empty, O_EXCL and 0600, before DeepSpeed opens it; None where the name
    exists already (whoever made it: it is left alone and never used)."""
    path = segment_path(rank, env)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return None
    os.fchmod(fd, 0o600)  # whatever the umask
    os.close(fd)
    return path


def agree_on_token(rank: int, world_size: int, tries: int = TRIES, draw: Callable[[], str] | None = None) -> str | None:
    """A token every rank could claim its segment name with (the names are claimed), or None after `tries`
    draws with a name taken. A collective: every rank of the started process group calls it."""
    import torch.distributed as td

    port = os.environ.get("MASTER_PORT", "")
    for _ in range(tries):
        said = [(draw or (lambda: secrets.token_hex(8)))() if rank == 0 else None]
        td.broadcast_object_list(said, src=0)
        env = dict(os.environ, MASTER_PORT=f"{port}-{said[0]}")
        path = claim_allreduce_segment(rank, env)
        claimed: list[object] = [None] * world_size
        td.all_gather_object(claimed, path is not None)
        if all(claimed):
            return str(said[0])
        if path is not None:
            path.unlink()  # ours, but a peer's name is taken: all ranks draw again
    return None


def start_deepspeed_comm(rank: int, world_size: int, start: Callable[[], None]) -> Path | None:
    """Start torch.distributed (gloo, from the environment) unless started, agree on private segment names, then
    call `start` (deepspeed.init_distributed) with MASTER_PORT carrying the token, and release this rank's name.
    Returns the name DeepSpeed used, or None where the job goes on without shared memory."""
    import torch.distributed as td

    if not td.is_initialized():
        td.init_process_group("gloo")  # before DeepSpeed's comm: the token travels over it
    token = agree_on_token(rank, world_size)
    port = os.environ["MASTER_PORT"]
    if token is None:
        os.environ.pop("LOCAL_SIZE", None)  # DeepSpeed then reduces over gloo, without segments
        if rank == 0:
            print(
                f"frenzy-slurm: every shared-memory name drawn in {SHM_DIR} was taken ({TRIES} tries): "
                "DeepSpeed communicates without shared memory (slower on one node); report it to the cluster's "
                "administrators",
                file=sys.stderr,
                flush=True,
            )
        start()
        return None
    os.environ["MASTER_PORT"] = f"{port}-{token}"
    try:
        start()  # DeepSpeed reads MASTER_ADDR/MASTER_PORT for the names now, and only now
        path = segment_path(rank)
    finally:
        os.environ["MASTER_PORT"] = port
    release_allreduce_segment(path)
    return path


def release_allreduce_segment(path: Path) -> bool:
    """Barrier, then unlink this rank's segment. Call after DeepSpeed's comm started, on every rank (the barrier
    is a collective). Returns whether there was a segment to remove."""
    import torch.distributed as td

    if td.is_available() and td.is_initialized() and td.get_world_size() > 1:
        td.barrier()
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    return True
