"""`frenzy-slurm watch --all-users` (frenzy_slurm/track/replan_site.py), on the fake Slurm: an operator's watcher
solves one assignment over every user's waiting jobs marked slurm.replan, reading only job directories it can
trust (jobdir/foreign.py), and says plainly when Slurm refuses it other users' jobs.

The users are names the fake Slurm gives jobs; `user_uid` maps them to this test's uid, so that the directories the
test writes belong to "the job's user" (a directory of a different owner is checked with a uid of no one's)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.errors import EXIT_SLURM_REJECTED
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.site.config import Replan
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track import replan_site
from frenzy_slurm.track.replan_site import NotOperator
from frenzy_slurm.track.replan_site import replan_site as site_pass
from frenzy_slurm.track.replan_watch import REPLANNED

from .helpers import make_spec
from .test_track_watch import _hold_pool

POOLS = [("short", "A100-40GB", 1, 4), ("long", "A100-40GB", 1, 4), ("spare", "A100-40GB", 1, 4), ("t4", "T4", 2, 4)]
A100 = "a100_40gb"
PRESET = "gpt2-xl"
NOBODY = 2**31 - 7  # a uid no account has


@pytest.fixture
def queue(tmp_path, monkeypatch):
    """alice's job waits on `short` (free in 5 h), bob's after it; `spare` (held for 10 h) frees up after both
    fsbatch: one of them can start there now, not both."""
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setattr(replan_site, "user_uid", lambda name: os.geteuid() if name != "mallory" else NOBODY)
    slurm = FakeSlurm(synthetic(POOLS), user="ops")
    slurm.operator = True
    site = SiteFile(synthetic_site(POOLS))
    _hold_pool(slurm, "short", A100, 1, 4, 5)
    _hold_pool(slurm, "long", A100, 1, 4, 8)
    spare_holder = _hold_pool(slurm, "spare", A100, 1, 4, 10)
    _hold_pool(slurm, "t4", "t4", 2, 4, 20)
    jobs = {}
    for user in ("alice", "bob"):
        slurm.user = user
        jobs[user] = _submit(slurm, site, tmp_path / user, f"w-{user}")
    slurm.user = "ops"
    slurm.cancel(spare_holder)
    return slurm, site, jobs


def _submit(slurm: FakeSlurm, site: SiteFile, home: Path, name: str, steps: int = 20_000) -> int:
    spec = make_spec(name=name, model={"preset": PRESET}, training__steps=steps)
    job = JobFile(home / f"{name}.yaml", spec, resolve_model(spec, "."))
    job_dir = home / "jobs" / name
    opts = PlanOptions(slurm=SlurmOptions(replan=True), job_dir=job_dir, now=slurm.now, env_check="off")
    return submit(plan_job(job, site, slurm, opts), slurm).job_id


def _dir(slurm: FakeSlurm, jid: int) -> Path:
    workdir = slurm.fake_jobs[jid].workdir
    assert workdir is not None
    return Path(workdir)


def test_two_users_jobs_are_solved_together_in_one_pass(queue):
    slurm, site, jobs = queue
    alice, bob = jobs["alice"], jobs["bob"]
    assert [slurm.fake_jobs[j].components[0].partition for j in (alice, bob)] == ["short", "long"]
    dry, skipped = site_pass(slurm, site.config, dry_run=True, now=slurm.now)
    assert skipped == [] and not any(r.applied for r in dry)
    assert [slurm.fake_jobs[j].components[0].partition for j in (alice, bob)] == ["short", "long"]  # dry: no change
    done, _ = site_pass(slurm, site.config, dry_run=False, now=slurm.now)
    # one solve over both users' jobs: alice's job takes the freed `spare` and starts; bob's takes `short`, which
    # frees for it 3 h sooner than `long` now that alice's job no longer waits there
    assert [(r.user, r.job_id, r.from_shape, r.to_shape, r.applied) for r in done] == [
        ("alice", alice, f"1x2 {A100}(short)", f"1x2 {A100}(spare)", True),
        ("bob", bob, f"1x2 {A100}(long)", f"1x2 {A100}(short)", True),
    ]
    assert all(r.predicted_end_staying - r.predicted_end_changed > 2 * 3600 for r in done)
    assert done[0].line().startswith(f"alice's job {alice} (pending): 1x2 {A100}(short) -> ")
    assert (slurm.fake_jobs[alice].components[0].partition, slurm.fake_jobs[alice].state) == ("spare", "RUNNING")
    assert (slurm.fake_jobs[bob].components[0].partition, slurm.fake_jobs[bob].state) == ("short", "PENDING")
    # recorded in the operator's own state directory, never in the user's job directory
    state = Path(os.environ["XDG_STATE_HOME"]) / "frenzy-slurm" / "replanned"
    record = json.loads((state / f"{alice}.json").read_text())
    assert (record["user"], record["job_dir"], [c["to"] for c in record["changes"]]) == (
        "alice",
        str(_dir(slurm, alice)),
        [f"1x2 {A100}(spare)"],
    )
    assert not (_dir(slurm, alice) / REPLANNED).exists() and not (_dir(slurm, bob) / REPLANNED).exists()
    again, _ = site_pass(slurm, site.config, dry_run=False, now=slurm.now)
    assert again == []  # nothing changed twice


def test_margins_hold_for_every_user(queue):
    slurm, site, jobs = queue
    wide = site.config.model_copy(update={"replan": Replan(margin_s=12 * 3600, margin_fraction=0.0)})
    done, _ = site_pass(slurm, wide, dry_run=False, now=slurm.now)
    assert done == [] and [slurm.fake_jobs[j].components[0].partition for j in jobs.values()] == ["short", "long"]


def _skip_reason(slurm: FakeSlurm, site: SiteFile, jid: int) -> str:
    done, skipped = site_pass(slurm, site.config, dry_run=False, now=slurm.now)
    assert jid not in {r.job_id for r in done}
    (why,) = [s for s in skipped if s.job_id == jid]
    assert "\n" not in why.line()
    return why.reason


def test_a_directory_writable_by_others_is_skipped_with_its_reason(queue):
    slurm, site, jobs = queue
    d = _dir(slurm, jobs["alice"])
    d.chmod(0o707)
    assert "is writable by everyone (mode 707)" in _skip_reason(slurm, site, jobs["alice"])
    assert slurm.fake_jobs[jobs["bob"]].components[0].partition == "short"  # bob's job still solved, alone


def test_a_directory_not_of_the_jobs_user_is_skipped(queue):
    slurm, site, jobs = queue
    slurm.fake_jobs[jobs["alice"]].user = "mallory"  # Slurm says mallory's job, the directory is someone else's
    reason = _skip_reason(slurm, site, jobs["alice"])
    assert "not to the job's user" in reason or "above its job directory belongs to" in reason


def test_a_symbolic_link_for_a_job_directory_is_skipped(queue, tmp_path):
    slurm, site, jobs = queue
    real = _dir(slurm, jobs["alice"])
    link = tmp_path / "link"
    link.symlink_to(real)
    slurm.fake_jobs[jobs["alice"]].workdir = str(link)
    assert _skip_reason(slurm, site, jobs["alice"]) == f"job directory {link} is a symbolic link"


def test_a_submission_record_that_names_another_job_is_skipped(queue):
    slurm, site, jobs = queue
    sub = _dir(slurm, jobs["alice"]) / "submission.json"
    record = json.loads(sub.read_text())
    sub.write_text(json.dumps(record | {"job_id": jobs["bob"]}))
    assert "does not name this job" in _skip_reason(slurm, site, jobs["alice"])


def test_a_plan_that_is_a_link_is_skipped(queue, tmp_path):
    slurm, site, jobs = queue
    plan = _dir(slurm, jobs["alice"]) / "plan.json"
    elsewhere = tmp_path / "plan-elsewhere.json"
    plan.rename(elsewhere)
    plan.symlink_to(elsewhere)
    assert "is a symbolic link" in _skip_reason(slurm, site, jobs["alice"])


def test_an_unreadable_directory_is_skipped_naming_the_site_setting(queue, monkeypatch):
    slurm, site, jobs = queue
    d = _dir(slurm, jobs["alice"])
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if Path(p) == d else real_access(p, mode))  # as root
    assert "job_dirs_group_readable" in _skip_reason(slurm, site, jobs["alice"])


def test_a_shape_bigger_than_the_job_asked_for_is_never_offered(queue, monkeypatch):
    """bob's plan has a 1x4 shape on `spare`, the soonest for it: the user's own limits would have had to allow
    4 GPUs, which an operator's update would not check, so only his 2-GPU shapes are offered."""
    slurm, site, jobs = queue
    checks = replan_site._within_request
    monkeypatch.setattr(replan_site, "_within_request", lambda site: lambda t, s: True)
    unchecked, _ = site_pass(slurm, site.config, dry_run=True, now=slurm.now)
    grow = {r.user: r.to_shape for r in unchecked}
    assert grow["bob"] == f"1x4 {A100}(spare)"  # what it would be without the rule
    monkeypatch.setattr(replan_site, "_within_request", checks)
    checked, _ = site_pass(slurm, site.config, dry_run=True, now=slurm.now)
    assert {r.user: r.to_shape for r in checked}["bob"] == f"1x2 {A100}(short)"


