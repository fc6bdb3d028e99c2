"""A job resumes from another job's checkpoints only when it was moved there, and only from the user's own files.

FRENZY_RESUME_DIR left in the submitting shell reached a job that was never moved (sbatch exports the
submitter's environment), and in_job.latest_checkpoint() then resumed from another user's directory without a
check: torch.load unpickles what it reads, so that user's code would run in the job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm import in_job

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = (
    "import os\n"
    "from frenzy_slurm import in_job\n"
    "print(os.environ.get('FRENZY_RESUME_DIR'), os.environ.get('FRENZY_STOP_SIGNAL'), in_job.latest_checkpoint())\n"
)


def _checkpoints(root: Path, step: int = 7) -> Path:
    d = root / "checkpoints"
    (d / f"step{step}").mkdir(parents=True)
    return d


def test_an_inherited_resume_dir_never_reaches_a_job_that_was_not_moved(tmp_path):
    elsewhere = _checkpoints(tmp_path / "someone-else")  # private and the user's own: only the inheritance is wrong
    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FRENZY_RESUME_DIR": str(elsewhere),
        "FRENZY_STOP_SIGNAL": "SIGUSR2",
        "FRENZY_NVML_SAMPLER": "0",
    }
    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job), "--script", str(script)],
        cwd=job,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["None", "None", "None"], res.stdout


@pytest.fixture
def fresh_job(tmp_path, monkeypatch):
    """in_job as a job sees it: an empty checkpoint directory of its own."""
    monkeypatch.setenv("FRENZY_CHECKPOINT_DIR", str(tmp_path / "job" / "checkpoints"))
    return tmp_path


def test_a_private_moved_directory_is_resumed_from(fresh_job, monkeypatch):
    moved = _checkpoints(fresh_job / "old")
    monkeypatch.setenv("FRENZY_RESUME_DIR", str(moved))
    assert in_job.latest_checkpoint() == moved / "step7"


def test_a_directory_others_can_write_is_not_resumed_from(fresh_job, monkeypatch, capsys):
    moved = _checkpoints(fresh_job / "old")
    moved.chmod(0o777)
    monkeypatch.setenv("FRENZY_RESUME_DIR", str(moved))
    assert in_job.latest_checkpoint() is None
    assert f"not resuming from {moved}: FRENZY_RESUME_DIR {moved} is writable by" in capsys.readouterr().err


def test_another_users_directory_is_not_resumed_from(fresh_job, monkeypatch, other_user, capsys):
    moved = _checkpoints(fresh_job / "old")
    os.chown(moved, other_user.uid, other_user.gid)
    monkeypatch.setenv("FRENZY_RESUME_DIR", str(moved))
    assert in_job.latest_checkpoint() is None
    assert f"FRENZY_RESUME_DIR {moved} belongs to {other_user.name}, not to you" in capsys.readouterr().err
