"""Every Python process frenzy-slurm starts that is not the user's own script runs with `-P` from a safe
directory: the runtime's NVML sampler starts from `/`, and no `[sys.executable, "-m"/"-c"]` in the package lacks
-P, so a module planted where the job runs is never imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PLANTED = "import pathlib\npathlib.Path(__file__).with_name('PLANTED-RAN').write_text('imported')\n"


def _plant(directory: Path, module: str = "pynvml") -> Path:
    """A module file that leaves PLANTED-RAN beside itself when imported."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(PLANTED)
    return directory / "PLANTED-RAN"


def test_nvml_sampler_starts_with_P_from_root(tmp_path, monkeypatch):
    import subprocess as sp

    from frenzy_slurm.runtime import nvml_sampler

    started: list[tuple[list[str], dict]] = []
    job = tmp_path / "job"
    job.mkdir()
    with monkeypatch.context() as m:
        m.setattr(sp, "Popen", lambda argv, **kw: started.append((list(argv), kw)))
        nvml_sampler.start_beside(job)
    argv, kw = started[0]
    assert argv[:4] == [sys.executable, "-P", "-m", "frenzy_slurm.runtime.nvml_sampler"], argv
    assert kw.get("cwd") == "/", kw
    # and that command, started where pynvml.py was planted, does not import it (a dead pid: it stops at once)
    marker = _plant(tmp_path / "cwd")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = gone.pid  # a process that has exited: the sampler stops after one sample
    cmd = nvml_sampler.sampler_argv(job, dead, 0.1)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:")
    res = subprocess.run(cmd, cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the sampler imported pynvml.py from its working directory"


def test_no_frenzy_python_child_without_P():
    """Every `sys.executable` the package starts passes -P (the user's own script, exec'd as a script, aside)."""
    import re

    offenders = []
    for path in (ROOT / "frenzy_slurm").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\[\s*(sys\.executable|python)\s*,\s*\"-[mc]\"", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders
