"""What fsqueue reads of a job directory: only your own, only regular files, bounded. Another user's FIFO or
/dev/zero never blocks it, a checkpoint tag is not read through a link, a malformed record is no record.

Tests with a second local user (`other_user`, an unprivileged `fsaudit`) need root and skip without it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL, ROOT
from .users import as_user, other_user  # noqa: F401 (fixture)

FSQUEUE = "import sys; from frenzy_slurm.cli.fsqueue import main; sys.argv[0] = 'fsqueue'; main()"


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _snapshot(path: Path, jobs: list[Job]) -> Path:
    """A static-backend snapshot holding these queue jobs (fsqueue --backend static reads its jobs)."""
    from frenzy_slurm.sim.synthetic import synthetic

    view = synthetic(LOCAL)
    path.write_text(view.model_copy(update={"jobs": jobs}).model_dump_json())
    return path


def _fsqueue(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FRENZY_JOBS_DIR": str(tmp_path / "jobs")}
    return subprocess.run(
        [sys.executable, "-c", FSQUEUE, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def _job(job_id: int, user: str, workdir: Path) -> Job:
    return Job(
        job_id=job_id,
        state="RUNNING",
        comment="frenzy:abc",
        user=user,
        workdir=str(workdir),
        name="x",
        partition="a100",
        gpus_per_node=1,
        node_count=1,
        start_time=int(time.time()) - 60,
    )


# ---------------------------------------------------------------- fsqueue reads job directories bounded


def test_fsqueue_all_does_not_open_another_users_job_directory(tmp_path, other_user):
    """The attacker's job directory holds a FIFO as checkpoints/latest and plan.json, and metrics.json is a link to
    /dev/zero: `fsqueue --all` by the victim (root here) returns at once and reads nothing of it."""
    trap = other_user.home / f"trap-{os.getpid()}"
    try:
        res = as_user(
            other_user,
            [
                "sh",
                "-c",
                f"mkdir -p {trap}/checkpoints && mkfifo {trap}/checkpoints/latest "
                f"{trap}/plan.json && ln -s /dev/zero {trap}/metrics.json && "
                f"chmod 755 {trap} {trap}/checkpoints",
            ],
        )
        assert res.returncode == 0, res.stderr
        snap = _snapshot(tmp_path / "snap.json", [_job(41, other_user.name, trap)])
        start = time.monotonic()
        try:
            out = _fsqueue(tmp_path, "--all", "--json", "--backend", "static", "--snapshot", str(snap), timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("fsqueue --all hung on another user's FIFO")
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - start < 30
        (job,) = json.loads(out.stdout)
        assert job["user"] == other_user.name and job["state"] == "RUNNING"
        assert job["plan"] is None and job["metrics"] is None and job["last_checkpoint_step"] is None
        assert any("reads only your own job directories" in n for n in job["notes"]), job["notes"]
        shown = _fsqueue(tmp_path, "41", "--backend", "static", "--snapshot", str(snap), timeout=30)
        assert shown.returncode == 0 and "reads only your own job directories" in shown.stdout, shown.stderr
    finally:
        shutil.rmtree(trap, ignore_errors=True)


def test_fsqueue_own_job_directory_fifo_and_device_are_refused_promptly(tmp_path):
    """Even in one's own job directory: a FIFO as checkpoints/latest or finished.json and /dev/zero as metrics.json
    are no records, read without blocking and without limit."""
    d = tmp_path / "jobs" / "mine"
    (d / "checkpoints").mkdir(parents=True, mode=0o700)
    os.mkfifo(d / "checkpoints" / "latest")
    os.mkfifo(d / "finished.json")
    (d / "metrics.json").symlink_to("/dev/zero")
    (d / "submission.json").write_text(json.dumps({"job_id": 42, "submission": "abc"}))  # fsbatch's record
    snap = _snapshot(tmp_path / "snap.json", [_job(42, _me(), d)])
    try:
        out = _fsqueue(tmp_path, "--json", "--backend", "static", "--snapshot", str(snap), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("fsqueue hung on a FIFO in the job directory")
    assert out.returncode == 0, out.stderr
    (job,) = json.loads(out.stdout)
    assert job["job_id"] == 42 and job["finished"] is None and job["metrics"] is None
    assert job["last_checkpoint_step"] is None


def test_checkpoint_tag_is_not_read_through_a_link(tmp_path):
    from frenzy_slurm.jobdir.checkpoints import latest_step as last_checkpoint

    (tmp_path / "elsewhere").write_text("step7")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").symlink_to(tmp_path / "elsewhere")
    assert last_checkpoint(tmp_path / "ckpt") is None
    (tmp_path / "ckpt" / "latest").unlink()
    (tmp_path / "ckpt" / "latest").write_text("step7\n")
    assert last_checkpoint(tmp_path / "ckpt") == 7
    (tmp_path / "ckpt" / "latest").write_text("step7" + " " * 10_000)  # a tag is a few bytes
    assert last_checkpoint(tmp_path / "ckpt") is None


def test_job_directory_owned_by_someone_else_is_not_read_for_your_job(tmp_path, other_user):
    """A job of yours whose working directory belongs to another user (they control its files): not read, and
    not taken for a frenzy-slurm job (fsbatch's job directories are the user's own), whatever its record says."""
    from frenzy_slurm.track.jobs import frenzy_jobs

    d = tmp_path / "theirs"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"step": 99}))
    (d / "submission.json").write_text(json.dumps({"job_id": 43, "submission": "abc"}))
    for f in (d, d / "metrics.json", d / "submission.json"):
        os.chown(f, other_user.uid, other_user.gid)
    assert frenzy_jobs([_job(43, _me(), d)]) == []


def test_find_job_dir_ignores_a_malformed_submission(tmp_path):
    from frenzy_slurm.track.jobs import find_job_dir

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "submission.json").write_text(json.dumps({"job_id": "x1"}))  # int() raised before
    assert find_job_dir(17, [tmp_path]) is None
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "submission.json").write_text(json.dumps({"job_id": "17"}))
    assert find_job_dir(17, [tmp_path]) == tmp_path / "b"
