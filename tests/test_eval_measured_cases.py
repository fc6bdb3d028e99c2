"""Published measurements as case files (a model.yaml plus `measurement:`), predicted only through the product's path:
the CUDA context comes from model.yaml, as it does for fsbatch and `frenzy-slurm memory`; every CSV row becomes a
case or a counted failure."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.eval.cases import MeasuredCase, load_case, load_unreadable, predict_case
from frenzy_slurm.eval.convert import convert
from frenzy_slurm.eval.dataset import REQUIRED_COLUMNS, MeasuredRow, interpret_row
from frenzy_slurm.marp import eager_module_loading, job_overheads
from frenzy_slurm.marp.overheads import Overheads
from tests.helpers import LOCAL, make_spec

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "data" / "marp_cases"
SCRIPT = {"trainer": "script", "script": "train.py", "framework": "hf-trainer"}


def test_the_cuda_context_comes_from_model_yaml():
    assert not eager_module_loading(make_spec(entry=SCRIPT))  # no version stated: a current torch
    assert not eager_module_loading(make_spec(entry=SCRIPT | {"torch_version": "2.1"}))
    assert eager_module_loading(make_spec(entry=SCRIPT | {"torch_version": "1.12"}))
    assert eager_module_loading(make_spec(entry=SCRIPT | {"env": {"CUDA_MODULE_LOADING": "EAGER"}}))
    assert not eager_module_loading(
        make_spec(entry=SCRIPT | {"torch_version": "1.12", "env": {"CUDA_MODULE_LOADING": "LAZY"}})
    )
    assert job_overheads(make_spec(entry=SCRIPT)).context_gib == 0.5
    assert job_overheads(make_spec(entry=SCRIPT | {"torch_version": "1.10"})).context_gib == 1.3
    # a site pool's measured contexts are the ones used
    pool = Overheads(context_gib=0.6, eager_context_gib=1.5)
    assert job_overheads(make_spec(entry=SCRIPT | {"torch_version": "1.10"}), pool).context_gib == 1.5
    assert job_overheads(make_spec(entry=SCRIPT), pool).context_gib == 0.6
    with pytest.raises(InputError, match="CUDA_MODULE_LOADING"):
        eager_module_loading(make_spec(entry=SCRIPT | {"env": {"CUDA_MODULE_LOADING": "sometimes"}}))


def test_fsbatch_pools_carry_the_jobs_cuda_context():
    from frenzy_slurm.has import Requirements
    from frenzy_slurm.has.pools import usable_pools
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    view, site = synthetic(LOCAL, busy=0.0, seed=1), synthetic_site(LOCAL)
    for version, context in (("1.12", 1.3), ("2.4", 0.5)):
        spec = make_spec(entry=SCRIPT | {"torch_version": version})
        pools, _ = usable_pools(Requirements.from_spec(spec), view, site)
        assert pools and {p.option.overheads.context_gib for p in pools} == {context}


def test_memory_device_metric_follows_the_jobs_module_loading(tmp_path):
    from frenzy_slurm.cli.admin import main

    peaks = {}
    for loading in ("EAGER", "LAZY"):
        path = tmp_path / f"m{loading}.yaml"
        spec = make_spec(
            entry=SCRIPT | {"env": {"CUDA_MODULE_LOADING": loading}},
            parallel={"sharding": "none", "tp": 1, "pp": 1},
            training__micro_batch=4,
            training__global_batch=4,
            training__activation_checkpointing="none",
        )
        path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
        res = CliRunner().invoke(main, ["memory", str(path), "--world", "1", "--metric", "device", "--json"])
        assert res.exit_code == 0, res.output
        peaks[loading] = json.loads(res.stdout)["peak_gib"]
    assert peaks["EAGER"] - peaks["LAZY"] == pytest.approx(1.3 - 0.5)


@pytest.mark.parametrize("path", sorted(CASES.glob("*.yaml")), ids=lambda p: p.stem)
def test_a_case_is_predicted_as_frenzy_slurm_memory_predicts_its_model_yaml(path, tmp_path):
    from frenzy_slurm.cli.admin import main

    case = load_case(path)
    pred = predict_case(case, path)
    got = pred.estimate.peak_gib
    model_yaml = tmp_path / "model.yaml"
    model_yaml.write_text(yaml.safe_dump(case.model_dump(mode="json", exclude={"measurement"}, exclude_defaults=True)))
    m = case.measurement
    gpu = ["--gpu", pred.gpu] if pred.gpu else []  # the catalog GPU the measurement names (eval/gpu_reading.py)
    res = CliRunner().invoke(
        main, ["memory", str(model_yaml), "--world", str(m.world_size), "--metric", m.metric, "--json", *gpu]
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["peak_gib"] == pytest.approx(got, rel=1e-12)


def test_a_case_file_is_strict(tmp_path):
    data = yaml.safe_load((CASES / "torchtitan-llama3-8b-fsdp.yaml").read_text())
    data["measurement"]["gpus"] = 8  # a misspelt key
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match=r"measurement\.gpus"):
        load_case(path)
    assert set(MeasuredCase.model_fields["measurement"].annotation.model_fields) >= {  # type: ignore[union-attr]
        "world_size",
        "gpu",
        "metric",
        "value_gib",
        "source",
    }


ROW = dict.fromkeys(REQUIRED_COLUMNS, "") | dict(
    row_id="X1",
    category="pretraining",
    model="Llama-3.1-8B",
    params_B="8.0",
    layers="32",
    hidden="4096",
    heads="32",
    kv_heads="8",
    ffn="14336",
    vocab="128256",
    tied_emb="no",
    seq_len="8192",
    micro_batch="1",
    num_gpus="8",
    precision="bf16 mixed",
    optimizer="AdamW",
    parallelism="FSDP=8",
    sharding_offload="FSDP2 over 8",
    activation_ckpt="selective (op)",
    attention_impl="sdpa",
    compile="no",
    value_GiB="60",
    metric_type="max_reserved",
    source="https://github.com/pytorch/torchtitan/blob/main/benchmarks/some_table.md",
    confidence="high",
)


def _write_csv(path: Path, rows: list[dict]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def test_a_framework_named_only_in_the_source_is_read():
    raw = {k: v for k, v in ROW.items()}
    row = MeasuredRow("X1", "pretraining", "high", raw["model"], 60.0, raw)
    it = interpret_row(row)
    assert it.spec.entry.framework == "torchtitan" and it.plan.recompute == "op"


def test_every_row_becomes_a_case_or_a_counted_failure(tmp_path):
    csv_path = tmp_path / "m.csv"
    _write_csv(
        csv_path, [ROW, ROW | {"row_id": "X2", "precision": "int3 magic"}, ROW | {"row_id": "X3", "value_GiB": "?"}]
    )
    written, failed = convert(csv_path, tmp_path / "cases")
    assert written == 1 and [u.case for u in failed] == ["X2", "X3"]
    assert "int3 magic" in failed[0].reason and failed[1].value_gib is None
    assert [u.case for u in load_unreadable(tmp_path / "cases")] == ["X2", "X3"]
    out = tmp_path / "o.json"
    res = subprocess.run(
        [sys.executable, "benchmarks/marp_accuracy.py", "--cases", str(tmp_path / "cases"), "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(out.read_text())["summary"]
    full = summary["by_class"]["full"]
    assert full["rows"] == 3 and full["failures"] == 2
    assert full["within_5pct"] <= 1 / 3  # a failure is never within 5 %
    assert set(summary["failures"]) == {"X2", "X3"}


def test_the_benchmark_sets_no_overheads_of_its_own():
    """The benchmark module names no overheads, torch version or context: only the product's path."""
    text = (ROOT / "benchmarks" / "marp_accuracy.py").read_text()
    assert "Overheads" not in text and "for_torch" not in text and "context_gib" not in text
    code = (ROOT / "frenzy_slurm" / "eval" / "cases.py").read_text()
    assert "predict_pinned" in code and "Overheads" not in code


def test_the_converter_command(tmp_path):
    from frenzy_slurm.eval.convert import main as convert_main

    csv_path = tmp_path / "m.csv"
    _write_csv(csv_path, [ROW, ROW | {"row_id": "X2", "optimizer": "Shampoo"}])
    res = CliRunner().invoke(convert_main, [str(csv_path), str(tmp_path / "out")])
    assert res.exit_code == 0 and "1 case files and 1 unreadable rows" in res.output
    assert load_case(tmp_path / "out" / "X1.yaml").measurement.world_size == 8
    (tmp_path / "bad.csv").write_text("row_id,category\nX,LoRA\n")
    res = CliRunner().invoke(convert_main, [str(tmp_path / "bad.csv"), str(tmp_path / "out2")])
    assert res.exit_code == 2 and "missing columns" in res.output
