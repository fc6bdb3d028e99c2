"""entry.environment: what job.sbatch loads and activates, and fsbatch's check that the job's Python finds the
framework's packages (without importing them)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.job import Entry
from frenzy_slurm.render.environment import check_environment, job_python, needed_packages, probe
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, make_spec, planned

TINY = {"arch": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 172, "vocab": 256, "max_positions": 128}}
TRAINING = {"seq_len": 64, "global_batch": 8, "micro_batch": 2, "steps": 5, "precision": "fp32"}


def spec_with(environment: dict, framework: str = "torch", trainer: str = "script", args=()):
    entry: dict = {"trainer": trainer, "environment": environment}
    if trainer == "script":
        entry |= {"script": "train.py", "framework": framework, "args": list(args)}
    return make_spec(model=TINY, training=TRAINING, entry=entry)


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory) -> Path:
    """A venv with nothing installed: its Python exists and finds no torch."""
    where = tmp_path_factory.mktemp("envs") / "bare"
    venv.EnvBuilder(with_pip=False).create(where)
    return where


def test_environment_fields_are_checked():
    with pytest.raises(ValidationError, match="one of python, venv or conda"):
        Entry(trainer="script", script="t.py", environment={"venv": "/v", "python": "/p"})
    with pytest.raises(ValidationError, match="not a module name"):
        Entry(trainer="script", script="t.py", environment={"modules": ["cuda; rm -rf ~"]})
    with pytest.raises(ValidationError, match="conda environment name"):
        Entry(trainer="script", script="t.py", environment={"conda": "$(id)"})
    with pytest.raises(ValidationError, match="built-in"):
        Entry(environment={"venv": "/v"})
    Entry(environment={"modules": ["cuda/12.4"]})  # modules work with the built-in trainer


def test_job_sbatch_loads_modules_and_activates_the_venv(tmp_path):
    spec = spec_with({"venv": "envs/my env", "modules": ["gcc/12", "cuda/12.4"]})
    req = planned(spec, synthetic(LOCAL), spec_path=tmp_path / "model.yaml")
    script = req.script
    want_venv = str(tmp_path / "envs" / "my env")
    assert re.findall(r"^module load (\S+) \|\|", script, re.M) == ["gcc/12", "cuda/12.4"]
    assert f"export VIRTUAL_ENV='{want_venv}'\n" in script
    assert f"export FRENZY_JOB_PYTHON='{want_venv}/bin/python'\n" in script
    # all of it before srun, and the script is valid shell
    assert script.index("module load") < script.index("export VIRTUAL_ENV") < script.index("\nsrun ")
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_job_sbatch_activates_conda_and_takes_its_python():
    script = planned(spec_with({"conda": "train-env"}), synthetic(LOCAL)).script
    assert "conda activate train-env ||" in script
    assert 'export FRENZY_JOB_PYTHON="$CONDA_PREFIX/bin/python"' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_no_environment_renders_nothing_extra():
    script = planned(make_spec(model=TINY, training=TRAINING), synthetic(LOCAL)).script
    assert "module load" not in script and "FRENZY_JOB_PYTHON" not in script and "VIRTUAL_ENV" not in script


def test_packages_per_framework():
    assert needed_packages(spec_with({}, "hf-trainer")) == ("torch", "transformers", "accelerate")
    assert needed_packages(spec_with({}, "hf-trainer", args=["$FRENZY_FRAMEWORK_ARGS"]))[-1] == "deepspeed"
    assert needed_packages(spec_with({}, "megatron")) == ("torch", "megatron.core")
    assert needed_packages(make_spec(model=TINY, training=TRAINING)) == ("torch", "deepspeed")


def test_probe_finds_without_importing(tmp_path, monkeypatch):
    """The probe answers for this venv's torch and deepspeed, for a missing package and a dotted name whose
    parent is missing, and finds a package without running its code (as the job's PYTHONPATH sees it)."""
    got = probe(sys.executable, ("torch", "deepspeed", "no_such_pkg_xyz", "no_such_parent.core"))
    assert got == {"torch": True, "deepspeed": True, "no_such_pkg_xyz": False, "no_such_parent.core": False}
    marker = tmp_path / "imported"
    pkg = tmp_path / "lib" / "frenzy_probe_marker"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "lib"))
    assert probe(sys.executable, ("frenzy_probe_marker",)) == {"frenzy_probe_marker": True}
    assert not marker.exists(), "the probe imported the package"


