"""fsbatch, submit and fsqueue end to end against the real local Slurm cluster (trivial payload)."""

from __future__ import annotations

import json
import re
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from .helpers import DEV_SITE, HOSTILE, PAYLOAD, fsbatch_json, payload_spec_file, run_cli, wait_done
from .slurm_fixture import occupy_gpus, sh, wait_for

SITE = DEV_SITE


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


spec_file = payload_spec_file


def test_homogeneous_job_completes(jobs_dir, tmp_path):
    out = fsbatch_json(str(spec_file(tmp_path)))
    assert out["decision"]["chosen"]["kind"] == "homogeneous"
    done = wait_done(out["job_id"])
    assert done["state"] == "COMPLETED" and done["finished"]["exit_code"] == 0
    job_dir = Path(out["job_dir"])
    ranks = [json.loads(p.read_text()) for p in sorted(job_dir.glob("rank-*.json"))]
    gpus = sum(c["nodes"] * c["gpus_per_node"] for c in out["decision"]["chosen"]["components"])
    assert len(ranks) == gpus and ranks[0]["world_size"] == gpus and ranks[0]["ds_config_exists"]
    assert {"job.sbatch", "ds_config.json", "plan.json", "model.yaml", "submission.json"} <= {
        p.name for p in job_dir.iterdir()
    }
    # Slurm creates the output file before the script runs, with the umask sbatch was run under: private too
    (out_file,) = job_dir.glob("slurm-*.out")
    assert stat.S_IMODE(out_file.stat().st_mode) == 0o600
    listing = run_cli("fsqueue")
    assert listing.returncode == 0 and str(out["job_id"]) in listing.stdout and "COMPLETED" in listing.stdout


def test_dry_run_submits_nothing_and_repeat_is_refused(jobs_dir, tmp_path):
    # a job that is still running when the repeat comes: once it has ended, a repeat is a rerun
    # (test_submit_rerun_live.py)
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(120)\n")
    data = yaml.safe_load(spec_file(tmp_path, "twice").read_text())
    data["entry"]["script"] = str(script)
    spec = tmp_path / "twice.yaml"
    spec.write_text(yaml.safe_dump(data))
    before = sh("squeue", "-h", "--states=all", "-o", "%i").split()
    dry = fsbatch_json(str(spec), "--dry-run")
    assert "job_id" not in dry and not Path(dry["job_dir"]).exists()
    # no job appeared (finished jobs may leave slurmctld's memory meanwhile: MinJobAge purges them)
    assert set(sh("squeue", "-h", "--states=all", "-o", "%i").split()) - set(before) == set()
    first = fsbatch_json(str(spec))
    again = run_cli("fsbatch", str(spec))
    assert again.returncode == 7 and f"job {first['job_id']} was already submitted" in again.stderr
    forced = fsbatch_json(str(spec), "--force")
    assert forced["job_id"] != first["job_id"]
    # --force never touches the earlier job's directory: the new job gets its own
    assert forced["job_dir"] == first["job_dir"] + ".2" and forced["earlier_job_dir"] == first["job_dir"]
    assert json.loads((Path(first["job_dir"]) / "submission.json").read_text())["job_id"] == first["job_id"]


