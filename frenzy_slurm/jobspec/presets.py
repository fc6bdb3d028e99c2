"""The built-in model presets (data in `frenzy_slurm/data/presets.yaml`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml

from frenzy_slurm.core.yamlfile import SHIPPED_DATA_LOADER
from frenzy_slurm.jobspec.arch import Architecture


@dataclass(frozen=True)
class Preset:
    name: str
    source: str
    params_b: float
    arch: Architecture


@cache
def presets() -> dict[str, Preset]:
    text = resources.files("frenzy_slurm").joinpath("data/presets.yaml").read_text()
    raw = yaml.load(text, Loader=SHIPPED_DATA_LOADER)
    return {
        name: Preset(name=name, source=entry["source"], params_b=entry["params_b"], arch=Architecture(**entry["arch"]))
        for name, entry in raw.items()
    }
