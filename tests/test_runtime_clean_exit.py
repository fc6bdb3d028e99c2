"""A task of the runtime ends with the status its run decided, whatever the interpreter's teardown does.

A run that trained every step ended FAILED when a rank died in std::terminate at interpreter exit (a C++ thread
of gloo still joinable). Here a `sitecustomize` aborts the process at exit (atexit -> os.abort), standing for any
destructor or finaliser that fails after the outcome is written: the runtime must not get that far
(runtime/ending.py). The live counterpart runs the tiny job on Slurm many times (test_runtime_clean_exit_live.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.runtime.dist import free_port

from .helpers import ROOT

# only in the process started with the variable: DeepSpeed's own helper processes (compiler checks) exit normally
ABORT_AT_EXIT = (
    "import atexit, os\nif os.environ.pop('FRENZY_TEST_ABORT_AT_EXIT', None) == '1':\n    atexit.register(os.abort)\n"
)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(ABORT_AT_EXIT)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "FRENZY_"))}
    return {**clean, "PYTHONPATH": f"{site}:{ROOT}", "FRENZY_TEST_ABORT_AT_EXIT": "1", **extra}


def _runtime(*args: str) -> list[str]:
    return [sys.executable, "-P", "-m", "frenzy_slurm.runtime", *args]


def test_the_teardown_stand_in_aborts_a_plain_python(tmp_path):
    res = subprocess.run([sys.executable, "-P", "-c", "pass"], env=_env(tmp_path), capture_output=True, timeout=60)
    assert res.returncode == -6  # SIGABRT: what a finished run used to die of


@pytest.mark.parametrize(
    ("args", "code"),
    [(("--help",), 0), (("--job-dir", "/nonexistent/job"), 2), (("--no-such-flag",), 2)],
)
def test_every_exit_of_the_runtime_keeps_its_status(tmp_path, args, code):
    res = subprocess.run(_runtime(*args), env=_env(tmp_path), capture_output=True, text=True, cwd="/", timeout=120)
    assert res.returncode == code, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.slow
def test_a_finished_run_exits_0_on_every_rank(tmp_path):
    pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")
    from .test_runtime_moved_resume import _job_dir

    job = _job_dir(tmp_path / "job", 2, ParallelPlan(dp=2, zero=1, micro_batch=2, grad_accum=2))
    port = str(free_port())
    procs = [
        subprocess.Popen(
            _runtime("--job-dir", str(job)),
            cwd=job,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=_env(
                tmp_path,
                DS_ACCELERATOR="cpu",
                RANK=str(r),
                LOCAL_RANK=str(r),
                WORLD_SIZE="2",
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=port,
            ),
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    assert json.loads((job / "metrics.json").read_text())["step"] == 2
    assert (job / "checkpoints" / "step2").is_dir()
