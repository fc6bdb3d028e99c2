"""A site install in one step: the shared venv, its modulefiles, /etc/frenzy-slurm, the Slurm prolog/epilog.

    frenzy-slurm site install --prefix /opt/frenzy-slurm --wheel frenzy_slurm-0.1.0-py3-none-any.whl [--dry-run]

What it owns (`install` returns one `Step` per thing it looked at; `frenzy-slurm site install` prints them):

- the venv at `--prefix` (created with this Python's `venv` where there is none; the wheel installed into it
  unless it already has that version; an existing venv that has frenzy-slurm is taken as it is);
- modulefiles for Lmod (`frenzy-slurm/VERSION.lua`) and Environment Modules (`frenzy-slurm/VERSION`, Tcl):
  PATH gets the venv's bin, FRENZY_SITE the site file;
- the site file's directory (`--etc`, default /etc/frenzy-slurm) and, with `--site-file`, site.yaml in it;
- contrib/slurm/prolog and epilog as `frenzy-prolog` / `frenzy-epilog` in `--scripts-dir` (default /etc/slurm),
  root's, 0755: slurmd runs them as root on every job.

slurm.conf is never edited: the lines to add are returned (`slurm_conf_lines`) for the admin to add. Running it
again changes nothing that is already as it should be (each step says `unchanged`). Targets that another user
could change are refused (InputError, exit 2) before anything is written: a symbolic link anywhere on the path,
or any directory on it, from / down, that is not root's or that group or others may write (a sticky directory
above the target such as /tmp excepted: there nobody else can rename what root puts in it). Each directory is
opened from / one component at a time (O_NOFOLLOW), checked on its descriptor, and written relative to it. What
is installed from is checked too: the --wheel (root's, writable by no one else, below safe directories; pip
installs a copy made from the checked descriptor), the --site-file (`inputfile.check_trusted`), and an
existing venv before its python runs as root.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import ancestors, owner_name, read_config_text, unsafe_ancestor
from frenzy_slurm.core.version import __version__
from frenzy_slurm.site.config import load_site

Outcome = Literal[
    "created", "updated", "installed", "unchanged", "would create", "would update", "would install", "note"
]
# Paths go into Lua strings, Tcl words and slurm.conf lines unquoted-safe: plain characters only
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+@%-]*\Z")
_WHEEL_NAME = re.compile(r"^frenzy_slurm-(?P<version>[0-9][A-Za-z0-9.+!_]*)-[^-]+-[^-]+-[^-]+\.whl\Z")
_EXTRA = re.compile(r"^[a-z][a-z0-9_-]*\Z")
SCRIPTS = {"prolog": "frenzy-prolog", "epilog": "frenzy-epilog"}  # contrib/slurm name -> installed name
MAX_INSTALLED_BYTES = 1 << 20  # site.yaml, modulefiles, prolog: a few KB
PIP_TIMEOUT_S = 900  # a first install downloads pydantic, click, jinja2, PyYAML (and torch with [train])


@dataclass(frozen=True)
class InstallOptions:
    prefix: Path  # the shared venv
    etc: Path = Path("/etc/frenzy-slurm")
    scripts_dir: Path = Path("/etc/slurm")
    modulefiles: Path | None = None  # default PREFIX/modulefiles
    wheel: Path | None = None
    extras: tuple[str, ...] = ()
    site_file: Path | None = None
    slurm_conf: Path | None = None  # read (never written) to say whether Prolog/Epilog are set already
    force: bool = False  # replace a site.yaml that differs from --site-file
    dry_run: bool = False
    python: str = sys.executable  # the Python that creates the venv

    @property
    def module_dir(self) -> Path:
        return self.modulefiles or self.prefix / "modulefiles"


@dataclass(frozen=True)
class Step:
    outcome: Outcome
    what: str
    path: Path | None = None

    def line(self) -> str:
        return f"{self.outcome:<13} {self.what}" + (f": {self.path}" if self.path else "")


@dataclass
class InstallResult:
    steps: list[Step] = field(default_factory=list)
    version: str = __version__
    slurm_conf_lines: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)


def _safe_path(path: Path, flag: str) -> Path:
    """An absolute path of plain characters (it goes into modulefiles and slurm.conf lines)."""
    text = os.path.normpath(str(path.absolute()))
    if not _SAFE_PATH.fullmatch(text):
        raise InputError(
            f"{flag} {path}: use an absolute path of letters, digits and _./+@%- only (it is written into "
            "modulefiles and slurm.conf lines)"
        )
    return Path(text)


def _owners() -> set[int]:
    """Who may own what the install writes or reads: root, and the running user where that is not root (a
    --dry-run by an admin's own account)."""
    return {0, os.geteuid()}


def _writable(st: os.stat_result) -> str | None:
    """Who besides the owner may write it: for what root installs, any group write bit counts (a group of
    root's own may still have members whose primary group it is)."""
    if st.st_mode & stat.S_IWOTH:
        return "others"
    return "its group" if st.st_mode & stat.S_IWGRP else None


def _symlink_refusal(flag: str, path: Path, p: Path) -> InputError:
    return InputError(
        f"{flag} {path}: {p} is a symbolic link; whoever can change the link decides where root writes. "
        f"Refused. To fix: give the real path ({p.resolve()})."
    )


def _check_dir(st: os.stat_result, p: Path, path: Path, flag: str) -> None:
    """One directory on the way to target `path` (`p`, maybe `path` itself): root's (or the running user's),
    and writable by no one else, the StrictModes rule (`inputfile.unsafe_ancestor`) that job directories
    follow. A sticky directory above the target (/tmp) is fine; the target itself must not be writable by
    others even so, since another user could create the names root is about to write there."""
    if stat.S_ISLNK(st.st_mode):
        raise _symlink_refusal(flag, path, p)
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{flag} {path}: {p} is not a directory. To fix: give a directory path.")
    if st.st_uid not in _owners():
        raise InputError(
            f"{flag} {path}: {p} belongs to {owner_name(st.st_uid)} (uid {st.st_uid}), not root; its owner could "
            "rename what is installed below it and put their own in its place (slurmd runs the prolog as root). "
            f"Refused. To fix: `chown root: {p}`, or choose a directory whose every parent is root's."
        )
    who = _writable(st)
    if who and (p == path or unsafe_ancestor(st, _owners(), _writable)):
        raise InputError(
            f"{flag} {path}: {p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); another user "
            f"could replace what is installed there. Refused. To fix: `chmod go-w {p}`, or choose a directory "
            "only root can write."
        )


def open_dir(path: Path, flag: str, create: bool = False) -> int | None:
    """A file descriptor of directory `path`, opened from / one component at a time (O_NOFOLLOW, relative to
    the one before), each checked by `_check_dir` on what was opened: the directory checked is the one
    written into, whatever is renamed meanwhile. A missing component is made (0755) when `create`, else
    None is returned. The caller closes the descriptor."""
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", flags)
    current = Path("/")
    try:
        _check_dir(os.fstat(fd), current, path, flag)
        for name in path.parts[1:]:
            current = current / name
            try:
                nfd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    os.close(fd)
                    return None
                os.mkdir(name, 0o755, dir_fd=fd)
                nfd = os.open(name, flags, dir_fd=fd)
                os.fchmod(nfd, 0o755)  # whatever the umask
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    _check_dir(os.stat(name, dir_fd=fd, follow_symlinks=False), current, path, flag)
                raise InputError(f"{flag} {path}: cannot open {current} ({exc.strerror})") from None
            os.close(fd)
            fd = nfd
            _check_dir(os.fstat(fd), current, path, flag)
        return fd
    except BaseException:
        os.close(fd)
        raise


def check_target(path: Path, flag: str) -> None:
    """Refuse a target directory another user could change: a symbolic link on its path, or a directory on
    it (every one from / down) that is not root's or that group or others can write (`_check_dir`)."""
    fd = open_dir(path, flag)
    if fd is not None:
        os.close(fd)


def _ensure_dir(path: Path, flag: str, dry_run: bool, steps: list[Step], what: str) -> int | None:
    """The directory `path`, checked and opened (made first where missing); None in a dry run where it is not
    there yet."""
    fd = open_dir(path, flag)
    if fd is not None:
        steps.append(Step("unchanged", what, path))
        return fd
    steps.append(Step("would create" if dry_run else "created", what, path))
    return None if dry_run else open_dir(path, flag, create=True)


def _read_at(dir_fd: int, name: str, path: Path) -> tuple[os.stat_result, bytes] | None:
    """The file `name` in the open directory (never through a link), or None where there is none."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{path} is a symbolic link; refused (remove it, then install again)") from None
        raise InputError(f"{path}: cannot read it ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{path} is not a regular file; refused (remove it, then install again)")
        with os.fdopen(os.dup(fd), "rb") as fh:
            return st, fh.read(MAX_INSTALLED_BYTES + 1)
    finally:
        os.close(fd)


def _write_at(dir_fd: int, name: str, data: bytes, mode: int) -> None:
    """`name` in the open directory replaced by a finished file: a random temporary name created O_EXCL,
    root's where root runs this, then renamed over it (a link planted at the name is replaced, not followed)."""
    tmp = f".{name}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if os.geteuid() == 0:
                os.fchown(fh.fileno(), 0, 0)
            os.fchmod(fh.fileno(), mode)  # after chown, which may clear set-id bits
            os.fsync(fh.fileno())
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _ensure_file(
    dir_fd: int | None, path: Path, data: bytes, mode: int, dry_run: bool, steps: list[Step], what: str
) -> None:
    """`path` (in the directory open as `dir_fd`; None: it does not exist yet) with this content and mode,
    root's (the running user's when not root); an existing one that matches is left alone."""
    uid = os.geteuid()
    have = None if dir_fd is None else _read_at(dir_fd, path.name, path)
    if have is not None:
        st, old = have
        if (
            old == data
            and stat.S_IMODE(st.st_mode) == mode
            and (st.st_uid, st.st_gid) == (uid, 0 if uid == 0 else st.st_gid)
        ):
            steps.append(Step("unchanged", what, path))
            return
    new = have is None
    steps.append(Step(("would create" if new else "would update") if dry_run else ("created" if new else "updated"),
                      what, path))  # fmt: skip
    if not dry_run:
        assert dir_fd is not None  # made by _ensure_dir unless dry_run
        _write_at(dir_fd, path.name, data, mode)


def script_source(name: str) -> bytes:
    """contrib/slurm/NAME as shipped in the package (frenzy_slurm/site/slurm links to contrib/slurm)."""
    return resources.files("frenzy_slurm").joinpath(f"site/slurm/{name}").read_bytes()


def lua_modulefile(version: str, prefix: Path, site: Path) -> str:
    """The Lmod modulefile (paths are plain, checked by `_safe_path`)."""
    return f"""-- frenzy-slurm {version}: written by `frenzy-slurm site install`; the next install overwrites edits
whatis("Name: frenzy-slurm")
whatis("Version: {version}")
whatis("Description: plans, submits and tracks LLM training jobs on this cluster's GPUs (fsbatch, fsqueue, fsinfo)")
help([[
frenzy-slurm {version}: fsbatch model.yaml plans and submits a training job; fsqueue shows it; fsinfo the GPUs.
Installed in {prefix}; the site file is {site}.
]])
prepend_path("PATH", "{prefix}/bin")
setenv("FRENZY_SITE", "{site}")
"""


def tcl_modulefile(version: str, prefix: Path, site: Path) -> str:
    """The Environment Modules (Tcl) modulefile."""
    return f"""#%Module1.0
## frenzy-slurm {version}: written by `frenzy-slurm site install`; the next install overwrites edits
proc ModulesHelp {{ }} {{
    puts stderr "frenzy-slurm {version}: fsbatch model.yaml plans and submits a training job; fsqueue shows it."
    puts stderr "Installed in {prefix}; the site file is {site}."
}}
module-whatis "frenzy-slurm {version}: plans, submits and tracks LLM training jobs on this cluster's GPUs"
prepend-path PATH {prefix}/bin
setenv FRENZY_SITE {site}
"""


def installed_version(prefix: Path) -> str | None:
    """frenzy-slurm's version in the venv at `prefix`, or None (no venv, or none installed in it)."""
    python = prefix / "bin" / "python"
    if not python.exists():
        return None
    res = subprocess.run(
        [str(python), "-P", "-c", "import frenzy_slurm; print(frenzy_slurm.__version__)"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )  # -P and cwd /: nothing of the working directory is imported
    return res.stdout.strip() if res.returncode == 0 and res.stdout.strip() else None


def _wheel_version(wheel: Path) -> str:
    m = _WHEEL_NAME.fullmatch(wheel.name)
    if not m:
        raise InputError(
            f"--wheel {wheel}: not a frenzy-slurm wheel file (frenzy_slurm-VERSION-py3-none-any.whl). To fix: "
            "build one with `pip wheel . --no-deps -w dist` in the source tree."
        )
    return m.group("version")


def _trusted_file_problem(st: os.stat_result) -> str | None:
    """Why a file root runs or installs could have been written by someone else, or None."""
    if st.st_uid not in _owners():
        return f"belongs to {owner_name(st.st_uid)}, not root"
    who = _writable(st)
    return f"is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o})" if who else None


def _check_above(path: Path, flag: str) -> None:
    """Every directory above `path` (as written and as resolved) follows the StrictModes rule."""
    for parent in ancestors(path):
        problem = unsafe_ancestor(os.lstat(parent), _owners(), _writable)
        if problem:
            raise InputError(
                f"{flag} {path}: the directory {parent} above it {problem}, so another user could put their own "
                f"file in its place, which root would install. Refused. To fix: keep it where every directory "
                "above is root's and writable only by root."
            )


def checked_wheel(wheel: Path, into: Path | None) -> None:
    """Refuse a --wheel another user could have written (not root's, writable by others, a link, or below a
    directory that does not follow StrictModes), and copy it, from the descriptor checked, into `into` (root's
    private directory, which pip then installs from): pip reads what was checked."""
    _wheel_version(wheel)
    _check_above(wheel, "--wheel")
    try:
        fd = os.open(wheel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise InputError(f"--wheel {wheel}: cannot use it ({why}). To fix: give the real path of the file.") from None
    with os.fdopen(fd, "rb") as src:
        st = os.fstat(src.fileno())
        problem = "is not a regular file" if not stat.S_ISREG(st.st_mode) else _trusted_file_problem(st)
        if problem:
            raise InputError(
                f"--wheel {wheel} {problem}: root would install what another user could have written. Refused. "
                f"To fix: `chown root: {wheel} && chmod 0644 {wheel}`, or build the wheel as root."
            )
        if into is not None:
            with open(into / wheel.name, "xb") as dst:
                shutil.copyfileobj(src, dst)


def _check_venv(prefix: Path) -> None:
    """An existing venv root runs (its python) and installs into: every entry in it root's and writable by no
    one else, and the interpreter its bin/python leads to too."""
    for top, dirs, files in os.walk(prefix):
        for name in [*dirs, *files]:
            p = Path(top) / name
            st = os.lstat(p)
            problem = (
                (None if st.st_uid in _owners() else f"belongs to {owner_name(st.st_uid)}")
                if stat.S_ISLNK(st.st_mode)
                else _trusted_file_problem(st)
            )
            if problem:
                raise InputError(
                    f"--prefix {prefix}: {p} {problem}; root runs this venv's python and installs into it. "
                    f"Refused. To fix: `chown -R root: {prefix} && chmod -R go-w {prefix}`."
                )
    python = Path(os.path.realpath(prefix / "bin" / "python"))
    if python.exists():
        _check_above(python, "--prefix")
        problem = _trusted_file_problem(os.stat(python))
        if problem:
            raise InputError(f"--prefix {prefix}: its python {python} {problem}; root runs it. Refused.")


def _run(argv: list[str], what: str) -> None:
    """venv and pip, under umask 022 whatever the admin's: everything in the prefix readable by all users, writable
    by root only (a group-writable venv would be refused by the next run, and rightly)."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd="/", umask=0o022)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise InputError(f"{what} failed (exit {res.returncode}): {' '.join(argv)}\n" + "\n".join(tail))


def _venv(opts: InstallOptions, steps: list[Step], wheel_copy: Path | None) -> str:
    """The venv at the prefix with frenzy-slurm in it; returns the installed (or to be installed) version.
    `wheel_copy` is the checked copy of --wheel that pip installs (None in a dry run)."""
    if opts.prefix.is_dir():
        _check_venv(opts.prefix)  # before its python runs as root
    have = installed_version(opts.prefix)
    want = _wheel_version(opts.wheel) if opts.wheel else None
    if have is not None and (want is None or want == have) and not opts.extras:
        steps.append(Step("unchanged", f"venv with frenzy-slurm {have}", opts.prefix))
        return have
    if want is None:
        raise InputError(
            f"--prefix {opts.prefix}: no venv with frenzy-slurm there. To fix: give --wheel FILE (build it with "
            "`pip wheel . --no-deps -w dist`), or --prefix of a venv that has it."
        )
    python = opts.prefix / "bin" / "python"
    if not python.exists():
        if opts.prefix.is_dir() and any(opts.prefix.iterdir()):
            raise InputError(
                f"--prefix {opts.prefix}: not empty and not a venv. To fix: give an empty or new directory."
            )
        steps.append(Step("would create" if opts.dry_run else "created", "venv", opts.prefix))
        if not opts.dry_run:
            check_target(opts.prefix, "--prefix")  # again, just before: nothing changed on the way since
            _run([opts.python, "-m", "venv", str(opts.prefix)], "creating the venv")
    assert opts.wheel is not None
    extras = f"[{','.join(opts.extras)}]" if opts.extras else ""
    steps.append(Step("would install" if opts.dry_run else "installed", str(opts.wheel.absolute()) + extras,
                      opts.prefix))  # fmt: skip
    if not opts.dry_run:
        assert wheel_copy is not None
        check_target(opts.prefix, "--prefix")
        _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", str(wheel_copy) + extras], "pip install")
    return want


def _prolog_lines(opts: InstallOptions, scripts: dict[str, Path]) -> tuple[list[str], list[str]]:
    """slurm.conf lines to add, and notes from the slurm.conf given with --slurm-conf."""
    lines = [f"Prolog={scripts['prolog']}", f"Epilog={scripts['epilog']}"]
    notes: list[str] = []
    if opts.slurm_conf is None:
        return lines, notes
    try:
        text = opts.slurm_conf.read_text(errors="replace")
    except OSError as exc:
        raise InputError(f"--slurm-conf {opts.slurm_conf}: cannot read it ({exc.strerror})") from None
    have = {}
    for raw in text.splitlines():
        key, eq, value = raw.split("#", 1)[0].partition("=")
        if eq and key.strip().lower() in ("prolog", "epilog"):
            have[key.strip().lower()] = value.strip()
    missing = []
    for kind, line in zip(("prolog", "epilog"), lines, strict=True):
        current = have.get(kind)
        if current == str(scripts[kind]):
            notes.append(f"{opts.slurm_conf} already has {line}")
        elif current:
            notes.append(
                f"{opts.slurm_conf} has {kind.capitalize()}={current}: call {scripts[kind]} from that script "
                "(slurm.conf takes one per line; several are comma-separated from 22.05 on)"
            )
        else:
            missing.append(line)
    return missing, notes


def _normalised(opts: InstallOptions) -> InstallOptions:
    """The options with plain absolute paths, refused where they are not (or not root where root is needed)."""
    for extra in opts.extras:
        if not _EXTRA.fullmatch(extra):
            raise InputError(f"--extras {extra!r}: an extra is a name such as train, nvml, calibrate, admin")
    paths = {
        "prefix": _safe_path(opts.prefix, "--prefix"),
        "etc": _safe_path(opts.etc, "--etc"),
        "scripts_dir": _safe_path(opts.scripts_dir, "--scripts-dir"),
        "modulefiles": _safe_path(opts.module_dir, "--modulefiles"),
    }
    if not opts.dry_run and os.geteuid() != 0:
        raise InputError(
            "site install writes root's files (the prolog and epilog slurmd runs as root, /etc/frenzy-slurm): "
            "run it as root, or with --dry-run to see what it would do"
        )
    return InstallOptions(**{**opts.__dict__, **paths})


def install(opts: InstallOptions) -> InstallResult:
    """Everything a site install needs, done (or, with dry_run, said); see the module docstring."""
    opts = _normalised(opts)
    for path, flag in (
        (opts.prefix, "--prefix"),
        (opts.etc, "--etc"),
        (opts.scripts_dir, "--scripts-dir"),
        (opts.module_dir, "--modulefiles"),
    ):
        check_target(path, flag)  # every refusal before anything is written
    site_data = None
    if opts.site_file is not None:
        load_site(opts.site_file)  # refused here (exit 2, with the field) rather than installed broken
        site_data = read_config_text(opts.site_file, "site file").encode()
    with tempfile.TemporaryDirectory(prefix="frenzy-install-") as private:  # root's, 0700
        wheel_copy = None if opts.wheel is None or opts.dry_run else Path(private)
        if opts.wheel is not None:
            checked_wheel(opts.wheel, wheel_copy)
        result = InstallResult()
        result.version = _venv(opts, result.steps, wheel_copy / opts.wheel.name if wheel_copy and opts.wheel else None)
    _install_files(opts, site_data, result)
    return result


def _install_files(opts: InstallOptions, site_data: bytes | None, result: InstallResult) -> None:
    """site.yaml, the modulefiles and the prolog/epilog, each written relative to its checked, open directory."""
    steps, dry = result.steps, opts.dry_run
    site = opts.etc / "site.yaml"
    fd = _ensure_dir(opts.etc, "--etc", dry, steps, "site directory")
    try:
        have = None if fd is None else _read_at(fd, site.name, site)
        if site_data is not None:
            if have is not None and have[1] != site_data and not opts.force:
                steps.append(Step("note", f"site.yaml differs from {opts.site_file}; kept (--force replaces it)", site))
            else:
                _ensure_file(fd, site, site_data, 0o644, dry, steps, "site file")
        elif have is None:
            result.next_steps.append(f"frenzy-slurm site detect -o {site}    # describe the GPUs (docs/admin.md)")
    finally:
        if fd is not None:
            os.close(fd)
    module_dir = opts.module_dir / "frenzy-slurm"
    modulefiles = {
        f"{result.version}.lua": ("modulefile", lua_modulefile(result.version, opts.prefix, site).encode()),
        result.version: ("modulefile", tcl_modulefile(result.version, opts.prefix, site).encode()),
    }
    _files_in(module_dir, "--modulefiles", "modulefile directory", modulefiles, 0o644, dry, steps)
    result.next_steps.append(f"module use {opts.module_dir}    # then: module load frenzy-slurm")
    installed = {kind: opts.scripts_dir / name for kind, name in SCRIPTS.items()}
    scripts = {name: (kind, script_source(kind)) for kind, name in SCRIPTS.items()}
    _files_in(opts.scripts_dir, "--scripts-dir", "Slurm scripts directory", scripts, 0o755, dry, steps)
    result.slurm_conf_lines, notes = _prolog_lines(opts, installed)
    steps.extend(Step("note", n) for n in notes)


def _files_in(
    directory: Path,
    flag: str,
    what: str,
    files: dict[str, tuple[str, bytes]],
    mode: int,
    dry_run: bool,
    steps: list[Step],
) -> None:
    """The directory (made where missing) and each file in it (name: (what, content)), written relative to one
    descriptor of it."""
    fd = _ensure_dir(directory, flag, dry_run, steps, what)
    try:
        for name, data in files.items():
            _ensure_file(fd, directory / name, data[1], mode, dry_run, steps, data[0])
    finally:
        if fd is not None:
            os.close(fd)
