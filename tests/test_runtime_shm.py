"""DeepSpeed's CPU shared-memory allreduce segments do not outlive a run (frenzy_slurm/runtime/shm.py)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from frenzy_slurm.runtime.shm import segment_path

from .helpers import deepspeed_rank_env


def test_segment_name_is_deepspeeds():
    env = {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29517"}
    assert segment_path(3, env) == Path(f"/dev/shm/deepspeed_allreduce_buffer_{os.getuid()}_10.1.2.3_29517_3")


def _rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(deepspeed_rank_env(rank, world, port))
    import deepspeed
    import torch

    from frenzy_slurm.runtime.shm import release_allreduce_segment

    deepspeed.init_distributed(dist_backend="gloo")
    existed = segment_path(rank).exists()
    removed = release_allreduce_segment(segment_path(rank))
    t = torch.full((4,), float(rank + 1))
    deepspeed.comm.all_reduce(t)  # the job goes on after the names are gone
    Path(out, f"{rank}").write_text(f"{existed} {removed} {t[0].item()}")
    # end as a training job does: both ranks done, then the process group down, which joins gloo's threads (a
    # process that exits with them running dies in std::terminate: "terminate called without an active exception")
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_a_two_rank_deepspeed_run_leaves_no_segment(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["True True 3.0"] * 2
    assert not any(segment_path(r, env).exists() for r in (0, 1))
