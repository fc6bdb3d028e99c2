"""`Job.logs()`, `Job.stdout()`, `Job.stderr()`: a job's output from Python, as `fsqueue JOBID --log` shows it
(per rank) or as Slurm wrote it (merged), and the output and error files as submitit's job.stdout()/stderr()
give them: None before the job has written them."""

from __future__ import annotations

import getpass

import pytest

from frenzy_slurm.api import Job
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit

from .helpers import LOCAL, fill, make_spec, planned
from .test_track_log import HETERO_SPEC

WRITTEN = "frenzy-slurm: job started\n0: rank 0 step 1\n2: rank 2 step 1\n0: rank 0 step 2\nsrun: done\n"


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


def submitted(tmp_path, **slurm_flags):
    """A two-component job (v100 ranks 0-1, t4 ranks 2-3) as the API follows it."""
    from frenzy_slurm.jobspec.job import SlurmOptions

    view = fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    req = planned(make_spec(**HETERO_SPEC), view, tmp_path / "jobs" / "h", options=SlurmOptions(**slurm_flags))
    slurm = FakeSlurm(view, user=getpass.getuser())
    done = submit(req, slurm)
    return Job(done.job_id, done.job_dir, slurm)


def test_logs_per_rank_and_merged(tmp_path):
    job = submitted(tmp_path)
    assert job.logs() == "" and job.stdout() is None and job.stderr() is None  # not started yet
    (job.job_dir / f"slurm-{job.job_id}.out").write_text(WRITTEN)
    assert job.logs() == (
        "==> batch script and srun <==\nfrenzy-slurm: job started\nsrun: done\n"
        "==> component 0 (v100) rank 0 <==\nrank 0 step 1\nrank 0 step 2\n"
        "==> component 0 (v100) rank 1 <==\n"
        "==> component 1 (t4) rank 2 <==\nrank 2 step 1\n"
        "==> component 1 (t4) rank 3 <==\n"
    )
    assert job.logs(rank=0, tail=1) == "==> component 0 (v100) rank 0 <==\nrank 0 step 2\n"
    assert job.logs(component=1) == "==> component 1 (t4) rank 2 <==\nrank 2 step 1\n==> component 1 (t4) rank 3 <==\n"
    assert job.logs(merged=True) == WRITTEN
    # Slurm's default: both streams in the output file
    assert job.stdout() == WRITTEN and job.stderr() == WRITTEN
    with pytest.raises(InputError, match="rank 9: job"):
        job.logs(rank=9)
    with pytest.raises(InputError, match="merged=True"):
        job.logs(merged=True, tail=3)


def test_a_separate_error_file(tmp_path):
    job = submitted(tmp_path, output="out-%j.txt", error="err-%x-%j.txt")
    (job.job_dir / f"out-{job.job_id}.txt").write_text("0: hello\n")
    assert job.stdout() == "0: hello\n" and job.stderr() is None
    (job.job_dir / f"err-{job.tracked().name}-{job.job_id}.txt").write_text("1: oops\n")
    assert job.stderr() == "1: oops\n"
    assert job.logs(merged=True) == "0: hello\n1: oops\n"
    assert job.logs(rank=1) == "==> component 0 (v100) rank 1 <==\noops\n"
