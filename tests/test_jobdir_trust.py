"""Job directories are trusted as OpenSSH's StrictModes trusts a directory: every directory above the jobs
directory (and the lock directory) is yours or root's and writable by no one else (a sticky /tmp is a fine
ancestor, not a jobs directory); an existing directory is reused only for this submission's own files, so
`--job-dir .` never overwrites the user's; job.sbatch records the directory's inode and its files' digests."""

from __future__ import annotations

import os

import pytest

from frenzy_slurm.core import inputfile
from frenzy_slurm.core.errors import EXIT_BAD_INPUT
from frenzy_slurm.jobdir import safety as jobdir
from frenzy_slurm.submission import submit

from .trust_world import fake, private_lock_dir, refusal, request, world  # noqa: F401  (fixtures)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")


# --- every directory above the jobs directory ------------------------------------------------------------


def test_group_writable_directory_above_the_jobs_directory_is_refused(world, tmp_path, monkeypatch):
    """A shared project directory (group-writable, not sticky): its members could rename the job directory away."""
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)  # a project group with other members
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)
    req = request(world, project / "alice" / "jobs" / "a")
    code, msg = refusal(submit, req, fake(world[0]))
    assert code == EXIT_BAD_INPUT
    assert f"the directory {project} above it is writable by its group (mode 2775)" in msg and "FRENZY_JOBS_DIR" in msg
    assert not (project / "alice" / "jobs" / "a").exists()


def test_world_writable_non_sticky_ancestor_is_refused(tmp_path):
    top = tmp_path / "open"
    (top / "jobs").mkdir(parents=True)
    top.chmod(0o777)
    (top / "jobs").chmod(0o700)
    code, msg = refusal(jobdir.check_private_dir, top / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"{top} above it is writable by everyone (mode 777)" in msg


def test_sticky_directory_such_as_tmp_is_a_fine_ancestor_but_not_a_jobs_directory(tmp_path):
    sticky = tmp_path / "scratch"
    (sticky / "me").mkdir(parents=True)
    sticky.chmod(0o1777)
    (sticky / "me").chmod(0o700)
    jobdir.check_private_dir(sticky / "me", "jobs directory")  # like /scratch/$USER under a 1777 /scratch
    code, msg = refusal(jobdir.check_private_dir, sticky, "jobs directory")
    assert code == EXIT_BAD_INPUT and "is writable by everyone" in msg


@needs_root
def test_ancestor_of_another_user_is_refused(tmp_path):
    """`/scratch/$USER` made by someone else first: its owner can swap anything below it."""
    theirs = tmp_path / "scratch-alice"
    (theirs / "jobs").mkdir(parents=True)
    os.chown(theirs, 4242, 4242)
    code, msg = refusal(jobdir.check_private_dir, theirs / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {theirs} above it belongs to 4242" in msg


@needs_root
def test_symbolic_link_above_of_another_user_is_refused(tmp_path):
    """A link in a sticky directory can be replaced by its owner: it must be the user's or root's."""
    sticky = tmp_path / "tmp"
    real = tmp_path / "real"
    (real / "jobs").mkdir(parents=True)
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "link").symlink_to(real)
    os.lchown(sticky / "link", 4242, 4242)
    code, msg = refusal(jobdir.check_private_dir, sticky / "link" / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {sticky / 'link'} above it belongs to 4242" in msg


def test_resolved_path_is_checked_too(tmp_path, monkeypatch):
    """A private link pointing into a shared directory: the directories the kernel walks are checked."""
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)
    shared = tmp_path / "shared"
    (shared / "jobs").mkdir(parents=True)
    shared.chmod(0o775)
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "mine" / "link").symlink_to(shared)
    code, msg = refusal(jobdir.check_private_dir, tmp_path / "mine" / "link" / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {shared} above it is writable by its group" in msg


# --- the lock directory's parents --------------------------------------------------------------------


def test_lock_directory_under_a_shared_directory_is_refused(world, tmp_path, monkeypatch):
    """Removing the lock directory (and the registry beside it) used to allow a duplicate submission."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(shared / "locks"))
    code, msg = refusal(submit, request(world, tmp_path / "jobs" / "a"), fake(world[0]))
    assert code == EXIT_BAD_INPUT and "lock directory" in msg and f"{shared} above it is writable by everyone" in msg
    assert "FRENZY_LOCK_DIR" in msg


# --- an existing directory is reused only for this submission's own files ------------------------------


def test_job_dir_dot_never_overwrites_the_users_files(world, tmp_path):
    """`fsbatch model.yaml --job-dir .` used to replace the user's model.yaml (and ds_config.json, job.sbatch)."""
    here = tmp_path / "work"
    here.mkdir(mode=0o700)
    (here / "model.yaml").write_text("my own model.yaml\n")
    (here / "train.py").write_text("print('mine')\n")
    code, msg = refusal(submit, request(world, here), fake(world[0]))
    assert code == EXIT_BAD_INPUT
    assert f"job directory {here} already holds files that are not this submission's (model.yaml, train.py)" in msg
    assert (here / "model.yaml").read_text() == "my own model.yaml\n"
    assert sorted(p.name for p in here.iterdir()) == ["model.yaml", "train.py"]


def test_another_submissions_rendering_is_not_overwritten(world, tmp_path):
    first = request(world, tmp_path / "jobs" / "a")
    jobdir.create_job_dir(first.job_dir, submission=first.submission)
    jobdir.write_files(first.job_dir, first.files)
    other = request(world, first.job_dir, training__steps=7)
    assert other.submission != first.submission
    code, msg = refusal(submit, other, fake(world[0]))
    assert code == EXIT_BAD_INPUT and "not this submission's" in msg and "plan.json" in msg


def test_a_refused_submissions_directory_and_an_empty_one_are_reused(world, tmp_path):
    req = request(world, tmp_path / "jobs" / "a")
    jobdir.create_job_dir(req.job_dir, submission=req.submission)
    jobdir.write_files(req.job_dir, req.files)
    (req.job_dir / "rejected.json").write_text("{}")
    assert submit(request(world, req.job_dir), fake(world[0])).job_dir == req.job_dir
    empty = tmp_path / "jobs" / "empty"
    empty.mkdir(mode=0o700)
    assert submit(request(world, empty, training__steps=9), fake(world[0])).job_dir == empty


# --- job.sbatch records the directory and the digests of the files it wrote ------------------------------


def _job_env(script: str) -> dict[str, str]:
    """The FRENZY_* values job.sbatch exports (what Slurm's copy of the script gives the job)."""
    import shlex

    env: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export FRENZY_"):
            for word in shlex.split(line)[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def test_script_records_the_directory_and_the_plans_digest(world, tmp_path):
    import hashlib

    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, fake(world[0]))
    env = _job_env((req.job_dir / "job.sbatch").read_text())
    assert env["FRENZY_JOB_DIR_INODE"] == str(os.stat(req.job_dir).st_ino)
    assert env["FRENZY_PLAN_SHA256"] == hashlib.sha256((req.job_dir / "plan.json").read_bytes()).hexdigest()
    assert env["FRENZY_DS_CONFIG_SHA256"] == hashlib.sha256((req.job_dir / "ds_config.json").read_bytes()).hexdigest()
    assert done.script == (req.job_dir / "job.sbatch").read_text()  # what submit reports is what was written
    # ...which is the request's script with the directory's identity recorded, and nothing else changed
    assert done.script == jobdir.bind_identity(req.script, os.stat(req.job_dir).st_ino, req.files)
