"""The checkpoint a job resumes from, as `checkpoints/latest` names it: the one reader of that file.

DeepSpeed (and the built-in trainer, which tags its saves `step<N>`) writes `checkpoints/<tag>/` per save and
`checkpoints/latest` holding the newest tag's name. fsqueue shows its step (track), the trainer keeps it when it
prunes (runtime.checkpoints), and a user's script resumes from it (in_job). The file lies in a job directory,
which fsqueue may read for a job it did not start: it is read bounded, as a regular file, never through a
link (a FIFO would block, /dev/zero never end, a link point anywhere).

Standard library only at import (so are core.inputfile and core.errors, which it uses): `in_job`, which a
user's script imports before torch, reads the checkpoint through it.
"""

from __future__ import annotations

import re
from pathlib import Path

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import read_config_text

MAX_LATEST_BYTES = 4096  # `checkpoints/latest` holds one tag name
STEP_TAG = re.compile(r"step(\d{1,18})")  # the trainer's tag (runtime.checkpoints.tag), matched whole


def latest_tag(ckpt_dir: Path) -> str | None:
    """The tag `ckpt_dir/latest` names (stripped), or None: no such file, not a regular file, a link, too
    big, not text, or empty."""
    try:
        text = read_config_text(ckpt_dir / "latest", "checkpoint tag", MAX_LATEST_BYTES, follow_symlinks=False)
    except InputError:
        return None
    return text.strip() or None


def latest_step(ckpt_dir: Path) -> int | None:
    """The step of the `step<N>` checkpoint `latest` names, or None (none, unreadable, or another tag)."""
    tag = latest_tag(ckpt_dir)
    m = STEP_TAG.fullmatch(tag) if tag is not None else None
    return int(m.group(1)) if m else None
