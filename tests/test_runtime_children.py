"""The runtime's own Python children import nothing from where the job runs (frenzy_slurm/runtime/children.py).

The universal-checkpoint converter (deepspeed.checkpoint.ds_to_universal, started by the trainer for a moved job)
ran as `python -m ...` without -P, from the job directory (the job's working directory): a `deepspeed/` package
planted there shadowed DeepSpeed's. The old check only read single-line argument lists and missed it.
"""

from __future__ import annotations

import ast
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.runtime.children import child_env, safe_pythonpath
from frenzy_slurm.runtime.trainer import convert_to_universal, converter_argv

from .helpers import ROOT

PLANTED = "import pathlib\npathlib.Path(__file__).parent.joinpath('PLANTED-RAN').write_text('imported')\n"


def _plant_package(job_dir: Path) -> Path:
    """A deepspeed/checkpoint/ds_to_universal.py in the job directory that leaves PLANTED-RAN there when run."""
    pkg = job_dir / "deepspeed" / "checkpoint"
    pkg.mkdir(parents=True)
    (job_dir / "deepspeed" / "__init__.py").write_text(PLANTED.replace(".parent.", ".parent.parent."))
    (pkg / "__init__.py").write_text("")
    (pkg / "ds_to_universal.py").write_text(PLANTED.replace(".parent.", ".parent.parent.parent."))
    return job_dir / "PLANTED-RAN"


def test_converter_command_line_is_isolated():
    argv = converter_argv(Path("/jobs/a/checkpoints/step4"), Path("/jobs/b/checkpoints/.w"))
    assert argv[:4] == [sys.executable, "-P", "-m", "deepspeed.checkpoint.ds_to_universal"]
    assert argv[argv.index("--input_folder") + 1] == "/jobs/a/checkpoints/step4"


def test_pythonpath_keeps_only_absolute_entries():
    assert safe_pythonpath(f"/opt/x::.:rel/dir:{os.pathsep}/opt/y") == "/opt/x:/opt/y"
    assert safe_pythonpath(":.") is None and safe_pythonpath(None) is None
    env = child_env({"PYTHONPATH": ":", "HOME": "/root"})
    assert env == {"HOME": "/root"}


@pytest.mark.slow
def test_converter_ignores_a_deepspeed_planted_in_the_job_directory(tmp_path, monkeypatch):
    """Run from the job directory with an empty PYTHONPATH entry, as in a job: DeepSpeed's own converter runs
    (and fails on the missing checkpoint), the planted package is never imported."""
    pytest.importorskip("deepspeed")
    job_dir = tmp_path / "job"
    marker = _plant_package(job_dir)
    monkeypatch.chdir(job_dir)
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}:")
    failed = convert_to_universal(job_dir / "checkpoints" / "step4", job_dir / "checkpoints" / ".work", job_dir)
    assert not marker.exists(), "the converter imported deepspeed/ from the job directory"
    assert failed, "the converter cannot succeed on a checkpoint that does not exist"
    # the planted package is importable where a bare `python -m` runs: the check above means something
    subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal"], cwd=job_dir, timeout=60)
    assert marker.exists()


def _python_children(tree: ast.AST) -> list[ast.List]:
    """Argument lists that start a Python: [sys.executable, ...] or [python, ...], on one line or many."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.List) and len(node.elts) >= 2:
            first = node.elts[0]
            is_python = (isinstance(first, ast.Attribute) and ast.unparse(first) == "sys.executable") or (
                isinstance(first, ast.Name) and first.id == "python"
            )
            if is_python:
                found.append(node)
    return found


def test_every_python_child_the_package_starts_passes_P():
    """Every [sys.executable, '-m'/'-c', ...] list in the package, also written over several lines, has -P first."""
    offenders = []
    for path in sorted((ROOT / "frenzy_slurm").rglob("*.py")):
        for node in _python_children(ast.parse(path.read_text())):
            second = node.elts[1]
            if isinstance(second, ast.Constant) and str(second.value).startswith("-") and second.value != "-P":
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


FAKE_PYNVML = (
    "from tests.nvml_fake import FakeNvml\n"
    "_fake = FakeNvml('pcie-4xa10.json')\n"
    "def __getattr__(name):\n"
    "    return getattr(_fake, name)\n"
)


def test_the_nvml_sampler_never_holds_the_steps_output(tmp_path):
    """slurmstepd forwards a task's stdout/stderr to srun until every process holding them has closed them: a
    sampler that inherited them kept the step open for up to a sample after the script ended (or for ever, if
    it hung). Here the sampler (on a fake NVML) sleeps 30 s between samples; its starter's pipes must close
    when the starter exits."""
    import time

    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    # the starter (the script, in a job) ends once the sampler has taken its first sample and sleeps
    code = (
        "import time\nfrom pathlib import Path\nfrom frenzy_slurm.runtime.nvml_sampler import start_beside\n"
        f"job = Path({str(job)!r})\nstart_beside(job, interval=30)\n"
        "deadline = time.monotonic() + 60\n"
        "while not list(job.glob('nvml-*.json')) and time.monotonic() < deadline:\n    time.sleep(0.2)\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{fake}:{ROOT}"}
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, env=env, timeout=120)
    took = time.monotonic() - t0
    assert res.returncode == 0 and res.stdout == "" and res.stderr == "", res.stderr
    assert took < 25, f"the starter's output stayed open {took:.0f} s: the sampler held it"
    assert list(job.glob("nvml-*.json")), "the sampler did not sample (so the check above proves nothing)"
    (log,) = job.glob("nvml-*.log")
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
