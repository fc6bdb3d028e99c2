"""On the real local cluster: fscancel of a job and of a heterogeneous job as one job (directories kept), by
name and never a job that is not ours; in an outage fscancel says so; `fsqueue JOBID --log` splits a real job's
output per component and rank, and reads the directory while slurmctld is down."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, fsbatch_json, run_cli, wait_done
from .slurm_fixture import occupy_gpus, sh, wait_for

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


def fscancel(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from frenzy_slurm.cli.fscancel import main; sys.argv[0] = 'fscancel'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def slurm_state(job: int) -> str:
    return sh("squeue", "-h", "--states=all", "-j", str(job), "-o", "%T").split("\n")[0]


def submit_talking_hetjob(spec: Path, script: Path) -> tuple[int, Path]:
    """A heterogeneous job planned and submitted as fsbatch does, whose ranks run `script` instead of the trainer.

    Only the built-in trainer gets heterogeneous plans (a user's script cannot run pipeline stages across GPU
    types), and it would train the big model for real: the rendered job.sbatch is kept, its srun step (with
    --label, as rendered) launches the script."""
    from dataclasses import replace
    from types import MappingProxyType

    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import PlanOptions, find_site_file, load_job, plan_job
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.submission import submit

    backend = open_backend("cli")
    req = plan_job(load_job(spec), find_site_file(None), backend, PlanOptions(slurm=SlurmOptions()))
    assert req.kind == "heterogeneous", req.decision.chosen
    lines = req.script.splitlines(keepends=True)
    (i,) = [k for k, line in enumerate(lines) if line.startswith("srun ")]
    assert lines[i].startswith("srun --het-group=0,1 --kill-on-bad-exit=1 --label "), lines[i]
    lines[i] = f"srun --het-group=0,1 --kill-on-bad-exit=1 --label {sys.executable} {script}\n"
    done = submit(replace(req, files=MappingProxyType({**req.files, "job.sbatch": "".join(lines)})), backend)
    return done.job_id, done.job_dir


def test_fscancel_and_log_of_a_heterogeneous_job(jobs_dir, tmp_path):
    occupy_gpus({"v100-2": 2, "t4-4": 2})  # a100 busy; two GPUs free in each other partition: a hetjob
    script = tmp_path / "talk.py"
    script.write_text(
        "import os, sys, time\n"
        "print(f'hello from rank {os.environ[\"SLURM_PROCID\"]}', flush=True)\n"
        "print(f'warning on rank {os.environ[\"SLURM_PROCID\"]}', file=sys.stderr, flush=True)\n"
        "time.sleep(300)\n"
    )
    spec = tmp_path / "het.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "hettalk",
                "model": {"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
                "training": {"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
            }
        )
    )
    job, job_dir = submit_talking_hetjob(spec, script)
    out = {"job_id": job, "job_dir": str(job_dir)}

    def logs():
        r = run_cli("fsqueue", str(job), "--log", "--json")
        data = json.loads(r.stdout) if r.returncode == 0 else None
        ranks = [s for s in (data or {}).get("sections", []) if s["rank"] is not None]
        return data if len(ranks) == 4 and all(len(s["lines"]) == 2 for s in ranks) else None

    data = wait_for(logs, timeout=120, interval=2.0, what="every rank's output")
    ranks = {s["rank"]: s for s in data["sections"] if s["rank"] is not None}
    assert [(ranks[r]["component"], ranks[r]["partition"]) for r in range(4)] == [
        (0, "v100"),
        (0, "v100"),
        (1, "t4"),
        (1, "t4"),
    ]
    assert all(sorted(ranks[r]["lines"]) == [f"hello from rank {r}", f"warning on rank {r}"] for r in range(4))
    assert data["files"] == [str(Path(out["job_dir"]) / f"slurm-{job}.out")]
    text = run_cli("fsqueue", str(job), "--log", "--component", "1", "--tail", "5")
    assert "==> component 1 (t4) rank 2 <==" in text.stdout and "rank 0" not in text.stdout
    res = fscancel(f"{job}+1")  # a component's name cancels the whole job
    assert res.returncode == 0 and f"job {job} hettalk (heterogeneous, 2 components): cancelled" in res.stdout
    wait_for(lambda: slurm_state(job) in TERMINAL, timeout=60, what="the hetjob to end")
    states = sh("squeue", "-h", "--states=all", "-j", str(job), "-o", "%i %T").splitlines()
    assert sorted(states) == [f"{job}+0 CANCELLED", f"{job}+1 CANCELLED"], states
    assert (Path(out["job_dir"]) / "plan.json").exists() and (Path(out["job_dir"]) / f"slurm-{job}.out").exists()


def test_fscancel_by_name_and_a_job_that_is_not_ours(jobs_dir, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(300)\n")
    spec = tmp_path / "napper.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "napper",
                "model": {"preset": "gpt2"},
                "training": {"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32"},
                "entry": {"trainer": "script", "script": str(script)},
            }
        )
    )
    out = fsbatch_json(str(spec))
    plain = sh("sbatch", "--parsable", "-J", "napper", "-p", "t4", "--wrap", "sleep 300").split(";")[0]
    res = fscancel("--name", "napper", "--json")
    assert res.returncode == 0, res.stderr
    assert [j["job_id"] for j in json.loads(res.stdout)["jobs"]] == [out["job_id"]]
    assert wait_done(out["job_id"])["state"] == "CANCELLED"
    assert slurm_state(int(plain)) in ("PENDING", "RUNNING")  # not a frenzy-slurm job: untouched
    refused = fscancel(plain)
    assert refused.returncode == 2 and f"scancel {plain}" in refused.stderr
    sh("scancel", plain)
    unknown = fscancel("999999")
    assert unknown.returncode == 2 and "not in Slurm's queue" in unknown.stderr
    assert Path(out["job_dir"], "plan.json").exists()


def test_outage_fscancel_says_so_and_log_reads_the_directory(jobs_dir, tmp_path):
    """With the controller unreachable fscancel exits 4 naming the outage, and `fsqueue JOBID --log` still shows
    the output from the job directory."""
    import os
    import re

    script = tmp_path / "talk.py"
    script.write_text("print('still here', flush=True)\nimport time\ntime.sleep(300)\n")
    spec = tmp_path / "talker.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "talker",
                "model": {"preset": "gpt2"},
                "training": {"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32"},
                "entry": {"trainer": "script", "script": str(script)},
            }
        )
    )
    out = fsbatch_json(str(spec))
    job = out["job_id"]
    log = Path(out["job_dir"]) / f"slurm-{job}.out"
    wait_for(lambda: log.exists() and "still here" in log.read_text(), timeout=90, what="the job's output")
    live = Path(os.environ["SLURM_CONF"])
    conf = tmp_path / "down" / "slurm.conf"
    conf.parent.mkdir()
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=21099", live.read_text()))
    for extra in ("gres.conf", "cgroup.conf"):
        if (live.parent / extra).exists():
            (conf.parent / extra).write_text((live.parent / extra).read_text())
    env = dict(os.environ, SLURM_CONF=str(conf))
    code = "import sys; from frenzy_slurm.cli.{} import main; sys.argv[0] = '{}'; main()"
    down = subprocess.run(
        [sys.executable, "-c", code.format("fscancel", "fscancel"), str(job)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )
    assert down.returncode == 4 and "Traceback" not in down.stderr, down.stderr
    assert "unreachable" in down.stderr.lower() or "controller" in down.stderr.lower(), down.stderr
    shown = subprocess.run(
        [sys.executable, "-c", code.format("fsqueue", "fsqueue"), str(job), "--log", "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )
    assert shown.returncode == 0, shown.stderr
    ranks = [s for s in json.loads(shown.stdout)["sections"] if s["rank"] is not None]
    assert ranks and all("still here" in s["lines"] for s in ranks), ranks
    assert slurm_state(job) == "RUNNING"  # nothing was cancelled
    sh("scancel", str(job))
