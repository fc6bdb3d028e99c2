"""Another user's job directory as the operator's watcher reads it (frenzy_slurm/jobdir/foreign.py): the directory
and every one above it are the job's user's or root's and writable by no one else, and each file read is the
job's user's, checked on the open file (`read_config_text(owner=...)`)."""

from __future__ import annotations

import os

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import read_job_record
from frenzy_slurm.jobdir.foreign import foreign_dir_problem, user_uid

ME = os.geteuid()
NOBODY = 2**31 - 7  # a uid no account has


@pytest.fixture
def job_dir(tmp_path):
    d = tmp_path / "jobs" / "j"
    d.mkdir(parents=True, mode=0o700)
    (tmp_path / "jobs").chmod(0o700)
    (d / "submission.json").write_text('{"job_id": 7}')
    return d


def test_a_private_directory_of_the_jobs_user_is_trusted(job_dir):
    assert foreign_dir_problem(job_dir, ME) is None
    assert read_job_record(job_dir / "submission.json", owner=ME) == {"job_id": 7}


def test_a_directory_of_someone_else_is_not(job_dir):
    why = foreign_dir_problem(job_dir, NOBODY)
    assert why is not None and ("not to the job's user" in why or "above its job directory belongs to" in why)


def test_a_directory_anyone_can_write_is_not(job_dir):
    job_dir.chmod(0o703)
    assert foreign_dir_problem(job_dir, ME) == f"job directory {job_dir} is writable by everyone (mode 703)"


def test_a_directory_above_that_anyone_can_write_is_not(job_dir):
    job_dir.parent.chmod(0o777)
    why = foreign_dir_problem(job_dir, ME)
    assert why == (
        f"the directory {job_dir.parent} above its job directory is writable by everyone (mode 777): another user "
        "could swap the job's files"
    )


def test_a_link_and_a_relative_path_are_not(job_dir, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(job_dir)
    assert foreign_dir_problem(link, ME) == f"job directory {link} is a symbolic link"
    assert "not an absolute path" in (foreign_dir_problem(job_dir.relative_to(tmp_path), ME) or "")


def test_a_file_of_another_owner_or_writable_by_others_is_refused(job_dir):
    with pytest.raises(InputError, match="belongs to"):
        read_job_record(job_dir / "submission.json", owner=NOBODY)
    (job_dir / "submission.json").chmod(0o602)
    with pytest.raises(InputError, match="is writable by everyone"):
        read_job_record(job_dir / "submission.json", owner=ME)


def test_a_user_without_an_account_has_no_uid():
    assert user_uid("no-such-user-frenzy") is None
