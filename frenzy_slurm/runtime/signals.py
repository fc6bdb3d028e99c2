"""The time-limit and preemption signals, caught from the runtime's first line and acted on at step boundaries.

Slurm sends SIGUSR2 `SIGNAL_LEAD_S` before the time limit (`--signal=USR2@300` in job.sbatch; NCCL owns
USR1) and SIGTERM on scancel or preemption. Python's default for USR2 is to die, so a handler installed
only after torch and DeepSpeed are imported (seconds to minutes) lets an early signal kill the job with
nothing saved. `install()` is therefore the first thing `python -m frenzy_slurm.runtime` does; the
trainer polls `pending()` after every step.
"""

from __future__ import annotations

import signal
from types import FrameType

STOP: dict[str, str | None] = {"signal": None}
CAUGHT = (signal.SIGUSR2, signal.SIGTERM)


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    STOP["signal"] = signal.Signals(signum).name


def install() -> None:
    """Record USR2/TERM instead of dying; idempotent."""
    for sig in CAUGHT:
        signal.signal(sig, _on_signal)


def pending() -> str | None:
    """The name of the first stop signal received (SIGUSR2, SIGTERM), or None."""
    return STOP["signal"]


def prepare_exec() -> None:
    """Before exec'ing a user's script: ignore USR2 until it installs its own handler.

    exec resets caught signals to their default (USR2: terminate) but keeps ignored ones ignored, so
    the early window stays safe; a script that handles USR2 replaces the disposition. SIGTERM goes back
    to its default, so scancel still stops a script that does not handle it.
    """
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
