"""Every number of a site file and of a calibration file is finite and within physical bounds: `1e999` (which YAML
reads as a string and pydantic as infinity) used to drop a pool from every plan without a word. A value out of
range is refused (exit 2) naming the file, the field and the allowed range with its unit."""

from __future__ import annotations

import copy
import time
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import BaseModel

from frenzy_slurm import __version__
from frenzy_slurm.calibration import CalibrationFile, load_calibration, site_fingerprint
from frenzy_slurm.cli.admin import main
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.site.config import SiteConfig, load_site

from .helpers import ROOT

SITE: dict[str, Any] = {
    "cluster": "t",
    "defaults": {},
    "preemption": {"qos": "preemptible"},
    "pools": [
        {
            "partition": "gpu",
            "gres_type": "a100",
            "gpu": "A100-80GB",
            "gpus_per_node": 4,
            "intra_node": "nvlink3",
            "overrides": {},
            "overheads": {},
        }
    ],
}


def _numeric(annotation: Any) -> bool:
    return annotation in (int, float) or any(_numeric(a) for a in typing.get_args(annotation))


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((m for a in typing.get_args(annotation) if (m := _model_in(a))), None)


def numeric_fields(model: type[BaseModel], data: dict, prefix: tuple = ()) -> list[tuple]:
    """The path of every int/float field of `model`, into the nested models `data` has (lists: item 0)."""
    out = []
    for name, info in model.model_fields.items():
        inner = _model_in(info.annotation)
        if inner is not None and name in data:
            sub = data[name][0] if isinstance(data[name], list) else data[name]
            at = (*prefix, name, 0) if isinstance(data[name], list) else (*prefix, name)
            out += numeric_fields(inner, sub, at)
        elif _numeric(info.annotation) and info.annotation is not bool:
            out.append((*prefix, name))
    return out


def _set(data: dict, path: tuple, value: Any) -> dict:
    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


SITE_FIELDS = numeric_fields(SiteConfig, SITE)


def test_every_number_of_the_site_file_is_covered():
    names = {".".join(map(str, p)) for p in SITE_FIELDS}
    assert {"pools.0.overheads.context_gib", "pools.0.overrides.memory_gib", "defaults.inter_node_gbs"} <= names
    assert "preemption.min_run_min" in names and "max_job_share" in names and len(names) >= 25


@pytest.mark.parametrize("path", SITE_FIELDS, ids=lambda p: ".".join(map(str, p)))
@pytest.mark.parametrize("value", ["1e999", "-1e999", "nan", 1e300, -1.0])
def test_a_site_number_out_of_bounds_is_refused_naming_field_and_range(tmp_path, path, value):
    file = tmp_path / "site.yaml"
    file.write_text(yaml.safe_dump(_set(SITE, path, value)))
    field = ".".join(map(str, path))
    with pytest.raises(InputError) as exc:
        load_site(file)
    msg = exc.value.message
    assert f"{file}:" in msg and f"{field}:" in msg, msg
    assert "allowed:" in msg or "between" in msg, msg


def test_infinite_context_overhead_exits_2_with_the_range(tmp_path):
    text = (ROOT / "site_configs" / "devcluster.yaml").read_text()
    text = text.replace(
        "    intra_node: nvlink3\n", "    intra_node: nvlink3\n    overheads: {context_gib: 1e999}\n", 1
    )
    site = tmp_path / "site.yaml"
    site.write_text(text)
    res = CliRunner().invoke(main, ["site", "validate", str(site)])
    assert res.exit_code == 2, res.output
    assert "pools.0.overheads.context_gib: Input should be a finite number" in res.output
    assert "(allowed: 0 <= value <= 1024 GiB)" in res.output
    big = text.replace("1e999", "5000")
    site.write_text(big)
    res = CliRunner().invoke(main, ["site", "validate", str(site)])
    assert res.exit_code == 2 and "less than or equal to 1024 (allowed: 0 <= value <= 1024 GiB" in res.output


def _calibration(site: SiteConfig) -> dict:
    step = {"gpu": "A100-80GB", "precision": "bf16-mixed", "jobs": 3, "raw_error": 0.2, "calibrated_error": 0.05}
    memory = {"mode": "bf16-mixed/full", "factor": 1.1, "jobs": 3, "ranks": 12}
    return CalibrationFile(
        site_file="site.yaml",
        site_fingerprint=site_fingerprint(site),
        created_at=time.time(),
        valid_until=time.time() + 86400,
        frenzy_version=__version__,
        step_time=[step],
        memory=[memory],
    ).model_dump(mode="json")


def test_every_number_of_the_calibration_file_is_bounded(tmp_path):
    site_file = tmp_path / "site.yaml"
    site_file.write_text(yaml.safe_dump(SITE))
    site = load_site(site_file)
    data = _calibration(site)
    fields = numeric_fields(CalibrationFile, data)
    assert ("step_time", 0, "step_overhead_s") in fields and ("memory", 0, "factor") in fields
    path = tmp_path / "site.calibration.yaml"
    for field in fields:
        for value in ("1e999", 1e300):
            path.write_text(yaml.safe_dump(_set(data, field, value)))
            with pytest.raises(InputError) as exc:
                load_calibration(path, site)
            name = ".".join(map(str, field))
            assert f"{name}:" in exc.value.message and "allowed:" in exc.value.message, exc.value.message
    path.write_text(yaml.safe_dump(data))
    assert load_calibration(path, site).memory[0].factor == 1.1


def test_every_dev_and_example_site_file_still_loads():
    for path in sorted(Path(ROOT / "site_configs").glob("*.yaml")):
        assert load_site(path).pools, path
