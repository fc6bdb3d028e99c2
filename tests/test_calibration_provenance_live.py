"""On the real cluster: another user's throwaway job (`sbatch --wrap true`) beside fsbatch's files and a forged
metrics.json does not count, because the site epilog records the script slurmctld really ran.

The dev cluster runs no Epilog, so the test runs contrib/slurm/epilog itself once the job has ended, as slurmd
would (root, Slurm's variables for the job); the epilog asks the real slurmctld for the script
(`scontrol write batch_script`) and the work directory (`scontrol show job`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .helpers import run_cli
from .slurm_fixture import sh, wait_for
from .test_calibration_accounting import _finished
from .test_calibration_cli import _job_dir, offline  # noqa: F401 (fixture: snapshot and site file)
from .test_calibration_provenance import EPILOG, _submitted, _tag
from .users import other_user  # noqa: F401 (fixture)


@pytest.fixture
def shared_dir():
    """A directory every user can reach (pytest's own tmp_path is root's alone): the other user's jobs live here."""
    d = Path(tempfile.mkdtemp(prefix="frenzy-calwatch-"))
    d.chmod(0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_a_throwaway_job_of_another_user_does_not_count(tmp_path, offline, shared_dir, clean_queue, other_user):
    snap, site = offline
    d = _finished(_job_dir(shared_dir, snap, site, "fab", 0.2), 1, peak_gib=0.0028)  # x0.70, forged
    _submitted(d)  # fsbatch's job.sbatch, identity bound, beside it: but it is not what runs
    for p in [d, *d.iterdir()]:
        os.chown(p, other_user.uid, other_user.gid)
    tag = _tag(d)
    partition = sh("sinfo", "-h", "-o", "%R").split()[0]
    argv = ["sbatch", "--parsable", f"--uid={other_user.name}", "-p", partition, "-t", "1", f"--chdir={d}"]
    job = int(sh(*argv, f"--comment={tag}", "-o", "/dev/null", "--wrap", "true").split(";")[0])
    (d / "submission.json").write_text(json.dumps({"job_id": str(job)}))
    os.chown(d / "submission.json", other_user.uid, other_user.gid)
    shown = wait_for(
        lambda: (
            (s := sh("scontrol", "-o", "show", "job", str(job), check=False))
            and not any(f"JobState={x} " in s for x in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"))
            and s
        ),
        timeout=120,
        what="the throwaway job to end",
    )
    # it ended (COMPLETED, or FAILED where the test cluster's spool is root's alone): either way a real job of
    # that user's, in that directory, with that comment, whose epilog runs
    assert f"UserId={other_user.name}(" in shown and f"WorkDir={d} " in shown, shown
    spool = tmp_path / "spool"
    env = {
        "PATH": os.environ["PATH"],
        "SLURM_CONF": os.environ["SLURM_CONF"],
        "FRENZY_SPOOL": str(spool),
        "SLURM_JOB_ID": str(job),
        "SLURM_JOB_USER": other_user.name,
        "SLURM_JOB_UID": str(other_user.uid),
        "SLURM_JOB_COMMENT": tag,
    }
    subprocess.run(["bash", str(EPILOG)], env=env, check=True, timeout=60)
    (record,) = [json.loads(f.read_text()) for f in spool.glob(f"{job}-*.json")]
    script = sh("scontrol", "write", "batch_script", str(job), "-")
    assert script.rstrip().endswith("\ntrue")  # what `--wrap true` made: not job.sbatch
    assert record["work_dir"] == str(d) and record["metrics_sha256"] is not None and record["script_sha256"]
    res = run_cli(
        "frenzy-slurm", "calibrate", "--site", str(site), "--json", "--dry-run", "--epilog-dir", str(spool), str(d)
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["accepted"] == [] and out["calibration"]["memory"] == []
    assert [r["why"] for r in out["rejected"]] == [
        f"job {job}: the batch script Slurm ran is not this directory's job.sbatch"
    ]
