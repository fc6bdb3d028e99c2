"""The one helper that runs Slurm commands: argument lists, a timeout, and errors that say what happened.

Used only inside the Slurm seam (`frenzy_slurm.slurm`).

Never uses a shell. Outage messages from any Slurm tool become SlurmUnavailable (exit 4).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

from frenzy_slurm.errors import EXIT_SLURM_UNAVAILABLE, FrenzyError

_OUTAGE = ("unable to contact slurm controller", "socket timed out", "connection refused",
           "zero bytes were transmitted or received", "slurm_load_", "munge", "authentication failure",
           "could not establish a configuration source", "unable to establish a configuration source")


class SlurmUnavailable(FrenzyError):
    """The controller cannot be reached or the Slurm commands are missing."""

    exit_code = EXIT_SLURM_UNAVAILABLE


class SlurmTimeout(SlurmUnavailable):
    """A command did not answer in time. It may still have acted (a submission can exist): callers that
    change state look the result up before reporting a failure."""


class SlurmCommandError(FrenzyError):
    """A Slurm command failed for a reason other than an outage; carries the command and its stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv, self.returncode, self.stderr = argv, returncode, stderr
        super().__init__(f"{' '.join(argv)} failed (exit {returncode}): {stderr.strip() or 'no message'}")


@dataclass(frozen=True)
class Result:
    argv: list[str]
    stdout: str
    stderr: str
    returncode: int


def run(argv: list[str], timeout: float = 30.0, check: bool = True, input_text: str | None = None,
        env: dict[str, str] | None = None, umask: int = -1) -> Result:
    """Run a Slurm command; raise SlurmUnavailable on outages and SlurmCommandError on other failures.

    `umask` (not -1) is set in the child only: sbatch passes it on to the job it creates."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input_text,
                              env=env if env is not None else os.environ.copy(), umask=umask)
    except FileNotFoundError:
        raise SlurmUnavailable(
            f"'{argv[0]}' was not found: the Slurm client commands are not installed or not on PATH "
            "(install slurm-client, or `module load slurm`); plan without Slurm with --backend static.") from None
    except subprocess.TimeoutExpired:
        raise SlurmTimeout(f"'{' '.join(argv)}' did not answer within {timeout:.0f}s: slurmctld is overloaded or down.") from None
    res = Result(argv, proc.stdout, proc.stderr, proc.returncode)
    if check:
        raise_for_status(res)
    return res


def raise_for_status(res: Result) -> None:
    """SlurmUnavailable for an outage, SlurmCommandError for any other failure, nothing on success."""
    if res.returncode == 0:
        return
    low = res.stderr.lower()
    if any(k in low for k in _OUTAGE):
        first = res.stderr.strip().splitlines()[0] if res.stderr.strip() else res.argv[0]
        raise SlurmUnavailable(f"Slurm is unreachable: {first} (from '{' '.join(res.argv)}'). "
                               "Check that slurmctld runs (`scontrol ping`) and SLURM_CONF.")
    raise SlurmCommandError(res.argv, res.returncode, res.stderr)
