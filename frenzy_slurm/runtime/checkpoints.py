"""The job directory's checkpoint layout: tag names, the latest step, and pruning old checkpoints.

DeepSpeed writes `checkpoints/<tag>/` per save and `checkpoints/latest` naming the newest tag. The
trainer tags saves `step<N>`. Nothing prunes them, so a long run with a short interval would fill the
file system: after each save rank 0 keeps the newest `keep` step tags (and always the one `latest`
names) and deletes older ones. Directories that are not `step<N>` are never touched. Light (no torch),
so fsqueue can read the latest step too.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

_TAG = re.compile(r"^step(\d+)$")


def tag(step: int) -> str:
    return f"step{step}"


def latest_step(ckpt_dir: Path) -> int | None:
    """The step of the checkpoint `latest` names, or None (no checkpoint, or unreadable)."""
    try:
        m = _TAG.match((ckpt_dir / "latest").read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None
    return int(m.group(1)) if m else None


def prune(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step checkpoints (never the latest one); returns what was deleted."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    steps = sorted((int(m.group(1)), p) for p in ckpt_dir.iterdir()
                   if p.is_dir() and not p.is_symlink() and (m := _TAG.match(p.name)))
    protected = latest_step(ckpt_dir)
    doomed = [p for step, p in steps[:-keep] if step != protected]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed
