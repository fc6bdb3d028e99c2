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
could change are refused (InputError, exit 2): a symbolic link anywhere on the path, or a directory on it that
group or others may write (a root-owned sticky directory such as /tmp excepted: there nobody else can replace
what root puts in it).
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Literal

from frenzy_slurm import __version__
from frenzy_slurm.errors import InputError
from frenzy_slurm.records import write_atomic

Outcome = Literal[
    "created", "updated", "installed", "unchanged", "would create", "would update", "would install", "note"
]
# Paths go into Lua strings, Tcl words and slurm.conf lines unquoted-safe: plain characters only
_SAFE_PATH = re.compile(r"^/[A-Za-z0-9_./+@%-]*\Z")
_WHEEL_NAME = re.compile(r"^frenzy_slurm-(?P<version>[0-9][A-Za-z0-9.+!_]*)-[^-]+-[^-]+-[^-]+\.whl\Z")
_EXTRA = re.compile(r"^[a-z][a-z0-9_-]*\Z")
SCRIPTS = {"prolog": "frenzy-prolog", "epilog": "frenzy-epilog"}  # contrib/slurm name -> installed name
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


def check_target(path: Path, flag: str) -> None:
    """Refuse a target another user could change: a symbolic link on its path, or an existing directory on it
    (the target's own too) that group or others can write, unless root owns it and it is sticky (/tmp)."""
    parts = [path, *path.parents]
    for p in reversed(parts):
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise InputError(
                f"{flag} {path}: {p} is a symbolic link; whoever can change the link decides where root writes. "
                f"Refused. To fix: give the real path ({p.resolve()})."
            )
        if not stat.S_ISDIR(st.st_mode):
            if p == path:
                continue  # a file target: its directory was checked
            raise InputError(f"{flag} {path}: {p} is not a directory. To fix: give a directory path.")
        writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        shared_tmp = st.st_uid == 0 and st.st_mode & stat.S_ISVTX and p != path
        if writable and not shared_tmp:
            who = "others" if st.st_mode & stat.S_IWOTH else "its group"
            raise InputError(
                f"{flag} {path}: {p} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); another user "
                f"could replace what is installed there. Refused. To fix: `chmod go-w {p}`, or choose a directory "
                "only root can write."
            )
        if p == path and st.st_uid not in (0, os.geteuid()):
            raise InputError(
                f"{flag} {path}: it belongs to uid {st.st_uid}, not root. Refused. To fix: `chown root: {p}`, or "
                "choose a directory of root's."
            )


def _ensure_dir(path: Path, flag: str, dry_run: bool, steps: list[Step], what: str) -> None:
    check_target(path, flag)
    if path.is_dir():
        steps.append(Step("unchanged", what, path))
        return
    steps.append(Step("would create" if dry_run else "created", what, path))
    if not dry_run:
        for d in reversed([path, *path.parents]):
            if not d.exists():
                d.mkdir(mode=0o755)
                os.chmod(d, 0o755)  # whatever the umask


def _ensure_file(path: Path, data: bytes, mode: int, dry_run: bool, steps: list[Step], what: str) -> None:
    """`path` with this content and mode, root's (the running user's when not root); an existing one that
    matches is left alone."""
    uid = os.geteuid()
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISLNK(st.st_mode):
        raise InputError(f"{path} is a symbolic link; refused (remove it, then install again)")
    if (
        st is not None
        and path.read_bytes() == data
        and stat.S_IMODE(st.st_mode) == mode
        and (st.st_uid, st.st_gid) == (uid, 0 if uid == 0 else st.st_gid)
    ):
        steps.append(Step("unchanged", what, path))
        return
    new = st is None
    steps.append(Step(("would create" if new else "would update") if dry_run else ("created" if new else "updated"),
                      what, path))  # fmt: skip
    if dry_run:
        return
    write_atomic(path, data, mode)
    if uid == 0:
        os.chown(path, 0, 0)
        os.chmod(path, mode)  # chown may clear set-id bits; the mode is what it should be


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
    if not m or not wheel.is_file():
        raise InputError(
            f"--wheel {wheel}: not a frenzy-slurm wheel file (frenzy_slurm-VERSION-py3-none-any.whl). To fix: "
            "build one with `pip wheel . --no-deps -w dist` in the source tree."
        )
    return m.group("version")


