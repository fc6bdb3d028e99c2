"""`site detect --dry-run` prints only the site file on stdout (one that validates), and `--json` one JSON
document, whatever the probe printed before its answer."""

from __future__ import annotations

import json
import os

import yaml
from click.testing import CliRunner

from tests.nvml_fake import FakeNvml


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
