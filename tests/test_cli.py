"""The commands as a user runs them: help, memory breakdown, candidates, JSON, exit codes."""

from __future__ import annotations

import json

import pytest
import yaml

from frenzy_slurm.core.units import GiB

from .helpers import DEV_DATA, EXAMPLES, ROOT, run_cli


@pytest.mark.parametrize("prog", ["fsbatch", "fsqueue", "fsinfo", "frenzy-slurm"])
def test_help(prog):
    res = run_cli(prog, "--help")
    assert res.returncode == 0
    assert "Usage:" in res.stdout and len(res.stdout.splitlines()) > 4


def test_memory_plan_breakdown_json():
    res = run_cli("frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--plan", "dp=8,zero=1,mb=1", "--json")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    st = data["stages"][0]
    parts = sum(st[k] for k in ("weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead"))
    assert st["peak"] == pytest.approx(parts)
    assert st["weights"] == pytest.approx(6_738_415_616 * 2 / GiB)  # bf16 copy, unsharded at ZeRO-1
    assert data["plan"].startswith("dp=8,tp=1,pp=1,zero=1,mb=1,ga=32")


def test_memory_table_and_fit_line():
    res = run_cli(
        "frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--plan", "dp=2,zero=3,mb=1", "--gpu", "T4"
    )
    assert res.returncode == 0, res.stderr
    assert "weights" in res.stdout and "does NOT fit" in res.stdout


def test_memory_candidates():
    res = run_cli(
        "frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--gpu", "A100-80GB:16", "--gpu", "T4:4", "--json"
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["T4"] == []  # keyed by the GPU named, without the count
    assert data["A100-80GB"] and all(c["peak_gib"] <= c["usable_gib"] for c in data["A100-80GB"])


def test_no_fit_exit_code():
    res = run_cli("frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--gpu", "T4:2")
    assert res.returncode == 3 and "fits on none" in res.stderr


@pytest.mark.parametrize(
    "plan,needle", [("dp=3,mb=1", "not a multiple"), ("tp=3", "tp(3) must divide"), ("zero=9", "zero(9)")]
)
def test_bad_plan(plan, needle):
    res = run_cli("frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--plan", plan)
    assert res.returncode == 2 and needle in res.stderr and "Traceback" not in res.stderr


@pytest.fixture
def offline_cluster(tmp_path):
    """A synthetic cluster as a static snapshot plus its site file: fsbatch without Slurm."""
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    pools = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]
    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(pools).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site(pools).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(snap), "--site", str(site)]


def test_fsbatch_dry_run_plans(offline_cluster, tmp_path):
    res = run_cli(
        "fsbatch",
        str(EXAMPLES / "qwen2-1.5b-qlora.yaml"),
        "--dry-run",
        "--json",
        *offline_cluster,
        "--job-dir",
        str(tmp_path / "job"),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    comps = out["decision"]["chosen"]["components"]
    assert {c["gpu_model"] for c in comps} <= {"T4", "V100-32GB"}  # limits.gpu_types is respected
    assert "#SBATCH --gres=gpu:" in out["script"]
    assert not (tmp_path / "job").exists(), "--dry-run writes nothing"


def test_fsbatch_dry_run_does_not_import_torch(offline_cluster):
    import subprocess
    import sys

    spec = str(EXAMPLES / "llama2-7b.yaml")
    code = (
        f"import sys; sys.argv=['fsbatch', {spec!r}, '--dry-run', *{offline_cluster!r}]\n"
        "from frenzy_slurm.cli.fsbatch import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "assert 'torch' not in sys.modules and 'deepspeed' not in sys.modules, 'heavy import'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stderr


def test_fsbatch_needs_site_file(tmp_path, monkeypatch):
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    env_free = run_cli(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        "--backend",
        "static",
        "--snapshot",
        str(tmp_path / "x.json"),
    )
    assert env_free.returncode == 2 and "no site file" in env_free.stderr


def test_accuracy_benchmark_on_dev_set(tmp_path):
    import subprocess
    import sys

    if not DEV_DATA.exists():
        pytest.skip(f"dev set not at {DEV_DATA}")
    out = tmp_path / "acc.json"
    res = subprocess.run(
        [sys.executable, "benchmarks/marp_accuracy.py", "--data", str(DEV_DATA), "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads(out.read_text())
    rows = {r["case"]: r for r in data["cases"]}
    assert len(rows) == 51  # every row: predicted, or a failure with its reason
    assert rows["B19"]["failure"] and rows["B19"]["predicted_gib"] is None
    assert rows["D02"]["accuracy"] == pytest.approx(1 - abs(rows["D02"]["predicted_gib"] - 8.478) / 8.478)
    assert {"deepspeed_states_gib", "megatron_formula_gib"} <= set(rows["D02"])
    # MARP must beat both reference estimators on the high-confidence rows
    high = data["summary"]["reference_by_confidence"]["high"]
    assert high["marp"] > high["deepspeed_states"] and high["marp"] > high["megatron_formula"]


def test_accuracy_benchmark_any_csv(tmp_path):
    import csv
    import subprocess
    import sys

    from frenzy_slurm.eval.dataset import REQUIRED_COLUMNS

    path = tmp_path / "m.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=[*REQUIRED_COLUMNS, "notes", "grad_accum_or_global_batch"])
        w.writeheader()
        base = dict(
            row_id="X1",
            category="full training",
            model="tiny",
            params_B="0.0",
            layers="2",
            hidden="64",
            heads="4",
            kv_heads="4",
            ffn="256",
            vocab="1000",
            tied_emb="no",
            seq_len="128",
            micro_batch="1",
            num_gpus="1",
            precision="fp32",
            optimizer="AdamW",
            parallelism="single GPU",
            sharding_offload="none",
            activation_ckpt="no",
            attention_impl="sdpa",
            compile="no",
            other_settings="",
            value_GiB="0.01",
            metric_type="max_allocated",
            source="test",
            confidence="high",
            notes="",
            grad_accum_or_global_batch="",
        )
        w.writerow(base)
        w.writerow(base | {"row_id": "X2", "precision": "int3 magic"})
    res = subprocess.run(
        [sys.executable, "benchmarks/marp_accuracy.py", "--data", str(path), "--json", str(tmp_path / "o.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    data = json.loads((tmp_path / "o.json").read_text())
    rows = {r["case"]: r for r in data["cases"]}
    assert rows["X1"]["predicted_gib"] > 0
    assert "precision 'int3 magic' is not recognised" in rows["X2"]["failure"]
    assert data["summary"]["by_class"]["full"]["rows"] == 2 and data["summary"]["by_class"]["full"]["failures"] == 1
