"""`fsqueue JOBID --log --follow`: the job's output as --log prints it, then each new line as it is written
(a header where the rank changes), until the job ends, with the job's status as exit code; Slurm asked
gently (back-off, and at once when finished.json appears); a pending job waited for; Ctrl-C quiet (130); a
closed pipe quiet. Against FakeSlurm, whose clock moves when the follow sleeps."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import frenzy_slurm.slurm as seam
from frenzy_slurm.cli.fsqueue import main
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track import follow

from .helpers import LOCAL, ROOT, fill, make_spec, planned
from .test_track_log import HETERO_SPEC


@pytest.fixture(autouse=True)
def private_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class Counting(FakeSlurm):
    """FakeSlurm that counts the job-state queries the follow makes."""

    queries = 0

    def jobs(self, job_ids=None, user=None):
        self.queries += 1
        return super().jobs(job_ids=job_ids, user=user)


@pytest.fixture
def running(tmp_path, monkeypatch):
    """A two-component job (v100 ranks 0-1, t4 ranks 2-3) running for 20 s, with its first lines written."""
    view = fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    req = planned(make_spec(**HETERO_SPEC), view, tmp_path / "jobs" / "h")
    slurm = Counting(view, user=getpass.getuser())
    done = submit(req, slurm)
    slurm.set_run_time(done.job_id, 20)
    out = done.job_dir / f"slurm-{done.job_id}.out"
    out.write_text("frenzy-slurm: job started\n0: rank 0 step 0\n2: rank 2 step 0\n")
    monkeypatch.setattr(seam, "open_backend", lambda backend, snapshot=None: slurm)
    monkeypatch.setattr(follow, "_clock", lambda: slurm.now)
    return slurm, done, out


def run_follow(slurm, monkeypatch, sleep, *args: str):
    monkeypatch.setattr(follow, "_sleep", sleep)
    slurm.queries = 0
    return CliRunner().invoke(main, list(args))


def test_follow_prints_new_lines_until_the_job_ends_and_exits_0(running, monkeypatch):
    slurm, done, out = running
    ticks = []

    def sleep(seconds: float) -> None:
        ticks.append(seconds)
        with out.open("a") as f:  # rank 1 writes a line in two pieces: printed once whole
            f.write(f"1: rank 1 step {len(ticks)}" if len(ticks) == 3 else "\n" if len(ticks) == 4 else "")
            if len(ticks) == 6:
                f.write("0: rank 0 done\nsrun: step ended\n")
        slurm.advance(seconds)

    res = run_follow(slurm, monkeypatch, sleep, str(done.job_id), "--log", "--follow")
    assert res.exit_code == 0, res.stdout + res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith(f"job {done.job_id} ") and lines[0].endswith(f"RUNNING; output {out}")
    assert lines[1:] == [
        "==> batch script and srun <==",
        "frenzy-slurm: job started",
        "==> component 0 (v100) rank 0 <==",
        "rank 0 step 0",
        "==> component 0 (v100) rank 1 <==",
        "==> component 1 (t4) rank 2 <==",
        "rank 2 step 0",
        "==> component 1 (t4) rank 3 <==",
        "==> component 0 (v100) rank 1 <==",
        "rank 1 step 3",
        "==> component 0 (v100) rank 0 <==",
        "rank 0 done",
        "==> batch script and srun <==",
        "srun: step ended",
    ]
    assert f"job {done.job_id} ended COMPLETED, exit code 0" in res.stderr
    # the files every second, Slurm with back-off (after 2 s, 3 s, 4.5 s, ...): the end seen within the longest wait
    assert set(ticks) == {follow.READ_EVERY_S} and 20 <= len(ticks) <= 20 + follow.LONGEST_QUERY_S
    assert slurm.queries <= 6


def test_follow_exits_with_the_jobs_status_and_asks_slurm_when_it_finishes(running, monkeypatch):
    slurm, done, out = running
    slurm.set_run_time(done.job_id, 3600)

    def sleep(seconds: float) -> None:
        slurm.advance(seconds)
        if slurm.now - slurm.fake_jobs[done.job_id].start >= 30 and slurm.fake_jobs[done.job_id].state == "RUNNING":
            with out.open("a") as f:
                f.write("3: Traceback\nsrun: error: task 3: Exited with exit code 3\n")
            slurm.fake_jobs[done.job_id].state, slurm.fake_jobs[done.job_id].end = "FAILED", slurm.now
            (done.job_dir / "finished.json").write_text(json.dumps({"job_id": str(done.job_id), "exit_code": 3}))
            sleep.ended = slurm.now

    res = run_follow(slurm, monkeypatch, sleep, str(done.job_id), "--log", "--follow", "--rank", "3")
    assert res.exit_code == 3, res.stdout + res.stderr
    assert res.stdout.splitlines()[1:] == ["==> component 1 (t4) rank 3 <==", "Traceback"]
    assert "ended FAILED, exit code 3" in res.stderr
    assert slurm.now - sleep.ended <= follow.READ_EVERY_S  # finished.json: asked at once, not after the back-off


def test_a_pending_job_is_waited_for(running, monkeypatch):
    slurm, done, out = running
    out.unlink()
    job = slurm.fake_jobs[done.job_id]
    job.state, job.start = "PENDING", None
    ticks = []

    def sleep(seconds: float) -> None:
        ticks.append(seconds)
        if len(ticks) == 40:  # it starts, writes and ends
            out.write_text("frenzy-slurm: job started\n2: hello\n")
            job.state, job.start, job.end = "COMPLETED", slurm.now, slurm.now
        slurm.now += seconds

    res = run_follow(slurm, monkeypatch, sleep, str(done.job_id), "--log", "-f", "--component", "1")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "is PENDING; waiting for its output" in res.stderr
    assert res.stdout.splitlines()[1:] == ["==> component 1 (t4) rank 2 <==", "hello"]
    assert slurm.queries <= 10  # 40 s: at most every 15 s once the back-off is grown


def test_ctrl_c_stops_following_quietly_with_130(running, monkeypatch):
    slurm, done, _ = running

    def sleep(seconds: float) -> None:
        raise KeyboardInterrupt

    res = run_follow(slurm, monkeypatch, sleep, str(done.job_id), "--log", "--follow")
    assert res.exit_code == 130 and res.stderr == ""
    assert slurm.fake_jobs[done.job_id].state == "RUNNING"  # the job runs on


@pytest.mark.parametrize(
    ("args", "said"),
    [(["--follow"], "--follow go with --log"), (["--log", "--follow", "--json"], "--follow prints lines")],
)
def test_follow_needs_log_and_no_json(running, monkeypatch, args, said):
    slurm, done, _ = running
    res = run_follow(slurm, monkeypatch, lambda s: None, str(done.job_id), *args)
    assert res.exit_code == 2 and said in res.stderr


def test_an_ended_job_prints_all_and_a_closed_pipe_is_quiet(running, tmp_path):
    """A job that has left the queue, from its directory (a saved snapshot knows no jobs), followed into
    `head`: its output up to head's lines, no traceback, no error."""
    slurm, done, out = running
    with out.open("a") as f:
        f.writelines(f"{i % 4}: line {i}\n" for i in range(200_000))
    (done.job_dir / "finished.json").write_text(json.dumps({"job_id": str(done.job_id), "exit_code": 0}))
    snap = tmp_path / "snap.json"
    snap.write_text(slurm.load().model_copy(update={"jobs": []}).model_dump_json())
    env = os.environ | {"FRENZY_JOBS_DIR": str(done.job_dir.parent), "PYTHONPATH": str(ROOT)}
    fsqueue = [sys.executable, "-c", "from frenzy_slurm.cli.fsqueue import main; main()"]
    args = [str(done.job_id), "--log", "--follow", "--backend", "static", "--snapshot", str(snap)]
    whole = subprocess.run([*fsqueue, *args], env=env, capture_output=True, text=True, timeout=120)
    assert whole.returncode == 0 and whole.stdout.splitlines()[-1] == "line 199999", whole.stderr
    assert "ended COMPLETED, exit code 0" in whole.stderr
    piped = subprocess.run(
        ["bash", "-c", 'set -o pipefail; "$@" | head -n 3', "-", *fsqueue, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert piped.stdout.splitlines()[1:] == ["==> batch script and srun <==", "frenzy-slurm: job started"]
    assert "Traceback" not in piped.stderr and "Error" not in piped.stderr, piped.stderr
