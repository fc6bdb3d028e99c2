"""Node features are read on every live Slurm version and backend: 22.05's sinfo --json gives them as a string,
23.11+'s scontrol --json and pyslurm as a list."""

from __future__ import annotations

import pytest

from frenzy_slurm.slurm import open_backend
from frenzy_slurm.slurm.cli import SlurmCliBackend

from .slurm_fixture import sh

pytestmark = pytest.mark.live

NODE = "v100-2"

FEATURES = "fsfeat,ib"


def _set_features(value: str) -> None:
    sh("scontrol", "update", f"NodeName={NODE}", f"AvailableFeatures={value}", f"ActiveFeatures={value}")


def test_node_features_are_read_on_every_live_version(live_slurm):
    """22.05's sinfo --json gives features as a string, 23.11+'s scontrol --json as a list, pyslurm as a list."""
    _set_features(FEATURES)
    try:
        backends = [SlurmCliBackend(), open_backend("auto")]
        for backend in backends:
            nodes = {n.name: n for n in backend.load().nodes}
            assert nodes[NODE].features == ["fsfeat", "ib"], backend.name
            assert nodes["v100-1"].features == [], backend.name
    finally:
        _set_features("")
