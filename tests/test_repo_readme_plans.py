"""Every command of README.md that plans, run exactly as written (parsed from README.md, so a changed or added line
is covered), with assertions on the plan it prints: the GPUs chosen, the memory figures.

`fsbatch ... --dry-run` lines with `--backend static` and `frenzy-slurm memory` lines run anywhere; the quick
start's live lines run on the local Slurm cluster with the environment the quick start exports (FRENZY_SITE).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.core.units import GiB

from .helpers import ROOT

README = ROOT / "README.md"
BIN = Path(sys.executable).parent  # fsbatch and frenzy-slurm, as the README's `source .venv/bin/activate` gives
# The allocation each README model.yaml must get on the dev cluster's shape (live, or the offline snapshot of it):
# Llama-2-7B fits 8 A100-40GB at ZeRO-2 and runs there in a fraction of the time any other pool takes. A README line
# planning a model not listed here fails below until its expected plan is added.
EXPECTED_ALLOCATION = {
    "examples/llama2-7b.yaml": "8xA100-40GB(a100)",
    "examples/tiny-apptainer.yaml": "2xA100-40GB(a100)",  # the CPU site: tiny, two pipeline stages
}


def readme_commands() -> list[str]:
    """The command lines of README.md's indented code blocks, without a trailing `# comment`. A line with a `$ `
    prompt is an example shown with its output (test_readme_error_example_prints_what_the_readme_shows)."""
    out = []
    for line in README.read_text().splitlines():
        if line.startswith("    ") and line.strip() and not line.strip().startswith("$ "):
            out.append(re.split(r"\s+#\s", line.strip(), maxsplit=1)[0].strip())
    return out


def planning_commands() -> list[str]:
    """`fsbatch ... --dry-run` and `frenzy-slurm memory ...` lines."""
    found = []
    for cmd in readme_commands():
        words = cmd.split()  # shlex would choke on the Python lines of the README's code blocks
        if (words[0] == "fsbatch" and "--dry-run" in words) or words[:2] == ["frenzy-slurm", "memory"]:
            found.append(cmd)
    return found


def offline(cmd: str) -> bool:
    argv = shlex.split(cmd)
    return argv[0] == "frenzy-slurm" or "--backend" in argv and argv[argv.index("--backend") + 1] == "static"


def quick_start_exports() -> dict[str, str]:
    """`export NAME=VALUE` lines of the README's code blocks (FRENZY_SITE=site_configs/devcluster.yaml)."""
    pairs = [c.split()[1].split("=", 1) for c in readme_commands() if re.fullmatch(r"export \w+=[\w./-]+", c)]
    return dict(pairs)


def run_as_written(cmd: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full = dict(env, PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=full, cwd=cwd, timeout=300)


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in [*(k for k in os.environ if k.startswith("SBATCH_")), "FRENZY_SITE", "FRENZY_CALIBRATION"]:
        monkeypatch.delenv(name, raising=False)
    return dict(os.environ)


def test_the_readme_has_planning_commands_of_both_kinds():
    cmds = planning_commands()
    assert any(offline(c) and c.startswith("fsbatch") for c in cmds), cmds
    assert any(not offline(c) for c in cmds), cmds
    assert any(c.startswith("frenzy-slurm memory") for c in cmds), cmds
    assert quick_start_exports().get("FRENZY_SITE") == "site_configs/devcluster.yaml"


def assert_planned_as_expected(cmd: str, res: subprocess.CompletedProcess[str]) -> None:
    """exit 0, the first line names the expected allocation, and no GPU pool of the cluster was left unused."""
    assert res.returncode == 0, f"{cmd}\n{res.stderr}"
    model = next(a for a in shlex.split(cmd)[1:] if a.endswith(".yaml") and a.startswith("examples/"))
    assert model in EXPECTED_ALLOCATION, f"README plans {model}: add its expected allocation to this test"
    m = re.match(r"(\S+): (homogeneous|heterogeneous) (\S+), plan ", res.stdout)
    assert m, res.stdout[:400]
    assert m.group(3) == EXPECTED_ALLOCATION[model], res.stdout.splitlines()[0]
    assert "not described in the site file" not in res.stdout + res.stderr
    assert "not used" not in res.stderr, res.stderr


@pytest.mark.parametrize("cmd", [c for c in planning_commands() if offline(c) and c.startswith("fsbatch")])
def test_offline_readme_plan(cmd, clean_env):
    assert_planned_as_expected(cmd, run_as_written(cmd, clean_env))


@pytest.mark.parametrize("cmd", [c for c in planning_commands() if c.startswith("frenzy-slurm memory")])
def test_readme_memory_breakdown(cmd, clean_env):
    """The breakdown's weights, gradients and optimizer states are what ZeRO keeps per GPU of the plan asked for:
    bf16 weights and gradients (2 bytes a parameter), fp32 Adam master weights and two moments (12 bytes), the
    optimizer states split over dp from ZeRO-1, the gradients from ZeRO-2, the weights from ZeRO-3."""
    res = run_as_written(cmd, clean_env)
    assert res.returncode == 0, res.stderr
    argv = shlex.split(cmd)
    plan = dict(kv.split("=") for kv in argv[argv.index("--plan") + 1].split(","))
    dp, zero = int(plan["dp"]), int(plan.get("zero", 0))
    assert plan.get("tp", "1") == plan.get("pp", "1") == "1", "extend this test for tp/pp plans"
    header, row = _table(res.stdout)
    gib = {name: float(row[header.index(name)]) for name in header if name not in ("stage", "layers", "at")}
    params = gib["params(M)"] * 1e6
    assert gib["weights"] == pytest.approx(params * 2 / (dp if zero >= 3 else 1) / GiB, abs=0.01)
    assert gib["gradients"] == pytest.approx(params * 2 / (dp if zero >= 2 else 1) / GiB, abs=0.01)
    assert gib["optimizer"] == pytest.approx(params * 12 / (dp if zero >= 1 else 1) / GiB, abs=0.01)
    parts = ["weights", "gradients", "optimizer", "activations", "logits", "buffers", "overhead"]
    assert gib["peak"] == pytest.approx(sum(gib[p] for p in parts), abs=0.05)


def _table(text: str) -> tuple[list[str], list[str]]:
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.split()[:1] == ["stage"] and "params(M)" in line)
    return lines[i].split(), lines[i + 1].split()


def test_readme_error_example_prints_what_the_readme_shows(tmp_path, clean_env):
    """`$ fsbatch bad.yaml --dry-run` and the line README shows under it, for a bad.yaml whose line 5 is a
    training.seq_len that is not an integer."""
    lines = README.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("$ fsbatch bad.yaml"))
    cmd, shown = lines[i].strip().removeprefix("$ "), lines[i + 1].strip()
    (tmp_path / "bad.yaml").write_text(
        "name: bad\nmodel:\n  preset: gpt2\ntraining:\n  seq_len: one thousand\n  global_batch: 8\n  steps: 10\n"
    )
    res = run_as_written(cmd, clean_env, cwd=tmp_path)
    assert res.returncode == 2
    assert res.stderr.strip() == shown


@pytest.mark.parametrize("cmd", [c for c in planning_commands() if not offline(c)])
def test_live_readme_plan(cmd, slurm_cluster, clean_queue, clean_env):
    """The quick start's planning lines on the local Slurm cluster, with its exports (FRENZY_SITE)."""
    env = dict(clean_env, SLURM_CONF=str(slurm_cluster), **quick_start_exports())
    assert_planned_as_expected(cmd, run_as_written(cmd, env))