def test_missing_packages_refuse_the_submission(bare_venv):
    spec = spec_with({"venv": str(bare_venv)}, "hf-trainer")
    with pytest.raises(InputError) as exc:
        check_environment(spec, Path("."), "refuse")
    msg = exc.value.message
    assert str(bare_venv / "bin" / "python") in msg and "entry.environment.venv" in msg
    assert "torch, transformers, accelerate" in msg and "--no-env-check" in msg
    (note,) = check_environment(spec, Path("."), "note")  # --dry-run: said, not refused
    assert "cannot find torch" in note and "exit 2" in note
    assert check_environment(spec, Path("."), "off") == []


def test_modules_make_it_a_note(bare_venv):
    spec = spec_with({"venv": str(bare_venv), "modules": ["cuda/12.4"]}, "torch")
    (note,) = check_environment(spec, Path("."), "refuse")
    assert "cannot find torch" in note and "cuda/12.4" in note and "compute nodes" in note


def test_missing_python_refuses(tmp_path):
    spec = spec_with({"python": "bin/python9"})
    with pytest.raises(InputError, match=r"bin/python9 \(entry.environment.python\) does not exist"):
        check_environment(spec, tmp_path, "refuse")


def test_conda_env_not_found_here_is_a_note(monkeypatch, tmp_path):
    monkeypatch.delenv("CONDA_EXE", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = spec_with({"conda": "nowhere"})
    assert job_python(spec, tmp_path).path is None
    (note,) = check_environment(spec, tmp_path, "refuse")
    assert "'nowhere' is not found" in note and "not checked" in note


def test_conda_env_found_through_conda_exe(monkeypatch, tmp_path, bare_venv):
    root = tmp_path / "miniconda"
    (root / "bin").mkdir(parents=True)
    (root / "envs").mkdir()
    (root / "envs" / "bare").symlink_to(bare_venv)
    monkeypatch.setenv("CONDA_EXE", str(root / "bin" / "conda"))
    spec = spec_with({"conda": "bare"})
    with pytest.raises(InputError, match="cannot find torch"):
        check_environment(spec, tmp_path, "refuse")


def test_the_default_python_passes_here():
    """This venv (the test's own Python, which fsbatch would use) has torch and deepspeed."""
    assert check_environment(make_spec(model=TINY, training=TRAINING), Path("."), "refuse") == []


def _fsbatch(tmp_path: Path, model: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL, gres_types={p: p for p, *_ in LOCAL}).model_dump_json())  # the site's GRES
    site = Path(__file__).resolve().parent.parent / "site_configs" / "devcluster-cpu.yaml"
    code = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, str(model), "--backend", "static", "--snapshot", str(snap), "--site", str(site),
         *flags],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip


