"""Reruns: fsbatch refuses a submission only while its earlier job lives (queued, running, or not yet visible
to Slurm shortly after sbatch); once that job has ended it submits a rerun into a new job directory and says
which job it follows. Against FakeSlurm: each state (and a rebuilt cluster that reuses the job id) is set on
demand, which real Slurm cannot do; tests/test_submit_rerun_live.py runs the same on the live cluster."""

from __future__ import annotations

import getpass
import json
import threading

import pytest

import frenzy_slurm.submission as sub
from frenzy_slurm.core.errors import EXIT_ALREADY_SUBMITTED, EXIT_BAD_INPUT, FrenzyError
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import BatchJob, ComponentRequest
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import SUBMIT_GRACE_S, submit

from .helpers import LOCAL, make_spec, planned


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def world():
    return synthetic(LOCAL), make_spec()


def request(world, job_dir, **kw):
    view, spec = world
    return planned(spec, view, job_dir, **kw)


def refused(req, slurm) -> str:
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    assert exc.value.exit_code == EXIT_ALREADY_SUBMITTED, exc.value.message
    return exc.value.message


def age_record(job_dir, seconds: float) -> None:
    """As if sbatch had answered `seconds` ago (the grace window runs on the wall clock)."""
    path = job_dir / "submission.json"
    record = json.loads(path.read_text())
    record["submitted_at"] -= seconds
    path.write_text(json.dumps(record))


def first_job(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    req = request(world, tmp_path / "jobs" / "a")
    return slurm, req, submit(req, slurm)


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "SUSPENDED", "COMPLETING", "REQUEUED", "CONFIGURING"])
def test_a_live_earlier_job_refuses_the_same_submission(world, tmp_path, state):
    slurm, req, done = first_job(world, tmp_path)
    slurm.fake_jobs[done.job_id].state = state
    msg = refused(request(world, req.job_dir), slurm)
    assert f"job {done.job_id} was already submitted from {req.job_dir}" in msg and f"is {state}" in msg
    msg = refused(request(world, tmp_path / "elsewhere" / "b"), slurm)  # from another directory too
    assert str(done.job_id) in msg
    assert list(slurm.fake_jobs) == [done.job_id] and not (tmp_path / "elsewhere" / "b").exists()


