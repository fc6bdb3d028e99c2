"""The GPU a measurement names, read onto the product's catalog (eval/gpu_reading.py): the model first named and
the memory size stated; what pins no single catalog entry leaves the prediction uncapped, never a failure."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval.gpu_reading import catalog_gpu, stated_sizes


@pytest.mark.parametrize(
    ("text", "name"),
    [
        ("A100 80GB", "A100-80GB"),
        ("A100 (80GB)", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("A100-SXM4 40GB", "A100-40GB"),
        ("a100_40g", "A100-40GB"),
        ("Tesla V100-SXM2 16GB", "V100-16GB"),
        ("V100 32GB", "V100-32GB"),
        ("A10G 24GB", "A10G"),  # the marketed 24 GB is 22.49 GiB as CUDA reports it
        ("A10 24GB", "A10"),
        ("RTX A6000 48GB", "RTX-A6000"),
        ("RTX 4090 24GB", "RTX-4090"),
        ("RTX 3090 24GB / RTX 4090", "RTX-3090"),  # the first named
        ("H100 80GB HBM3", "H100-SXM"),  # equal memory: the SXM part unless PCIe is stated
        ("H100 PCIe 80GB", "H100-PCIe"),
        ("H200 141GB (8/host)", "H200"),
        ("GeForce RTX 4090", "RTX-4090"),  # one size exists: the model alone pins it
    ],
)
def test_a_stated_gpu_maps_to_its_catalog_entry(text, name):
    gpu = catalog_gpu(text)
    assert gpu is not None and gpu.name == name


@pytest.mark.parametrize(
    "text",
    [
        "A100",  # 40 and 80 GB exist
        "NVIDIA A100 (40 vs 80 GB not stated)",
        "not stated (NVIDIA, likely A100/A800)",
        "H100 SXM 96GB HBM2e",  # no catalog H100 holds 96 GB
        "NVIDIA RTX PRO 6000 Blackwell 96GB",  # a model the catalog lacks
        "not stated",
    ],
)
def test_what_pins_no_single_entry_maps_to_none(text):
    assert catalog_gpu(text) is None


def test_alternative_sizes_are_all_read():
    assert stated_sizes("a100, 40 vs 80 gb") == {40.0, 80.0}
    assert stated_sizes("a100 40/80gb") == {40.0, 80.0}
    assert stated_sizes("h200 141gb (8/host)") == {141.0}
