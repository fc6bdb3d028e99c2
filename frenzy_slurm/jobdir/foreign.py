"""Another user's job directory, as an operator's watcher reads it (`frenzy-slurm watch --all-users`).

Every other command reads only the caller's own job directories (track/jobs.py). The site-wide watcher runs as an
operator account and must read each opted-in job's plan.json, which makes what it reads there part of what it
does to a job. So a directory is read only where what it holds can be the job's user's word and no one else's,
the rules fsbatch itself follows for the user's own directories (jobdir/safety.py), with the job's user in the
place of "you":

- the directory belongs to the job's user (Slurm's `UserId`, by name) and no one else can write into it;
- every directory above it belongs to that user or root and no one else can rename what it holds (OpenSSH's
  StrictModes, `inputfile.unsafe_ancestor`), so no other user can put their own directory in its place;
- the operator may read it: job directories are private (0700) unless the site file sets
  `job_dirs_group_readable`, which makes them 0750 for the user's group;
- each file read is a regular file of the job's user, writable by no one else, opened without following a link
  and checked on the open file (`read_config_text(owner=...)`).

Nothing is ever written there: the watcher records what it changed in its own state directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from frenzy_slurm.core.inputfile import ancestors, owner_name, unsafe_ancestor, writable_by_others


def user_uid(name: str) -> int | None:
    """The uid of the account `name` on this host, or None where it has none."""
    try:
        import pwd

        return pwd.getpwnam(name).pw_uid
    except (KeyError, ImportError):
        return None


def foreign_dir_problem(job_dir: Path, uid: int) -> str | None:
    """Why the job directory `job_dir` of the user `uid` cannot be trusted or read by this process, or None."""
    if not job_dir.is_absolute():
        return f"its working directory {job_dir} is not an absolute path"
    user = owner_name(uid)

    def by_user(st: os.stat_result) -> str | None:
        return writable_by_others(st, (uid,))  # a user-private group of the job's user gives no one else access

    for parent in ancestors(job_dir):
        try:
            st = os.lstat(parent)
        except OSError as exc:
            return f"cannot check {parent} above its job directory ({exc.strerror})"
        why = unsafe_ancestor(st, {uid, 0}, by_user)
        if why:
            return f"the directory {parent} above its job directory {why}: another user could swap the job's files"
    try:
        st = os.lstat(job_dir)
    except OSError as exc:
        return f"job directory {job_dir}: {exc.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"job directory {job_dir} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"job directory {job_dir} is not a directory"
    if st.st_uid != uid:
        return f"job directory {job_dir} belongs to {owner_name(st.st_uid)}, not to the job's user {user}"
    who = by_user(st)
    if who:
        return f"job directory {job_dir} is writable by {who} (mode {stat.S_IMODE(st.st_mode):o})"
    if not os.access(job_dir, os.R_OK | os.X_OK):
        return (
            f"job directory {job_dir} is not readable by you (mode {stat.S_IMODE(st.st_mode):o}): job directories are "
            "private unless the site file sets job_dirs_group_readable and you are in the job's group"
        )
    return None
