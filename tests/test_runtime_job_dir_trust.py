"""The job trusts only the directory and files its submission made: a directory swapped in its place or a
changed plan.json stops the runtime with one message (exit 2) before it reads anything there, and the trainer
loads only checkpoints the job itself wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.submission import submit

from .helpers import LOCAL, planned
from .trust_world import fake, private_lock_dir, refusal, request, world  # noqa: F401  (fixtures)

# --- the directory and files the submission recorded -----------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _job_env(script: str) -> dict[str, str]:
    """The FRENZY_* values job.sbatch exports (what Slurm's copy of the script gives the job)."""
    import shlex

    env: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export FRENZY_"):
            for word in shlex.split(line)[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def written(world, job_dir: Path):
    """A job directory as fsbatch writes it (fake Slurm), and the environment its script gives the job."""
    req = request(world, job_dir)
    submit(req, fake(world[0]))
    return req, _job_env((job_dir / "job.sbatch").read_text())


def test_job_refuses_a_directory_swapped_in_its_place(world, tmp_path):
    """The audit's attack: the victim's directory renamed away, a copy with a planted plan.json in its place."""
    import shutil

    from frenzy_slurm.runtime.trust import open_job_dir

    req, env = written(world, tmp_path / "jobs" / "a")
    open_job_dir(req.job_dir, env)  # the real one passes
    req.job_dir.rename(tmp_path / "jobs" / "moved")
    shutil.copytree(tmp_path / "jobs" / "moved", req.job_dir)  # same files, another directory
    os.chmod(req.job_dir, 0o700)
    code, msg = refusal(open_job_dir, req.job_dir, env)
    assert code == EXIT_BAD_INPUT and "is not the one fsbatch wrote (inode" in msg


def test_job_refuses_a_changed_plan(world, tmp_path):
    from frenzy_slurm.runtime.trust import open_job_dir

    req, env = written(world, tmp_path / "jobs" / "a")
    plan = req.job_dir / "plan.json"
    plan.write_text(plan.read_text().replace('"steps": 100', '"steps": 101'))
    code, msg = refusal(open_job_dir, req.job_dir, env)
    assert code == EXIT_BAD_INPUT and f"{plan} is not the file fsbatch wrote" in msg


def test_runtime_stops_with_one_message_before_reading_a_swapped_directory(world, tmp_path):
    """The runtime entry point: exit 2 and the reason on stderr, no traceback, nothing of the directory used."""
    import subprocess
    import sys

    req, env = written(world, tmp_path / "jobs" / "a")
    (req.job_dir / "plan.json").write_text("{}")
    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(req.job_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=req.job_dir,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == EXIT_BAD_INPUT and "Traceback" not in res.stderr, res.stderr
    assert "plan.json is not the file fsbatch wrote" in res.stderr


# --- only the job's own checkpoints are loaded ------------------------------------------


def _tiny_job(tmp_path: Path, steps: int, interval: int):
    """tiny-cpu rendered for one CPU rank and written as fsbatch writes it; its script's environment."""
    from frenzy_slurm.jobspec import load_job_spec

    text = (
        (ROOT / "examples" / "tiny-cpu.yaml")
        .read_text()
        .replace("  steps: 6\n", f"  steps: {steps}\n  checkpoint_interval: {interval}\n")
    )
    (tmp_path / "tiny.yaml").write_text(text + "limits:\n  max_gpus: 1\n")  # one CPU rank
    spec = load_job_spec(tmp_path / "tiny.yaml")
    view = synthetic(LOCAL)
    job = planned(
        spec, view, tmp_path / "jobs" / "t", spec_path=tmp_path / "tiny.yaml", model=resolve_model(spec, tmp_path)
    )
    submit(job, fake(view))
    return job.job_dir, _job_env((job.job_dir / "job.sbatch").read_text())


def _train(job_dir: Path, env: dict[str, str]):
    import subprocess
    import sys

    from frenzy_slurm.runtime.dist import free_port

    run_env = {
        **os.environ,
        **env,
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
    }
    for key in ("SLURM_PROCID", "SLURM_JOB_ID", "LOCAL_SIZE"):
        run_env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=job_dir,
        env=run_env,
    )


@pytest.mark.slow
def test_resume_loads_only_checkpoints_the_job_wrote(tmp_path):
    import json

    pytest.importorskip("deepspeed")
    from frenzy_slurm.runtime import checkpoints

    job_dir, env = _tiny_job(tmp_path, steps=4, interval=2)
    first = _train(job_dir, env)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = job_dir / "checkpoints"
    manifest = json.loads((ckpt / "step4" / checkpoints.MANIFEST).read_text())
    assert manifest["files"] and all(len(v) == 64 for v in manifest["files"].values())
    # a longer run of the same directory (a requeue) resumes from its own checkpoint
    (ckpt / "latest").write_text("step2")
    plan = json.loads((job_dir / "plan.json").read_text())
    assert plan["spec"]["training"]["steps"] == 4
    again = _train(job_dir, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((job_dir / "metrics.json").read_text())["resumed_from_step"] == 4
    # a pickle put in place of one of its files is refused before DeepSpeed loads (unpickles) it
    victim = next(n for n in manifest["files"] if n.endswith("model_states.pt"))
    (ckpt / "step4" / victim).write_bytes(b"planted pickle")
    bad = _train(job_dir, env)
    assert bad.returncode == EXIT_BAD_INPUT and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert (
        f"checkpoint checkpoints/step4 is not what this job wrote ({job_dir}/checkpoints/step4/{victim} "
        "differs from what this job wrote" in bad.stderr
    )
    # so is a file added beside the job's own
    (ckpt / "step4" / victim).unlink()
    (ckpt / "step4" / "zz_extra_optim_states.pt").write_bytes(b"planted")
    bad = _train(job_dir, env)
    assert bad.returncode == EXIT_BAD_INPUT and "zz_extra_optim_states.pt was not written by this job" in bad.stderr
