"""The small files frenzy-slurm writes and reads back: atomic writes and JSON records.

Every record (submission.json, plan.json, metrics.json, a view snapshot, the queue cache) is written
whole or not at all: a reader never sees half a file, and a crash leaves the old one. Files are
created private to the user (0600) unless told otherwise: they can hold environment values.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import read_config_text


def write_atomic(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    """Write `path` by renaming a finished temporary file over it (same directory, so the rename is atomic).

    The one writer of every file frenzy-slurm writes. The temporary name is random and created O_EXCL (a link
    planted there is never followed, as `write_text` on a guessable `.name.tmp-PID` would), and the rename
    replaces a link planted at `path` itself instead of writing through it.
    """
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # O_EXCL, mode 0600
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, data: Any, mode: int = 0o600) -> None:
    write_atomic(path, json.dumps(data, indent=2, default=str) + "\n", mode)


MAX_RECORD_BYTES = 256 << 20  # a 2,000-node snapshot or a long run's metrics.json are a few MB


def read_json(path: Path, what: str = "file") -> Any:
    """A JSON file's content, or InputError naming the file, the line and what it should be."""
    # a regular file of bounded size: a snapshot named /dev/zero (or a FIFO) must not be read forever
    text = read_config_text(path, what, MAX_RECORD_BYTES)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: the {what} is not valid JSON: {exc.msg}.") from None


def read_json_or_none(path: Path) -> Any:
    """An optional record (finished.json, metrics.json): its content, or None if absent or unreadable."""
    try:
        return read_json(path)
    except InputError:
        return None


# A job directory's records (plan.json, metrics.json of a long run, submission.json) are at most a few MB.
MAX_JOB_RECORD_BYTES = 64 << 20


def read_job_record(
    path: Path, what: str = "job record", max_bytes: int = MAX_JOB_RECORD_BYTES, owner: int | None = None
) -> Any:
    """A job directory's JSON record, read as fsqueue and calibrate read what a job left behind: a regular file
    opened without following a link (O_NOFOLLOW) or waiting on a FIFO (O_NONBLOCK), of at most `max_bytes`
    (and, with `owner`, of that uid's and writable by no one else); InputError naming the file otherwise."""
    text = read_config_text(path, what, max_bytes, follow_symlinks=False, owner=owner)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: the {what} is not valid JSON: {exc.msg}.") from None


def read_job_record_or_none(path: Path, max_bytes: int = MAX_JOB_RECORD_BYTES, owner: int | None = None) -> Any:
    """An optional job record: its content, or None if absent, not a regular file, too large or not JSON (or, with
    `owner`, not of that uid's alone)."""
    try:
        return read_job_record(path, max_bytes=max_bytes, owner=owner)
    except InputError:
        return None
