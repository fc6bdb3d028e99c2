"""Clusters whose GPU GRES has no type (`Gres=gpu:4`) are planned on once the site file says which GPU
they are (a pool with `untyped: true`), and say plainly what to add when it does not."""

from __future__ import annotations

import json
import os

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, EXIT_NO_FIT, NoFitError
from frenzy_slurm.site.config import Pool, SiteConfig, load_site
from frenzy_slurm.slurm.cli import node_from_json
from frenzy_slurm.slurm.parse import parse_gpu_gres
from frenzy_slurm.slurm.view import ClusterView, Node, Partition, PoolKey

from .helpers import make_spec, plan, run_cli


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:4", (None, 4)),
        ("gpu:4(S:0-1)", (None, 4)),
        ("gres/gpu=2", (None, 2)),
        ("gpu:2(IDX:0-1)", (None, 2)),
        ("gpu:0(IDX:N/A)", (None, 0)),
        ("gpu:a100:4(S:0-1)", ("a100", 4)),
        ("gpu:a100:2(S:0),gpu:2(S:1)", ("a100", 4)),  # typed and untyped entries on one node add up
        ("mps:100,gpu:4(S:0-1)", (None, 4)),  # non-GPU GRES ignored
    ],
)
def test_untyped_gres_keeps_its_count(text, expected):
    assert parse_gpu_gres(text) == expected


def test_node_json_with_untyped_gres_keeps_gpus():
    node = node_from_json(
        {"name": "g1", "partitions": ["gpu"], "state": ["IDLE"], "gres": "gpu:4(S:0-1)", "gres_used": "gpu:1(IDX:0)"}
    )
    assert (node.gpu_type, node.gpus_total, node.gpus_used, node.gpus_free) == (None, 4, 1, 3)


def _view(now: float = 1.8e9) -> ClusterView:
    """Partition `gpu`: 2 nodes of untyped gpu:4; partition `t4`: 1 node of typed gpu:t4:4; `cpu`: no GPUs."""
    nodes = [
        Node(name="g1", partitions=["gpu"], state="idle", gpus_total=4, cpus=32, memory_mb=256000),
        Node(name="g2", partitions=["gpu"], state="idle", gpus_total=4, cpus=32, memory_mb=256000),
        Node(name="t1", partitions=["t4"], state="idle", gpu_type="t4", gpus_total=4, cpus=32, memory_mb=256000),
        Node(name="c1", partitions=["cpu"], state="idle", cpus=32, memory_mb=256000),
    ]
    parts = [
        Partition(name="gpu", nodes=["g1", "g2"]),
        Partition(name="t4", nodes=["t1"]),
        Partition(name="cpu", nodes=["c1"]),
    ]
    return ClusterView(backend="static", taken_at=now, partitions=parts, nodes=nodes)


def _site(untyped_model: str | None = "A100-80GB") -> SiteConfig:
    pools = [Pool(partition="t4", gres_type="t4", gpu="T4", gpus_per_node=4, intra_node="pcie3")]
    if untyped_model:
        pools.append(Pool(partition="gpu", untyped=True, gpu=untyped_model, gpus_per_node=4, intra_node="nvlink3"))
    return SiteConfig(cluster="untyped", pools=pools)


def test_view_pools_include_untyped_gpus_beside_typed_ones():
    pools = {p.key: p for p in _view().pools()}
    assert set(pools) == {PoolKey("gpu", None), PoolKey("t4", "t4")}
    assert (pools[PoolKey("gpu", None)].gpus_total, pools[PoolKey("gpu", None)].gpus_per_node) == (8, 4)
    assert str(PoolKey("gpu", None)) == "gpu/untyped"


def test_has_plans_on_untyped_gpus_the_site_file_maps():
    d = plan(make_spec(), _view(), _site())
    comp = d.chosen.components[0]
    assert (comp.partition, comp.gpu_type, comp.gpu_model) == ("gpu", None, "A100-80GB")


def test_rendered_script_asks_for_untyped_gpus_without_a_type(tmp_path):
    from .helpers import planned

    request = planned(make_spec(), _view(), job_dir=tmp_path / "job", site=_site())
    script = request.script
    comp = request.plan.decision.chosen.components[0]
    assert comp.gpu_type is None
    assert f"#SBATCH --gres=gpu:{comp.gpus_per_node}\n" in script
    assert "--gres=gpu:None" not in script


def test_without_a_mapping_the_untyped_gpus_are_named_with_the_fix():
    with pytest.raises(NoFitError) as exc:
        plan(make_spec(limits={"gpu_types": ["gpu"]}), _view(), _site(None))
    msg = exc.value.message
    assert exc.value.exit_code == EXIT_NO_FIT
    assert "partition gpu has 8 GPUs whose GRES has no type" in msg
    assert "untyped: true" in msg and "gpu: MODEL" in msg


def test_an_untyped_only_cluster_without_a_mapping_exits_3_with_the_fix():
    view = _view().model_copy(update={"nodes": [n for n in _view().nodes if n.partitions != ["t4"]]})
    with pytest.raises(NoFitError) as exc:
        plan(make_spec(), view, _site(None))
    assert "the cluster has no GPUs" not in exc.value.message
    assert "gpu/untyped: partition gpu has 8 GPUs whose GRES has no type" in exc.value.message


