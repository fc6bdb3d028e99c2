"""The site epilog's records are written by a JSON encoder and keyed by Slurm's job id (numeric, from Slurm),
whatever a job's comment holds; without Python the epilog writes nothing and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from tests.test_site_epilog import FAKE_SMI

ROOT = Path(__file__).resolve().parent.parent

EPILOG = ROOT / "contrib" / "slurm" / "epilog"

HOSTILE = 'frenzy:abc", "job_id": "99", "gpus": [], "x": {"y": "\n}\'$(touch /tmp/pwned-epilog)`id`\\'


def _epilog(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    full = {"PATH": os.environ["PATH"], "NVIDIA_SMI": str(smi), "FRENZY_SPOOL": str(tmp_path / "spool"), **env}
    return subprocess.run(["bash", str(EPILOG)], env=full, capture_output=True, text=True, timeout=30)


def test_epilog_hostile_comment_stays_a_string_in_that_jobs_record(tmp_path):
    from frenzy_slurm.calibration.observe import read_epilog_dir

    res = _epilog(
        tmp_path, SLURM_JOB_ID="77", SLURM_JOB_GPUS="0,1", SLURM_JOB_COMMENT=HOSTILE, SLURM_JOB_USER='eve"}, {"'
    )
    assert res.returncode == 0, res.stderr
    files = list((tmp_path / "spool").glob("*.json"))
    assert [f.name.split("-")[0] for f in files] == ["77"]
    rec = json.loads(files[0].read_text())
    assert rec["job_id"] == "77"
    assert rec["comment"] == HOSTILE and rec["user"] == 'eve"}, {"'
    assert set(rec) == {
        *("job_id", "host", "comment", "user", "written_at", "gpus"),
        *("work_dir", "script_sha256", "metrics_sha256"),  # what calibrate trusts another user's job by
    }
    assert [(g["index"], g["max_process_memory_mib"]) for g in rec["gpus"]] == [(0, 29000), (1, 41000)]
    assert list(read_epilog_dir(tmp_path / "spool")) == ["77"]  # calibration sees job 77 only, never 99
    assert not Path("/tmp/pwned-epilog").exists()


def test_epilog_job_id_comes_from_slurm_and_must_be_numeric(tmp_path):
    res = _epilog(tmp_path, SLURM_JOB_ID="../99", SLURM_JOB_GPUS="0", SLURM_JOB_COMMENT="frenzy:abc")
    assert res.returncode == 0 and not (tmp_path / "spool").exists()


def test_epilog_without_python_writes_nothing_and_exits_0(tmp_path):
    res = _epilog(
        tmp_path,
        SLURM_JOB_ID="80",
        SLURM_JOB_GPUS="0",
        SLURM_JOB_COMMENT="frenzy:abc",
        FRENZY_EPILOG_PYTHON=str(tmp_path / "no-python"),
    )
    assert res.returncode == 0 and not (tmp_path / "spool").exists()
