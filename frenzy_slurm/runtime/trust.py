"""What the job trusts in its job directory: the directory fsbatch made, and the files it wrote there.

The job script records, when fsbatch writes the job directory, the directory's inode and the sha256 of
plan.json and ds_config.json (`FRENZY_JOB_DIR_INODE`, `FRENZY_PLAN_SHA256`, `FRENZY_DS_CONFIG_SHA256`;
Slurm keeps the script, so no one can change them). Before it reads anything there, the runtime opens
the directory once (no link followed at its last step), checks it is the user's, writable by no one
else, with every directory above it the user's or root's (`jobdir.safety.check_private_dir`), that it
is the inode recorded, and that plan.json and ds_config.json have the recorded digests. The built-in
trainer then works through that open directory (`/proc/self/fd/N`), so a rename of the path later (between
requeues) changes nothing it reads or writes. A directory swapped in by another user, or a plan.json
planted in it, stops the job before any of it is used. The device number is not compared: NFS clients
number their mounts each their own way, and the inode with the owner and the digests identify the directory.

Scripts rendered before this check (or a runtime started by hand) have no record: only the ownership and
mode checks apply then.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobdir.safety import check_private_dir, writable_by_others

UNSET = "unset"  # what a dry run's script shows: nothing recorded yet


@dataclass(frozen=True)
class TrustedDir:
    """The job directory, opened once and checked: `path` as named, `fd` open on it, `via_fd` naming it by fd."""

    path: Path
    fd: int

    @property
    def via_fd(self) -> Path:
        return Path(f"/proc/self/fd/{self.fd}")


def sha256_at(dir_fd: int, name: str) -> str:
    """sha256 of the regular file `name` of this user's in the open directory (no link followed)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{name} in the job directory is not a regular file.")
        if st.st_uid != os.geteuid():
            raise InputError(f"{name} in the job directory belongs to uid {st.st_uid}, not to you.")
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    finally:
        os.close(fd)


def _recorded(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key, UNSET).strip()
    return None if value in ("", UNSET) else value


def open_job_dir(path: Path, env: dict[str, str] | None = None) -> TrustedDir:
    """Open and check the job directory as described above; InputError (the job stops) where it fails."""
    e = os.environ if env is None else env
    path = Path(os.path.abspath(path))
    check_private_dir(path, "job directory")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(f"job directory {path}: cannot open it ({exc.strerror}).") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or writable_by_others(st):
            raise InputError(
                f"job directory {path} changed while it was checked (owner uid {st.st_uid}, mode "
                f"{stat.S_IMODE(st.st_mode):o}); the job stops without reading it."
            )
        inode = _recorded(e, "FRENZY_JOB_DIR_INODE")
        if inode is not None and str(st.st_ino) != inode:
            raise InputError(
                f"job directory {path} is not the one fsbatch wrote (inode {inode} at submission, {st.st_ino} now): "
                "someone replaced it. The job stops without reading anything there; check who can write the "
                "directories above it, then submit again from a private location."
            )
        for name, key in (("plan.json", "FRENZY_PLAN_SHA256"), ("ds_config.json", "FRENZY_DS_CONFIG_SHA256")):
            want = _recorded(e, key)
            if want is None:
                continue
            try:
                got = sha256_at(fd, name)
            except FileNotFoundError:
                raise InputError(f"{path / name} is missing; the job stops (submit again with fsbatch).") from None
            if got != want:
                raise InputError(
                    f"{path / name} is not the file fsbatch wrote (sha256 {got[:12]}..., recorded "
                    f"{want[:12]}...): it was changed after submission. The job stops without using "
                    "it; submit again with fsbatch (`fsbatch MODEL.yaml --force`)."
                )
    except BaseException:
        os.close(fd)
        raise
    return TrustedDir(path, fd)
