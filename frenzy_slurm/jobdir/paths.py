"""Where job directories are: the user's jobs folder, and the directory a job is planned into by default.

`$FRENZY_JOBS_DIR`, else `./frenzy-jobs` (relative to the working directory): fsbatch plans into it, and
fsqueue, `frenzy-slurm calibrate` and `frenzy-slurm jobs` look there when they are given no directory.
"""

from __future__ import annotations

import os
from pathlib import Path


def jobs_dir() -> Path:
    """The user's jobs folder, as given (`$FRENZY_JOBS_DIR`, else `frenzy-jobs`); callers make it absolute
    where they record it."""
    return Path(os.environ.get("FRENZY_JOBS_DIR", "frenzy-jobs"))


def default_job_dir(name: str, submission: str) -> Path:
    """The directory a job (model.yaml's `name`) is planned into when none is given:
    `<jobs folder>/<name>-<submission hash[:8]>`."""
    return (jobs_dir() / f"{name}-{submission[:8]}").absolute()
