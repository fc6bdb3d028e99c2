"""`frenzy-slurm salloc`: the planned allocation as salloc's options (hetjob components `:`-separated), the job
directory written for the launcher, and salloc exec'd through the Slurm seam."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from frenzy_slurm.cli.admin import main
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import commands
from frenzy_slurm.submission.interactive import salloc_command

from .helpers import EXAMPLES, LOCAL, ROOT, fill, make_spec, planned

JOB_DIR = Path("/scratch/jobs/alloc-0001")
OFFLINE = ["--backend", "static", "--snapshot", str(EXAMPLES / "offline" / "cluster.json")]
CPU_SITE = ["--site", str(ROOT / "site_configs" / "devcluster-cpu.yaml")]


def test_homogeneous_plan_as_salloc_options():
    options = SlurmOptions(account="proj1", qos="normal", constraint="nvlink", exclusive=True)
    req = planned(make_spec(), synthetic(LOCAL), JOB_DIR, options=options)
    (c,) = req.decision.chosen.components
    gres = f"gpu:{c.gpu_type}:{c.gpus_per_node}"
    assert salloc_command(req, ["hostname"]) == [
        "salloc", f"--partition={c.partition}", f"--nodes={c.nodes}", f"--gres={gres}",
        f"--ntasks-per-node={c.gpus_per_node}", f"--cpus-per-task={c.cpus_per_task}",
        f"--time={req.plan.time_min}", "--job-name=t", "--account=proj1", "--qos=normal",
        "--constraint=nvlink", "--exclusive", "hostname",
    ]  # fmt: skip


def test_heterogeneous_plan_is_colon_separated_components():
    view = fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    spec = make_spec(
        model={"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
        training={"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
    )
    req = planned(spec, view, JOB_DIR, options=SlurmOptions(constraint="ib"))
    assert req.kind == "heterogeneous"
    argv = salloc_command(req, [])
    first, second = " ".join(argv[1:]).split(" : ")
    a, b = req.decision.chosen.components
    assert first == (
        f"--partition={a.partition} --nodes=1 --gres=gpu:{a.gpu_type}:2 --ntasks-per-node=2 "
        f"--cpus-per-task={a.cpus_per_task} --time={req.plan.time_min} --job-name=t --constraint=ib"
    )
    # the time limit and name propagate to later components (Slurm's heterogeneous_jobs.html); -C does not
    assert second == (
        f"--partition={b.partition} --nodes=1 --gres=gpu:{b.gpu_type}:2 --ntasks-per-node=2 "
        f"--cpus-per-task={b.cpus_per_task} --constraint=ib"
    )


def test_dry_run_prints_the_command_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    res = CliRunner().invoke(
        main,
        [
            "salloc",
            str(EXAMPLES / "tiny-cpu.yaml"),
            *OFFLINE,
            *CPU_SITE,
            "--dry-run",
            "-t",
            "30",
            "--",
            "nvidia-smi",
            "-L",
        ],
    )
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("salloc --partition=") and res.stdout.endswith(
        " --time=30 --job-name=tiny-cpu nvidia-smi -L\n"
    )
    assert "nothing allocated" in res.stderr
    assert not (tmp_path / "jobs").exists()


@pytest.fixture
def fake_salloc(tmp_path, monkeypatch):
    """A `salloc` on PATH, and os.execvpe recorded instead of run."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "salloc").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "salloc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    calls: list[tuple[str, list[str], dict[str, str]]] = []
    monkeypatch.setattr(commands.os, "execvpe", lambda file, argv, env: calls.append((file, argv, env)))
    return calls


def test_allocation_writes_the_job_directory_and_execs_salloc(tmp_path, monkeypatch, fake_salloc):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    res = CliRunner().invoke(main, ["salloc", str(EXAMPLES / "tiny-cpu.yaml"), *OFFLINE, *CPU_SITE, "--no-env-check"])
    assert res.exit_code == 0, res.output
    ((file, argv, env),) = fake_salloc
    assert file == "salloc" and argv[0] == "salloc" and argv[-1] == "--job-name=tiny-cpu"  # no command: the shell
    job_dir = Path(env["FRENZY_JOB_DIR"])
    script = (job_dir / "job.sbatch").read_text()
    assert f"export FRENZY_JOB_DIR_INODE={job_dir.stat().st_ino} " in script  # bound, as fsbatch writes it
    assert oct(job_dir.stat().st_mode & 0o777) == "0o700"
    assert f"`bash {job_dir}/job.sbatch`" in res.stderr


def test_missing_salloc_is_slurm_unavailable(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    res = CliRunner().invoke(main, ["salloc", str(EXAMPLES / "tiny-cpu.yaml"), *OFFLINE, *CPU_SITE, "--no-env-check"])
    assert res.exit_code == 4 and "'salloc' was not found" in res.stderr
