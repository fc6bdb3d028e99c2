"""Distributed environment of one task inside the allocation, derived from Slurm's variables.

In a heterogeneous step (`srun --het-group=0,1`) SLURM_PROCID and SLURM_NTASKS are global across
components, SLURM_LOCALID is per node, and CUDA_VISIBLE_DEVICES lists the node's GPUs for the step
(SLURM_JOB_GPUS is inherited from group 0 and wrong elsewhere), so the task's GPU is
CUDA_VISIBLE_DEVICES[SLURM_LOCALID]. Ranks are in component order, which is pipeline-stage order.

MASTER_PORT is chosen by the job script on the first node, `python -P -m frenzy_slurm.runtime.dist free-port`:
a port nobody listens on there, below the kernel's ephemeral range (where outgoing connections take their
ports, so a port free now could be taken by one before rank 0 listens). A port derived from the job id
(`20000 + id % 20000`, as before) collided with co-tenants' servers and with the ephemeral range.
"""

from __future__ import annotations

import os
import random
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

PORT_FLOOR = 20000  # the lowest rendezvous port tried; below are well-known and registered services


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
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK=str(self.local_rank),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
        )


def from_environ(env: dict[str, str] | None = None) -> DistEnv:
    e = os.environ if env is None else env
    if "SLURM_PROCID" in e:
        rank, world, local = int(e["SLURM_PROCID"]), int(e["SLURM_NTASKS"]), int(e.get("SLURM_LOCALID", "0"))
    else:  # not under srun: a single process (or an explicit torchrun-style environment)
        rank, world, local = int(e.get("RANK", "0")), int(e.get("WORLD_SIZE", "1")), int(e.get("LOCAL_RANK", "0"))
    gpus = tuple(g for g in e.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip() not in ("", "NoDevFiles"))
    return DistEnv(
        rank=rank,
        world_size=world,
        local_rank=local,
        master_addr=e.get("MASTER_ADDR", "127.0.0.1"),
        master_port=int(e.get("MASTER_PORT", "29500")),
        visible_gpus=gpus,
    )


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where unreadable)."""
    try:
        low, high = (int(v) for v in path.read_text().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _free(port: int) -> bool:
    """Nobody on this node listens on (or holds) `port`, on IPv4 or IPv6."""
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((addr, port))
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (97, 99):  # no IPv6 on this node: IPv4 decides
                continue
            return False
    return True


def free_port(tries: int = 200, rng: random.Random | None = None) -> int:
    """A port free on this node for the rendezvous: random between PORT_FLOOR and the ephemeral range, else one
    the kernel hands out (bind to 0)."""
    low, _ = ephemeral_range()
    pick = rng or random.SystemRandom()
    if low - 1 > PORT_FLOOR:
        for _ in range(tries):
            port = pick.randint(PORT_FLOOR, low - 1)
            if _free(port):
                return port
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


if __name__ == "__main__":  # python -P -m frenzy_slurm.runtime.dist free-port (the job script, on the first node)
    if sys.argv[1:] != ["free-port"]:
        sys.exit("usage: python -P -m frenzy_slurm.runtime.dist free-port")
    print(free_port())
