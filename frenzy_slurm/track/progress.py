"""A running job's progress: the record the built-in trainer keeps (progress.json), and the one-line display
`fsbatch --wait` (one line per job of a sweep) shows on a terminal while it waits.

progress.json is written by rank 0 after its first step, then at most every PROGRESS_EVERY_S seconds, and after
its last: one small atomic write (records.write_json renames a finished file), so a reader never sees half a
record and a long run writes a few bytes every half minute. metrics.json, written at the end, stays the full
record. The display is for people: on a terminal it redraws its lines in place (carriage return and cursor
up, each line cut to the terminal's width); where stderr is not a terminal (a pipe, a log file, CI) it prints
nothing, so logs keep only the lines that say a job ended. Light (the standard library, `records`, Slurm's
time format): the trainer imports it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

from frenzy_slurm.core.records import read_job_record_or_none, write_json
from frenzy_slurm.slurm.timefmt import format_slurm_time

PROGRESS_FILE = "progress.json"
PROGRESS_EVERY_S = 30.0  # the trainer's record at most this often: a few bytes per half minute on a shared file system
MAX_PROGRESS_BYTES = 1 << 16  # the record is a few hundred bytes
REDRAW_S = 1.0  # the display's elapsed time ticks each second
READ_EVERY_S = 5.0  # and reads each job's progress.json at most this often


@dataclass
class ProgressRecorder:
    """Rank 0's progress.json: after the first step of a run, then at most every `every_s` seconds, and
    after the last step (`step` is the number of steps done, `loss` the last step's)."""

    job_dir: Path
    total_steps: int
    every_s: float = PROGRESS_EVERY_S
    clock: Callable[[], float] = time.monotonic
    _last: float | None = None

    def step(self, step: int, loss: object, step_time_s: float) -> bool:
        """Record this step if it is due: whether it wrote."""
        now = self.clock()
        if self._last is not None and now - self._last < self.every_s and step < self.total_steps:
            return False
        self._last = now
        record = {
            "step": step,
            "total_steps": self.total_steps,
            "loss": float(loss) if isinstance(loss, (int, float)) else None,
            "step_time_s": step_time_s,
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0),
            "written_at": time.time(),
        }
        write_json(self.job_dir / PROGRESS_FILE, record)
        return True


def read_progress(job_dir: Path) -> dict[str, Any] | None:
    """The job's latest progress: progress.json while it runs, metrics.json's once it has ended (whichever
    is newer); None where neither is readable (a script's job records no steps)."""
    found = []
    for name in (PROGRESS_FILE, "metrics.json"):
        rec = read_job_record_or_none(
            job_dir / name, **({"max_bytes": MAX_PROGRESS_BYTES} if name == PROGRESS_FILE else {})
        )
        if isinstance(rec, dict) and isinstance(rec.get("step"), int):
            if name == "metrics.json" and isinstance(rec.get("loss"), list) and rec["loss"]:
                last = rec["loss"][-1]
                rec = rec | {"loss": last[1] if isinstance(last, list) and len(last) == 2 else None}
            found.append(rec)
    return max(found, key=lambda r: (r.get("written_at") or 0, r["step"])) if found else None


def progress_line(
    job_id: int,
    name: str,
    state: str,
    elapsed_s: float | None,
    progress: Mapping[str, Any] | None = None,
    reason: str = "",
) -> str:
    """One job on one line: `1234 tiny-cpu RUNNING 00:01:05 step 40/100 loss 2.314 1.2 s/step`, the step part
    only where the trainer recorded one; a pending job with Slurm's reason, `1234 tiny-cpu PENDING (Resources)`.
    Control characters (a job name is anyone's text) are shown as `?`."""
    state = f"{state} ({reason})" if reason else state
    parts = [str(job_id), name, state] + ([format_slurm_time(elapsed_s)] if elapsed_s is not None else [])
    p = progress or {}
    step, total = p.get("step"), p.get("total_steps")
    if isinstance(step, int):
        parts.append(f"step {step}/{total}" if isinstance(total, int) else f"step {step}")
    loss = p.get("loss")
    if isinstance(loss, (int, float)) and not isinstance(loss, bool):
        parts.append(f"loss {loss:.4g}")
    step_time = p.get("step_time_s")
    if isinstance(step_time, (int, float)) and not isinstance(step_time, bool) and step_time > 0:
        parts.append(f"{step_time:.3g} s/step")
    return "".join(c if c.isprintable() else "?" for c in " ".join(parts))


