"""`site detect`'s probe step runs `python -P` from `/` on the node (`srun --chdir=/`), so a module planted in
the admin's working directory (a `pynvml.py`) is never imported, even by a probe started without -P."""

from __future__ import annotations

import json
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


# ---- -P and a safe working directory ----------------------------------------------------------------


class _RecordingBackend:
    """The Slurm seam's run_step, recording the probe command instead of starting srun."""

    def __init__(self) -> None:
        self.argv: list[str] | None = None

    def run_step(self, pool, gpus, argv, timeout):
        self.argv = list(argv)
        return ""


def test_site_detect_probe_does_not_import_a_planted_pynvml(tmp_path):
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.site.detect import probe_pools

    view = synthetic([("a100", "A100-40GB", 1, 4)])
    backend = _RecordingBackend()
    probe_pools(backend, view, sys.executable, 30)
    assert backend.argv is not None and backend.argv[:3] == [sys.executable, "-P", "-m"], backend.argv
    # run exactly that command where an attacker planted pynvml.py: the working directory (and an empty
    # PYTHONPATH entry, which means the working directory) must not be searched
    marker = _plant(tmp_path / "cwd")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:")  # frenzy_slurm from the checkout; the trailing ':' is ''
    res = subprocess.run(backend.argv, cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the probe imported pynvml.py from its working directory"
    answer = json.loads(res.stdout.strip().splitlines()[-1])
    assert answer["host"]  # the real probe ran (with or without NVML on this machine)


def test_probe_drops_the_working_directory_even_when_started_without_P(tmp_path):
    marker = _plant(tmp_path / "cwd")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-m", "frenzy_slurm.runtime.nvml_probe"],
        cwd=tmp_path / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


def test_site_probe_step_runs_from_root_directory(monkeypatch):
    """`srun --chdir=/`: the step never starts in the admin's directory (or /tmp, srun's fallback)."""
    from frenzy_slurm.slurm import cli as slurm_cli
    from frenzy_slurm.slurm.view import PoolKey

    seen: list[list[str]] = []

    class _Done:
        stdout = "{}"

    monkeypatch.setattr(slurm_cli, "run", lambda argv, timeout: seen.append(list(argv)) or _Done())
    backend = slurm_cli.SlurmCliBackend.__new__(slurm_cli.SlurmCliBackend)
    backend.run_step(PoolKey("a100", "a100"), 1, ["python", "-P", "-m", "x"], 30)
    srun = seen[0]
    assert "--chdir=/" in srun and srun.index("--chdir=/") < srun.index("python"), srun