@pytest.mark.parametrize("state", ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"])
def test_an_ended_job_is_followed_by_a_rerun_in_a_new_directory(world, tmp_path, state):
    slurm, req, done = first_job(world, tmp_path)
    (req.job_dir / "metrics.json").write_text('{"step": 6}')
    slurm.fake_jobs[done.job_id].state = state
    before = {p.name: p.read_bytes() for p in req.job_dir.iterdir()}
    again = request(world, req.job_dir)  # what the same fsbatch plans: the used directory's first free sibling
    assert again.job_dir == req.job_dir.with_name("a.2") and again.earlier_job_dir == req.job_dir
    rerun = submit(again, slurm)
    assert rerun.job_id != done.job_id and rerun.job_dir == again.job_dir
    assert rerun.follows == sub.Followed(done.job_id, req.job_dir, state)
    assert {p.name: p.read_bytes() for p in req.job_dir.iterdir()} == before  # nothing of the earlier job touched
    assert json.loads((rerun.job_dir / "submission.json").read_text())["job_id"] == rerun.job_id
    # and the rerun, now queued, refuses the next one in its turn
    msg = refused(request(world, req.job_dir), slurm)
    assert f"job {rerun.job_id} was already submitted from {rerun.job_dir}" in msg


def test_job_gone_from_slurm_counts_as_alive_only_within_the_grace_window(world, tmp_path):
    slurm, req, done = first_job(world, tmp_path)
    del slurm.fake_jobs[done.job_id]  # neither squeue nor sacct knows it (yet, or any more)
    msg = refused(request(world, req.job_dir), slurm)
    assert "not yet visible to Slurm" in msg and f"{SUBMIT_GRACE_S:.0f} s" in msg
    age_record(req.job_dir, SUBMIT_GRACE_S + 1)
    rerun = submit(request(world, req.job_dir), slurm)
    assert rerun.follows is not None and (rerun.follows.job_id, rerun.follows.state) == (done.job_id, "gone")


def test_left_the_queue_accounting_decides(world, tmp_path, monkeypatch):
    slurm, req, done = first_job(world, tmp_path)
    age_record(req.job_dir, SUBMIT_GRACE_S + 1)
    monkeypatch.setattr(slurm, "jobs", lambda job_ids=None, user=None: [])  # past MinJobAge: squeue forgot it
    slurm.fake_jobs[done.job_id].state = "RUNNING"  # accounting that never heard of the end (a lost record)
    msg = refused(request(world, req.job_dir), slurm)
    assert "RUNNING in Slurm's accounting" in msg
    slurm.fake_jobs[done.job_id].state = "COMPLETED"
    rerun = submit(request(world, req.job_dir), slurm)
    assert rerun.follows == sub.Followed(done.job_id, req.job_dir, "COMPLETED")


def test_finished_record_of_that_job_ends_it_within_the_grace_window(world, tmp_path):
    slurm, req, done = first_job(world, tmp_path)
    del slurm.fake_jobs[done.job_id]
    (req.job_dir / "finished.json").write_text(json.dumps({"job_id": str(done.job_id), "exit_code": 0}))
    rerun = submit(request(world, req.job_dir), slurm)
    assert rerun.follows == sub.Followed(done.job_id, req.job_dir, "COMPLETED")


def test_rebuilt_cluster_that_gave_the_id_to_another_job(world, tmp_path):
    """The old job id now names someone else's running job: it carries no tag and another working directory."""
    slurm, req, done = first_job(world, tmp_path)
    age_record(req.job_dir, SUBMIT_GRACE_S + 1)
    rebuilt = FakeSlurm(world[0], user=getpass.getuser())
    other = rebuilt.submit(
        BatchJob(
            script=tmp_path / "x.sbatch",
            workdir=tmp_path / "theirs",
            components=[
                ComponentRequest(partition="a100", gpu_type="a100_40gb", nodes=1, gpus_per_node=1, time_min=60)
            ],
            comment="their own",
        )
    )
    assert other.job_id == done.job_id and rebuilt.fake_jobs[other.job_id].state == "RUNNING"
    rerun = submit(request(world, tmp_path / "new-login-dir" / "a"), rebuilt)
    assert rerun.job_id != done.job_id and rerun.follows == sub.Followed(done.job_id, req.job_dir, "gone")


def test_rerun_from_another_directory_follows_the_latest_ended_job(world, tmp_path):
    slurm, req, done = first_job(world, tmp_path)
    slurm.fake_jobs[done.job_id].state = "COMPLETED"
    second = submit(request(world, tmp_path / "two" / "b"), slurm)
    assert second.follows is not None and second.follows.job_id == done.job_id
    slurm.fake_jobs[second.job_id].state = "FAILED"
    third = submit(request(world, tmp_path / "three" / "c"), slurm)
    assert third.follows == sub.Followed(second.job_id, tmp_path / "two" / "b", "FAILED")


def test_concurrent_reruns_after_the_job_ended_give_one_job(world, tmp_path):
    slurm, req, done = first_job(world, tmp_path)
    slurm.fake_jobs[done.job_id].state = "COMPLETED"
    results: list[object] = []

    def one(i: int) -> None:
        try:
            results.append(submit(request(world, tmp_path / f"d{i}" / "job"), slurm))
        except FrenzyError as exc:
            results.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made = [r for r in results if isinstance(r, sub.Submitted)]
    assert len(made) == 1 and len(slurm.fake_jobs) == 2
    assert all(r.exit_code == EXIT_ALREADY_SUBMITTED for r in results if isinstance(r, FrenzyError))


def test_force_submits_while_the_earlier_job_runs(world, tmp_path):
    slurm, req, done = first_job(world, tmp_path)
    forced = submit(request(world, req.job_dir, force=True), slurm)
    assert forced.job_id != done.job_id and forced.job_dir.name == "a.2" and forced.follows is None


def test_request_planned_before_its_directory_was_used_is_refused_not_overwritten(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    stale = request(world, tmp_path / "jobs" / "a")  # planned (as by the API) but not submitted yet
    done = submit(request(world, tmp_path / "jobs" / "a"), slurm)
    slurm.fake_jobs[done.job_id].state = "COMPLETED"
    with pytest.raises(FrenzyError) as exc:
        submit(stale, slurm)
    assert exc.value.exit_code == EXIT_BAD_INPUT and "Run fsbatch again" in exc.value.message
    assert json.loads((stale.job_dir / "submission.json").read_text())["job_id"] == done.job_id
