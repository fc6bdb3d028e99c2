"""What the job-directory trust modules share (tests/test_jobdir_trust.py: the submission's side,
tests/test_runtime_job_dir_trust.py: the job's; tests/test_runtime_rendezvous_port.py takes the world and the
request): a private lock directory for every test, one planned world per module, the request fsbatch would submit
into a directory, a fake Slurm run as this user, and a refusal's exit code and message. The modules import the
fixtures by name, which is how pytest finds them (the lock directory only where imported)."""

from __future__ import annotations

import getpass
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import FrenzyError
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm

from .helpers import LOCAL, make_spec, plan, planned


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    lock = tmp_path / "locks"
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(lock))
    return lock


@pytest.fixture(scope="module")
def world():
    view = synthetic(LOCAL)
    spec = make_spec()
    return view, spec, plan(spec, view)


def request(world, job_dir: Path, **spec_over):
    """The request fsbatch would submit (planning.plan_job) into `job_dir`."""
    view, spec, _ = world
    if spec_over:
        spec = make_spec(**spec_over)
    return planned(spec, view, job_dir)


def fake(view) -> FakeSlurm:
    return FakeSlurm(view, user=getpass.getuser())


def refusal(fn, *args, **kw) -> tuple[int, str]:
    with pytest.raises(FrenzyError) as exc:
        fn(*args, **kw)
    return exc.value.exit_code, exc.value.message
