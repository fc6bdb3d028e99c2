"""Which jobs are frenzy-slurm's: what fsbatch recorded (submission.json in the user's own job directory, naming the
job id and the submission its comment carries), not a `frenzy:` comment anyone can type. fscancel --name once
cancelled a plain job of the user's whose comment started with `frenzy:`. Against FakeSlurm; the live test is
tests/test_track_job_identity_live.py."""

from __future__ import annotations

import getpass
import json

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import BatchJob, ComponentRequest
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.track.jobs import cancel_jobs, frenzy_jobs, recorded_by_fsbatch

from .helpers import LOCAL

ME = getpass.getuser()


@pytest.fixture
def slurm():
    return FakeSlurm(synthetic(LOCAL), user=ME)


def submit(slurm, tmp_path, name: str, submission: str, record: dict | None, user: str = ME) -> int:
    """A job tagged frenzy:<submission>; `record` (job_id filled in if None-valued) its submission.json."""
    d = tmp_path / f"{name}-{len(slurm.fake_jobs)}"
    d.mkdir(mode=0o700)
    slurm.user = user
    comp = ComponentRequest(partition="a100", gpu_type="a100_40gb", nodes=1, gpus_per_node=1, time_min=60)
    done = slurm.submit(
        BatchJob(script=d / "job.sbatch", workdir=d, components=[comp], name=name, comment=f"frenzy:{submission}")
    )
    slurm.user = ME
    if record is not None:
        (d / "submission.json").write_text(json.dumps({"job_id": done.job_id, "submission": submission} | record))
    return done.job_id


def test_only_jobs_fsbatch_recorded_are_frenzy_jobs(slurm, tmp_path):
    real = submit(slurm, tmp_path, "run", "aaaa", {})
    forged = submit(slurm, tmp_path, "run", "bbbb", None)  # sbatch --comment frenzy:bbbb --wrap ...
    other_id = submit(slurm, tmp_path, "run", "cccc", {"job_id": 1})  # a record, of another job
    other_sub = submit(slurm, tmp_path, "run", "dddd", {"submission": "eeee"})  # a record of another submission
    jobs = {j.job_id: j for j in slurm.jobs()}
    assert [recorded_by_fsbatch(jobs[i]) for i in (real, forged, other_id, other_sub)] == [True, False, False, False]
    assert [t.job_id for t in frenzy_jobs(slurm.jobs())] == [real]
    assert [t.job_id for t in frenzy_jobs(slurm.jobs(), user=ME)] == [real]


def test_a_record_through_a_link_or_in_a_linked_directory_is_no_record(slurm, tmp_path):
    jid = submit(slurm, tmp_path, "run", "aaaa", None)
    d = tmp_path / "run-0"
    (tmp_path / "elsewhere.json").write_text(json.dumps({"job_id": jid, "submission": "aaaa"}))
    (d / "submission.json").symlink_to(tmp_path / "elsewhere.json")
    assert frenzy_jobs(slurm.jobs()) == []


def test_another_users_tagged_job_is_shown_unverified(slurm, tmp_path):
    theirs = submit(slurm, tmp_path, "x", "ffff", None, user="someone-else")
    (t,) = frenzy_jobs(slurm.jobs())
    assert t.job_id == theirs and t.recorded is False
    assert any("not verified as a frenzy-slurm job" in n for n in t.notes), t.notes


def test_fscancel_name_and_mine_leave_a_forged_tag_alone(slurm, tmp_path):
    real = submit(slurm, tmp_path, "run", "aaaa", {})
    forged = submit(slurm, tmp_path, "run", "bbbb", None)
    assert [c.job_id for c in cancel_jobs(slurm, name="run")] == [real]
    assert slurm.fake_jobs[forged].state == "RUNNING" and slurm.fake_jobs[real].state == "CANCELLED"
    assert cancel_jobs(slurm, mine=True) == []
    assert slurm.fake_jobs[forged].state == "RUNNING"
    with pytest.raises(InputError, match=f"job {forged} is not a frenzy-slurm job .*`scancel {forged}`"):
        cancel_jobs(slurm, [forged])
    assert slurm.fake_jobs[forged].state == "RUNNING"
