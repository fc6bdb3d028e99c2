"""The job directory's rules, each written once in frenzy_slurm.jobdir: one reader of `checkpoints/latest` for
fsqueue, the trainer and a user's script; one default jobs folder; one private-group rule for job directories;
and `in_job`, which reads checkpoints through jobdir, still imports nothing beyond the standard library."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm import in_job
from frenzy_slurm.core import inputfile
from frenzy_slurm.jobdir import checkpoints, paths, safety
from frenzy_slurm.runtime import checkpoints as runtime_checkpoints
from frenzy_slurm.track import jobs as track

ROOT = Path(__file__).resolve().parent.parent


def test_importing_in_job_loads_only_the_standard_library(tmp_path):
    """A user's script imports in_job before torch: nothing of pydantic, PyYAML, jinja2 or torch, and of
    frenzy_slurm only the modules on the way to the checkpoint reader."""
    code = "import json, sys\nfrom frenzy_slurm import in_job\nprint(json.dumps(sorted(sys.modules)))"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    modules = set(json.loads(res.stdout))
    assert not {"pydantic", "yaml", "jinja2", "torch", "click"} & modules
    assert {m for m in modules if m.startswith("frenzy_slurm")} == {
        "frenzy_slurm",
        "frenzy_slurm.in_job",
        "frenzy_slurm.jobdir",
        "frenzy_slurm.jobdir.checkpoints",
        "frenzy_slurm.core",
        "frenzy_slurm.core.errors",
        "frenzy_slurm.core.inputfile",
        "frenzy_slurm.core.version",
    }


@pytest.fixture
def ckpt(tmp_path) -> Path:
    d = tmp_path / "checkpoints"
    for step in (5, 9):
        (d / f"step{step}").mkdir(parents=True)
    return d


def test_fsqueue_the_trainer_and_in_job_read_latest_alike(ckpt, monkeypatch):
    (ckpt / "latest").write_text("step5\n")
    monkeypatch.setenv("FRENZY_CHECKPOINT_DIR", str(ckpt))
    monkeypatch.delenv("FRENZY_RESUME_DIR", raising=False)
    assert checkpoints.latest_step(ckpt) == runtime_checkpoints.latest_step(ckpt) == 5
    assert track.latest_step is checkpoints.latest_step  # what fsqueue shows as the last checkpoint
    assert in_job.latest_checkpoint() == ckpt / "step5"


def test_a_latest_that_is_a_link_is_read_by_none_of_them(ckpt, tmp_path, monkeypatch):
    """`latest` planted as a link (to a file of someone else's choosing) is not followed: before, the trainer's
    pruning and in_job read through it; now all fall back as if there were none."""
    (tmp_path / "elsewhere").write_text("step5")
    (ckpt / "latest").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("FRENZY_CHECKPOINT_DIR", str(ckpt))
    monkeypatch.delenv("FRENZY_RESUME_DIR", raising=False)
    assert runtime_checkpoints.latest_step(ckpt) is None
    assert in_job.latest_checkpoint() == ckpt / "step9"  # the highest-numbered directory, as without `latest`


@pytest.mark.parametrize("text", ["", "global_step5", "step", "x" * 5000])
def test_a_latest_naming_no_step_tag_gives_no_step(ckpt, text):
    (ckpt / "latest").write_text(text)
    assert checkpoints.latest_step(ckpt) is None


def test_an_oversized_latest_is_not_read_as_a_tag(ckpt, monkeypatch):
    (ckpt / "latest").write_text("step9" + " " * checkpoints.MAX_LATEST_BYTES)
    assert checkpoints.latest_tag(ckpt) is None


def test_the_default_jobs_folder_is_decided_once(monkeypatch, tmp_path):
    monkeypatch.delenv("FRENZY_JOBS_DIR", raising=False)
    assert paths.jobs_dir() == Path("frenzy-jobs")
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    assert paths.jobs_dir() == tmp_path / "jobs"
    assert paths.default_job_dir("tiny", "0123456789abcdef") == tmp_path / "jobs" / "tiny-01234567"


def test_a_job_directory_trusts_only_your_own_private_group(monkeypatch):
    """The trusted-file rule accepts a private group of the directory's owner or of yours; a job directory,
    which must be yours, only yours. One predicate (inputfile.group_private_to) answers both."""
    asked: list[tuple[int, int]] = []

    def private_to(gid: int, uid: int) -> bool:
        asked.append((gid, uid))
        return uid == 1234  # a private group of the owner's, not of yours

    monkeypatch.setattr(inputfile, "group_private_to", private_to)
    st = os.stat_result((stat.S_IFDIR | 0o770, 0, 0, 0, 1234, 77, 0, 0, 0, 0))
    assert inputfile.writable_by_others(st) is None
    assert safety.writable_by_others(st) == "its group"
    assert (77, os.geteuid()) in asked