def test_site_pool_is_typed_or_untyped_not_both_nor_neither():
    with pytest.raises(ValueError, match="both gres_type: a100 and untyped: true"):
        Pool(partition="gpu", gres_type="a100", untyped=True, gpu="A100-80GB", gpus_per_node=4, intra_node="nvlink3")
    with pytest.raises(ValueError, match="needs gres_type"):
        Pool(partition="gpu", gpu="A100-80GB", gpus_per_node=4, intra_node="nvlink3")


def _site_file(tmp_path, gpu: str):
    path = tmp_path / "site.yaml"
    path.write_text(
        "cluster: untyped\npools:\n"
        f"  - {{partition: gpu, untyped: true, gpu: {gpu}, gpus_per_node: 4, intra_node: nvlink3}}\n"
    )
    os.chmod(path, 0o644)
    return path


def test_unknown_gpu_for_untyped_pool_exits_2_naming_file_field_and_fix(tmp_path):
    from frenzy_slurm.core.errors import FrenzyError

    path = _site_file(tmp_path, "a100-80gb")
    with pytest.raises(FrenzyError) as exc:
        load_site(path)
    msg = exc.value.message
    assert exc.value.exit_code == EXIT_BAD_INPUT
    assert str(path) in msg and "pools" in msg and "did you mean A100-80GB" in msg


def test_offline_plan_on_an_untyped_snapshot(tmp_path):
    """fsbatch --dry-run with --backend static on a snapshot of an untyped cluster (examples/offline format)."""
    snap = tmp_path / "cluster.json"
    snap.write_text(_view().model_dump_json())
    site = _site_file(tmp_path, "A100-80GB")
    spec = tmp_path / "m.yaml"
    spec.write_text(
        json.dumps(
            {"name": "u", "model": {"preset": "gpt2"}, "training": {"seq_len": 128, "global_batch": 8, "steps": 10}}
        )
    )
    res = run_cli(
        "fsbatch", str(spec), "--dry-run", "--backend", "static", "--snapshot", str(snap), "--site", str(site)
    )
    assert res.returncode == 0, res.stderr
    assert "--gres=gpu:" in res.stdout and "A100-80GB" in res.stdout + res.stderr
    assert "--gres=gpu:None" not in res.stdout

    unmapped = tmp_path / "t4only.yaml"
    unmapped.write_text(
        "cluster: untyped\npools:\n  - {partition: t4, gres_type: t4, gpu: T4, gpus_per_node: 4, intra_node: pcie3}\n"
    )
    os.chmod(unmapped, 0o644)
    res = run_cli(
        "fsbatch", str(spec), "--dry-run", "--backend", "static", "--snapshot", str(snap), "--site", str(unmapped)
    )
    assert "gpu/untyped: partition gpu has 8 GPUs whose GRES has no type" in res.stdout + res.stderr


def test_example_untyped_site_file_loads():
    from .helpers import ROOT

    site = load_site(ROOT / "site_configs" / "example-untyped.yaml")
    assert site.pool("gpu", None) is not None and site.pool("gpu", None).gpu == "A100-80GB"
    assert site.pool("gpu-h100", "h100") is not None


def test_site_detect_writes_an_untyped_pool_with_the_model_nvml_reports(monkeypatch):
    import yaml
    from click.testing import CliRunner

    import frenzy_slurm.slurm as slurm_pkg
    from frenzy_slurm.cli.admin import main
    from frenzy_slurm.runtime.nvml_probe import probe
    from frenzy_slurm.slurm.fake import FakeSlurm

    from .nvml_fake import FakeNvml

    fake = FakeSlurm(_view())
    fake.step_output[PoolKey("gpu", None)] = json.dumps(probe(FakeNvml("dgx-a100-80gb.json")))
    monkeypatch.setattr(slurm_pkg, "open_backend", lambda *a, **k: fake)
    res = CliRunner().invoke(main, ["site", "detect", "--dry-run"])
    assert res.exit_code == 0, res.output
    pools = {p["partition"]: p for p in yaml.safe_load(res.stdout)["pools"]}
    assert pools["gpu"]["untyped"] is True and "gres_type" not in pools["gpu"]
    assert pools["gpu"]["gpu"] == "A100-80GB"
    assert pools["t4"]["gres_type"] == "t4"


def test_site_validate_names_untyped_gpus_the_file_does_not_describe():
    from frenzy_slurm.site.tools import validate_site

    assert validate_site(_site(), _view()) == []
    (problem,) = validate_site(_site(None), _view())
    assert problem.startswith("partition gpu has untyped gpu GPUs that the site file does not describe")
    assert "add a pool with untyped: true and gpu: MODEL" in problem
    typed_only = _view().model_copy(update={"nodes": [n for n in _view().nodes if n.partitions != ["gpu"]]})
    assert "no node of partition 'gpu' has GRES untyped gpu (found: no GPUs)" in validate_site(_site(), typed_only)[0]
