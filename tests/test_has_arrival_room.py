"""Room for arrivals (site arrival_room): HAS prices the jobs that arrive at a pool it leaves without a free GPU and
that Slurm then starts on a slower type."""

from __future__ import annotations

from dataclasses import replace

import pytest

from frenzy_slurm.has import pricing
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.view import PoolKey

from .helpers import LOCAL, fill, make_spec, plan

TRAINING = {"seq_len": 1024, "global_batch": 64, "steps": 1000, "precision": "bf16-mixed"}


def _half_busy_a100(jobs: int = 4):
    """a100-2 (4 GPUs) runs `jobs` jobs, each with a 21-min limit; a100-1's 4 GPUs are free."""
    view = fill(synthetic(LOCAL), "a100", {"a100-1": 4}, minutes=20)
    busy = next(j for j in view.jobs if j.nodes == ["a100-2"])
    split = [replace(busy, job_id=busy.job_id + i, gpus_per_node=4 // jobs) for i in range(jobs)]
    return view.model_copy(update={"jobs": [j for j in view.jobs if j is not busy] + split})


def test_a_job_leaves_a_free_gpu_where_jobs_arrive_and_would_find_none():
    spec = make_spec(limits__gpu_types=["a100", "t4"], training=TRAINING)
    view = _half_busy_a100()
    site = synthetic_site(LOCAL)
    assert site.arrival_room == 0.0  # off unless the site sets it
    assert plan(spec, view, site=site).chosen.label() == "4xA100-40GB(a100)"  # all 4 free GPUs
    d = plan(spec, view, site=site.model_copy(update={"arrival_room": 1.0}))
    # four jobs run there; an arrival finding no A100 free runs on a T4, which the catalog rates far slower: what
    # the arrivals lose is more than the 5 min the job gains on 4 GPUs
    assert d.chosen.label() == "2xA100-40GB(a100)" and d.chosen.start == view.taken_at
    four = next(a for a in d.alternatives if a.description == "4xA100-40GB(a100)")
    assert four.allocation.completion < d.chosen.completion
    assert "delays the jobs queued for and arriving at its GPUs" in four.lost_because


def test_one_job_running_there_does_not_outweigh_the_gain():
    """With one job running, half of its typical run for the arrivals beyond the free GPUs is less than what the
    fourth GPU gains: the job still takes the 4 free GPUs."""
    spec = make_spec(limits__gpu_types=["a100", "t4"], training=TRAINING)
    site = synthetic_site(LOCAL).model_copy(update={"arrival_room": 1.0})
    assert plan(spec, _half_busy_a100(jobs=1), site=site).chosen.label() == "4xA100-40GB(a100)"
    assert plan(spec, synthetic(LOCAL), site=site).chosen.label() == "4xA100-40GB(a100)"  # idle: none expected


def test_no_price_where_the_arrivals_would_wait_anyway():
    """No other pool the job may use has a free GPU (here: it may use only the a100s): an arrival waits for the
    next GPU to free whether or not this job takes the last ones, which the queue's price already counts."""
    spec = make_spec(limits__gpu_types=["a100"], training=TRAINING)
    site = synthetic_site(LOCAL).model_copy(update={"arrival_room": 1.0})
    assert plan(spec, _half_busy_a100(), site=site).chosen.label() == "4xA100-40GB(a100)"


def test_displaced_arrivals_priced_from_the_view():
    d = pricing.demand(_half_busy_a100(jobs=2))[PoolKey("a100", "a100_40gb")]
    limit = 21 * 60
    assert d.free == 4 and d.running == 2 and d.arrivals_per_s == pytest.approx(2 / limit)
    assert pricing.arrivals(d, 600) == pytest.approx(2 * 600 / limit)
    assert pricing.arrivals(d, 7200) == 2.0  # at most as many as run there now
    # taking all 4 free GPUs for 10 min: the arrivals expected meanwhile find none, each half a typical run late
    assert pricing.displaced_s(d, 4, 600) == pytest.approx(2 * 600 / limit * 0.5 * limit)
    # leaving one free: only the arrivals beyond it; leaving two: none
    assert pricing.displaced_s(d, 3, 7200) == pytest.approx((2 - 1) * 0.5 * limit)
    assert pricing.displaced_s(d, 2, 7200) == 0.0
    assert pricing.displaced_s(None, 4, 600) == 0.0 and pricing.displaced_s(d, 4, 0) == 0.0
