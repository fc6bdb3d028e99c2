"""A release index made that of a view whose pending queue changed in the middle (a job left it, another joined
ahead of some): only the groups of partitions whose queue changed are reserved again (`ReleaseIndex.extend`,
`_refit`), and the answer is the index a new build gives. The watcher decides each of a user's pending jobs on
the view without it, one after another, so this is its pass's common case (issue 30)."""

from __future__ import annotations

import dataclasses
import random

from frenzy_slurm.has.moves import without_job
from frenzy_slurm.sim.synthetic import synthetic, with_queue
from frenzy_slurm.slurm.releases import ReleaseIndex
from frenzy_slurm.slurm.view import ClusterView

POOLS = [("a100", "A100-80GB", 4, 8), ("v100", "V100-32GB", 6, 8), ("t4", "T4", 6, 4)]


def _with_queue(view: ClusterView, pending: int, seed: int, multi: bool = False) -> ClusterView:
    out = with_queue(view, POOLS, pending, seed)
    if multi:  # the first pending job may run in two partitions (sbatch -p a100,v100)
        jobs = list(out.jobs)
        j = next(j for j in jobs if j.state == "PENDING")
        jobs[jobs.index(j)] = dataclasses.replace(j, partition="a100,v100")
        out = out.model_copy(update={"jobs": jobs})
    return out


def _same(a: ReleaseIndex, b: ReleaseIndex) -> None:
    assert a.timeline.busy == b.timeline.busy
    assert (a.queued, a.reserved, a._first_reservation) == (b.queued, b.reserved, b._first_reservation)
    for partition, gpu, _, per_node in POOLS:
        gres = gpu.lower().replace("-", "_")
        for nodes in (1, 2, 3):
            for g in {1, per_node}:
                for duration in (600.0, 3600.0, 86400.0):
                    assert a.window(partition, gres, nodes, g, duration) == b.window(
                        partition, gres, nodes, g, duration
                    )


def test_an_index_without_one_pending_job_after_another_equals_a_new_one():
    view = _with_queue(synthetic(POOLS, busy=0.7, seed=3), 40, seed=3)
    index = ReleaseIndex(view, view.taken_at)
    pending = [j.job_id for j in view.jobs if j.state == "PENDING"]
    rng = random.Random(3)
    for job_id in rng.sample(pending, 12) + [pending[0], pending[-1]]:
        smaller = without_job(view, job_id)
        assert index.extend(smaller, view.taken_at)
        _same(index, ReleaseIndex(smaller, view.taken_at))
    assert index.extend(view, view.taken_at)  # the whole queue again
    _same(index, ReleaseIndex(view, view.taken_at))


def test_a_job_joining_the_queue_ahead_of_others_is_refitted_too():
    view = _with_queue(synthetic(POOLS, busy=0.6, seed=4), 30, seed=4)
    pending = sorted((j for j in view.jobs if j.state == "PENDING"), key=lambda j: j.job_id)
    early = dataclasses.replace(pending[5], job_id=pending[4].job_id + 0)  # a copy of job 5 at job 4's place
    without4 = view.model_copy(update={"jobs": [j for j in view.jobs if j.job_id != pending[4].job_id]})
    index = ReleaseIndex(without4, view.taken_at)
    joined = without4.model_copy(update={"jobs": [*without4.jobs, early]})
    assert index.extend(joined, view.taken_at)
    _same(index, ReleaseIndex(joined, view.taken_at))


def test_a_job_of_several_partition_groups_makes_a_new_index():
    view = _with_queue(synthetic(POOLS, busy=0.7, seed=5), 30, seed=5, multi=True)
    index = ReleaseIndex(view, view.taken_at)
    last = max(j.job_id for j in view.jobs if j.state == "PENDING")
    assert not index.extend(without_job(view, last - 3), view.taken_at)  # the a100,v100 job spans two groups


def test_a_later_now_is_not_refitted():
    view = _with_queue(synthetic(POOLS, busy=0.7, seed=6), 20, seed=6)
    index = ReleaseIndex(view, view.taken_at)
    first = min(j.job_id for j in view.jobs if j.state == "PENDING")
    assert not index.extend(without_job(view, first), view.taken_at + 60.0)
