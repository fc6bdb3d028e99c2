"""On the real local cluster: a plain `sbatch --comment frenzy:...` job is not a frenzy-slurm job for fsqueue,
fscancel --name/--mine or `frenzy-slurm watch`, even with the comment and working directory of a real fsbatch job,
while that real job is still handled (tests/test_track_job_identity.py has the rules against the fake Slurm)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import DEV_SITE, ROOT, fsbatch_json, payload_spec_file, run_cli
from .slurm_fixture import sh, wait_for

pytestmark = pytest.mark.live


def fscancel(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from frenzy_slurm.cli.fscancel import main; sys.argv[0] = 'fscancel'; main()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120)


def sleeping_spec(directory: Path, name: str, seconds: int) -> Path:
    script = directory / "sleep.py"
    script.write_text(f"import time\ntime.sleep({seconds})\n")
    data = yaml.safe_load(payload_spec_file(directory, name).read_text())
    data["entry"]["script"] = str(script)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def plain_sbatch(name: str, comment: str, workdir: Path) -> int:
    out = sh(
        "sbatch",
        "--parsable",
        "-p",
        "t4",
        "-t",
        "10",
        "-J",
        name,
        f"--comment={comment}",
        f"--chdir={workdir}",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 60",
    )
    return int(out.split(";")[0])


def alive(job: int) -> bool:
    return sh("squeue", "-h", "-j", str(job), "-o", "%T").strip() in ("PENDING", "RUNNING")


def test_a_forged_frenzy_comment_is_left_alone(live_jobs_dir, tmp_path, monkeypatch):
    from frenzy_slurm.planning import SiteFile
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.track import watch

    real = fsbatch_json(str(sleeping_spec(tmp_path, "twin", 120)))
    job_dir = Path(real["job_dir"])
    # the strongest forgery: the real job's own tag, name and job directory (its plan.json, its submission.json)
    same_tag = plain_sbatch("twin", f"frenzy:{real['submission']}", job_dir)
    made_up = plain_sbatch("twin", "frenzy:0123456789abcdef", tmp_path)
    wait_for(lambda: all(alive(j) for j in (real["job_id"], same_tag, made_up)), what="three jobs queued")

    listed = json.loads(run_cli("fsqueue", "--json").stdout)
    ids = {j["job_id"]: j for j in listed}  # (jobs of earlier tests stay listed for MinJobAge after they end)
    assert ids[real["job_id"]]["recorded"] is True and same_tag not in ids and made_up not in ids
    shown = run_cli("fsqueue", str(same_tag))
    assert shown.returncode == 2 and f"job {same_tag} is not a frenzy-slurm job" in shown.stderr, shown.stderr

    considered: list[int] = []  # what the watcher would decide about: every frenzy-slurm job of the user
    monkeypatch.setattr(watch, "_eligible", lambda t: considered.append(t.job_id) and False)
    watch.watch_once(SiteFile(load_site(DEV_SITE), DEV_SITE), open_backend("cli"), dry_run=True)
    assert real["job_id"] in considered and same_tag not in considered and made_up not in considered

    refused = fscancel(str(same_tag))
    assert refused.returncode == 2 and f"scancel {same_tag}" in refused.stderr, refused.stderr
    by_name = fscancel("--name", "twin", "--json")
    assert by_name.returncode == 0, by_name.stderr
    assert [j["job_id"] for j in json.loads(by_name.stdout)["jobs"]] == [real["job_id"]]
    mine = fscancel("--mine", "--json")
    assert mine.returncode == 0 and json.loads(mine.stdout)["jobs"] == [], mine.stdout
    assert alive(same_tag) and alive(made_up)
    wait_for(lambda: not alive(real["job_id"]), what="the real job cancelled")
