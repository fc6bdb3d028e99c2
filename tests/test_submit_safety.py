"""Submission: job directories and locks safe on shared file systems, --force never deleting a
job's files, one job per user and submission whatever the directory, and an sbatch timeout that created
the job. Against FakeSlurm (a timeout after the job exists cannot be produced on demand by real Slurm)."""

from __future__ import annotations

import os
import stat
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from frenzy_slurm.core import inputfile
from frenzy_slurm.core.errors import EXIT_ALREADY_SUBMITTED, EXIT_BAD_INPUT, EXIT_SLURM_UNAVAILABLE, FrenzyError
from frenzy_slurm.jobdir.safety import next_free_dir
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.submission import submit

from .helpers import LOCAL, make_spec, plan, planned
from .trust_world import fake, refusal


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    lock = tmp_path / "locks"
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(lock))
    return lock


@pytest.fixture
def world():
    view = synthetic(LOCAL)
    spec = make_spec(entry={"env": {"WANDB_API_KEY": "secret-token"}})
    decision = plan(spec, view)
    return view, spec, decision


def request(world, job_dir: Path, **plan_options):
    """The request fsbatch would submit (planning.plan_job) into `job_dir`."""
    view, spec, _ = world
    return planned(spec, view, job_dir, **plan_options)


def test_job_directory_and_files_are_private(world, tmp_path):
    jobs = tmp_path / "jobs"
    req = request(world, jobs / "a")
    submit(req, fake(world[0]))
    assert stat.S_IMODE(os.stat(jobs).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(req.job_dir).st_mode) == 0o700
    for p in req.job_dir.iterdir():
        want = 0o700 if p.name == "job.sbatch" else 0o600
        assert stat.S_IMODE(p.stat().st_mode) == want, p.name
    assert "secret-token" in (req.job_dir / "job.sbatch").read_text()  # the secret is there, but only for its owner


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_jobs_directory_writable_by_others_is_refused(world, tmp_path, mode, monkeypatch):

    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)  # a shared project group
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    code, msg = refusal(submit, request(world, shared / "a"), fake(world[0]))
    assert code == EXIT_BAD_INPUT and "writable by" in msg and "--job-dir" in msg


def test_jobs_directory_of_another_user_is_refused(world, tmp_path):
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 4242, 4242) if os.geteuid() == 0 else pytest.skip("needs root to make a foreign directory")
    code, msg = refusal(submit, request(world, other / "a"), fake(world[0]))
    assert code == EXIT_BAD_INPUT and "belongs to" in msg


def test_symlinked_lock_is_not_followed(world, tmp_path, private_lock_dir):
    req = request(world, tmp_path / "jobs" / "a")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    private_lock_dir.mkdir(mode=0o700)
    (private_lock_dir / f"submit-{req.submission}.lock").symlink_to(victim)
    code, msg = refusal(submit, req, fake(world[0]))
    assert code == EXIT_BAD_INPUT and "lock file" in msg
    assert victim.read_text() == "precious"


def test_lock_owned_by_another_user_is_an_input_error(world, tmp_path, private_lock_dir):
    if os.geteuid() != 0:
        pytest.skip("needs root to make a foreign file")
    req = request(world, tmp_path / "jobs" / "a")
    private_lock_dir.mkdir(mode=0o700)
    lock = private_lock_dir / f"submit-{req.submission}.lock"
    lock.write_text("")
    os.chown(lock, 4242, 4242)
    code, msg = refusal(submit, req, fake(world[0]))
    assert code == EXIT_BAD_INPUT and "not a plain file of yours" in msg


def test_symlinked_file_in_job_dir_is_replaced_not_followed(world, tmp_path):
    req = request(world, tmp_path / "jobs" / "a")
    req.job_dir.mkdir(parents=True, mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    (req.job_dir / "plan.json").symlink_to(victim)
    submit(req, fake(world[0]))
    assert victim.read_text() == "precious"
    assert not (req.job_dir / "plan.json").is_symlink()


def test_force_never_touches_the_earlier_job(world, tmp_path):
    from frenzy_slurm.jobdir.safety import job_outputs

    slurm = fake(world[0])
    first = request(world, tmp_path / "jobs" / "a")
    done = submit(first, slurm)
    ckpt = first.job_dir / "checkpoints" / "step10"
    ckpt.mkdir(parents=True)
    (first.job_dir / "metrics.json").write_text("{}")
    before = sorted(p.name for p in first.job_dir.iterdir())
    code, _ = refusal(submit, request(world, first.job_dir), slurm)
    assert code == EXIT_ALREADY_SUBMITTED
    # what fsbatch --force does: a directory with a job's files gets a fresh sibling
    assert job_outputs(first.job_dir)
    again = request(world, first.job_dir, force=True)  # planned into the next free sibling
    assert again.job_dir == next_free_dir(first.job_dir) and again.earlier_job_dir == first.job_dir
    forced = submit(again, slurm)
    assert forced.job_id != done.job_id and again.job_dir.name == "a.2"
    assert sorted(p.name for p in first.job_dir.iterdir()) == before and ckpt.is_dir()
    # and a forced submit straight into a directory used since it was planned refuses rather than overwrite it
    late = request(world, tmp_path / "jobs" / "c")
    late.job_dir.mkdir(mode=0o700)
    (late.job_dir / "metrics.json").write_text("{}")
    code, msg = refusal(submit, replace(late, force=True), slurm)
    assert code == EXIT_BAD_INPUT and "never writes over" in msg


def test_one_job_per_submission_across_directories(world, tmp_path):
    """Five concurrent fsbatch runs of one model.yaml from five directories: one job (it used to be five)."""
    slurm = fake(world[0])
    results: list[object] = []

    def one(i: int) -> None:
        try:
            results.append(submit(request(world, tmp_path / f"dir{i}" / "job"), slurm))
        except FrenzyError as exc:
            results.append(exc)

    for i in range(5):
        (tmp_path / f"dir{i}").mkdir(mode=0o700)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(slurm.fake_jobs) == 1
    refused = [r for r in results if isinstance(r, FrenzyError)]
    assert len(refused) == 4 and all(r.exit_code == EXIT_ALREADY_SUBMITTED for r in refused)
    assert all("job directory" in r.message for r in refused)


def test_sbatch_timeout_finds_the_job_by_its_tag(world, tmp_path):
    import json

    slurm = fake(world[0])
    slurm.submit_times_out = True  # the job is created, but sbatch's answer never arrives
    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, slurm, timeout_waits=(0.0,))
    assert done.job_id in slurm.fake_jobs
    record = json.loads((req.job_dir / "submission.json").read_text())
    assert record["job_id"] == done.job_id and "timed out" in record["recovered"]


