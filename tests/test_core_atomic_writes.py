"""Every file frenzy-slurm writes is written atomically and never through a link planted at its name or at
its temporary name (records.write_atomic, or an O_NOFOLLOW open)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from .helpers import LOCAL, ROOT

# ---------------------------------------------------------------- every write atomic, never through a link


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "bashrc"
    victim.write_text("# the victim's shell start-up\n")
    return victim


def test_write_calibration_never_writes_through_a_planted_link(tmp_path):
    from frenzy_slurm.calibration import CalibrationFile, write_calibration

    victim = _victim(tmp_path)
    target = tmp_path / "site.calibration.yaml"
    (tmp_path / f".{target.name}.tmp-{os.getpid()}").symlink_to(victim)  # the name the old code wrote to
    cal = CalibrationFile(site_file="site.yaml", site_fingerprint="x", created_at=0, valid_until=1, frenzy_version="0")
    write_calibration(target, cal)
    assert victim.read_text() == "# the victim's shell start-up\n"
    assert yaml.safe_load(target.read_text())["site_fingerprint"] == "x"
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # every user's fsbatch reads it


def test_site_detect_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    """In-process (the old temporary name held the pid): --backend static describes pools from GRES and writes."""
    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main
    from frenzy_slurm.sim.synthetic import synthetic

    victim = _victim(tmp_path)
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    out = tmp_path / "site.yaml"
    (tmp_path / f".site.yaml.tmp-{os.getpid()}").symlink_to(victim)
    (tmp_path / "site.yaml.detected").symlink_to(victim)
    res = CliRunner().invoke(main, ["site", "detect", "-o", str(out), "--backend", "static", "--snapshot", str(snap)])
    assert victim.read_text() == "# the victim's shell start-up\n", res.output
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(out.read_text())["pools"] and not out.is_symlink()
    assert not (tmp_path / "site.yaml.detected").exists()  # renamed over the site file once it loaded


def test_save_workload_replaces_a_link_at_the_output(tmp_path):
    from frenzy_slurm.sim.workload import WorkloadFile, WorkloadJob, save_workload

    victim = _victim(tmp_path)
    wl = WorkloadFile(jobs=[WorkloadJob(id=0, submit_s=0, model="gpt2", seq_len=128, global_batch=8, steps=10)])
    for name in ("w.yaml", "w.csv"):
        (tmp_path / name).symlink_to(victim)
        save_workload(wl, tmp_path / name)
        assert victim.read_text() == "# the victim's shell start-up\n"
        assert not (tmp_path / name).is_symlink()


def test_sampler_lock_is_not_opened_through_a_link(tmp_path):
    from frenzy_slurm.runtime.nvml_sampler import merge_metrics

    victim = _victim(tmp_path)
    (tmp_path / ".metrics.lock").symlink_to(victim)
    with pytest.raises(OSError):
        merge_metrics(tmp_path)  # ELOOP: the lock is refused, never truncated
    assert victim.read_text() == "# the victim's shell start-up\n"


def test_no_write_text_left_in_the_package():
    """Every file frenzy-slurm writes goes through records.write_atomic (or an O_NOFOLLOW open)."""
    import re

    offenders = []
    for p in (ROOT / "frenzy_slurm").rglob("*.py"):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(
                r"\.write_text\(|\.write_bytes\(|(?<!fd)open\([^)]*[\"'][wa]b?\+?[\"']|\.savefig\((?!png|image)", line
            ):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []
