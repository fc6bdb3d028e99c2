"""The job directory's checkpoint layout: tag names, the latest step, and pruning old checkpoints.

DeepSpeed writes `checkpoints/<tag>/` per save and `checkpoints/latest` naming the newest tag. The
trainer tags saves `step<N>`. Nothing prunes them, so a long run with a short interval would fill the
file system: after each save rank 0 keeps the newest `keep` step tags (and always the one `latest`
names) and deletes older ones. Directories that are not `step<N>` are never touched. Light (no torch),
so fsqueue can read the latest step too.

Loading a DeepSpeed checkpoint unpickles it (`torch.load(weights_only=False)`): a file planted there runs
code as the user. So the job loads only what it wrote itself: after each save the ranks digest the tag's
files (each a share) and rank 0 writes `checkpoints/<tag>/frenzy-manifest.json` (sha256 of every file);
before loading, the ranks check the tag against it: every file listed, with its digest, a regular file of
the user's, nothing else there. A tag without a manifest (a save cut short) is passed over for the newest
one that has it; a tag whose files differ from its manifest stops the job, naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import stat
from pathlib import Path

from frenzy_slurm.core.records import write_json
from frenzy_slurm.jobdir.checkpoints import latest_step  # the one reader of `latest`

_TAG = re.compile(r"^step(\d+)\Z")
MANIFEST = "frenzy-manifest.json"
_CHUNK = 1 << 20


def tag(step: int) -> str:
    return f"step{step}"


def step_of(tag_name: str) -> int:
    """The step a `step<N>` tag was saved at."""
    m = _TAG.match(tag_name)
    if m is None:
        raise ValueError(f"{tag_name!r} is not a step<N> checkpoint tag")
    return int(m.group(1))


def prune(ckpt_dir: Path, keep: int) -> list[Path]:
    """Delete all but the newest `keep` step checkpoints (never the latest one); returns what was deleted."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    steps = sorted(
        (int(m.group(1)), p)
        for p in ckpt_dir.iterdir()
        if p.is_dir() and not p.is_symlink() and (m := _TAG.match(p.name))
    )
    protected = latest_step(ckpt_dir)
    doomed = [p for step, p in steps[:-keep] if step != protected]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


def tag_files(tag_dir: Path) -> list[str]:
    """The files of a checkpoint tag (relative paths, sorted), without the manifest."""
    out = []
    for root, dirs, files in os.walk(tag_dir):
        dirs.sort()
        for name in files:
            rel = os.path.relpath(os.path.join(root, name), tag_dir)
            if rel != MANIFEST:
                out.append(rel)
    return sorted(out)


def digest(path: Path) -> str:
    """sha256 of a regular file of this user's, read without following a link; ValueError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise ValueError(f"{path} is not a regular file of yours")
        h = hashlib.sha256()
        while chunk := os.read(fd, _CHUNK):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def digest_share(tag_dir: Path, rank: int, world: int) -> dict[str, str]:
    """This rank's share of a tag's digests (every `world`-th file from `rank`): the ranks digest in parallel."""
    return {name: digest(tag_dir / name) for name in tag_files(tag_dir)[rank::world]}


def write_manifest(tag_dir: Path, digests: dict[str, str], submission: str | None) -> None:
    """Record what this job wrote in the tag (after every rank's share is gathered)."""
    write_json(tag_dir / MANIFEST, {"submission": submission, "files": dict(sorted(digests.items()))})


def read_manifest(tag_dir: Path) -> dict[str, str] | None:
    """The tag's recorded digests, or None where there is no manifest of this user's."""
    try:
        digest(tag_dir / MANIFEST)  # a regular file of the user's, not a link
        data = json.loads((tag_dir / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        return None
    return files


def check_share(tag_dir: Path, rank: int, world: int) -> list[str]:
    """What in this rank's share of the tag differs from its manifest (empty: the job wrote all of it).

    Rank 0 also compares the names: a file that is there but not listed (planted) is refused too."""
    recorded = read_manifest(tag_dir)
    if recorded is None:
        return [f"{tag_dir / MANIFEST} is missing or unreadable"]
    present = tag_files(tag_dir)
    problems = []
    if rank == 0:
        problems += [f"{tag_dir / n} was not written by this job" for n in sorted(set(present) - set(recorded))]
        problems += [f"{tag_dir / n} is missing" for n in sorted(set(recorded) - set(present))]
    for name in sorted(set(present) & set(recorded))[rank::world]:
        try:
            if digest(tag_dir / name) != recorded[name]:
                problems.append(f"{tag_dir / name} differs from what this job wrote (sha256 {recorded[name][:12]}...)")
        except (OSError, ValueError) as exc:
            problems.append(f"{tag_dir / name}: {exc}")
    return problems


def resume_tag(ckpt_dir: Path) -> tuple[str | None, list[str]]:
    """The checkpoint to resume from: the newest step tag with a manifest (complete: written after every rank
    saved), and the newer tags passed over for lacking one (a save cut short before its manifest)."""
    try:
        steps = sorted(
            (int(m.group(1)), p)
            for p in ckpt_dir.iterdir()
            if p.is_dir() and not p.is_symlink() and (m := _TAG.match(p.name))
        )
    except OSError:
        return None, []
    skipped: list[str] = []
    for _, path in reversed(steps):
        if read_manifest(path) is not None:
            return path.name, skipped
        skipped.append(path.name)
    return None, skipped
