"""Whatever ends sbatch without a job id (a timeout, a lost connection, a full disk, a signal), fsbatch looks
the job up by its tag and records it: a SIGTERM during sbatch records the job before stopping, a second signal
stops at once naming the tag. Against FakeSlurm (a controller that creates the job and then fails cannot be
produced on demand); test_submit_sbatch_interrupted_live.py has the real cluster's."""

from __future__ import annotations

import errno
import getpass
import json
import os
import signal
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import (
    EXIT_ALREADY_SUBMITTED,
    EXIT_FAILURE,
    EXIT_SLURM_UNAVAILABLE,
    FrenzyError,
)
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.parse import SlurmUnexpected
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.submission import submit

from .helpers import LOCAL, make_spec, plan, planned

# -- whatever ends sbatch, look the job up by its tag ------------------------------------------------------


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def world():
    view = synthetic(LOCAL)
    spec = make_spec()
    return view, spec, plan(spec, view)


def request(world, job_dir: Path):
    """The request fsbatch would submit (planning.plan_job) into `job_dir`."""
    view, spec, _ = world
    return planned(spec, view, job_dir)


def _created_then(slurm: FakeSlurm, error: Exception, signals: int = 0):
    """slurm.submit creates the job, optionally signals this process, then fails with `error` (or answers)."""
    orig = slurm.submit

    def submit_(job):
        done = orig(job)
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
        if error is not None:
            raise error
        return done

    slurm.submit = submit_


@pytest.mark.parametrize(
    "error",
    [
        # sbatch's own MessageTimeout against a paused slurmctld: exit 1 with an outage message, not our timeout
        SlurmUnavailable(
            "Slurm is unreachable: sbatch: error: Batch job submission failed: Socket timed out on "
            "send/recv operation (from 'sbatch --parsable job.sbatch')."
        ),
        SlurmCommandError(["sbatch"], 1, "sbatch: error: Batch job submission failed: Unexpected message received"),
        SlurmCommandError(["sbatch"], -2, ""),  # killed by a signal after sending the job
        SlurmUnexpected("sbatch --parsable printed 'garbage', not a job id"),
    ],
    ids=["sbatch-own-timeout", "error-exit", "killed", "garbled-answer"],
)
def test_sbatch_ending_without_a_job_id_still_records_the_job(world, tmp_path, error):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, error)
    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, slurm, timeout_waits=(0.0,))
    assert list(slurm.fake_jobs) == [done.job_id]
    record = json.loads((req.job_dir / "submission.json").read_text())
    assert record["job_id"] == done.job_id and "found in the queue by its tag" in record["recovered"]


def test_sbatch_own_timeout_without_a_job_says_it_may_appear(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    slurm.submit = lambda job: (_ for _ in ()).throw(SlurmUnavailable("Slurm is unreachable: socket timed out."))
    req = request(world, tmp_path / "jobs" / "a")
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm, timeout_waits=(0.0,))
    assert exc.value.exit_code == EXIT_SLURM_UNAVAILABLE
    assert f"frenzy:{req.submission}" in exc.value.message and "may still have been created" in exc.value.message


# -- a full disk and signals during sbatch ----------------------------------------------------------------


def test_disk_full_after_sbatch_names_the_job_and_a_rerun_records_it(world, tmp_path, monkeypatch):
    import frenzy_slurm.submission as sub

    slurm = FakeSlurm(world[0], user=getpass.getuser())
    req = request(world, tmp_path / "jobs" / "a")
    real = sub.write_json

    def full(path, data, mode=0o600):
        if path.name == "submission.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, mode)

    monkeypatch.setattr(sub, "write_json", full)
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    (job_id,) = slurm.fake_jobs
    assert exc.value.exit_code == EXIT_FAILURE
    msg = exc.value.message
    assert f"job {job_id} was submitted" in msg and "No space left on device" in msg
    assert str(req.job_dir / "submission.json") in msg and f"frenzy:{req.submission}" in msg
    monkeypatch.setattr(sub, "write_json", real)  # space again: the same fsbatch finds the job, submits nothing
    with pytest.raises(FrenzyError) as again:
        submit(request(world, req.job_dir), slurm)
    assert again.value.exit_code == EXIT_ALREADY_SUBMITTED and str(job_id) in again.value.message
    assert json.loads((req.job_dir / "submission.json").read_text())["job_id"] == job_id
    assert list(slurm.fake_jobs) == [job_id]


def test_sigterm_during_sbatch_records_the_job_before_stopping(world, tmp_path, capfd):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, None, signals=1)
    req = request(world, tmp_path / "jobs" / "a")
    before = signal.getsignal(signal.SIGTERM)  # another test (or the runtime's signals module) may have set one
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    (job_id,) = slurm.fake_jobs
    assert exc.value.exit_code == 128 + signal.SIGTERM
    assert f"job {job_id} was submitted and recorded" in exc.value.message
    assert json.loads((req.job_dir / "submission.json").read_text())["job_id"] == job_id
    assert "SIGTERM received: finishing the submission first" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_second_signal_stops_at_once_naming_the_tag(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, None, signals=2)
    req = request(world, tmp_path / "jobs" / "a")
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    assert exc.value.exit_code == 128 + signal.SIGTERM
    assert f"frenzy:{req.submission}" in exc.value.message and "a job may have been created" in exc.value.message
    assert not (req.job_dir / "submission.json").exists()
    with pytest.raises(FrenzyError) as again:  # the same fsbatch finds it by its tag
        submit(request(world, req.job_dir), slurm)
    assert again.value.exit_code == EXIT_ALREADY_SUBMITTED
    assert (req.job_dir / "submission.json").exists()
