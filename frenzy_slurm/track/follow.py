"""Following a running job: its output lines as they are written (`fsqueue JOBID --log --follow`).

The output files are read where they grow (a stat and a read of the new bytes each second: cheap); Slurm is
asked about the job's state gently, one query for the job after 2 s, then ever less often up to every
LONGEST_QUERY_S, and at once when the job script records its end (finished.json appears). When the job has
ended, the rest of its output is read and the follow ends with the job's final state.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from frenzy_slurm.slurm.job import ENDED, job_phase
from frenzy_slurm.track.jobs import MAX_LOG_BYTES, LogSection, log_ranks, output_files, rank_of_line, read_own_file

READ_EVERY_S = 1.0  # how often the output files are looked at: a stat, and a read of what is new
FIRST_QUERY_S = 2.0  # Slurm is asked after 2 s (as sbatch --wait), each later time 1.5x later, at most every 15 s:
QUERY_GROWTH = 1.5  # slurmctld is shared, and a few seconds' delay in seeing the end is what tail -f users accept
LONGEST_QUERY_S = 15.0
UNSEEN_LOOKS = 3  # a job neither in the queue nor recorded anywhere this many looks in a row is taken as gone


class Job(Protocol):
    """What following needs of a job (the API's `Job` is one; track sits below the API and does not import it)."""

    @property
    def job_dir(self) -> Path: ...

    @property
    def state(self) -> str: ...


def read_from(path: Path, offset: int, max_bytes: int = MAX_LOG_BYTES) -> tuple[bytes, int]:
    """At most `max_bytes` of a regular file of this user from `offset` on, never through a link
    (`track.read_own_file`), and the file's size now. InputError names the file otherwise."""
    data, _, size = read_own_file(path, offset, max_bytes)
    return data, size


@dataclass
class _Followed:
    """One output file: how far it has been read, and a line not yet ended by a newline."""

    path: Path
    offset: int | None = None  # None: not read yet (the file may not exist yet)
    partial: bytes = b""


@dataclass
class OutputReader:
    """A job's output files, read incrementally: each `poll` returns the lines written since the last one, as
    (rank, text) with srun's label taken off (rank None for the batch script's and srun's own lines), only
    those of `rank` or `component` where one is asked for. The first read of a file starts at its last
    MAX_LOG_BYTES (from a whole line). A line is returned once its newline is written, or by `poll(final=True)`."""

    job_dir: Path
    job_id: int
    rank: int | None = None
    component: int | None = None
    name: str = ""
    notes: list[str] = field(default_factory=list)
    _ranks: list[tuple[int, str]] = field(default_factory=list)
    _files: list[_Followed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._ranks = log_ranks(self.job_dir, self.job_id, self.rank, self.component)
        paths, notes = output_files(self.job_dir, self.job_id, self.name)
        self._files = [_Followed(p) for p in paths]
        self.notes += notes

    @property
    def ranks(self) -> list[tuple[int, str]]:
        """Per global rank of the plan, its component and partition."""
        return self._ranks

    @property
    def files(self) -> list[Path]:
        """The output files that exist (have been read)."""
        return [f.path for f in self._files if f.offset is not None]

    def poll(self, final: bool = False) -> list[tuple[int | None, str]]:
        out: list[tuple[int | None, str]] = []
        for f in self._files:
            out += self._read(f, final)
        return [(r, text) for r, text in out if self.wanted(r)]

    def title(self, r: int | None) -> str:
        """The section a line of rank `r` belongs to, as `fsqueue --log` heads it."""
        comp, part = self._ranks[r] if r is not None and r < len(self._ranks) else (None, None)
        return LogSection(r, comp, part, []).title

    def wanted(self, r: int | None) -> bool:
        if r is None:
            return self.rank is None and self.component is None
        comp = self._ranks[r][0] if r < len(self._ranks) else None
        return (self.rank is None or r == self.rank) and (self.component is None or comp == self.component)

    def _read(self, f: _Followed, final: bool) -> list[tuple[int | None, str]]:
        if f.offset is None:
            if not f.path.exists() and not f.path.is_symlink():
                return []  # not written yet: the job has not started
            size = os.lstat(f.path).st_size
            f.offset = max(0, size - MAX_LOG_BYTES)
            if f.offset:
                self.notes.append(f"{f.path}: only its last {MAX_LOG_BYTES >> 20} MiB were read")
                data, _ = read_from(f.path, f.offset)
                skip = data.find(b"\n") + 1 if b"\n" in data else len(data)  # from the first whole line
                f.offset += skip
        data, size = read_from(f.path, f.offset)
        if size < f.offset:  # truncated (a requeued run that does not append): from its start again
            self.notes.append(f"{f.path} was truncated; read again from its start")
            f.offset, f.partial = 0, b""
            data, size = read_from(f.path, 0)
        f.offset += len(data)
        data = f.partial + data
        end = len(data) if final else data.rfind(b"\n") + 1
        f.partial = data[end:]
        text = data[:end].decode("utf-8", errors="replace")
        return [rank_of_line(line, self._ranks) for line in text.splitlines()]


def follow_job(
    job: Job,
    reader: OutputReader,
    emit: Callable[[list[tuple[int | None, str]]], None],
    *,
    state: str | None = None,
    sleep: Callable[[float], None] | None = None,
    clock: Callable[[], float] | None = None,
) -> str:
    """Hand every new output line of the job to `emit` until the job has ended, then the rest: its final
    state. The output is read each READ_EVERY_S; Slurm is asked (one query for the job) with back-off, and
    at once when finished.json appears. A job neither in the queue nor recorded for UNSEEN_LOOKS looks in a
    row ends the follow as UNKNOWN. `state`: the job's state as the caller just saw it (else one query).
    Ctrl-C (KeyboardInterrupt) is the caller's."""
    sleep = sleep or _sleep
    clock = clock or _clock
    finished = job.job_dir / "finished.json"
    state, unseen = state or job.state, 0
    delay = FIRST_QUERY_S
    next_query = clock() + delay
    had_finished = finished.exists()
    while job_phase(state) not in ENDED:
        emit(reader.poll())
        sleep(READ_EVERY_S)
        has_finished = finished.exists()
        if clock() >= next_query or (has_finished and not had_finished):
            state = job.state
            unseen = unseen + 1 if state == "UNKNOWN" else 0
            if unseen >= UNSEEN_LOOKS:
                break
            delay = min(delay * QUERY_GROWTH, LONGEST_QUERY_S)
            next_query = clock() + delay
        had_finished = has_finished
    emit(reader.poll(final=True))
    return state


def _sleep(seconds: float) -> None:
    """time.sleep; tests replace it to write output and move a fake Slurm's clock."""
    time.sleep(seconds)


def _clock() -> float:
    """time.monotonic; tests replace it with a fake Slurm's clock."""
    return time.monotonic()
