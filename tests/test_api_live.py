"""The Python API, fsbatch --wait, sweeps and --dependency against the real local Slurm cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .helpers import EXAMPLES, ROOT, fsbatch_json, payload_spec_file, run_cli, wait_done

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"


@pytest.mark.slow
def test_plan_submit_wait_metrics(live_jobs_dir):
    pytest.importorskip("deepspeed", reason="training needs the train extra (pip install -e '.[dev]')")
    import frenzy_slurm as fs

    plan = fs.plan(EXAMPLES / "tiny-cpu.yaml", {"training.steps": 4}, site=CPU_SITE)
    assert plan.gpus >= 1 and plan.request.plan.spec.training.steps == 4
    job = fs.submit(plan)
    assert job.state in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED")
    state = job.wait(timeout=400, poll=5)
    log = next(job.job_dir.glob("slurm-*.out"), None)
    assert state == "COMPLETED", log.read_text()[-3000:] if log else "no log"
    assert job.exit_code == 0 and job.wait_exit_code(state) == 0
    m = job.metrics()
    assert m is not None and m.step == m.total_steps == 4
    assert m.step_time_s > 0 and m.tokens_per_s > 0 and m.peak_gib > 0 and len(m.loss) >= 1
    assert fs.job(job.job_dir).state == "COMPLETED"


def test_fsbatch_wait_returns_the_job_exit_code(live_jobs_dir, tmp_path):
    ok = run_cli("fsbatch", str(payload_spec_file(tmp_path, "waitok")), "--wait")
    assert ok.returncode == 0, ok.stderr
    job_id = ok.stdout.split("Submitted batch job ")[1].split()[0]
    assert f"fsbatch: job {job_id} ended COMPLETED, exit code 0" in ok.stdout
    failing = tmp_path / "fail.py"
    failing.write_text("import sys\nsys.exit(3)\n")
    data = yaml.safe_load(payload_spec_file(tmp_path, "waitfail").read_text())
    data["entry"]["script"] = str(failing)
    spec = tmp_path / "waitfail.yaml"
    spec.write_text(yaml.safe_dump(data))
    bad = run_cli("fsbatch", str(spec), "--wait", "--parsable")
    assert bad.returncode == 3, bad.stderr
    assert bad.stdout.strip().isdigit()  # --parsable: only the job id on stdout, the rest on stderr
    assert f"job {bad.stdout.strip()} ended FAILED, exit code 3" in bad.stderr


def test_sweep_submits_one_job_per_value(live_jobs_dir, tmp_path):
    res = run_cli("fsbatch", str(payload_spec_file(tmp_path, "sw")), "--set", "training.steps=2,3", "--json", "--wait")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert [o["job"] for o in out] == ["sw_2", "sw_3"] and len({o["job_id"] for o in out}) == 2
    for o in out:
        record = json.loads((Path(o["job_dir"]) / "submission.json").read_text())
        assert record["job_id"] == o["job_id"]
        assert json.loads((Path(o["job_dir"]) / "finished.json").read_text())["exit_code"] == 0
        assert f"fsbatch: job {o['job_id']} ended COMPLETED, exit code 0" in res.stderr


def test_dependency_is_checked_against_the_queue(live_jobs_dir, tmp_path):
    missing = run_cli("fsbatch", str(payload_spec_file(tmp_path, "dep0")), "-d", "afterok:999999")
    assert missing.returncode == 2 and "Slurm knows no job 999999" in missing.stderr
    assert not list(live_jobs_dir.glob("dep0-*/submission.json"))
    first = fsbatch_json(str(payload_spec_file(tmp_path, "dep1")))
    second = fsbatch_json(str(payload_spec_file(tmp_path, "dep2")), "-d", f"afterok:{first['job_id']}")
    script = (Path(second["job_dir"]) / "job.sbatch").read_text()
    assert f"#SBATCH --dependency=afterok:{first['job_id']}\n" in script
    assert wait_done(first["job_id"])["state"] == "COMPLETED"
    assert wait_done(second["job_id"])["state"] == "COMPLETED"
    ended = json.loads((Path(first["job_dir"]) / "finished.json").read_text())["finished_at"]
    began = json.loads((Path(second["job_dir"]) / "started.json").read_text())["started_at"]
    assert began >= ended  # Slurm held the second job until the first had succeeded
