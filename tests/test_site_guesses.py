"""`site init` and `site detect` without NVML: Slurm names GPUs, it does not measure them. A GRES type that does not pin
one catalog model down ('a100': a 40 or an 80 GB card) leaves `gpu:` out with a comment saying what to fill in; one
that does ('t4') is written with `unconfirmed:`; `site validate` lists what was never measured; and no job is planned
on a pool whose GPU memory is a guess until the admin confirms it (or writes the memory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.cli.admin import main
from frenzy_slurm.cli.fsbatch import main as fsbatch
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.runtime.nvml_probe import probe
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.site.config import SiteConfig, load_site, require_measured_memory
from frenzy_slurm.site.detect import interpret, merge_site
from frenzy_slurm.site.tools import propose_site, validate_site

from .helpers import ROOT
from .nvml_fake import FakeNvml

TINY = ROOT / "examples" / "tiny-cpu.yaml"


def _view(gres: dict[str, str | None]):
    """A cluster whose partition P has 2 nodes of 4 GPUs of GRES type gres[P] (None: untyped)."""
    view = synthetic([(p, "T4", 2, 4) for p in gres])
    nodes = [n.model_copy(update={"gpu_type": gres[n.partitions[0]]}) for n in view.nodes]
    return view.model_copy(update={"nodes": nodes})


@pytest.fixture
def snap(tmp_path) -> Path:
    path = tmp_path / "snap.json"
    path.write_text(_view({"a100": "a100", "t4": "t4", "gpu": None}).model_dump_json())
    return path


def test_init_leaves_an_unknown_model_out_and_marks_a_guess(snap):
    res = CliRunner().invoke(main, ["site", "init", "--backend", "static", "--snapshot", str(snap)])
    assert res.exit_code == 0, res.output
    text = res.stdout
    pools = {p["partition"]: p for p in yaml.safe_load(text)["pools"]}
    assert "gpu" not in pools["a100"] and "intra_node" not in pools["a100"]
    assert "gpu" not in pools["gpu"] and pools["gpu"]["untyped"] is True
    assert (
        "# gpu model unknown: Slurm calls it 'a100' (it may be A100-40GB or A100-80GB); run `frenzy-slurm site "
        "detect` on a node with NVML, or set gpu: to one of `frenzy-slurm site catalog`"
    ) in text
    assert "gpu model unknown: the GRES has no type" in text
    # T4 is PCIe 3 (the catalog's 16 GB/s), not the pcie4 it used to be given
    assert (pools["t4"]["gpu"], pools["t4"]["intra_node"], pools["t4"]["unconfirmed"]) == (
        "T4",
        "pcie3",
        ["gpu", "intra_node"],
    )
    assert "A100-80GB" not in text.split("it may be")[0]  # never written as the a100 pool's model


def test_an_unknown_model_does_not_load_until_the_admin_names_it(tmp_path, snap):
    site = tmp_path / "site.yaml"
    res = CliRunner().invoke(main, ["site", "init", "-o", str(site), "--backend", "static", "--snapshot", str(snap)])
    assert res.exit_code == 0 and "check: a100/a100: gpu model unknown" in res.stderr, res.output
    check = CliRunner().invoke(main, ["site", "validate", str(site), "--backend", "static", "--snapshot", str(snap)])
    assert check.exit_code == 2 and "pools.0.gpu: required field is missing" in check.output, check.output
    assert "matches the cluster" not in check.output


def _guessed_site(tmp_path: Path, snap: Path) -> Path:
    """init's file with the unknown pools filled in by the admin, the t4 guess left as it was."""
    text = CliRunner().invoke(main, ["site", "init", "--backend", "static", "--snapshot", str(snap)]).stdout
    data = yaml.safe_load(text)
    for pool in data["pools"]:
        if pool["partition"] != "t4":
            pool.update(gpu="A100-40GB", intra_node="nvlink3")
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(data))
    return site


def test_validate_names_what_was_never_measured(tmp_path, snap):
    site = _guessed_site(tmp_path, snap)
    res = CliRunner().invoke(main, ["site", "validate", str(site), "--backend", "static", "--snapshot", str(snap)])
    assert res.exit_code == 1 and "matches the cluster" not in res.output, res.output
    assert "pool t4/t4: gpu: T4 was guessed from Slurm's names, never measured or confirmed" in res.output
    assert "pool t4/t4: intra_node: pcie3 was guessed" in res.output
    assert "a100/a100: gpu" not in res.output  # written by the admin: confirmed