def test_heterogeneous_job_when_a100_is_busy(jobs_dir, tmp_path):
    occupy_gpus({"v100-2": 2, "t4-4": 2})  # a100 busy; two GPUs free in each other partition
    big = tmp_path / "big.yaml"
    big.write_text(
        yaml.safe_dump(
            {
                "name": "big",
                "model": {"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
                "training": {"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
                "entry": {"trainer": "script", "script": str(PAYLOAD)},
                # a script that builds its stages from plan.json's layer_split (only the built-in trainer's default)
                "parallel": {"heterogeneous": True},
            }
        )
    )
    out = fsbatch_json(str(big))
    chosen = out["decision"]["chosen"]
    assert chosen["kind"] == "heterogeneous"
    assert [c["partition"] for c in chosen["components"]] == ["v100", "t4"]
    job = out["job_id"]
    shown = sh("squeue", "-h", "--states=all", "-j", str(job), "-o", "%i %P")
    assert f"{job}+0 v100" in shown and f"{job}+1 t4" in shown
    done = wait_done(job)
    assert done["state"] == "COMPLETED" and [c["partition"] for c in done["components"]] == ["v100", "t4"]
    ranks = {r["rank"]: r for r in (json.loads(p.read_text()) for p in Path(out["job_dir"]).glob("rank-*.json"))}
    assert sorted(ranks) == [0, 1, 2, 3]
    assert [ranks[i]["host"].split("-")[0] for i in range(4)] == [
        "v100",
        "v100",
        "t4",
        "t4",
    ]  # stage order = rank order
    assert len({r["master"] for r in ranks.values()}) == 1


def test_hostile_strings_reach_the_payload_verbatim(jobs_dir, tmp_path):
    spec = yaml.safe_load(spec_file(tmp_path, "hostile").read_text())
    spec["entry"]["args"] = HOSTILE
    spec["entry"]["env"] = {"HOSTILE_A": HOSTILE[0], "HOSTILE_B": HOSTILE[1]}
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = fsbatch_json(str(path))
    wait_done(out["job_id"])
    rec = json.loads((Path(out["job_dir"]) / "rank-0.json").read_text())
    assert rec["argv"] == HOSTILE
    assert rec["env"] == {"HOSTILE_A": HOSTILE[0], "HOSTILE_B": HOSTILE[1]}
    assert not list(Path(out["job_dir"]).glob("pwned*")) and not list(tmp_path.glob("pwned*"))


def test_slurm_rejection_is_explained(jobs_dir, tmp_path):
    res = run_cli("fsbatch", str(spec_file(tmp_path, "rej")), "--sbatch=--reservation=nosuch")
    assert res.returncode == 5, res.stderr
    assert "Slurm refused the job" in res.stderr and "reservation" in res.stderr.lower()
    assert "Traceback" not in res.stderr
    rejected = list(jobs_dir.glob("rej-*/rejected.json"))
    assert len(rejected) == 1
    record = json.loads(rejected[0].read_text())
    assert "reservation is invalid" in record["stderr"].lower() and record["explanation"]
    assert not list(jobs_dir.glob("rej-*/submission.json"))


def test_explain_lists_alternatives(jobs_dir, tmp_path):
    res = run_cli("fsbatch", str(spec_file(tmp_path, "ex")), "--dry-run", "--explain")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(line.startswith("*") and "chosen" in line for line in lines)
    header = lines.index(next(line for line in lines if "allocation" in line and "why" in line))
    table = [line for line in lines[header:] if line[:1] in "* "]
    # the chosen row and at least two alternatives, each with an allocation label such as 4xA100-40GB(a100)
    assert len([row for row in table if re.search(r"\d+x[A-Z][A-Za-z0-9-]*\(", row)]) >= 3


def test_fsqueue_user_filter_and_json(jobs_dir, tmp_path):
    out = fsbatch_json(str(spec_file(tmp_path, "mine")))
    wait_done(out["job_id"])
    mine = json.loads(run_cli("fsqueue", "--json").stdout)
    assert any(j["job_id"] == out["job_id"] for j in mine)
    other = json.loads(run_cli("fsqueue", "-u", "nobody-else", "--json").stdout)
    assert other == []


def test_unknown_job(jobs_dir):
    res = run_cli("fsqueue", "999999")
    assert res.returncode == 2 and "not a frenzy-slurm job" in res.stderr


def test_scancel_cancels_whole_hetjob(jobs_dir, tmp_path):
    script = tmp_path / "sleep.py"
    script.write_text("import time\ntime.sleep(120)\n")
    data = yaml.safe_load(spec_file(tmp_path, "cancel").read_text())
    data["entry"]["script"] = str(script)
    p = tmp_path / "cancel.yaml"
    p.write_text(yaml.safe_dump(data))
    out = fsbatch_json(str(p))
    wait_for(lambda: "RUNNING" in run_cli("fsqueue", str(out["job_id"])).stdout, what="running")
    subprocess.run(["scancel", str(out["job_id"])], check=True)
    assert wait_done(out["job_id"])["state"] == "CANCELLED"
