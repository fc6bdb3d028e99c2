"""Every rank stops at the same step boundary (`runtime.trainer.agreed_stop`): Slurm signals each task by itself,
so at a boundary one rank may have the signal and another not yet; a rank that stopped to save alone would wait for
the others in the save's barrier while they ran on into the next step's pipeline sends, until SIGKILL. Two real
gloo ranks, torch's own process group."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frenzy_slurm.runtime.dist import free_port

from .helpers import deepspeed_rank_env

pytest.importorskip("torch")


def _rank(rank: int, world: int, port: int, out: str, seen: list[str | None]) -> None:
    os.environ.update(deepspeed_rank_env(rank, world, port))
    import torch
    import torch.distributed as td

    from frenzy_slurm.runtime import trainer

    td.init_process_group("gloo")
    answers = []
    # boundary 1: nobody has a signal; 2: only the given rank has one; 3: every rank keeps what was agreed
    for step, signal in enumerate([None, seen[rank], None], start=1):
        if signal is not None:
            trainer._stop["signal"] = signal
        answers.append(f"{step}:{trainer.agreed_stop(torch.device('cpu'), world)}:{trainer._stop['signal']}")
    Path(out, str(rank)).write_text(" ".join(answers))
    td.barrier()
    td.destroy_process_group()


@pytest.mark.parametrize(
    ("seen", "want"),
    [
        # only rank 1 got the preemption's SIGTERM by boundary 2: both stop there, and rank 0 (which requeues the
        # job) records it as its own
        ([None, "SIGTERM"], "1:None:None 2:SIGTERM:SIGTERM 3:SIGTERM:SIGTERM"),
        # one rank has the time-limit warning, the other a SIGTERM: the warning wins (checkpoint and requeue)
        (["SIGTERM", "SIGUSR2"], "1:None:None 2:SIGUSR2:SIGUSR2 3:SIGUSR2:SIGUSR2"),
    ],
)
def test_ranks_agree_on_a_stop_signal_only_some_of_them_received(tmp_path, seen, want):
    import torch.multiprocessing as mp

    mp.spawn(_rank, args=(2, free_port(), str(tmp_path), seen), nprocs=2, join=True)
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == [want, want]


def test_one_rank_asks_nobody(monkeypatch):
    import torch

    from frenzy_slurm.runtime import trainer

    monkeypatch.setitem(trainer._stop, "signal", "SIGUSR2")
    assert trainer.agreed_stop(torch.device("cpu"), 1) == "SIGUSR2"