def _plan(site: Path, snap: Path):
    args = [str(TINY), "--dry-run", "--json", "--backend", "static", "--snapshot", str(snap), "--site", str(site)]
    return CliRunner().invoke(fsbatch, args)


def test_no_plan_on_a_guessed_memory_until_confirmed(tmp_path, snap):
    site = _guessed_site(tmp_path, snap)
    res = _plan(site, snap)
    assert res.exit_code == 2, res.output
    assert "pool(s) t4/t4 (gpu: T4) was guessed" in res.output and "remove 'gpu' from the pool's unconfirmed" in (
        res.output
    )
    data = yaml.safe_load(site.read_text())
    t4 = next(p for p in data["pools"] if p["partition"] == "t4")
    t4["overrides"] = {"memory_gib": 15.0}  # the admin wrote the memory: no longer a guess
    site.write_text(yaml.safe_dump(data))
    assert _plan(site, snap).exit_code == 0
    del t4["overrides"]
    t4["unconfirmed"] = ["intra_node"]  # the model confirmed; a guessed link speed does not stop planning
    site.write_text(yaml.safe_dump(data))
    assert _plan(site, snap).exit_code == 0


def test_detect_without_nvml_keeps_unknown_unknown_and_nvml_confirms():
    det = interpret("a100", "a100", 4, None, "no answer")
    text, changes = merge_site(None, "c", [det], "2026-12-06")
    pool = yaml.safe_load(text)["pools"][0]
    assert "gpu" not in pool and "intra_node" not in pool, text
    assert "gpu model unknown: Slurm calls it 'a100'" in text and "intra_node unknown" in text
    assert changes == ["a100/a100: added (gpu unknown, 4 per node, link unknown; source slurm)"]
    with pytest.raises(Exception, match="gpu"):
        SiteConfig.model_validate(yaml.safe_load(text))
    guessed = (
        "cluster: c\npools:\n  - partition: gpu\n    gres_type: a100\n    gpu: A100-80GB\n    gpus_per_node: 8\n"
        "    intra_node: nvlink3\n    unconfirmed: [gpu, intra_node]  # guessed\n"
    )
    measured = interpret("gpu", "a100", 8, probe(FakeNvml("dgx-a100-80gb.json")))
    out, changes = merge_site(guessed, "c", [measured], "2026-12-06")
    site = SiteConfig.model_validate(yaml.safe_load(out))
    assert site.pools[0].unconfirmed == [] and "unconfirmed" not in out
    assert f"gpu/a100: gpu A100-80GB measured by NVML on {measured.host}, no longer unconfirmed" in changes


def test_the_shipped_site_files_state_their_gpus():
    for path in sorted((ROOT / "site_configs").glob("*.yaml")):
        site = load_site(path)
        require_measured_memory(site, path)
        assert all(not p.unconfirmed for p in site.pools), path


def test_validate_site_lists_unconfirmed_values_beside_slurm_disagreements():
    site = SiteConfig.model_validate(
        {
            "cluster": "synthetic",
            "pools": [
                {"partition": "t4", "gres_type": "t4", "gpu": "T4", "gpus_per_node": 4, "intra_node": "pcie3",
                 "unconfirmed": ["gpu"]},
            ],
        }
    )  # fmt: skip
    problems = validate_site(site, _view({"t4": "t4"}))
    assert problems == [
        "pool t4/t4: gpu: T4 was guessed from Slurm's names, never measured or confirmed (its memory is the "
        "catalog's for that model): check it (`frenzy-slurm site detect` measures it with NVML on a node), then "
        "remove 'gpu' from the pool's unconfirmed: list"
    ]
    with pytest.raises(InputError, match=r"t4/t4 \(gpu: T4\) was guessed"):
        require_measured_memory(site, Path("site.yaml"))
    assert propose_site(_view({"t4": "t4"}))[1] == ["t4/t4: gpu T4 and intra_node pcie3 are guesses; confirm them"]
