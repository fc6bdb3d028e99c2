"""Which job directories a calibration may rest on: jobs Slurm ran, as frenzy-slurm planned them, measured by them.

A calibration changes every user's plans, and `frenzy-slurm calibrate` is pointed at many users' job
directories (a shell glob over /scratch/*/frenzy-jobs). Every file in a job directory is its owner's, and
so is every process of the job: a user can write any plan.json or metrics.json, and can run `sbatch --wrap
true` to get a real job id for them. What the user cannot forge is Slurm's accounting and the record the
site epilog (contrib/slurm/epilog, root, after the job) writes from Slurm's own data: the digest of the
batch script slurmctld ran, the digest of metrics.json as it was when the job ended, the job's comment and
user. So a directory is evidence only if:

- it is a directory (not a link) that nobody but its owner can write, and its plan.json, metrics.json and
  submission.json are regular files (not links) of that owner;
- its submission.json names a job that Slurm's accounting (`sacct`, one query for all) knows, run by that
  same user and, where accounting records it, in that directory; a job still pending or running is not
  measured yet;
- where accounting answers, the job's allocation is the plan's (nodes, GPUs) and it ran at least as long as
  the steps metrics.json claims;
- another user's directory has the site epilog's record of its job (root's, in a directory only root can
  write): the script Slurm ran is the directory's job.sbatch, a frenzy-slurm script of this plan.json (its
  comment is `frenzy:<plan's submission>`, it names plan.json's digest and launches plan.json's command),
  the record's user owns the directory, and metrics.json is the one the epilog found when the job ended;
- no other directory already stood for the same job.

One user can still run real jobs and rewrite metrics.json while they run: that is why the fit counts each
user's jobs as one vote and bounds how far one calibration moves a correction (calibration/fit.py).

The caller's own job directories count without the epilog's record (the caller vouches for its own files;
a job id that accounting contradicts is rejected all the same), and where nothing can be checked the report
says so. Every directory is either accepted, with why, or rejected, with why; `calibrate` prints both.
"""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.core.inputfile import group_private_to, owner_name, read_config_text
from frenzy_slurm.core.records import MAX_JOB_RECORD_BYTES, read_job_record, read_job_record_or_none
from frenzy_slurm.jobdir.planfile import read_job_plan
from frenzy_slurm.slurm import SlurmUnavailable
from frenzy_slurm.slurm.view import job_phase

if TYPE_CHECKING:
    from frenzy_slurm.slurm.backend import AccountingRecord, SlurmBackend

# what calibration reads from a job directory (metrics.json may be absent: epilog or sacct peaks instead)
_JOB_FILES = ("plan.json", "submission.json", "metrics.json", "job.sbatch")
MAX_EPILOG_BYTES = 1 << 20  # one node's epilog record: a few KB
MAX_SUBMISSION_BYTES = 1 << 16  # a submission record is a few hundred bytes
# sacct's ElapsedRaw is whole seconds, and a step's time is measured on another clock: this much is rounding
ELAPSED_SLACK_S = 2.0


@dataclass
class Verdict:
    """The directories a fit may use (with the job id and why) and those it may not (with why)."""

    accepted: list[tuple[Path, str | None, str]] = field(default_factory=list)  # (dir, job id, why)
    rejected: list[tuple[Path, str]] = field(default_factory=list)  # (dir, why)
    accounting: bool = False  # whether Slurm's accounting answered
    owners: dict[Path, str] = field(default_factory=dict)  # accepted dir -> its owner: one vote per user

    @property
    def dirs(self) -> list[Path]:
        return [d for d, _, _ in self.accepted]


