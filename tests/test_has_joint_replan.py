"""Joint re-planning of waiting jobs (frenzy_slurm/has/replan.py) on constructed cases with known answers.

Each job waits as option 0; the assignment may move it to another of its options only where that pays by more
than the margin, and the options chosen to start now must fit the GPUs free in their pool together."""

from __future__ import annotations

import pytest

import frenzy_slurm.has.replan as replan
from frenzy_slurm.has.replan import Margin, Option, PendingJob, assign, free_gpus
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.view import PoolKey

from .helpers import LOCAL

NOW = 1.0e9
H = 3600.0


def _opt(partition: str, nodes: int, per_node: int, hours: float, now: bool) -> Option:
    return Option(partition, partition, nodes, per_node, NOW + hours * H, now)


def _two_jobs_one_free_pool() -> list[PendingJob]:
    """Both jobs wait 10 h on the T4s; 8 A100s are free now. Job 1 gains 6 h there, job 2 gains 8 h: only one
    fits, and the joint answer gives it to job 2 although job 1 is first in the queue."""
    return [
        PendingJob(1, (_opt("t4", 2, 4, 10, False), _opt("a100", 2, 4, 4, True))),
        PendingJob(2, (_opt("t4", 2, 4, 10, False), _opt("a100", 2, 4, 2, True))),
    ]


def test_the_ilp_gives_free_gpus_to_the_job_that_gains_most():
    pytest.importorskip("scipy")
    assert assign(_two_jobs_one_free_pool(), {PoolKey("a100", "a100"): 8}, NOW) == {2: 1}


def test_without_scipy_the_greedy_pass_serves_the_queue_in_order(monkeypatch):
    def no_scipy(*a, **k):
        raise ImportError("scipy")

    monkeypatch.setattr(replan, "_milp", no_scipy)
    assert assign(_two_jobs_one_free_pool(), {PoolKey("a100", "a100"): 8}, NOW) == {1: 1}


@pytest.mark.parametrize("free", [16, 4])
def test_both_move_where_both_fit_and_neither_where_neither_fits(free):
    pytest.importorskip("scipy")
    got = assign(_two_jobs_one_free_pool(), {PoolKey("a100", "a100"): free}, NOW)
    assert got == ({1: 1, 2: 1} if free == 16 else {})


def test_a_change_within_the_margin_is_not_made():
    """10 h left, 0.5 h sooner elsewhere: below 10% of the remaining time; 2 h sooner pays."""
    small = [PendingJob(1, (_opt("t4", 1, 4, 10, False), _opt("v100", 1, 4, 9.5, False)))]
    assert assign(small, {}, NOW) == {}
    assert assign(small, {}, NOW, Margin(seconds=600, fraction=0.01)) == {1: 1}
    big = [PendingJob(1, (_opt("t4", 1, 4, 10, False), _opt("v100", 1, 4, 8, False)))]
    assert assign(big, {}, NOW) == {1: 1}


def test_a_job_whose_current_shape_takes_free_gpus_keeps_them_from_the_jobs_after_it():
    """Job 1 starts now where it waits (4 of the 4 free A100s); job 2 could only start there too."""
    jobs = [
        PendingJob(1, (_opt("a100", 1, 4, 3, True), _opt("t4", 1, 4, 9, False))),
        PendingJob(2, (_opt("t4", 1, 4, 10, False), _opt("a100", 1, 4, 2, True))),
    ]
    for solver in ("milp", "greedy"):
        free = {PoolKey("a100", "a100"): 4}
        if solver == "greedy":
            got = replan._greedy(jobs, {1: [0], 2: [0, 1]}, free)
            assert got == {1: 0, 2: 0}
        else:
            pytest.importorskip("scipy")
            # jointly, job 1 going to the T4s (6 h later) for job 2 (8 h sooner) pays: 2 h less in all, but job 1's
            # T4 option is no gain for job 1, so it is never offered and both stay
            assert assign(jobs, free, NOW) == {}


def test_free_gpus_are_counted_per_pool():
    view = synthetic(LOCAL)
    free = free_gpus(view)
    assert free[PoolKey("a100", "a100_40gb")] == 8
    assert free[PoolKey("v100", "v100_32gb")] == 16
    assert free[PoolKey("t4", "t4")] == 16
