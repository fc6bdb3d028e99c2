"""The examples that name a script name one that exists, and plan with the job environment check on (the
packages each framework needs are in the dev install)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.jobspec import load_job_spec
from frenzy_slurm.render.environment import check_environment
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import EXAMPLES, LOCAL

SCRIPT_EXAMPLES = [
    p
    for p in sorted([*EXAMPLES.glob("*.yaml"), *EXAMPLES.glob("scripts/*.yaml")])
    if load_job_spec(p).entry.trainer == "script"
]


def test_there_are_script_examples():
    names = {p.name for p in SCRIPT_EXAMPLES}
    assert {"hf_trainer_full.yaml", "peft_lora.yaml", "torch_ddp.yaml", "llama3-8b-lora.yaml"} <= names


@pytest.mark.parametrize("path", SCRIPT_EXAMPLES, ids=lambda p: p.name)
def test_example_names_a_script_that_exists(path: Path):
    spec = load_job_spec(path)
    script = path.parent / spec.entry.script
    assert script.is_file(), f"{path.name}: entry.script {spec.entry.script} does not exist"
    compiled = subprocess.run([sys.executable, "-m", "py_compile", str(script)], capture_output=True, text=True)
    assert compiled.returncode == 0, compiled.stderr
    assert "from frenzy_slurm import in_job" in script.read_text(), "the example shows the stop/requeue helper"


@pytest.mark.parametrize("path", SCRIPT_EXAMPLES, ids=lambda p: p.name)
def test_example_passes_the_environment_check(path: Path):
    pytest.importorskip("transformers", reason="the examples extra (pip install -e '.[dev]')")
    spec = load_job_spec(path)
    assert check_environment(spec, path.parent, "refuse") == []


def test_tiny_examples_plan_offline(tmp_path):
    """fsbatch --dry-run of each tiny example against a snapshot: exit 0, the script handed the plan."""
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL, gres_types={p: p for p, *_ in LOCAL}).model_dump_json())  # the site's GRES
    site = EXAMPLES.parent / "site_configs" / "devcluster-cpu.yaml"
    for name in ("hf_trainer_full", "peft_lora", "torch_ddp"):
        code = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
        res = subprocess.run(
            [
                sys.executable,
                "-c",
                code,
                str(EXAMPLES / "scripts" / f"{name}.yaml"),
                "--dry-run",
                "--json",
                "--backend",
                "static",
                "--snapshot",
                str(snap),
                "--site",
                str(site),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert "export FRENZY_MICRO_BATCH=" in out["script"] and "export FRENZY_FRAMEWORK=" in out["script"]


def test_qlora_on_a_cpu_node_says_why_and_exits_2(tmp_path):
    """QLoRA needs bitsandbytes' CUDA kernels: without a GPU the example stops before loading anything."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this node has a GPU")
    env = {**os.environ, "PYTHONPATH": str(EXAMPLES.parent)}
    res = subprocess.run(
        [sys.executable, str(EXAMPLES / "scripts" / "peft_lora.py"), "--qlora"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "QLoRA needs a CUDA GPU" in res.stderr and "without --qlora" in res.stderr
    assert "Traceback" not in res.stderr
