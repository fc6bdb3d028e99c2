"""Error types shared by every stage, and the exit codes the commands map them to.

Each user-facing failure is one exception carrying a complete message (what was
tried, why it failed, how to fix it); the CLI prints it without a traceback.
"""

from __future__ import annotations

# Exit codes follow Slurm's habit of small, documented integers.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_BAD_INPUT = 2  # model.yaml, site file or flags are invalid (click also uses 2 for usage errors)
EXIT_NO_FIT = 3  # the job fits nowhere within its limits
EXIT_SLURM_UNAVAILABLE = 4  # controller down or Slurm commands missing
EXIT_SLURM_REJECTED = 5  # Slurm refused the submission
EXIT_SLURM_UNEXPECTED = 6  # Slurm answered something we cannot parse
# this submission's earlier job is still alive: pending, running or not yet visible to Slurm
# (submission.SUBMIT_GRACE_S); once it has ended, the same fsbatch submits a rerun into a new directory. --force
# submits another job anyway.
EXIT_ALREADY_SUBMITTED = 7


class FrenzyError(Exception):
    """Base class: a message meant for the user and the exit code that goes with it."""

    exit_code = EXIT_FAILURE

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class InputError(FrenzyError):
    """A user-supplied file or flag is invalid."""

    exit_code = EXIT_BAD_INPUT


class NoFitError(FrenzyError):
    """No allocation within the user's limits can hold the job."""

    exit_code = EXIT_NO_FIT
