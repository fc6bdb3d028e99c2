"""In the job: the stop signals are caught from the first line, user scripts survive an early
USR2, old checkpoints are pruned, and a module planted in the job directory never runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from frenzy_slurm.runtime import checkpoints

ROOT = Path(__file__).resolve().parent.parent


def test_handler_is_installed_before_torch_is_imported():
    code = (
        "import signal, sys; import frenzy_slurm.runtime.__main__; "
        "print(signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None), "
        "signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.stdout.split() == ["True", "True", "False"], out.stderr


def _signal_mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    return 0


def test_early_usr2_does_not_kill_a_user_script(tmp_path):
    """USR2 that arrives while the runtime starts the user's script is not fatal (it used to be: exit -12)."""
    script = tmp_path / "train.py"
    script.write_text("import os, time\ntime.sleep(1.5)\nprint('alive', os.environ.get('FRENZY_STOP_SIGNAL'))\n")
    proc = subprocess.Popen(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(tmp_path), "--script", str(script)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    bit = 1 << (signal.SIGUSR2 - 1)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and proc.poll() is None:
        if (_signal_mask(proc.pid, "SigCgt") | _signal_mask(proc.pid, "SigIgn")) & bit:
            break
        time.sleep(0.005)
    else:
        proc.kill()
        pytest.fail("the runtime never caught or ignored SIGUSR2")
    proc.send_signal(signal.SIGUSR2)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, (proc.returncode, err)
    assert out.startswith("alive")


def test_planted_module_in_job_dir_does_not_run(tmp_path):
    """The job runs with its working directory in the job directory; -P keeps that off sys.path."""
    from frenzy_slurm.jobspec import load_job_spec
    from frenzy_slurm.render import runtime_command

    planted = tmp_path / "frenzy_slurm"
    planted.mkdir()
    (planted / "__init__.py").write_text("raise SystemExit('PLANTED CODE RAN')\n")
    spec = load_job_spec(ROOT / "examples" / "tiny-cpu.yaml")
    cmd = runtime_command(spec, tmp_path, None)  # the built-in trainer: no user script
    res = subprocess.run([*cmd, "--help"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert "PLANTED" not in res.stderr + res.stdout and res.returncode == 0, res.stderr


def _ckpt(root: Path, steps: list[int], latest: int) -> Path:
    d = root / "checkpoints"
    for s in steps:
        (d / f"step{s}").mkdir(parents=True)
        (d / f"step{s}" / "mp_rank_00_model_states.pt").write_bytes(b"x")
    (d / "latest").write_text(f"step{latest}")
    (d / "notes").mkdir()  # not a step tag: never touched
    return d


def test_prune_keeps_the_newest_and_the_latest(tmp_path):
    d = _ckpt(tmp_path, [10, 20, 30, 40, 50], latest=50)
    deleted = checkpoints.prune(d, keep=2)
    assert sorted(p.name for p in deleted) == ["step10", "step20", "step30"]
    assert sorted(p.name for p in d.iterdir()) == ["latest", "notes", "step40", "step50"]
    assert checkpoints.latest_step(d) == 50


def test_prune_never_deletes_what_latest_names(tmp_path):
    d = _ckpt(tmp_path, [100, 200, 300], latest=100)  # e.g. a resumed run whose newer saves were partial
    checkpoints.prune(d, keep=1)
    assert sorted(p.name for p in d.iterdir()) == ["latest", "notes", "step100", "step300"]


def test_keep_checkpoints_is_a_spec_field(write_yaml):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.jobspec import load_job_spec

    text = (ROOT / "examples" / "tiny-cpu.yaml").read_text()
    assert load_job_spec(write_yaml(text)).training.keep_checkpoints == 3
    one = text.replace("  steps: 6\n", "  steps: 6\n  keep_checkpoints: 1\n")
    assert load_job_spec(write_yaml(one)).training.keep_checkpoints == 1
    with pytest.raises(InputError, match="keep_checkpoints"):
        load_job_spec(write_yaml(text.replace("  steps: 6\n", "  steps: 6\n  keep_checkpoints: 0\n")))