@dataclass
class ProgressDisplay:
    """Lines redrawn in place on a terminal (`stream` is one), nothing elsewhere. `show(lines)` draws them over
    the previous ones; `message(text, to)` prints a line above them (a job that ended); `close()` clears them
    (what they said, the messages say)."""

    stream: IO[str]
    enabled: bool | None = None  # None: whether `stream` is a terminal
    _drawn: int = 0
    _lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.enabled is None:
            try:
                self.enabled = self.stream.isatty()
            except (AttributeError, ValueError, OSError):  # a closed or detached stream
                self.enabled = False

    def _size(self) -> os.terminal_size:
        """The terminal's columns and lines; 80x24 where it says none (a pty nobody sized reports 0x0)."""
        try:
            size = os.get_terminal_size(self.stream.fileno())
        except (AttributeError, ValueError, OSError):
            return os.terminal_size((80, 24))
        return size if size.columns > 0 and size.lines > 0 else os.terminal_size((80, 24))

    def _fit(self, lines: Sequence[str]) -> list[str]:
        """At most the terminal's height less one line (a block taller than the screen cannot be redrawn), each
        cut to its width less one column (a wrapped line would break the cursor arithmetic)."""
        width, height = self._size()
        rows = list(lines)
        if len(rows) > max(1, height - 1):
            keep = max(0, height - 2)
            rows = rows[:keep] + [f"... and {len(rows) - keep} more jobs"]
        return [r if len(r) < width else r[: max(1, width - 2)] + "~" for r in rows]

    def _clear(self) -> str:
        """Back to the start of the drawn lines, clearing them (the cursor is on the last one)."""
        if not self._drawn:
            return ""
        up = f"\x1b[{self._drawn - 1}A" if self._drawn > 1 else ""
        return f"\r{up}\x1b[J"

    def show(self, lines: Sequence[str]) -> None:
        if not self.enabled:
            return
        self._lines = list(lines)
        rows = self._fit(self._lines)
        self.stream.write(self._clear() + "\n".join(f"{r}\x1b[K" for r in rows))
        self.stream.flush()
        self._drawn = len(rows)

    def message(self, text: str, to: IO[str] | None = None) -> None:
        """`text` on its own line above the display (on `to`, default the display's stream), then the display
        again below it."""
        out = to or self.stream
        if self.enabled and self._drawn:
            self.stream.write(self._clear())
            self.stream.flush()
            self._drawn = 0
        out.write(text + "\n")
        out.flush()
        if self.enabled and self._lines:
            self.show(self._lines)

    def close(self) -> None:
        if self.enabled and self._drawn:
            self.stream.write(self._clear())
            self.stream.flush()
        self._drawn, self._lines = 0, []


class _Looked(Protocol):
    """A job as `api.wait_all` leaves it after a look (api.Job): its id, directory and last state."""

    job_id: int
    job_dir: Path

    @property
    def last_look(self) -> Any: ...  # track.TrackedJob | None


@dataclass
class WaitLines:
    """fsbatch --wait's display: one `progress_line` per job, redrawn each REDRAW_S while it sleeps (the
    elapsed time ticks), each job's progress.json read at most every READ_EVERY_S; the state is the last
    look's. Where the display is off, sleeping is only sleeping."""

    display: ProgressDisplay
    clock: Callable[[], float] = time.monotonic
    _jobs: Sequence[_Looked] = ()
    _progress: dict[int, dict[str, Any] | None] = field(default_factory=dict)
    _read_at: float | None = None

    def update(self, jobs: Sequence[_Looked]) -> None:
        """After a look: the states are new, progress is read again."""
        self._jobs = jobs
        self._read_at = None
        self.draw()

    def draw(self) -> None:
        if not self.display.enabled:
            return
        if self._read_at is None or self.clock() - self._read_at >= READ_EVERY_S:
            self._progress = {j.job_id: read_progress(j.job_dir) for j in self._jobs}
            self._read_at = self.clock()
        lines = []
        for j in self._jobs:
            t = j.last_look
            if t is not None:
                reason = next((c.reason for c in t.components if c.reason), "") if t.state == "PENDING" else ""
                lines.append(
                    progress_line(t.job_id, t.name, t.state, t.elapsed_s, self._progress.get(j.job_id), reason)
                )
        self.display.show(lines)

    def sleep(self, seconds: float, base: Callable[[float], None]) -> None:
        """`base(seconds)`, in REDRAW_S slices with a redraw after each where the display is on."""
        if not self.display.enabled:
            base(seconds)
            return
        left = seconds
        while left > 0:
            base(min(REDRAW_S, left))
            left -= REDRAW_S
            self.draw()
