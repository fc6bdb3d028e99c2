"""DeepSpeed's shared-memory segments get names no one else can guess, and a taken name never fails the job.

The audit's denial of service: another user made one empty world-writable file in /dev/shm per possible rendezvous
port and rank, under the name DeepSpeed's CPU allreduce forms (uid, MASTER_ADDR, MASTER_PORT, rank), and every
shared-memory job of the victim on that node failed. Here the attacker plants the names of the job's own port
(the rest of the 25,536 files would change nothing), then the job trains.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.runtime.dist import free_port
from frenzy_slurm.runtime.shm import PREFIX, SHM_DIR, segment_path

from .helpers import ROOT, deepspeed_rank_env
from .users import as_user

pytestmark = pytest.mark.slow
pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")


def _plant(user, paths: list[Path]) -> None:
    """Create each path empty and world-writable as `user`, as the attacker did."""
    code = (
        "import os, sys\n"
        "for p in sys.argv[1:]:\n"
        "    os.close(os.open(p, os.O_CREAT | os.O_RDWR, 0o666)); os.chmod(p, 0o666)\n"
    )
    res = as_user(user, [sys.executable, "-c", code, *map(str, paths)], cwd=Path("/"))
    assert res.returncode == 0, res.stderr
    assert all(os.stat(p).st_uid == user.uid for p in paths)


def _ours(port: int) -> list[Path]:
    return sorted(SHM_DIR.glob(f"{PREFIX}_{os.getuid()}_127.0.0.1_{port}-*"))


def test_a_job_trains_beside_segments_planted_under_its_predictable_names(tmp_path, other_user):
    from .test_runtime_moved_resume import _job_dir

    port = free_port()
    planted = [segment_path(r, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}) for r in range(2)]
    _plant(other_user, planted)
    job = _job_dir(tmp_path / "job", 2, ParallelPlan(dp=2, zero=0, micro_batch=2, grad_accum=2))
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job)],
                cwd=job,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                env={
                    **{k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FRENZY_"))},
                    **deepspeed_rank_env(r, 2, port),
                    "PYTHONPATH": str(ROOT),
                },
            )
            for r in range(2)
        ]
        outs = [p.communicate(timeout=600)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
        assert json.loads((job / "metrics.json").read_text())["step"] == 2
        # planted files left to their owner, untouched; the job's own names (with their token) are gone
        assert all(os.stat(p).st_uid == other_user.uid and os.stat(p).st_size == 0 for p in planted)
        assert _ours(port) == []
    finally:
        for p in planted:
            p.unlink(missing_ok=True)


def _rank(rank: int, world: int, port: int, out: str) -> None:
    """Token agreement around taken names, then DeepSpeed's comm with every drawn name taken."""
    os.environ.update(deepspeed_rank_env(rank, world, port))
    import deepspeed
    import torch
    import torch.distributed as td

    from frenzy_slurm.runtime import shm

    td.init_process_group("gloo")
    taken = json.loads(Path(out, "taken.json").read_text())
    draws = iter(["t1", "t2"])
    token = shm.agree_on_token(rank, world, draw=lambda: next(draws))
    mine = segment_path(rank, dict(os.environ, MASTER_PORT=f"{port}-{token}"))
    st = os.lstat(mine)
    mine.unlink()
    td.barrier()
    shm.secrets.token_hex = lambda _n: "t3"  # type: ignore[attr-defined]  # every later draw: a taken name
    used = shm.start_deepspeed_comm(rank, world, lambda: deepspeed.init_distributed(dist_backend="gloo"))
    t = torch.full((4,), float(rank + 1))
    deepspeed.comm.all_reduce(t)
    Path(out, str(rank)).write_text(
        f"{token} {stat.S_IMODE(st.st_mode):o} {used} {os.environ.get('LOCAL_SIZE')} {t[0].item()} {len(taken)}"
    )
    from frenzy_slurm.runtime.ending import close_process_group

    close_process_group(barrier=True)


def test_a_taken_name_draws_another_and_all_taken_goes_on_without_shm(tmp_path, other_user):
    import torch.multiprocessing as mp

    port = free_port()
    # t1 is taken for rank 1 only: every rank draws again; t3 (every later draw) is taken for rank 0
    taken = [segment_path(1, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": f"{port}-t1"})]
    taken += [segment_path(0, {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": f"{port}-t3"})]
    _plant(other_user, taken)
    (tmp_path / "taken.json").write_text(json.dumps([str(p) for p in taken]))
    try:
        mp.spawn(_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
        assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["t2 600 None None 3.0 2"] * 2
        assert all(os.stat(p).st_uid == other_user.uid for p in taken)
        assert _ours(port) == sorted(taken)  # the job's own names are gone, the planted ones kept
    finally:
        for p in taken:
            p.unlink(missing_ok=True)
