"""max_job_share counts the room that pools at least as fast leave free (has/decide.py, `share_caps`): on a few
one-node pools a long job that scales well may take a whole pool where another pool as fast keeps room for the
jobs that arrive meanwhile (docs/has.md, "One-node pools")."""

from __future__ import annotations

import importlib

import pytest

from frenzy_slurm.has import Requirements
from frenzy_slurm.has.pools import usable_pools
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.job import Job

from .helpers import fill, make_spec, plan

# two one-node pools of the same type (two partitions) and one of a slower type
TWINS = [("h100a", "H100-SXM", 1, 8), ("h100b", "H100-SXM", 1, 8), ("v100", "V100-32GB", 1, 8)]
has_decide = importlib.import_module("frenzy_slurm.has.decide")  # the module (frenzy_slurm.has.decide is the function)
LONG = {"seq_len": 1024, "global_batch": 64, "steps": 20000, "precision": "bf16-mixed"}


def _spec(*types: str):
    return make_spec(limits__gpu_types=list(types), training=LONG)


def _caps(view, pools_shape) -> dict[str, float]:
    site = synthetic_site(pools_shape)
    req_pools, _ = usable_pools(_req(), view, site, view.pools())
    caps = has_decide.share_caps(req_pools, site.max_job_share, "bf16-mixed")
    return {k.partition: v for k, v in caps.items()}


def _req() -> Requirements:
    return Requirements(name="t", global_batch=64, steps=LONG["steps"])


def test_caps_add_the_spare_gpus_of_pools_at_least_as_fast():
    view = synthetic(TWINS)
    # idle: each H100 pool keeps 4 for its arrivals and has 4 more free, which the other H100 pool may count;
    # the V100 pool may count both H100 pools' spare (faster), the H100 pools not the V100's (slower)
    assert _caps(view, TWINS) == {"h100a": 8.0, "h100b": 8.0, "v100": 12.0}
    # h100b runs a job on 6 of its 8 GPUs: 2 free, under the 4 it keeps, so nothing spare for h100a
    busy = fill(view, "h100b", {"h100b-1": 2})
    assert _caps(busy, TWINS) == {"h100a": 4.0, "h100b": 8.0, "v100": 8.0}


def test_pending_gpus_are_not_spare():
    """GPUs a queued job waits for are owed to it, not room for arrivals."""
    view = synthetic(TWINS)
    queued = Job(job_id=900, state="PENDING", partition="h100b", node_count=1, gpu_type="h100_sxm", gpus_per_node=4)
    waiting = view.model_copy(update={"jobs": [*view.jobs, queued]})
    assert _caps(waiting, TWINS)["h100a"] == pytest.approx(4.0)


def test_a_long_job_takes_a_whole_pool_where_a_pool_as_fast_keeps_room():
    view = synthetic(TWINS)
    site = synthetic_site(TWINS)
    d = plan(_spec("h100_sxm"), view, site=site)
    assert d.chosen.gpus == 8 and len(d.chosen.components) == 1
    # the other H100 pool busy: the share holds (4 of 8), as before this rule
    busy = fill(view, "h100b", {"h100b-1": 2}, minutes=600)
    assert plan(_spec("h100_sxm"), busy, site=site).chosen.gpus == 4


def test_a_slower_free_pool_is_not_room(monkeypatch):
    """Room on a slower pool costs an arrival the speed it loses there: it does not lift the share."""
    shape = [("h100", "H100-SXM", 1, 8), ("v100", "V100-32GB", 1, 8)]
    d = plan(_spec("h100_sxm"), synthetic(shape), site=synthetic_site(shape))
    assert d.chosen.gpus == 4
    wide = next(a for a in d.alternatives if a.description == "8xH100-SXM(h100)")
    assert "at most 50% of a pool" in wide.lost_because and "pools at least as fast" in wide.lost_because
    # and with the rule off, the twins' job is held to the share too
    monkeypatch.setattr(has_decide, "SHARE_COUNTS_OTHER_POOLS", False)
    assert plan(_spec("h100_sxm"), synthetic(TWINS), site=synthetic_site(TWINS)).chosen.gpus == 4