def test_fsbatch_refuses_notes_or_skips(tmp_path, bare_venv):
    """Submitting with a venv that lacks torch: exit 2 before Slurm is asked; --dry-run: a note, exit 0;
    --no-env-check: not even a note."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    model = tmp_path / "model.yaml"
    model.write_text(
        "name: envcheck\nmodel:\n  arch: {layers: 2, hidden: 64, heads: 4, ffn: 172, vocab: 256}\n"
        "training: {seq_len: 64, global_batch: 4, steps: 2, precision: fp32}\n"
        f"entry:\n  trainer: script\n  framework: torch\n  script: train.py\n  environment: {{venv: {bare_venv}}}\n"
    )
    refused = _fsbatch(tmp_path, model)
    assert refused.returncode == 2, refused.stderr
    assert "cannot find torch" in refused.stderr and "--no-env-check" in refused.stderr
    assert "Traceback" not in refused.stderr
    dry = _fsbatch(tmp_path, model, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "note:" in dry.stderr and "cannot find torch" in dry.stderr
    assert "export FRENZY_JOB_PYTHON=" in dry.stdout
    skipped = _fsbatch(tmp_path, model, "--dry-run", "--no-env-check")
    assert skipped.returncode == 0 and "cannot find torch" not in skipped.stderr


def test_the_rendered_environment_lines_run(tmp_path):
    """job.sbatch's lines before the rendezvous, run by bash with a stand-in `module` function: the modules load
    in order under `set -u`, the venv's bin/ comes first on PATH, FRENZY_JOB_PYTHON names its python."""
    spec = spec_with({"venv": "env dir", "modules": ["gcc/12", "cuda/12.4"]})
    script = planned(spec, synthetic(LOCAL), spec_path=tmp_path / "model.yaml").script
    head = script[: script.index("# Rendezvous")]
    log = tmp_path / "modules.log"
    probe = (
        f'module() {{ [ "$1" = load ] && echo "$2" >> {str(log)!r}; }}\n'
        + head
        + 'printf "%s\\n%s\\n" "${PATH%%:*}" "$FRENZY_JOB_PYTHON"\n'
    )
    res = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert log.read_text().split() == ["gcc/12", "cuda/12.4"]
    first_on_path, python = res.stdout.split("\n")[-3:-1]
    assert first_on_path == str(tmp_path / "env dir" / "bin") and python == str(tmp_path / "env dir" / "bin" / "python")


def wrapper(path: Path, python: str) -> None:
    """A command that runs `python` (a symlink would lose the venv: Python finds pyvenv.cfg beside the name run)."""
    path.write_text(f'#!/bin/sh\nexec {python} "$@"\n')
    path.chmod(0o755)


def test_python_by_command_name(tmp_path, monkeypatch, bare_venv):
    """environment.python: python3.11-style names are looked up on PATH (here, and in the job after the modules);
    job.sbatch exports the name, which the runtime execs through PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper(bin_dir / "frenzy-test-python", sys.executable)  # this venv's: torch and deepspeed found
    wrapper(bin_dir / "frenzy-bare-python", str(bare_venv / "bin" / "python"))
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    spec = spec_with({"python": "frenzy-test-python"}, "deepspeed")
    assert job_python(spec, tmp_path).path == bin_dir / "frenzy-test-python"
    assert check_environment(spec, tmp_path, "refuse") == []
    script = planned(spec, synthetic(LOCAL), spec_path=tmp_path / "model.yaml").script
    assert "export FRENZY_JOB_PYTHON=frenzy-test-python\n" in script
    with pytest.raises(InputError, match="cannot find torch"):
        check_environment(spec_with({"python": "frenzy-bare-python"}), tmp_path, "refuse")
    with pytest.raises(InputError, match=r"'no-such-python' \(entry.environment.python\) is not on PATH"):
        check_environment(spec_with({"python": "no-such-python"}), tmp_path, "refuse")
    (note,) = check_environment(spec_with({"python": "no-such-python", "modules": ["python/3.11"]}), tmp_path, "refuse")
    assert "not on PATH on this login node" in note and "python/3.11" in note


def test_runtime_execs_a_python_found_on_path(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper(bin_dir / "frenzy-test-python", sys.executable)
    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    script = tmp_path / "train.py"
    script.write_text("import sys; print('ran', sys.argv[1:])\n")
    root = Path(__file__).resolve().parent.parent
    env = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(root),
        "FRENZY_JOB_PYTHON": "frenzy-test-python",
        "FRENZY_NVML_SAMPLER": "0",
    }
    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir), "--script", str(script),
         "--", "a"],
        capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0 and res.stdout.strip() == "ran ['a']", res.stderr