def test_sbatch_timeout_without_a_job_says_what_to_do(world, tmp_path):
    slurm = fake(world[0])
    slurm.submit_times_out = True
    req = request(world, tmp_path / "jobs" / "a")
    orig = slurm.submit

    def lost(job):  # the controller dropped it: nothing in the queue
        try:
            orig(job)
        finally:
            slurm.fake_jobs.clear()

    slurm.submit = lost
    code, msg = refusal(submit, req, slurm, timeout_waits=(0.0,))
    assert code == EXIT_SLURM_UNAVAILABLE and f"frenzy:{req.submission}" in msg and "again" in msg


def test_rerun_after_a_lost_answer_records_the_job(world, tmp_path):
    """The timeout outlasted the look-up; a later fsbatch finds the job by its tag and records it."""
    slurm = fake(world[0])
    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, slurm)
    (req.job_dir / "submission.json").unlink()  # as if the answer had been lost
    code, msg = refusal(submit, request(world, req.job_dir), slurm)
    assert code == EXIT_ALREADY_SUBMITTED and str(done.job_id) in msg
    assert (req.job_dir / "submission.json").exists()


def test_site_may_make_job_directories_group_readable(world, tmp_path):
    view, spec, _ = world
    site = synthetic_site(LOCAL).model_copy(update={"job_dirs_group_readable": True})
    req = planned(spec, view, tmp_path / "jobs" / "g", site=site)
    assert req.group_readable
    submit(req, fake(view))
    assert stat.S_IMODE(os.stat(req.job_dir).st_mode) == 0o750
    assert stat.S_IMODE((req.job_dir / "plan.json").stat().st_mode) == 0o640
    assert "umask 027" in req.script and "umask 077" in request(world, tmp_path / "x").script
    assert (req.umask, request(world, tmp_path / "x").umask) == (0o027, 0o077)  # what sbatch is run under


def test_cli_backend_runs_sbatch_under_the_jobs_umask(tmp_path, monkeypatch):
    """sbatch hands its own umask to the job, and Slurm creates the job's -o/-e files with it."""
    from frenzy_slurm.slurm import BatchJob
    from frenzy_slurm.slurm.cli import SlurmCliBackend

    bindir = tmp_path / "bin"
    bindir.mkdir()
    seen = tmp_path / "umask"
    (bindir / "sbatch").write_text(f"#!/bin/sh\numask > {seen}\necho 4242\n")
    (bindir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    for mask, want in ((0o077, "0077"), (0o027, "0027")):
        done = SlurmCliBackend().submit(
            BatchJob(script=tmp_path / "job.sbatch", workdir=tmp_path, components=[], umask=mask)
        )
        assert done.job_id == 4242 and seen.read_text().strip() == want


def test_site_file_field_defaults_to_private():
    from frenzy_slurm.sim.synthetic import synthetic_site

    assert synthetic_site(LOCAL).job_dirs_group_readable is False


def test_lock_directory_writable_by_others_is_refused(world, tmp_path, monkeypatch):
    """The lock never lives in a shared directory such as /tmp (it used to sit beside a custom --job-dir)."""
    shared = tmp_path / "sharedlocks"
    shared.mkdir()
    shared.chmod(0o1777)
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(shared))
    code, msg = refusal(submit, request(world, tmp_path / "jobs" / "a"), fake(world[0]))
    assert code == EXIT_BAD_INPUT and "lock directory" in msg and "FRENZY_LOCK_DIR" in msg
    assert not list(shared.iterdir())


def test_duplicate_from_another_directory_after_the_job_left_the_queue(world, tmp_path):
    """The queue forgets finished jobs; the user's registry does not (until the job directory is removed)."""
    import shutil

    slurm = fake(world[0])
    first = request(world, tmp_path / "jobs" / "a")
    done = submit(first, slurm)
    slurm.fake_jobs.clear()  # finished and gone from the queue (MinJobAge)
    code, msg = refusal(submit, request(world, tmp_path / "other" / "b"), slurm)
    assert code == EXIT_ALREADY_SUBMITTED and str(done.job_id) in msg and str(first.job_dir) in msg
    shutil.rmtree(first.job_dir)  # the user cleans up: a fresh start is allowed
    again = submit(request(world, tmp_path / "other" / "b"), slurm)
    assert again.job_id != done.job_id


def test_group_writable_is_accepted_only_for_a_user_private_group(monkeypatch, tmp_path):
    from frenzy_slurm.jobdir import safety as jobdir

    d = tmp_path / "jobs"
    d.mkdir()
    d.chmod(0o770)
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: True)
    jobdir.check_private_dir(d, "jobs directory")  # umask 002 with a user-private group: fine
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)
    with pytest.raises(FrenzyError, match="writable by its group"):
        jobdir.check_private_dir(d, "jobs directory")
