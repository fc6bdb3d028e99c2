"""`frenzy-slurm watch` changes a waiting job marked slurm.replan in place (frenzy_slurm/track/replan_watch.py), on the
fake Slurm: two partitions of the same A100s, both held by another user; when one frees up, the job waiting on
the other is updated to it and keeps its id and submit time (its place in the queue)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.site.config import Replan
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import my_user_name
from frenzy_slurm.track.replan_watch import REPLANNED
from frenzy_slurm.track.watch import watch_once

from .helpers import make_spec
from .test_track_watch import _hold_pool

POOLS = [("short", "A100-40GB", 1, 4), ("long", "A100-40GB", 1, 4), ("t4", "T4", 2, 4)]
A100 = "a100_40gb"


@pytest.fixture
def waiting(tmp_path, monkeypatch):
    """Our job waits on `short` (free in 5 h); `long` is held for 8 h by a job that is cancelled after fsbatch."""
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    slurm = FakeSlurm(synthetic(POOLS), user=my_user_name())
    site = SiteFile(synthetic_site(POOLS))
    _hold_pool(slurm, "short", A100, 1, 4, 5)
    long_holder = _hold_pool(slurm, "long", A100, 1, 4, 8)
    _hold_pool(slurm, "t4", "t4", 2, 4, 20)
    spec = make_spec(name="w", model={"preset": "gpt2-medium"}, training__steps=20_000)
    job = JobFile(tmp_path / "w.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(replan=True), job_dir=tmp_path / "jobs" / "w", now=slurm.now, env_check="off")
    jid = submit(plan_job(job, site, slurm, opts), slurm).job_id
    assert slurm.fake_jobs[jid].components[0].partition == "short"
    slurm.cancel(long_holder)
    slurm.operator = True  # the job grows from 1 to 4 GPUs per node: a change of tasks per node, an operator's
    return slurm, site, jid, tmp_path / "jobs" / "w"


def test_a_waiting_job_moves_in_place_to_the_partition_that_freed_up(waiting):
    slurm, site, jid, job_dir = waiting
    submitted = slurm.fake_jobs[jid].submitted
    dry: list = []
    assert watch_once(site, slurm, dry_run=True, now=slurm.now, reshaped=dry) == []
    assert [(r.job_id, r.applied) for r in dry] == [(jid, False)]
    assert slurm.fake_jobs[jid].components[0].partition == "short"  # a dry run changes nothing
    done: list = []
    watch_once(site, slurm, now=slurm.now, reshaped=done)
    assert [(r.job_id, r.applied, r.to_shape) for r in done] == [(jid, True, f"1x4 {A100}(long)")]
    assert done[0].predicted_end_staying - done[0].predicted_end_changed > 4 * 3600
    j = slurm.fake_jobs[jid]
    assert (j.job_id, j.submitted, j.components[0].partition, j.state) == (jid, submitted, "long", "RUNNING")
    record = json.loads((job_dir / REPLANNED).read_text())
    assert [(c["from"], c["to"]) for c in record["changes"]] == [(done[0].from_shape, f"1x4 {A100}(long)")]
    assert done[0].from_shape.endswith("(short)")
    again: list = []
    watch_once(site, slurm, now=slurm.now, reshaped=again)
    assert again == []  # running now: nothing to change, nothing changed twice


def test_a_plain_user_is_not_offered_more_gpus_per_node_than_the_job_was_submitted_with(waiting):
    # slurmctld lets only operators change a job's tasks per node, and refuses a plain user's update that names it
    # after applying the fields before it; without it, more GPUs per node than submitted never run (docs/admin.md)
    slurm, site, jid, job_dir = waiting
    slurm.operator = False
    assert slurm.fake_jobs[jid].components[0].gpus_per_node == 1
    done: list = []
    watch_once(site, slurm, now=slurm.now, reshaped=done)
    assert done == []
    j = slurm.fake_jobs[jid]
    assert (j.components[0].partition, j.components[0].gpus_per_node, j.bad_constraints) == ("short", 1, False)
    assert not (job_dir / REPLANNED).exists()


def test_a_gain_within_the_sites_margin_is_not_taken(waiting):
    slurm, site, jid, _ = waiting
    wide = SiteFile(site.config.model_copy(update={"replan": Replan(margin_s=12 * 3600, margin_fraction=0.0)}))
    got: list = []
    watch_once(wide, slurm, now=slurm.now, reshaped=got)
    assert got == [] and slurm.fake_jobs[jid].components[0].partition == "short"


def test_a_job_not_marked_replan_is_left(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    slurm = FakeSlurm(synthetic(POOLS), user=my_user_name())
    site = SiteFile(synthetic_site(POOLS))
    _hold_pool(slurm, "short", A100, 1, 4, 5)
    holder = _hold_pool(slurm, "long", A100, 1, 4, 8)
    _hold_pool(slurm, "t4", "t4", 2, 4, 20)
    spec = make_spec(name="n", model={"preset": "gpt2-medium"}, training__steps=20_000)
    job = JobFile(Path(tmp_path / "n.yaml"), spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(), job_dir=tmp_path / "jobs" / "n", now=slurm.now, env_check="off")
    jid = submit(plan_job(job, site, slurm, opts), slurm).job_id
    slurm.cancel(holder)
    got: list = []
    watch_once(site, slurm, now=slurm.now, reshaped=got)
    assert got == [] and slurm.fake_jobs[jid].components[0].partition == "short"


def test_a_job_that_started_meanwhile_refuses_and_nothing_is_recorded(waiting, monkeypatch):
    from frenzy_slurm.slurm.run import SlurmCommandError

    slurm, site, jid, job_dir = waiting

    def started(job_id, component, restate_tasks=True):
        raise SlurmCommandError(["scontrol", "update"], 1, "Job is no longer pending execution")

    monkeypatch.setattr(slurm, "update_pending", started)
    got: list = []
    watch_once(site, slurm, now=slurm.now, reshaped=got)
    assert [(r.applied, r.note) for r in got] == [(False, "Slurm refused: Job is no longer pending execution")]
    assert "not updated" in got[0].line()
    assert not (job_dir / REPLANNED).exists()