def _owned_dir(d: Path) -> tuple[int, str | None]:
    """(owner uid, why it cannot be evidence or None): a real directory, its files regular and the owner's."""
    try:
        st = os.lstat(d)
    except OSError as exc:
        return -1, f"cannot read it ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        return st.st_uid, "is a symbolic link; give the job directory itself"
    if not stat.S_ISDIR(st.st_mode):
        return st.st_uid, "is not a directory"
    if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not group_private_to(st.st_gid, st.st_uid)):
        return st.st_uid, (
            f"is writable by others (mode {stat.S_IMODE(st.st_mode):o}): anyone could have written its records"
        )
    for name in _JOB_FILES:
        try:
            fst = os.lstat(d / name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            return st.st_uid, f"{name}: cannot read it ({exc.strerror})"
        if not stat.S_ISREG(fst.st_mode):
            return st.st_uid, f"{name} is not a regular file (a link, FIFO or device)"
        if fst.st_uid != st.st_uid:
            return st.st_uid, (
                f"{name} belongs to {owner_name(fst.st_uid)}, not to the directory's owner {owner_name(st.st_uid)}"
            )
    return st.st_uid, None


def submitted_job_id(d: Path) -> str | None:
    """The job id submission.json records (a bounded read of a regular file), or None."""
    try:
        sub = read_job_record(d / "submission.json", "submission record", MAX_SUBMISSION_BYTES)
    except InputError:
        return None
    job_id = str(sub.get("job_id", "")) if isinstance(sub, dict) else ""
    return job_id if job_id.isdigit() else None


def _accounting(backend: SlurmBackend | None, ids: list[int]) -> dict[int, AccountingRecord] | None:
    """Slurm's records of these jobs (one sacct), or None where the site keeps none or it does not answer."""
    if backend is None:
        return None
    try:
        return backend.accounting(ids)
    except SlurmUnavailable:
        return None


def _read(path: Path) -> str | None:
    """A job directory's file: a regular file read bounded, never through a link nor waiting on a FIFO."""
    try:
        return read_config_text(path, path.name, MAX_JOB_RECORD_BYTES, follow_symlinks=False)
    except InputError:
        return None


def _sha256(path: Path) -> str | None:
    """The digest of a job directory's file as it is on disk, or None."""
    text = _read(path)
    return None if text is None else hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def trusted_epilog_records(directory: Path) -> tuple[dict[str, list[dict[str, Any]]], str | None]:
    """The site epilog's records (job id -> one per node) and, where the directory cannot be trusted, why not:
    only root may have written them (a directory or record another user could write proves nothing)."""

    try:
        st = os.lstat(directory)
    except OSError as exc:
        return {}, f"epilog directory {directory}: cannot read it ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return {}, (
            f"epilog directory {directory} is not a directory of root's that only root can write "
            f"(owner {owner_name(st.st_uid)}, mode {stat.S_IMODE(st.st_mode):o}): its records are not the epilog's"
        )
    out: dict[str, list[dict]] = {}
    for f in sorted(directory.glob("*.json")):
        try:
            fst = os.lstat(f)
            if fst.st_uid != 0 or fst.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                continue  # not root's: not the epilog's
            rec = read_job_record(f, "epilog record", MAX_EPILOG_BYTES)  # regular, bounded, no link
            if isinstance(rec, dict) and f.name.startswith(f"{rec.get('job_id')}-"):
                out.setdefault(str(rec["job_id"]), []).append(rec)
        except (OSError, InputError):
            continue
    return out, None


def _script_problem(d: Path, records: list[dict]) -> str | None:
    """Why the epilog's record does not show that Slurm ran this directory's frenzy-slurm plan, or None."""
    import shlex

    ran = {r.get("script_sha256") for r in records} - {None}
    if not ran:
        return "the site epilog could not read the batch script Slurm ran (scontrol write batch_script)"
    if _sha256(d / "job.sbatch") not in ran:
        return "the batch script Slurm ran is not this directory's job.sbatch"
    try:
        plan = read_job_plan(d / "plan.json")
    except FrenzyError as exc:
        return f"unreadable: {exc.message}"
    script = _read(d / "job.sbatch") or ""
    tag = f"frenzy:{plan.submission}"
    if {r.get("comment") for r in records} != {tag} or f"#SBATCH --comment={tag}\n" not in script:
        return f"Slurm's job comment is not this plan's ({tag}): not the job fsbatch submitted for it"
    if f"FRENZY_PLAN_SHA256={_sha256(d / 'plan.json')} " not in script:
        return "plan.json is not the plan the job's script names (changed since it was submitted)"
    command = " ".join(shlex.quote(str(c)) for c in plan.command)
    srun = [ln for ln in script.splitlines() if ln.startswith("srun ") and ln.endswith(" " + command)]
    cmd = plan.command
    where = cmd[cmd.index("--job-dir") + 1] if "--job-dir" in cmd[:-1] else ""
    if not srun or "frenzy_slurm.runtime" not in cmd or os.path.realpath(where) != os.path.realpath(d):
        return "the script Slurm ran does not launch frenzy-slurm's runtime on this directory's plan"
    return None


def epilog_problem(d: Path, owner: str, records: list[dict[str, Any]]) -> str | None:
    """Why the site epilog's record of the job does not vouch for this directory's measurements, or None."""
    users = {r.get("user") for r in records}
    if users != {owner}:
        return f"the site epilog recorded the job as {', '.join(map(str, users))}'s, not {owner}'s"
    problem = _script_problem(d, records)
    if problem is not None:
        return problem
    if os.path.lexists(d / "metrics.json"):
        found = {r.get("metrics_sha256") for r in records} - {None}
        if not found:
            return "metrics.json was not there when the job ended (the site epilog found none): written afterwards"
        if _sha256(d / "metrics.json") not in found:
            return "metrics.json is not the one the site epilog found when the job ended: changed afterwards"
    return None


