"""Job directories and the submission lock, made safe for shared file systems.

A job directory holds the rendered script, `plan.json` (with `entry.env`, which can carry secrets),
checkpoints and logs; the job runs with it as its working directory. So:

- the jobs directory above it must belong to the user and be writable by no one else (otherwise another
  user could plant or swap files in it); a directory writable by others, such as /tmp, is refused;
- so must every directory above those (as OpenSSH's StrictModes checks them): each belongs to the user or
  root and is writable by no one else, except a sticky directory of root's or the user's (/tmp, /scratch),
  where no one can rename another's entries. Otherwise another user renames the job directory away while
  the job waits and puts one of theirs, with a plan.json and a pickled checkpoint, in its place;
- an existing directory is reused only if it holds nothing but this submission's rendered files (a
  refused submission): `--job-dir .` must never overwrite the user's own model.yaml;
- a job directory is created private (0700), its files 0600 (job.sbatch 0700), written through a
  temporary file and a rename, so a symlink planted in place of a file is replaced, never followed;
- a directory that an earlier job used (its records, checkpoints or logs) is never written into again
  nor deleted: a rerun after its job ended, and `fsbatch --force`, plan the new job into a fresh sibling directory;
- concurrent fsbatch runs of one submission serialise on a lock in the user's own private directory
  (`$FRENZY_LOCK_DIR`, else `$XDG_CACHE_HOME/frenzy-slurm/locks`, else `~/.cache/frenzy-slurm/locks`),
  whatever the job directory, opened with O_NOFOLLOW and checked to be the user's; beside it,
  `submitted-<hash>.json` lists the directories this submission was submitted from, so a duplicate of a
  live job is recognised from another directory, and a rerun after it ended says which job it follows.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from frenzy_slurm.core import inputfile
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import ancestors, owner_name, unsafe_ancestor
from frenzy_slurm.core.records import read_json_or_none, write_atomic, write_json

DIR_MODE = 0o700
FILE_MODE = 0o600
SCRIPT_MODE = 0o700
GROUP_READABLE = 0o050  # added to directories (r-x) where the site file says job_dirs_group_readable; 0o040 to files
# What a job (or Slurm for it) writes: a directory holding any of these belongs to a job that was submitted.
_JOB_OUTPUT = ("submission.json", "started.json", "finished.json", "metrics.json", "progress.json", "checkpoints")
# What fsbatch itself writes before the job runs: the only names an existing directory may hold to be reused.
_RENDERED = ("job.sbatch", "plan.json", "model.yaml", "ds_config.json", "calibration.json", "rejected.json")


def writable_by_others(st: os.stat_result) -> str | None:
    """Who besides you may create, rename or delete entries in this directory ("everyone", "its group"), or
    None: only a user-private group of yours gives no one else access (`inputfile.writable_by_others`)."""
    return inputfile.writable_by_others(st, (os.geteuid(),))


def _unsafe_ancestor(path: Path, st: os.stat_result) -> str | None:
    """Why the directory (or symbolic link) `path` above a private directory lets someone else swap what lies
    below it, or None: the StrictModes rule every trusted path follows (`inputfile.unsafe_ancestor`)."""
    return unsafe_ancestor(st, {os.geteuid(), 0}, writable_by_others)


def check_ancestors(path: Path, what: str) -> None:
    """Every directory above `path` belongs to the user or root and nobody else can rename what it holds
    (OpenSSH's StrictModes rule), else InputError naming the directory and the fix."""
    for parent in ancestors(path):
        try:
            st = os.lstat(parent)
        except OSError as exc:
            raise InputError(f"{what} {path}: cannot check {parent} above it ({exc.strerror}).") from None
        why = _unsafe_ancestor(parent, st)
        if why:
            raise InputError(
                f"{what} {path}: the directory {parent} above it {why}, so another user could rename the directories "
                f"below it and put theirs in their place (with a plan.json or checkpoint your job would load). Use a "
                f"location whose every directory is yours or root's and writable only by you, e.g. "
                f"FRENZY_JOBS_DIR=$HOME/frenzy-jobs or --job-dir under it (or `chmod go-w {parent}` if it is yours)."
            )


def check_private_dir(path: Path, what: str) -> os.stat_result:
    """`path` is a directory of this user that nobody else can write into, and so is every directory above it
    (`check_ancestors`), else InputError with the fix."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot use it ({exc.strerror}).") from None
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{what} {path} is not a directory.")
    if st.st_uid != os.geteuid():
        raise InputError(
            f"{what} {path} belongs to {owner_name(st.st_uid)}, not to you; files written there could be "
            "read or replaced by its owner. Use a directory of your own (set FRENZY_JOBS_DIR or --job-dir)."
        )
    who = writable_by_others(st)
    if who:
        raise InputError(
            f"{what} {path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o}): another user could "
            f"plant files that your job runs or reads. Use a private directory (FRENZY_JOBS_DIR or "
            f"--job-dir), or `chmod go-w {path}` if it is yours alone."
        )
    check_ancestors(path, what)
    return st


def make_private_dir(path: Path, what: str) -> Path:
    """Create `path` (and missing parents) with mode 0700 where it does not exist, then check it."""
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"{what} {path}: cannot create it ({exc.strerror}).") from None
    check_private_dir(path, what)
    return path


def lock_dir() -> Path:
    if os.environ.get("FRENZY_LOCK_DIR"):
        return Path(os.environ["FRENZY_LOCK_DIR"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "frenzy-slurm" / "locks"


@contextmanager
def user_lock(key: str) -> Iterator[None]:
    """An exclusive lock for one submission of this user, held across every job directory."""
    try:
        directory = make_private_dir(lock_dir(), "lock directory")
    except InputError as exc:
        raise InputError(
            f"{exc.message} Set FRENZY_LOCK_DIR to a private directory of yours (on a file system "
            "every login node sees)."
        ) from None
    path = directory / f"submit-{key}.lock"
    try:
        # O_NOFOLLOW: a symlink planted at the lock's path must not make us open (or create) another file
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        raise InputError(
            f"lock file {path}: cannot open it ({exc.strerror}); remove it if it is not a plain file of yours."
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise InputError(
                f"lock file {path} is not a plain file of yours (owner {owner_name(st.st_uid)}); "
                "remove it and run fsbatch again."
            )
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _registry(key: str) -> Path:
    return lock_dir() / f"submitted-{key}.json"


def registered(key: str) -> list[dict[str, Any]]:
    """Earlier submissions of `key` by this user whose job directory still records that job.

    A directory the user has since deleted (or whose record names another job) no longer counts: removing
    a job directory is how a user says "start this one afresh".
    """
    entries = read_json_or_none(_registry(key))
    out = []
    for e in entries if isinstance(entries, list) else []:
        if not isinstance(e, dict) or "job_dir" not in e:
            continue
        record = read_json_or_none(Path(str(e["job_dir"])) / "submission.json")
        if isinstance(record, dict) and record.get("job_id") == e.get("job_id"):
            out.append({**e, "submitted_at": record.get("submitted_at")})  # the grace window starts there
    return out


def register(key: str, job_id: int, job_dir: Path) -> None:
    """Add a submission of `key` to the user's registry (call under `user_lock(key)`)."""
    entries = [e for e in registered(key) if Path(str(e["job_dir"])) != job_dir]
    entries.append({"job_id": job_id, "job_dir": str(job_dir)})
    write_json(_registry(key), entries)


def job_outputs(job_dir: Path) -> list[str]:
    """The names in `job_dir` that a submitted job (or Slurm for it) wrote; empty for a fresh directory."""
    try:
        names = {p.name for p in job_dir.iterdir()}
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise InputError(f"job directory {job_dir}: cannot list it ({exc.strerror}).") from None
    return sorted(n for n in names if n in _JOB_OUTPUT or (n.startswith("slurm-") and n.endswith(".out")))


def next_free_dir(job_dir: Path) -> Path:
    """`NAME.2`, `NAME.3`, ...: the first sibling of `job_dir` that does not exist yet (for --force)."""
    n = 2
    while True:
        cand = job_dir.with_name(f"{job_dir.name}.{n}")
        if not cand.exists() and not cand.is_symlink():
            return cand
        n += 1


def foreign_entries(job_dir: Path, submission: str) -> list[str]:
    """The names in an existing directory that are not this submission's rendered files, sorted.

    A directory may be reused only for what fsbatch wrote there itself: the files `_RENDERED` names, of this
    very submission (its plan.json says so), or links in their place (replaced, never followed). Anything
    else (the user's own model.yaml in `--job-dir .`, another submission's plan) is the user's, and stays.
    """
    try:
        entries = list(os.scandir(job_dir))
    except OSError as exc:
        raise InputError(f"job directory {job_dir}: cannot list it ({exc.strerror}).") from None
    ours = _plan_submission(job_dir / "plan.json") == submission
    foreign = []
    for e in entries:
        name = e.name
        rendered = name in _RENDERED or any(name.startswith(f".{r}.") and name.endswith(".tmp") for r in _RENDERED)
        if not rendered or (not ours and not e.is_symlink()):
            foreign.append(name)
    return sorted(foreign)


def _plan_submission(path: Path) -> str | None:
    """The submission a plan.json records, or None (absent, a link, not a plan fsbatch wrote)."""
    if path.is_symlink():
        return None
    plan = read_json_or_none(path)
    return plan.get("submission") if isinstance(plan, dict) else None


def create_job_dir(job_dir: Path, group_readable: bool = False, *, submission: str) -> None:
    """Create the job directory private, or reuse one that holds nothing but this submission's rendered files
    (a refused submission, or an empty directory).

    Its parent (the jobs directory) must be the user's and writable by nobody else, and so must every
    directory above (`check_ancestors`).
    """
    make_private_dir(job_dir.parent, "jobs directory")
    try:
        os.mkdir(job_dir, DIR_MODE)
        if group_readable:
            os.chmod(job_dir, DIR_MODE | GROUP_READABLE)
    except FileExistsError:
        if job_dir.is_symlink():
            raise InputError(
                f"job directory {job_dir} is a symbolic link; remove it or choose another --job-dir."
            ) from None
        check_private_dir(job_dir, "job directory")
        used = job_outputs(job_dir)
        if used:
            raise InputError(
                f"job directory {job_dir} holds an earlier job's files ({', '.join(used)}); frenzy-slurm "
                "never writes over them. Use --force (the new job gets a new directory) or another "
                "--job-dir."
            ) from None
        foreign = foreign_entries(job_dir, submission)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise InputError(
                f"job directory {job_dir} already holds files that are not this submission's ({shown}); "
                "frenzy-slurm writes job.sbatch, plan.json, model.yaml and ds_config.json there and never "
                "over your own files. Name a new directory with --job-dir (fsbatch creates it), or leave "
                "--job-dir out to use $FRENZY_JOBS_DIR or ./frenzy-jobs."
            ) from None
    except OSError as exc:
        raise InputError(f"job directory {job_dir}: cannot create it ({exc.strerror}).") from None


# The line of job.sbatch (templates/_launch.j2) that records what the job may trust; `bind_identity` fills it in.
_IDENTITY_LINE = "export FRENZY_JOB_DIR_INODE=unset FRENZY_PLAN_SHA256=unset FRENZY_DS_CONFIG_SHA256=unset\n"


def bind_identity(script: str, inode: int, files: Mapping[str, str]) -> str:
    """The job script with the job directory's inode and the digests of plan.json and ds_config.json recorded
    (runtime/trust.py checks them in the job). A template without the line is left as it is."""

    def sha(name: str) -> str:
        return hashlib.sha256(files[name].encode()).hexdigest() if name in files else "unset"

    line = (
        f"export FRENZY_JOB_DIR_INODE={inode} FRENZY_PLAN_SHA256={sha('plan.json')} "
        f"FRENZY_DS_CONFIG_SHA256={sha('ds_config.json')}\n"
    )
    return script.replace(_IDENTITY_LINE, line, 1)


def write_files(job_dir: Path, files: Mapping[str, str], group_readable: bool = False) -> dict[str, str]:
    """Each file private (or group-readable), written whole through a temporary file and a rename (never
    through a symlink); the files as written. job.sbatch records the directory's inode and the digests of
    what the job will trust (`bind_identity`)."""
    script_mode = SCRIPT_MODE | (GROUP_READABLE if group_readable else 0)
    file_mode = FILE_MODE | (0o040 if group_readable else 0)
    fd = os.open(job_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        inode = os.fstat(fd).st_ino
    finally:
        os.close(fd)
    written = {
        name: bind_identity(text, inode, files) if name.endswith(".sbatch") else text for name, text in files.items()
    }
    for name, text in written.items():
        write_atomic(job_dir / name, text, script_mode if name.endswith(".sbatch") else file_mode)
    return written
