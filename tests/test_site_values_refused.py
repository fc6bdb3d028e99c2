"""A site file's names hold no newline, its keys are given once, its values are within range and its
trusted_factories entries are factory or module names: otherwise fsbatch exits 2 naming the file and field."""

from __future__ import annotations

import pytest
import yaml

from .test_spec_no_newlines import dry, offline  # noqa: F401

BREAKERS = ["x\n", "x\r", "x\r\n", "x\n#SBATCH --uid=0", "\nx"]


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("key", ["partition", "gres_type"])
def test_site_names_with_a_newline_are_refused(offline, tmp_path, key, value):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["pools"][0][key] += value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and f"pools.0.{key}" in out and str(path) in out, out


def test_duplicate_keys_in_a_site_file_are_refused(offline, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text((offline / "site.yaml").read_text() + "max_job_share: 0.5\nmax_job_share: 1.0\n")
    code, out, _ = dry(offline, site=site)
    assert code == 2 and str(site) in out and "the key 'max_job_share' is given twice" in out, out


@pytest.mark.parametrize(
    "pool_field,value,needle",
    [
        ("intra_node", 0, "is not a link speed"),
        ("intra_node", -5, "is not a link speed"),
        ("intra_node", float("inf"), "not a finite number"),
        ("intra_node", float("nan"), "not a finite number"),
        ("overrides", {"memory_gib": float("inf")}, "not a finite number"),
        ("overrides", {"memory_gib": 1e300}, "less than or equal to 16384"),
        ("overrides", {"bf16": float("inf")}, "not a finite number"),
        ("overrides", {"efficiency": 1e-300}, "greater than or equal to 0.01"),
        ("overrides", {"step_overhead_s": float("inf")}, "not a finite number"),
        ("inter_node_gbs", float("inf"), "not a finite number"),
        ("gpus_per_node", 10**9, "less than or equal to 256"),
        ("cpus_per_gpu", 10**9, "less than or equal to 1024"),
    ],
)
def test_site_values_out_of_range_are_refused(offline, tmp_path, pool_field, value, needle):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["pools"][0][pool_field] = value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and str(path) in out and f"pools.0.{pool_field}" in out and needle in out, out


def test_trusted_factories_entries_are_checked(offline, tmp_path):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["trusted_factories"] = ["torch.hub:load; rm -rf /"]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and "trusted_factories" in out and "not a factory or module name" in out, out
