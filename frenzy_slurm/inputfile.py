"""Reading a file a user named on the login node: regular files only, a size cap, strict UTF-8.

model.yaml, site files and Hugging Face `config.json` are read here. A device (`/dev/zero`), a FIFO
or a directory would be read forever or block, and an oversized file is never a real config, so both
are refused before any byte is parsed. Every failure is an InputError naming the file and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from frenzy_slurm.errors import InputError

# model.yaml and site files are a few KB; the largest Hugging Face config.json files are ~100 KB.
MAX_CONFIG_BYTES = 1 << 20


def line_of(data: bytes | str, offset: int) -> int:
    """1-based line number of a byte/char offset."""
    if isinstance(data, bytes):
        return data[:offset].count(b"\n") + 1
    return data[:offset].count("\n") + 1


def read_config_text(
    path: Path, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES, follow_symlinks: bool = True
) -> str:
    """The text of a small regular file, or InputError (not regular, too big, not UTF-8, NUL bytes).

    `follow_symlinks=False` for files in directories frenzy-slurm did not choose (a job directory of
    someone else's job): a link planted there must not make us read a file of the link's choosing.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        # O_NONBLOCK: opening a FIFO must not hang waiting for a writer before we can refuse it.
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not follow_symlinks:
            raise InputError(f"{path}: the {what} is a symbolic link; it is read only as a regular file.") from None
        raise InputError(f"{path}: cannot read {what} ({exc.strerror}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = (
                "a directory"
                if stat.S_ISDIR(st.st_mode)
                else "a device"
                if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                else "a FIFO"
                if stat.S_ISFIFO(st.st_mode)
                else "a socket or special file"
            )
            raise InputError(f"{path}: the {what} is {kind}, not a regular file; give the path of a real file.")
        if st.st_size > max_bytes:
            raise InputError(
                f"{path}: the {what} is {st.st_size} bytes; more than the {max_bytes} allowed "
                "for a configuration file. Is it the right file?"
            )
        chunks, total = [], 0
        while True:  # read at most max_bytes + 1, whatever st_size said (files can grow while read)
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise InputError(
                    f"{path}: the {what} is larger than the {max_bytes} bytes allowed for a "
                    "configuration file. Is it the right file?"
                )
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror}).") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(
            f"{path}:{line_of(raw, exc.start)}: the {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} "
            f"at offset {exc.start}); save it as UTF-8."
        ) from None
    nul = text.find("\0")
    if nul >= 0:
        raise InputError(f"{path}:{line_of(text, nul)}: the {what} contains a NUL byte; it is not a text file.")
    return text


def _owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def _group_private_to(gid: int, uid: int) -> bool:
    """A user-private group of `uid` (Debian's USERGROUPS: named after the user, no other members): its write
    bit gives no one else access, as OpenSSH's StrictModes also accepts (and as jobs directories do)."""
    try:
        import grp

        owner = _owner_name(uid)
        group = grp.getgrgid(gid)
    except (KeyError, ImportError):
        return False
    return group.gr_name == owner and set(group.gr_mem) <= {owner}


def _trusted_problem(path: Path, st: os.stat_result) -> str | None:
    """Why `path` (stat `st`) could have been written by someone other than you or root, or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to {_owner_name(st.st_uid)}, not to you or root"
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by everyone (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWGRP and not _group_private_to(st.st_gid, st.st_uid):
        return f"is writable by its group (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_trusted(path: Path, what: str, why: str) -> None:
    """`path` (a file or directory) and the directory holding it belong to you or root and nobody else can
    write them; else InputError (exit 2) with the fix. `why` says what a planted file would do.

    Site files, calibration files and job-script templates steer every job (a template is shell that runs
    in the job), so one that another user could edit or replace is refused, not read. A symbolic link is
    judged by its target and the target's directory, and by the directory holding the link.
    """
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{what} {path}: cannot use it ({getattr(exc, 'strerror', None) or exc}).") from None
    checks = [(real, what)] + [
        (d, f"the directory of {what} {path},")
        for d in dict.fromkeys([real.parent, path.absolute().parent])
        if d != real
    ]
    for target, label in checks:
        try:
            st = os.stat(target)
        except OSError as exc:
            raise InputError(f"{label} {target}: cannot use it ({exc.strerror}).") from None
        if target == real and not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode)):
            return  # a device or FIFO: the reader refuses it as "not a regular file", the clearer message
        problem = _trusted_problem(target, st)
        if problem is None:
            continue
        fix = (
            f"`chmod go-w {target}` if it is yours, or keep the file in a directory only you (or root) can write"
            if "writable" in problem
            else "a copy of your own (or root's) in a directory only you (or root) can write"
        )
        raise InputError(
            f"{label} {target} {problem}: another user could change it, and {why}. Refused. To fix: {fix}."
        )
