"""Reading a file a user named on the login node: regular files only, a size cap, strict UTF-8.

model.yaml, site files and Hugging Face `config.json` are read here. A device (`/dev/zero`), a FIFO
or a directory would be read forever or block, and an oversized file is never a real config, so both
are refused before any byte is parsed. Every failure is an InputError naming the file and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from frenzy_slurm.errors import InputError

# model.yaml and site files are a few KB; the largest Hugging Face config.json files are ~100 KB.
MAX_CONFIG_BYTES = 1 << 20


def line_of(data: bytes | str, offset: int) -> int:
    """1-based line number of a byte/char offset."""
    return data[:offset].count(b"\n" if isinstance(data, bytes) else "\n") + 1


def read_config_text(path: Path, what: str = "file", max_bytes: int = MAX_CONFIG_BYTES) -> str:
    """The text of a small regular file, or InputError (not regular, too big, not UTF-8, NUL bytes)."""
    try:
        # O_NONBLOCK: opening a FIFO must not hang waiting for a writer before we can refuse it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror}).") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode)
                    or stat.S_ISBLK(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket or special file")
            raise InputError(f"{path}: the {what} is {kind}, not a regular file; give the path of a real file.")
        if st.st_size > max_bytes:
            raise InputError(f"{path}: the {what} is {st.st_size} bytes; more than the {max_bytes} allowed "
                             "for a configuration file. Is it the right file?")
        chunks, total = [], 0
        while True:  # read at most max_bytes + 1, whatever st_size said (files can grow while read)
            chunk = os.read(fd, min(1 << 16, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise InputError(f"{path}: the {what} is larger than the {max_bytes} bytes allowed for a "
                                 "configuration file. Is it the right file?")
    except OSError as exc:
        raise InputError(f"{path}: cannot read {what} ({exc.strerror}).") from None
    finally:
        os.close(fd)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}:{line_of(raw, exc.start)}: the {what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} "
                         f"at offset {exc.start}); save it as UTF-8.") from None
    nul = text.find("\0")
    if nul >= 0:
        raise InputError(f"{path}:{line_of(text, nul)}: the {what} contains a NUL byte; it is not a text file.")
    return text
