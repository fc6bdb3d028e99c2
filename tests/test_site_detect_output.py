"""Issue 21, for the site: `site detect --dry-run` prints only the site file on stdout; the epilog's records are
encoded by a JSON encoder and keyed by Slurm's job id, whatever a job's comment holds."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import yaml
from click.testing import CliRunner

from tests.nvml_fake import FakeNvml
from tests.test_site_epilog import FAKE_SMI

ROOT = Path(__file__).resolve().parent.parent
EPILOG = ROOT / "contrib" / "slurm" / "epilog"


def _fake_cluster(monkeypatch):
    """A two-pool FakeSlurm behind open_backend: a100 answers the probe with NVML's JSON (after a banner line),
    t4 prints nothing (described from Slurm's GRES, with a problem on stderr)."""
    import frenzy_slurm.slurm as slurm_pkg
    from frenzy_slurm.runtime.nvml_probe import probe
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.slurm.fake import FakeSlurm
    from frenzy_slurm.slurm.view import PoolKey

    fake = FakeSlurm(synthetic([("a100", "A100-80GB", 1, 8), ("t4", "T4", 1, 4)], now=0.0))
    fake.step_output[PoolKey("a100", "a100_80gb")] = "motd\n" + json.dumps(probe(FakeNvml("dgx-a100-80gb.json")))
    fake.step_output[PoolKey("t4", "t4")] = "no json here\n"
    monkeypatch.setattr(slurm_pkg, "open_backend", lambda *a, **k: fake)


def test_site_detect_dry_run_stdout_is_only_a_site_file_that_validates(tmp_path, monkeypatch):
    from frenzy_slurm.cli.admin import main
    from frenzy_slurm.site.config import load_site

    _fake_cluster(monkeypatch)
    res = CliRunner().invoke(main, ["site", "detect", "--dry-run"])
    assert res.exit_code == 0, res.output
    captured = tmp_path / "site.yaml"  # what `site detect --dry-run > site.yaml` leaves
    captured.write_text(res.stdout)
    os.chmod(captured, 0o644)
    site = load_site(captured)
    assert {p.partition for p in site.pools} == {"a100", "t4"}
    assert yaml.safe_load(res.stdout)["pools"]
    # the status lines are there, on stderr
    assert "a100/a100_80gb: 8 x " in res.stderr and "A100-80GB" in res.stderr
    assert "t4/t4: described from Slurm's GRES" in res.stderr
    assert "a100/a100_80gb:" not in res.stdout and "t4/t4:" not in res.stdout


def test_site_detect_json_stdout_is_one_json_document(monkeypatch):
    from frenzy_slurm.cli.admin import main

    _fake_cluster(monkeypatch)
    res = CliRunner().invoke(main, ["site", "detect", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["written"] is False and {p["pool"] for p in doc["pools"]} == {"a100/a100_80gb", "t4/t4"}
    assert yaml.safe_load(doc["text"])["pools"]


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