def test_a_job_held_back_by_its_users_limits_is_not_touched(queue):
    slurm, site, jobs = queue
    rows = slurm._job_rows

    def limited(fake_jobs):  # Slurm says alice's job waits for her association's GPU limit
        return [replace(r, reason="AssocGrpGRES") if r.job_id == jobs["alice"] else r for r in rows(fake_jobs)]

    slurm._job_rows = limited  # type: ignore[method-assign]
    reason = _skip_reason(slurm, site, jobs["alice"])
    assert reason.startswith("it waits for Reason=AssocGrpGRES, not for its turn")
    assert slurm.fake_jobs[jobs["alice"]].components[0].partition == "short"


def test_without_operator_rights_the_pass_stops_with_one_line(queue):
    slurm, site, _ = queue
    slurm.operator = False
    with pytest.raises(NotOperator) as caught:
        site_pass(slurm, site.config, dry_run=False, now=slurm.now)
    assert caught.value.exit_code == EXIT_SLURM_REJECTED == 5
    assert "sacctmgr modify user" in caught.value.message and "set AdminLevel=Operator" in caught.value.message
    assert "Invalid user id for job" in caught.value.message and "\n" not in caught.value.message


def test_the_command_says_so_and_exits_5(queue, tmp_path, monkeypatch):
    from frenzy_slurm import api
    from frenzy_slurm.cli.watch import watch

    slurm, site, _ = queue
    slurm.operator = False
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(site.config.model_dump(mode="json")))
    monkeypatch.setattr(api, "open_backend", lambda backend, snapshot: slurm)
    monkeypatch.setattr(time, "time", lambda: slurm.now)  # the fake's clock is not the wall clock
    got = CliRunner().invoke(watch, ["--all-users", "--once", "--site", str(site_file)])
    assert got.exit_code == 5, got.output
    lines = got.output.strip().splitlines()
    assert lines[-1].startswith("frenzy-slurm watch: error: Slurm refused to change another user's job")
    assert "sacctmgr modify user" in lines[-1] and "Traceback" not in got.output


def test_the_command_in_json_lists_changes_and_skips(queue, tmp_path, monkeypatch):
    from frenzy_slurm import api
    from frenzy_slurm.cli.watch import watch

    slurm, site, jobs = queue
    _dir(slurm, jobs["alice"]).chmod(0o707)
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(site.config.model_dump(mode="json")))
    monkeypatch.setattr(api, "open_backend", lambda backend, snapshot: slurm)
    monkeypatch.setattr(time, "time", lambda: slurm.now)  # the fake's clock is not the wall clock
    got = CliRunner().invoke(watch, ["--all-users", "--once", "--dry-run", "--json", "--site", str(site_file)])
    assert got.exit_code == 0, got.output
    record = json.loads(got.output)
    assert record["all_users"] is True and record["dry_run"] is True
    assert [(s["job_id"], s["user"]) for s in record["skipped"]] == [(jobs["alice"], "alice")]
    assert [(r["job_id"], r["user"], r["applied"]) for r in record["reshaped"]] == [(jobs["bob"], "bob", False)]
    assert record["reshaped"][0]["to_shape"] == f"1x2 {A100}(short)"
