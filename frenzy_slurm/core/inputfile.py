"""Reading a file a user named on the login node: regular files only, a size cap, strict UTF-8.

model.yaml, site files and Hugging Face `config.json` are read here. A device (`/dev/zero`), a FIFO
or a directory would be read forever or block, and an oversized file is never a real config, so both
are refused before any byte is parsed. Every failure is an InputError naming the file and the fix.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from frenzy_slurm.core.errors import InputError

# model.yaml and site files are a few KB; the largest Hugging Face config.json files are ~100 KB.
MAX_CONFIG_BYTES = 1 << 20


def line_of(data: bytes | str, offset: int) -> int:
    """1-based line number of a byte/char offset."""
    if isinstance(data, bytes):
        return data[:offset].count(b"\n") + 1
    return data[:offset].count("\n") + 1


def read_config_text(
    path: Path,
    what: str = "file",
    max_bytes: int = MAX_CONFIG_BYTES,
    follow_symlinks: bool = True,
    owner: int | None = None,
) -> str:
    """The text of a small regular file, or InputError (not regular, too big, not UTF-8, NUL bytes).

    `follow_symlinks=False` for files in directories frenzy-slurm did not choose (a job directory of
    someone else's job): a link planted there must not make us read a file of the link's choosing.
    `owner`: the file, as opened, must belong to this uid and be writable by no one else (checked on the open
    file, so a name swapped after a check is still refused): what an operator's watcher reads from another
    user's job directory is that user's word, and no one else's.
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
        if owner is not None and st.st_uid != owner:
            raise InputError(f"{path}: the {what} belongs to {owner_name(st.st_uid)}, not to {owner_name(owner)}.")
        if owner is not None and (who := writable_by_others(st, (owner,))):
            raise InputError(f"{path}: the {what} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}).")
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


def owner_name(uid: int) -> str:
    try:
        import pwd

        return pwd.getpwuid(uid).pw_name
    except (KeyError, ImportError):
        return str(uid)


def group_private_to(gid: int, uid: int) -> bool:
    """A user-private group of `uid` (Debian's USERGROUPS: named after the user, no other members): its write
    bit gives no one else access, as OpenSSH's StrictModes also accepts. The one such rule: trusted files,
    job directories (jobdir.safety) and calibration records all ask it."""
    try:
        import grp

        owner = owner_name(uid)
        group = grp.getgrgid(gid)
    except (KeyError, ImportError):
        return False
    return group.gr_name == owner and set(group.gr_mem) <= {owner}


def _trusted_problem(path: Path, st: os.stat_result) -> str | None:
    """Why `path` (stat `st`) could have been written by someone other than you or root, or None."""
    if st.st_uid not in (os.geteuid(), 0):
        return f"belongs to {owner_name(st.st_uid)}, not to you or root"
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by everyone (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWGRP and not group_private_to(st.st_gid, st.st_uid):
        return f"is writable by its group (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def writable_by_others(st: os.stat_result, private_to: tuple[int, ...] | None = None) -> str | None:
    """Who besides the owner (and root) may create, rename or delete entries of this directory ("everyone",
    "its group"), or None. A user-private group (USERGROUPS) of one of `private_to` gives no one else access:
    by default its owner or you; a job directory, which must be yours, only yours (jobdir.safety)."""
    users = (st.st_uid, os.geteuid()) if private_to is None else private_to
    if st.st_mode & stat.S_IWOTH:
        return "everyone"
    if st.st_mode & stat.S_IWGRP and not any(group_private_to(st.st_gid, uid) for uid in users):
        return "its group"
    return None


def ancestors(path: Path) -> list[Path]:
    """Every directory above `path`, as written (its links included) and as resolved, each once."""
    lexical = Path(os.path.abspath(path))
    out: list[Path] = [lexical] if lexical.is_symlink() else []  # a link named as the directory itself, too
    for p in [*lexical.parents, *Path(os.path.realpath(lexical)).parents]:
        if p not in out:
            out.append(p)
    return out


def unsafe_ancestor(
    st: os.stat_result,
    owners: frozenset[int] | set[int],
    writable: Callable[[os.stat_result], str | None] = writable_by_others,
) -> str | None:
    """OpenSSH's StrictModes rule for a directory (or link) above something trusted: why its owner or mode lets
    someone else rename what lies below it and put their own in its place, or None. `owners` are the accepted
    owners (you and root); a sticky directory (/tmp) is fine, since no one renames another's entry there."""
    if st.st_uid not in owners:
        return f"belongs to {owner_name(st.st_uid)}"
    if stat.S_ISLNK(st.st_mode):
        return None  # a link cannot be changed, only replaced, and its directory is checked too
    who = writable(st)
    if who and not st.st_mode & stat.S_ISVTX:
        return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def check_trusted(path: Path, what: str, why: str) -> None:
    """`path` (a file or directory) and the directory holding it belong to you or root and nobody else can
    write them, and every directory above them follows StrictModes (`unsafe_ancestor`); else InputError
    (exit 2) with the fix. `why` says what a planted file would do.

    Site files, calibration files and job-script templates steer every job (a template is shell that runs
    in the job), so one that another user could edit or replace is refused, not read: also where another user
    owns a directory further up and could rename the one holding it and put theirs in its place. A symbolic
    link is judged by its target and the target's directories, and by the directories holding the link.
    """
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError) as exc:
        raise InputError(f"{what} {path}: cannot use it ({getattr(exc, 'strerror', None) or exc}).") from None
    holders = list(dict.fromkeys([real.parent, path.absolute().parent]))
    checks = [(real, what)] + [(d, f"the directory of {what} {path},") for d in holders if d != real]
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
    _check_trusted_ancestors(path, holders, what, why)


def _check_trusted_ancestors(path: Path, holders: list[Path], what: str, why: str) -> None:
    """Every directory above the ones holding `path` (as written and as resolved) follows StrictModes."""
    above = list(dict.fromkeys(a for d in holders for a in ancestors(d) if a not in holders))
    for parent in above:
        try:
            st = os.lstat(parent)
        except OSError as exc:
            raise InputError(f"{what} {path}: cannot check {parent} above it ({exc.strerror}).") from None
        problem = unsafe_ancestor(st, {os.geteuid(), 0})
        if problem:
            raise InputError(
                f"{what} {path}: the directory {parent} above it {problem}, so another user could rename the "
                f"directories below it and put their own {what} in its place, and {why}. Refused. To fix: keep "
                f"it where every directory above is yours or root's and writable only by you (or root)"
                + (f", or `chmod go-w {parent}` if it is yours." if "writable" in problem else ".")
            )
