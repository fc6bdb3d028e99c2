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

from frenzy_slurm.errors import InputError


def write_atomic(path: Path, text: str | bytes, mode: int = 0o600) -> None:
    """Write `path` by renaming a finished temporary file over it (same directory, so the rename is atomic)."""
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
    from frenzy_slurm.inputfile import read_config_text

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
