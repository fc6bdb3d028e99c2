"""Which job directories a calibration may rest on: jobs Slurm's accounting knows, run by the directory's owner.

A calibration changes every user's plans, and `frenzy-slurm calibrate` is pointed at many users' job
directories (a shell glob over /scratch/*/frenzy-jobs), so a directory is evidence only if:

- it is a directory (not a link) that nobody but its owner can write, and its plan.json, metrics.json and
  submission.json are regular files (not links) of that owner;
- its submission.json names a job that Slurm's accounting (`sacct`, one query for all) knows, run by that
  same user and, where accounting records it, in that directory; a job still pending or running is not
  measured yet;
- no other directory already stood for the same job.

Where the site keeps no accounting (or it does not answer), or a directory records no job id, nothing can
be checked against Slurm: only the caller's own job directories count then, and the report says so (the
caller vouches for its own files; a job id that accounting contradicts is rejected all the same). Every directory
is either accepted, with why, or rejected, with why; `calibrate` prints both.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm.errors import InputError
from frenzy_slurm.inputfile import _group_private_to, _owner_name
from frenzy_slurm.records import read_job_record

if TYPE_CHECKING:
    from frenzy_slurm.slurm.backend import AccountingRecord, SlurmBackend

# what calibration reads from a job directory (metrics.json may be absent: epilog or sacct peaks instead)
_JOB_FILES = ("plan.json", "submission.json", "metrics.json")
MAX_SUBMISSION_BYTES = 1 << 16  # a submission record is a few hundred bytes


@dataclass
class Verdict:
    """The directories a fit may use (with the job id and why) and those it may not (with why)."""

    accepted: list[tuple[Path, str | None, str]] = field(default_factory=list)  # (dir, job id, why)
    rejected: list[tuple[Path, str]] = field(default_factory=list)  # (dir, why)
    accounting: bool = False  # whether Slurm's accounting answered

    @property
    def dirs(self) -> list[Path]:
        return [d for d, _, _ in self.accepted]


def _owned_dir(d: Path) -> tuple[int, str | None]:
    """(owner uid, why it cannot be evidence or None): a real directory, its files regular and the owner's."""
    try:
        st = os.lstat(d)
    except OSError as exc:
        return -1, f"cannot read it ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return st.st_uid, "is a symbolic link; give the job directory itself"
    if not stat.S_ISDIR(st.st_mode):
        return st.st_uid, "is not a directory"
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _group_private_to(st.st_gid, st.st_uid)):
        return st.st_uid, (
            f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): anyone could have written its records"
        )
    for name in _JOB_FILES:
        try:
            fst = os.lstat(d / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return st.st_uid, f"{name}: cannot read it ({exc.strerror})"
        if not stat.S_ISREG(fst.st_mode):
            return st.st_uid, f"{name} is not a regular file (a link, FIFO or device)"
        if fst.st_uid != st.st_uid:
            return st.st_uid, (
                f"{name} belongs to {_owner_name(fst.st_uid)}, not to the directory's owner {_owner_name(st.st_uid)}"
            )
    return st.st_uid, None


def submitted_job_id(d: Path) -> str | None:
    """The job id submission.json records (a bounded read of a regular file), or None."""
    try:
        sub = read_job_record(d / "submission.json", "submission record", MAX_SUBMISSION_BYTES)
    except InputError:
        return None
    job_id = str(sub.get("job_id", "")) if isinstance(sub, dict) else ""
    return job_id if job_id.isdigit() else None


def _accounting(backend: SlurmBackend | None, ids: list[int]) -> dict[int, AccountingRecord] | None:
    """Slurm's records of these jobs (one sacct), or None where the site keeps none or it does not answer."""
    from frenzy_slurm.slurm import SlurmUnavailable

    if backend is None:
        return None
    try:
        return backend.accounting(ids)
    except SlurmUnavailable:
        return None


def verify_jobs(dirs: list[Path], backend: SlurmBackend | None) -> Verdict:
    """Accept or reject each job directory as evidence for a calibration (see the module docstring)."""
    me = os.geteuid()
    verdict = Verdict()
    candidates: list[tuple[Path, int, str | None]] = []
    for d in dirs:
        uid, problem = _owned_dir(d)
        if problem is not None:
            verdict.rejected.append((d, problem))
        else:
            candidates.append((d, uid, submitted_job_id(d)))
    ids = sorted({int(j) for _, _, j in candidates if j})
    records = _accounting(backend, ids) if ids else None  # no job id at all: nothing to ask Slurm about
    verdict.accounting = records is not None
    seen: dict[str, Path] = {}
    for d, uid, job_id in candidates:
        owner = _owner_name(uid)
        if records is None or job_id is None:
            # nothing to check against Slurm: your own directories are yours to vouch for, others' are not
            if job_id is None:
                unchecked = "no readable submission.json with a job id"
            else:
                unchecked = "Slurm's accounting did not answer (the site keeps none?)"
            if uid != me:
                verdict.rejected.append(
                    (
                        d,
                        f"belongs to {owner}, and {unchecked}, so its job cannot be checked: "
                        "only your own job directories count unchecked",
                    )
                )
            else:
                verdict.accepted.append((d, job_id, f"your own job directory; not checked against Slurm ({unchecked})"))
            continue
        if job_id in seen:
            verdict.rejected.append((d, f"job {job_id} is already counted from {seen[job_id]}"))
            continue
        rec = records.get(int(job_id))
        if rec is None:
            verdict.rejected.append((d, f"job {job_id} is unknown to Slurm's accounting (it never ran here)"))
            continue
        if rec.user != owner:
            verdict.rejected.append(
                (d, f"job {job_id} was run by {rec.user or 'an unknown user'}, but the directory belongs to {owner}")
            )
            continue
        if rec.work_dir and os.path.realpath(rec.work_dir) != os.path.realpath(d):
            verdict.rejected.append((d, f"job {job_id} ran in {rec.work_dir}, not in this directory"))
            continue
        from frenzy_slurm.slurm.view import job_phase

        if job_phase(rec.state) in ("pending", "running"):
            verdict.rejected.append((d, f"job {job_id} is {rec.state}: not measured yet"))
            continue
        seen[job_id] = d
        verdict.accepted.append((d, job_id, f"job {job_id} of {owner}, {rec.state} in Slurm's accounting"))
    return verdict
