"""contrib/slurm/epilog with a stand-in nvidia-smi answering as a real one does; calibrate reads its records."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EPILOG = ROOT / "contrib" / "slurm" / "epilog"

# what `nvidia-smi -i N --query-gpu=pci.bus_id,name,memory.total` and `--query-accounted-apps=max_memory_usage`
# print with --format=csv,noheader,nounits (two accounted processes on GPU 1)
FAKE_SMI = """#!/bin/bash
i=$2
case "$3" in
  --query-gpu=*) echo "00000000:0${i}:00.0, NVIDIA A100-SXM4-80GB, 81920" ;;
  --query-accounted-apps=*) if [[ $i == 1 ]]; then printf '30211\\n41000\\n'; else echo 29000; fi ;;
esac
"""


def _run(tmp_path: Path, **env) -> subprocess.CompletedProcess:
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    full = {"PATH": os.environ["PATH"], "NVIDIA_SMI": str(smi), "FRENZY_SPOOL": str(tmp_path / "spool"), **env}
    return subprocess.run(["bash", str(EPILOG)], env=full, capture_output=True, text=True, timeout=30)


def test_epilog_records_frenzy_jobs_peaks(tmp_path):
    res = _run(
        tmp_path, SLURM_JOB_ID="77", SLURM_JOB_GPUS="0,1", SLURM_JOB_COMMENT="frenzy:abc123", SLURM_JOB_USER="alice"
    )
    assert res.returncode == 0, res.stderr
    files = list((tmp_path / "spool").glob("77-*.json"))
    assert len(files) == 1
    rec = json.loads(files[0].read_text())
    assert rec["job_id"] == "77" and rec["comment"] == "frenzy:abc123"
    assert [(g["index"], g["max_process_memory_mib"], g["memory_total_mib"]) for g in rec["gpus"]] == [
        (0, 29000, 81920),
        (1, 41000, 81920),
    ]


def test_epilog_ignores_other_jobs_and_never_fails(tmp_path):
    res = _run(tmp_path, SLURM_JOB_ID="78", SLURM_JOB_GPUS="0", SLURM_JOB_COMMENT="not ours")
    assert res.returncode == 0 and not (tmp_path / "spool").exists()
    res = _run(tmp_path, SLURM_JOB_ID="79", SLURM_JOB_COMMENT="frenzy:x")  # no GPUs: a record without peaks
    assert (
        res.returncode == 0
        and json.loads((tmp_path / "spool" / f"79-{os.uname().nodename.split('.')[0]}.json").read_text())["gpus"] == []
    )


def test_calibrate_uses_epilog_records_for_jobs_without_metrics(tmp_path):
    from frenzy_slurm.calibration.observe import _epilog_metrics, read_epilog_dir
    from frenzy_slurm.has.model import Component

    _run(tmp_path, SLURM_JOB_ID="77", SLURM_JOB_GPUS="0,1", SLURM_JOB_COMMENT="frenzy:abc123")
    records = read_epilog_dir(tmp_path / "spool")["77"]
    comp = Component(
        partition="gpu",
        gpu_type="a100",
        gpu_model="A100-80GB",
        nodes=1,
        gpus_per_node=2,
        stages=[0],
        peak_gib=40.0,
        capacity_gib=76.0,
    )
    m = _epilog_metrics(records, [comp])
    assert [(r["gpu_model"], round(r["peak_gib"], 3), r["predicted_gib"]) for r in m["ranks"]] == [
        ("A100-80GB", 28.32, 40.0),
        ("A100-80GB", 40.039, 40.0),
    ]