def _run(argv: list[str], what: str) -> None:
    """venv and pip, under umask 022 whatever the admin's: everything in the prefix readable by all users, writable
    by root only (a group-writable venv would be refused by the next run, and rightly)."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=PIP_TIMEOUT_S, cwd="/", umask=0o022)
    if res.returncode != 0:
        tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
        raise InputError(f"{what} failed (exit {res.returncode}): {' '.join(argv)}\n" + "\n".join(tail))


def _venv(opts: InstallOptions, steps: list[Step]) -> str:
    """The venv at the prefix with frenzy-slurm in it; returns the installed (or to be installed) version."""
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
            _run([opts.python, "-m", "venv", str(opts.prefix)], "creating the venv")
    assert opts.wheel is not None
    target = str(opts.wheel.absolute()) + (f"[{','.join(opts.extras)}]" if opts.extras else "")
    steps.append(Step("would install" if opts.dry_run else "installed", target, opts.prefix))
    if not opts.dry_run:
        _run([str(python), "-m", "pip", "install", "--quiet", "--upgrade", target], "pip install")
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


def install(opts: InstallOptions) -> InstallResult:
    """Everything a site install needs, done (or, with dry_run, said); see the module docstring."""
    prefix = _safe_path(opts.prefix, "--prefix")
    etc = _safe_path(opts.etc, "--etc")
    scripts_dir = _safe_path(opts.scripts_dir, "--scripts-dir")
    modules = _safe_path(opts.module_dir, "--modulefiles")
    for extra in opts.extras:
        if not _EXTRA.fullmatch(extra):
            raise InputError(f"--extras {extra!r}: an extra is a name such as train, nvml, calibrate, admin")
    opts = InstallOptions(**{**opts.__dict__, "prefix": prefix, "etc": etc, "scripts_dir": scripts_dir,
                             "modulefiles": modules})  # fmt: skip
    if not opts.dry_run and os.geteuid() != 0:
        raise InputError(
            "site install writes root's files (the prolog and epilog slurmd runs as root, /etc/frenzy-slurm): "
            "run it as root, or with --dry-run to see what it would do"
        )
    result = InstallResult()
    steps = result.steps
    for path, flag in (
        (prefix, "--prefix"),
        (etc, "--etc"),
        (scripts_dir, "--scripts-dir"),
        (modules, "--modulefiles"),
    ):
        check_target(path, flag)  # every refusal before anything is written
    site_data = None
    if opts.site_file is not None:
        from frenzy_slurm.site.config import load_site

        load_site(opts.site_file)  # refused here (exit 2, with the field) rather than installed broken
        site_data = opts.site_file.read_bytes()

    result.version = _venv(opts, steps)
    _ensure_dir(etc, "--etc", opts.dry_run, steps, "site directory")
    site = etc / "site.yaml"
    if site_data is not None:
        if site.exists() and site.read_bytes() != site_data and not opts.force:
            steps.append(Step("note", f"site.yaml differs from {opts.site_file}; kept (--force replaces it)", site))
        else:
            _ensure_file(site, site_data, 0o644, opts.dry_run, steps, "site file")
    elif not site.exists():
        result.next_steps.append(f"frenzy-slurm site detect -o {site}    # describe the GPUs (docs/admin.md)")

    module_dir = modules / "frenzy-slurm"
    _ensure_dir(module_dir, "--modulefiles", opts.dry_run, steps, "modulefile directory")
    for name, text in (
        (f"{result.version}.lua", lua_modulefile(result.version, prefix, site)),
        (result.version, tcl_modulefile(result.version, prefix, site)),
    ):
        _ensure_file(module_dir / name, text.encode(), 0o644, opts.dry_run, steps, "modulefile")
    result.next_steps.append(f"module use {modules}    # then: module load frenzy-slurm")

    _ensure_dir(scripts_dir, "--scripts-dir", opts.dry_run, steps, "Slurm scripts directory")
    installed = {kind: scripts_dir / name for kind, name in SCRIPTS.items()}
    for kind, path in installed.items():
        _ensure_file(path, script_source(kind), 0o755, opts.dry_run, steps, kind)
    result.slurm_conf_lines, notes = _prolog_lines(opts, installed)
    steps.extend(Step("note", n) for n in notes)
    return result
