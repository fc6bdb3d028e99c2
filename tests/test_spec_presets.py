"""Presets reproduce their models' published parameter counts."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.gpus import catalog, match_gpu
from frenzy_slurm.jobspec import presets
from frenzy_slurm.marp.params import count_params


@pytest.mark.parametrize("name", sorted(presets()))
def test_parameter_count_matches_published(name):
    p = presets()[name]
    got = count_params(p.arch).total(p.arch.layers) / 1e9
    assert got == pytest.approx(p.params_b, rel=0.005), f"{name}: {got:.4f}B vs published {p.params_b}B"


def test_llama2_7b_exact():
    a = presets()["llama-2-7b"].arch
    assert count_params(a).total(a.layers) == 6_738_415_616


@pytest.mark.parametrize(
    "name,expected",
    [
        ("a100", "A100-80GB"),
        ("A100-SXM4-40GB", "A100-40GB"),
        ("v100", "V100-32GB"),
        ("V100-SXM2-16GB", "V100-16GB"),
        ("h100", "H100-SXM"),
        ("h100-pcie", "H100-PCIe"),
        ("t4", "T4"),
        ("a10", "A10"),
        ("a10g", "A10G"),
        ("NVIDIA H200", "H200"),
        ("rtx_4090", "RTX-4090"),
        ("mi250", None),
    ],
)
def test_gpu_matching(name, expected):
    spec = match_gpu(name)
    assert (spec.name if spec else None) == expected


def test_catalog_has_required_gpus():
    need = {
        "V100-16GB",
        "V100-32GB",
        "T4",
        "A10",
        "A10G",
        "A40",
        "A100-40GB",
        "A100-80GB",
        "L4",
        "L40S",
        "H100-PCIe",
        "H100-SXM",
        "H200",
        "RTX-3090",
        "RTX-4090",
        "RTX-A6000",
    }
    assert need <= set(catalog())
    assert catalog()["A100-80GB"].bf16 == 312
