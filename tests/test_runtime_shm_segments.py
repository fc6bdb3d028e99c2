"""DeepSpeed's shared-memory allreduce segments are the job's own: each rank creates its segment private and
exclusive, never reuses an existing name or one another user planted, and DeepSpeed runs on the segments the
ranks claimed (shared memory only where the local size says so)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from .helpers import deepspeed_rank_env

# --- DeepSpeed's shared-memory segments are the job's own --------------------------------------------------


@pytest.fixture
def shm_env():
    import random

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(random.randint(40000, 60000))}
    from frenzy_slurm.runtime.shm import segment_path

    yield env
    for rank in range(2):
        segment_path(rank, env).unlink(missing_ok=True)


def test_segment_is_created_private_and_exclusive(shm_env):
    from frenzy_slurm.runtime.shm import claim_allreduce_segment

    path = claim_allreduce_segment(0, shm_env)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_an_existing_segment_name_is_never_reused(shm_env):
    """Names carry a random token now (runtime/shm.py): a name that exists is a collision, left alone."""
    from frenzy_slurm.runtime.shm import claim_allreduce_segment, segment_path

    old = segment_path(1, shm_env)
    old.write_bytes(b"old run")
    assert claim_allreduce_segment(1, shm_env) is None and old.read_bytes() == b"old run"


def test_a_segment_planted_by_another_user_is_never_used(shm_env, other_user):
    """The audit's attack: a world-writable segment made first under the job's name. It is not used (the job
    draws another name, test_runtime_shm_private_names.py) and left to its owner, never written."""
    import sys

    from frenzy_slurm.runtime.shm import claim_allreduce_segment, segment_path

    from .users import as_user

    planted = segment_path(0, shm_env)
    code = (
        f"import os; os.close(os.open({str(planted)!r}, os.O_CREAT | os.O_RDWR, 0o666)); "
        f"os.chmod({str(planted)!r}, 0o666)"
    )
    res = as_user(other_user, [sys.executable, "-c", code], cwd=Path("/"))
    assert res.returncode == 0, res.stderr
    assert os.stat(planted).st_uid == other_user.uid
    assert claim_allreduce_segment(0, shm_env) is None
    assert os.stat(planted).st_uid == other_user.uid and os.stat(planted).st_size == 0


def test_shm_is_used_only_where_local_size_says_so():
    from frenzy_slurm.runtime.shm import uses_shm_allreduce

    assert (
        uses_shm_allreduce(2, {"LOCAL_SIZE": "2"})
        and not uses_shm_allreduce(2, {})
        and not uses_shm_allreduce(4, {"LOCAL_SIZE": "2"})
    )


def _claiming_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(deepspeed_rank_env(rank, world, port))
    import deepspeed
    import torch

    from frenzy_slurm.runtime.shm import segment_path, start_deepspeed_comm

    seen = {}

    def start() -> None:  # as the trainer does: the names claimed, DeepSpeed's comm started on them
        deepspeed.init_distributed(dist_backend="gloo")
        seen["st"] = os.stat(segment_path(rank))

    used = start_deepspeed_comm(rank, world, start)
    st = seen["st"]
    assert used is not None and not used.exists()
    t = torch.full((4,), float(rank + 1))
    deepspeed.comm.all_reduce(t)
    Path(out, f"{rank}").write_text(f"{stat.S_IMODE(st.st_mode):o} {st.st_size > 0} {t[0].item()}")
    torch.distributed.barrier()  # then the group down, joining gloo's threads (else the exit may abort)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_runs_on_segments_the_ranks_claimed(tmp_path):
    """DeepSpeed opens (O_CREAT without O_EXCL) and fills the empty 0600 segments the ranks made first."""
    pytest.importorskip("deepspeed")
    import torch.multiprocessing as mp

    from frenzy_slurm.runtime.dist import free_port
    from frenzy_slurm.runtime.shm import segment_path

    port = free_port()
    mp.spawn(_claiming_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["600 True 3.0"] * 2
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    assert not any(segment_path(r, env).exists() for r in (0, 1))
