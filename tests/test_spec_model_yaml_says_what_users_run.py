"""model.yaml can say what users run, as a new user writes it from the docs alone: every block the reference refers
to is documented, `frenzy-slurm memory` keeps what model.yaml says, hf-trainer's two backends are told apart, and
what MARP does not model (MoE/expert parallelism, DoRA, DeepSpeed-Ulysses) is refused by name, while 4-bit optimizer
states are costed. A setting a user writes is never silently dropped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.cli.admin import main
from frenzy_slurm.core.errors import EXIT_BAD_INPUT
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.reference import render
from frenzy_slurm.marp import estimate_memory, state_layout, workload_from_spec
from frenzy_slurm.marp.plan import ParallelPlan

ROOT = Path(__file__).resolve().parent.parent


def _yaml(tmp_path: Path, **sections: dict) -> Path:
    data: dict = {
        "name": "t",
        "model": {"preset": "llama-3.2-1b"},
        "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 2, "steps": 10},
        "entry": {"trainer": "script", "script": "train.py", "framework": "hf-trainer"},
        "parallel": {"sharding": "zero3", "tp": 1, "pp": 1},
    }
    for name, block in sections.items():
        data[name] = data.get(name, {}) | block
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _memory(*args: str) -> tuple[int, str, dict | None]:
    res = CliRunner().invoke(main, ["memory", *args])
    try:
        data = json.loads(res.stdout) if res.exit_code == 0 and "--json" in args else None
    except json.JSONDecodeError:
        data = None
    return res.exit_code, res.output, data


def test_every_block_the_reference_names_is_documented():
    text = render()
    assert (ROOT / "docs" / "model-yaml.md").read_text() == text
    sections = {line[3:] for line in text.splitlines() if line.startswith("## ")}
    current = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = line[3:]
        elif "| block | see below |" in line:
            name = line.split("`")[1]
            full = name if current == "top level" else f"{current}.{name}"
            assert full in sections, f"{full} is 'see below' but has no section"
    assert {"parallel", "deepspeed"} <= sections
    assert "`ep`" in text and "`ulysses`" in text and "`dora`" in text and "`experts`" in text


def test_plan_without_ckpt_keeps_model_yamls_checkpointing(tmp_path):
    path = _yaml(tmp_path, training={"activation_checkpointing": "full"})
    _, _, kept = _memory(str(path), "--plan", "dp=8,zero=3,mb=2", "--metric", "allocated", "--json")
    _, _, full = _memory(str(path), "--plan", "dp=8,zero=3,mb=2,ckpt=full", "--metric", "allocated", "--json")
    _, _, none = _memory(str(path), "--plan", "dp=8,zero=3,mb=2,ckpt=none", "--metric", "allocated", "--json")
    assert kept and full and none
    assert kept["peak_gib"] == full["peak_gib"] != none["peak_gib"]


def test_help_names_every_checkpointing_value():
    res = CliRunner().invoke(main, ["memory", "--help"])
    assert "none|selective|full|op" in " ".join(res.output.split())


def test_plan_and_world_together_change_the_pinned_plan(tmp_path):
    path = _yaml(tmp_path, training={"activation_checkpointing": "full"})
    code, out, data = _memory(str(path), "--world", "8", "--plan", "mb=1", "--metric", "allocated", "--json")
    assert code == 0, out
    _, _, pinned = _memory(str(path), "--plan", "dp=8,zero=3,mb=1,ga=2,ckpt=full", "--metric", "allocated", "--json")
    assert data == pinned
    code, out, _ = _memory(str(path), "--world", "8", "--plan", "dp=4")
    assert code == EXIT_BAD_INPUT and "make 4 GPUs, not 8" in out


def test_hf_trainer_zero3_is_deepspeed_and_full_shard_is_fsdp(tmp_path):
    from frenzy_slurm.jobspec import load_job_spec

    peaks = {}
    for sharding, layout in (("zero3", "deepspeed"), ("full-shard", "torch")):
        spec = load_job_spec(_yaml(tmp_path, parallel={"sharding": sharding}))
        assert state_layout(spec) == layout
        w = workload_from_spec(spec, resolve_model(spec, tmp_path))
        plan = ParallelPlan(dp=8, zero=3, micro_batch=2)
        peaks[sharding] = estimate_memory(w, plan, "allocated").peak
    assert peaks["zero3"] != peaks["full-shard"]


@pytest.mark.parametrize(
    "section,block,words",
    [
        (
            "model",
            {"preset": None, "arch": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 100, "experts": 8}},
            "Mixture-of-Experts",
        ),
        ("parallel", {"ep": 4}, "expert parallelism"),
        ("training", {"method": "lora", "lora": {"dora": True}}, "DoRA"),
        ("parallel", {"ulysses": 4}, "Ulysses"),
    ],
    ids=["moe", "ep", "dora", "ulysses"],
)
def test_what_marp_does_not_model_is_refused_by_name(tmp_path, section, block, words):
    if section == "model":
        path = tmp_path / "model.yaml"
        data = yaml.safe_load(_yaml(tmp_path).read_text())
        data["model"] = {"arch": block["arch"]}
        path.write_text(yaml.safe_dump(data))
    else:
        path = _yaml(tmp_path, **{section: block})
    code, out, _ = _memory(str(path), "--world", "8")
    assert code == EXIT_BAD_INPUT and words in out and "Traceback" not in out


def test_4bit_optimizer_states_are_costed(tmp_path):
    from frenzy_slurm.jobspec import load_job_spec

    parts = {}
    for opt in ("adamw", "adam-8bit", "adam-4bit"):
        spec = load_job_spec(_yaml(tmp_path, training={"optimizer": opt}, parallel={"sharding": "none"}))
        w = workload_from_spec(spec, resolve_model(spec, tmp_path))
        parts[opt] = estimate_memory(w, ParallelPlan(dp=1, micro_batch=2), "allocated").stages[0].optimizer
    # torchao AdamW4bit: two 4-bit states and an fp32 scale per 128 values, against AdamW's two fp32 states
    assert parts["adam-4bit"] / parts["adamw"] == pytest.approx(2 * (0.5 + 4 / 128) / 8)
    assert parts["adam-4bit"] < parts["adam-8bit"] < parts["adamw"]