def _measured_seconds(d: Path) -> float:
    """The training time metrics.json claims: the sum of its step times (0 without any)."""
    data = read_job_record_or_none(d / "metrics.json")
    times = data.get("step_times_s") if isinstance(data, dict) else None
    try:
        return float(sum(float(t) for t in times)) if isinstance(times, list) else 0.0
    except (TypeError, ValueError):
        return 0.0


def accounting_problem(d: Path, rec: AccountingRecord) -> str | None:
    """Why Slurm's record of the job contradicts plan.json or metrics.json (allocation, run time), or None."""
    try:
        comps = read_job_plan(d / "plan.json").decision.chosen.components
    except FrenzyError as exc:
        return f"unreadable: {exc.message}"
    if len(comps) == 1:  # sacct's record of a heterogeneous job is its first component's alone
        nodes, gpus = comps[0].nodes, comps[0].nodes * comps[0].gpus_per_node
        if rec.nodes is not None and rec.nodes != nodes:
            return f"job {rec.job_id} was allocated {rec.nodes} node(s), but plan.json plans {nodes}"
        if rec.alloc_gpus is not None and rec.alloc_gpus != gpus:
            return f"job {rec.job_id} was allocated {rec.alloc_gpus} GPU(s), but plan.json plans {gpus}"
    claimed = _measured_seconds(d)
    if rec.elapsed_s is not None and claimed > rec.elapsed_s + ELAPSED_SLACK_S:
        return f"metrics.json claims {claimed:.0f} s of steps, but job {rec.job_id} ran {rec.elapsed_s} s"
    return None


def _judge(
    d: Path, uid: int, job_id: str | None, records: dict[int, AccountingRecord] | None, epilog: dict[str, list[dict]]
) -> tuple[str | None, str]:
    """(why rejected, or None; why accepted) for one candidate directory."""
    owner, mine = owner_name(uid), uid == os.geteuid()
    checked: list[str] = []
    rec = records.get(int(job_id)) if records is not None and job_id is not None else None
    if records is not None and job_id is not None:
        if rec is None:
            return f"job {job_id} is unknown to Slurm's accounting (it never ran here)", ""
        if rec.user != owner:
            return f"job {job_id} was run by {rec.user or 'an unknown user'}, but the directory belongs to {owner}", ""
        if rec.work_dir and os.path.realpath(rec.work_dir) != os.path.realpath(d):
            return f"job {job_id} ran in {rec.work_dir}, not in this directory", ""
        if job_phase(rec.state) in ("pending", "running"):
            return f"job {job_id} is {rec.state}: not measured yet", ""
        problem = accounting_problem(d, rec)
        if problem is not None:
            return problem, ""
        checked.append(f"{rec.state} in Slurm's accounting")
    ran = epilog.get(job_id or "")
    if ran:
        problem = epilog_problem(d, owner, ran)
        if problem is not None:
            return f"job {job_id}: {problem}", ""
        checked.append("its script and metrics.json confirmed by the site epilog's record")
    elif not mine:
        unchecked = "records no job id" if job_id is None else f"has no record of the site epilog for job {job_id}"
        return (
            f"belongs to {owner}, and {unchecked}: its owner could have written every file in it "
            "(only your own job directories count without the epilog's record: install contrib/slurm/epilog "
            "and pass --epilog-dir)",
            "",
        )
    if not checked:
        why = "no readable submission.json with a job id" if job_id is None else "Slurm's accounting did not answer"
        return None, f"your own job directory; not checked against Slurm ({why}; the site keeps none?)"
    if job_id is None:
        return None, "your own job directory; " + ", ".join(checked)
    return None, f"job {job_id} of {owner}, " + ", ".join(checked)


def verify_jobs(
    dirs: list[Path], backend: SlurmBackend | None, epilog: dict[str, list[dict[str, Any]]] | None = None
) -> Verdict:
    """Accept or reject each job directory as evidence for a calibration (see the module docstring); `epilog`:
    the site epilog's records (trusted_epilog_records)."""
    verdict = Verdict()
    candidates: list[tuple[Path, int, str | None]] = []
    for d in dirs:
        uid, problem = _owned_dir(d)
        if problem is not None:
            verdict.rejected.append((d, problem))
        else:
            candidates.append((d, uid, submitted_job_id(d)))
    ids = sorted({int(j) for _, _, j in candidates if j})
    records = _accounting(backend, ids) if ids else None  # no job id at all: nothing to ask Slurm about
    verdict.accounting = records is not None
    seen: dict[str, Path] = {}
    for d, uid, job_id in candidates:
        if job_id is not None and job_id in seen:
            verdict.rejected.append((d, f"job {job_id} is already counted from {seen[job_id]}"))
            continue
        problem, why = _judge(d, uid, job_id, records, epilog or {})
        if problem is not None:
            verdict.rejected.append((d, problem))
            continue
        if job_id is not None:
            seen[job_id] = d
        verdict.accepted.append((d, job_id, why))
        verdict.owners[d] = owner_name(uid)
    return verdict
