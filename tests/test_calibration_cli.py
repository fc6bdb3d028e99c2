"""`frenzy-slurm calibrate` and fsbatch with a calibration, offline (static snapshot): job directories as
fsbatch renders them, with metrics.json as the trainer writes it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from .helpers import EXAMPLES, run_cli


@pytest.fixture
def offline(tmp_path):
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    pools = [("a100", "A100-40GB", 2, 4), ("t4", "T4", 2, 4)]
    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(pools).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site(pools).model_dump(mode="json")))
    return snap, site


def _job_dir(tmp_path: Path, snap: Path, site: Path, name: str, steady: float) -> Path:
    """A finished job: fsbatch's rendered files plus the trainer's metrics.json."""
    from frenzy_slurm.planning import PlanOptions, SiteFile, load_job, plan_job
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.slurm import open_backend

    job = load_job(EXAMPLES / "tiny-cpu.yaml")
    # the site without its path: planned with raw predictions, as the jobs calibration learns from were
    req = plan_job(
        job,
        SiteFile(load_site(site)),
        open_backend("static", snap),
        PlanOptions(slurm=job.spec.slurm.overridden(), job_dir=tmp_path / name),
    )
    d = tmp_path / name
    d.mkdir()
    for fname, text in req.files.items():
        (d / fname).write_text(text)
    times = [3.0, 5.0] + [steady] * 4  # warm-up and profiled steps are slow
    (d / "metrics.json").write_text(
        json.dumps(
            {
                "job_id": name,
                "step_times_s": times,
                "profiled_steps": [1],
                "step_time_s": steady,
                "ranks": [
                    {"rank": r, "peak_gib": 0.005, "predicted_allocated_gib": 0.004, "device": "cpu"} for r in (0, 1)
                ],
            }
        )
    )
    return d


def _dry(snap, site, *extra):
    res = run_cli(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        "--json",
        "--backend",
        "static",
        "--snapshot",
        str(snap),
        "--site",
        str(site),
        *extra,
    )
    return res


def test_calibrate_then_fsbatch_predicts_the_measured_step(tmp_path, offline):
    snap, site = offline
    dirs = [_job_dir(tmp_path, snap, site, f"run{i}", s) for i, s in enumerate((0.19, 0.2, 0.21))]
    raw = json.loads(_dry(snap, site).stdout)["decision"]["chosen"]["step_time_s"]
    assert raw < 0.001
    res = run_cli("frenzy-slurm", "calibrate", "--site", str(site), *map(str, dirs))
    assert res.returncode == 0, res.stderr
    assert "error before" in res.stdout and (tmp_path / "site.calibration.yaml").exists()
    out = json.loads(_dry(snap, site).stdout)
    assert out["decision"]["chosen"]["step_time_s"] == pytest.approx(0.2, rel=0.05)
    assert out["calibration"]["raw_step_time_s"] == pytest.approx(raw, rel=1e-6)
    assert out["calibration"]["calibration"]["memory_factor"] == pytest.approx(1.25)
    plain = json.loads(_dry(snap, site, "--no-calibration").stdout)
    assert (
        plain["decision"]["chosen"]["step_time_s"] == pytest.approx(raw) and plain["calibration"]["calibration"] is None
    )
    shown = _dry(snap, site, "--explain")
    assert shown.returncode == 0


def test_too_few_jobs_write_nothing_applied(tmp_path, offline):
    snap, site = offline
    dirs = [_job_dir(tmp_path, snap, site, f"run{i}", 0.2) for i in range(2)]
    res = run_cli("frenzy-slurm", "calibrate", "--site", str(site), *map(str, dirs))
    assert res.returncode == 0
    assert "fewer than min_jobs(3); not applied" in res.stdout and "nothing is applied" in res.stdout
    assert not (tmp_path / "site.calibration.yaml").exists()


def test_stale_calibration_is_an_error_not_ignored(tmp_path, offline):
    snap, site = offline
    dirs = [_job_dir(tmp_path, snap, site, f"run{i}", 0.2) for i in range(3)]
    assert run_cli("frenzy-slurm", "calibrate", "--site", str(site), *map(str, dirs)).returncode == 0
    data = yaml.safe_load(site.read_text())
    data["pools"][0]["gpus_per_node"] = 8  # the site changed after the fit
    site.write_text(yaml.safe_dump(data))
    res = _dry(snap, site)
    assert res.returncode == 2 and "stale calibration" in res.stderr and "Traceback" not in res.stderr


def test_calibrate_takes_a_jobs_root_and_since(tmp_path, offline):
    import os

    snap, site = offline
    root = tmp_path / "jobs"
    root.mkdir()
    dirs = [_job_dir(root, snap, site, f"run{i}", 0.2) for i in range(3)]
    old = time.time() - 10 * 86400
    os.utime(dirs[0] / "metrics.json", (old, old))
    res = run_cli("frenzy-slurm", "calibrate", "--site", str(site), str(root), "--json", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert len(json.loads(res.stdout)["calibration"]["jobs"]) == 3
    res = run_cli("frenzy-slurm", "calibrate", "--site", str(site), str(root), "--since", "7", "--dry-run")
    assert res.returncode == 0 and "2 measured job(s)" in res.stdout and "fewer than min_jobs(3)" in res.stdout
