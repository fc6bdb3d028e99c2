"""The watcher's intent records: what a move is doing, written before each step, so any pass can finish it.

A move is several Slurm commands and files (hold, sbatch, moved.json, scancel), and the watcher may be killed,
lose a reply or hit a full disk between any two. Before it acts it writes an intent (`MoveIntent`, one JSON
file per moved job in `<lock directory>/watch/`, the user's private directory, through the one atomic writer):
which job, which step, and the tag of the successor it is about to submit (the job comment `frenzy:<submission>`
and the job directory it is submitted from, which together name one submission). Every pass first finishes
the intents it finds (`resume`), each step idempotent:

- no successor of that tag in the queue: the move did not happen; the old job is released (a pending job's
  hold, whether or not the hold's reply arrived) and runs as before;
- a successor: the move happened; moved.json is written if missing, the old job is stopped (a pending one
  cancelled, a running one sent SIGTERM once), and the intent is removed.

So a job is never held for ever, and a run never has two live copies: the old job is released only where no
successor exists, and a job with a successor is stopped, never moved again.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frenzy_slurm.core.errors import FrenzyError
from frenzy_slurm.core.records import read_job_record_or_none, write_json
from frenzy_slurm.jobdir.safety import lock_dir, make_private_dir
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.slurm.view import Job, job_phase

MOVED = "moved.json"  # in the old job's directory: where it went

Step = Literal["hold", "submit", "stop"]


class MoveIntent(BaseModel):
    """One move in progress: written before each step, removed once the old job is stopped."""

    model_config = ConfigDict(extra="forbid")

    job_id: int = Field(description="The job being moved.")
    kind: Literal["pending", "running"] = Field(description="Its state when the move began.")
    job_dir: str = Field(description="Its job directory (where moved.json goes).")
    tag: str = Field(description="The successor's job comment, frenzy:<submission>.")
    successor_dir: str = Field(description="The job directory the successor is submitted from (its WorkDir).")
    step: Step = Field(
        description="The step about to be taken: hold (the old job), submit (the successor), stop (the old job)."
    )
    successor: int | None = Field(None, description="The successor's job id, once sbatch answered.")
    moved: dict = Field(default_factory=dict, description="What moved.json records (from, to, steps left, while).")
    at: float = Field(description="When the move began, epoch seconds.")


def journal_dir() -> Path:
    """`<lock directory>/watch`: private to the user, on a file system every login node sees."""
    return make_private_dir(lock_dir() / "watch", "watch journal")


def save(intent: MoveIntent) -> None:
    """Record the step about to be taken (atomically: a crash leaves the previous step's record)."""
    write_json(journal_dir() / f"{intent.job_id}.json", intent.model_dump(mode="json"))


def drop(intent: MoveIntent) -> None:
    (journal_dir() / f"{intent.job_id}.json").unlink(missing_ok=True)


def open_intents() -> list[MoveIntent]:
    """Every move a pass began and did not finish (a record that does not parse is left for the user)."""
    out = []
    for f in sorted(journal_dir().glob("*.json")):
        data = read_job_record_or_none(f)
        try:
            out.append(MoveIntent.model_validate(data))
        except ValidationError:
            continue
    return out


def successor_of(intent: MoveIntent, backend: SlurmBackend, user: str) -> Job | None:
    """The job the move submitted, found by its tag: the comment and the directory it was submitted from."""
    if intent.successor is not None:
        rows = backend.jobs([intent.successor])
    else:
        rows = backend.jobs(user=user)
    where = os.path.realpath(intent.successor_dir)
    return next(
        (j for j in rows if j.comment == intent.tag and j.workdir and os.path.realpath(j.workdir) == where), None
    )


def moved_record(job_dir: Path) -> dict[str, Any] | None:
    """moved.json of a job the watcher moved (None: not moved)."""
    data = read_job_record_or_none(job_dir / MOVED)
    return data if isinstance(data, dict) else None


def write_moved(intent: MoveIntent, successor: int) -> None:
    """moved.json in the old job's directory (what moved where), unless this move already wrote it."""
    path = Path(intent.job_dir)
    if (moved_record(path) or {}).get("moved_to_job") == successor:
        return
    record = {"moved_to_job": successor, "moved_to_dir": intent.successor_dir, "at": time.time(), **intent.moved}
    write_json(path / MOVED, record)


def release(backend: SlurmBackend, job_id: int) -> None:
    """Undo a hold (sent or only meant): a job that is not pending, or is gone, refuses, which is fine."""
    try:
        backend.release(job_id)
    except SlurmCommandError:
        pass


def stop_old(intent: MoveIntent, backend: SlurmBackend, successor: int) -> None:
    """The old job's end once its successor exists: cancelled if pending, SIGTERM once if running."""
    intent = intent.model_copy(update={"successor": successor})
    if intent.step != "stop":
        write_moved(intent, successor)
        save(intent.model_copy(update={"step": "stop"}))  # recorded first: a running job is signalled once
        try:
            if intent.kind == "running":
                backend.cancel(intent.job_id, signal="TERM")  # it saves a checkpoint; the successor follows
            else:
                backend.cancel(intent.job_id)
        except SlurmCommandError:
            pass  # it ended meanwhile: the successor resumes from what it saved
    elif intent.kind == "pending":
        _cancel_if_pending(backend, intent.job_id)
    drop(intent)


def _cancel_if_pending(backend: SlurmBackend, job_id: int) -> None:
    """A pending move's old job, still queued after its cancel was recorded (the reply was lost): cancel it."""
    rows = backend.jobs([job_id])
    if rows and job_phase(rows[0].state) == "pending":
        try:
            backend.cancel(job_id)
        except SlurmCommandError:
            pass


def resume(intent: MoveIntent, backend: SlurmBackend, user: str) -> int | None:
    """Finish one open move (see the module docstring): the successor's job id, or None where there was none
    (the old job is then released, as before the move)."""
    found = successor_of(intent, backend, user)
    if found is None:
        release(backend, intent.job_id)
        drop(intent)
        return None
    stop_old(intent, backend, found.job_id)
    return found.job_id


def resume_all(backend: SlurmBackend, user: str) -> list[str]:
    """Every open move finished, as far as Slurm answers (one that cannot be finished now stays for the next);
    one line for each, saying what was done."""
    done = []
    for intent in open_intents():
        try:
            found = resume(intent, backend, user)
        except (SlurmUnavailable, FrenzyError, OSError) as exc:
            done.append(f"job {intent.job_id}: its unfinished move stays for the next pass ({exc})")
            continue
        if found is None:
            done.append(f"job {intent.job_id}: an unfinished move had submitted nothing; released, it waits as before")
        else:
            done.append(f"job {intent.job_id}: finished its move to job {found}")
    return done
