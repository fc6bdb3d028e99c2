"""Stage 6, submit: write the job directory atomically and hand the script to Slurm, exactly once per live job.

Idempotency: the submission hash is in the job comment (`frenzy:<hash>`) and the job directory records
`submission.json`. A second `fsbatch` of the same model.yaml and flags is refused (exit 7) while the earlier
job of that submission, from whichever directory, is still alive: pending, running or suspended in the queue,
or not yet visible to Slurm within `SUBMIT_GRACE_S` of sbatch's answer. Once it has ended (the queue or
accounting says a terminal state, or it is gone from both after the grace window, as on a rebuilt cluster) the
same fsbatch submits a rerun into a new job directory (`planning.choose_job_dir` never reuses a directory a job
used) and `Submitted.follows` names the job it follows. `--force` submits another job whatever the earlier
one does. `submit` takes only the JobRequest plan_job returns: what --dry-run printed.
A lock in the user's private directory serialises concurrent fsbatch runs of one submission (see jobdir.py for the
job directory's safety: ownership, modes, no symlink following, nothing of an earlier job overwritten).
Whatever ends sbatch without a job id (our timeout, sbatch's own MessageTimeout, an error exit, an answer
that is not a job id), the job is looked up in the queue by its tag and recorded if it exists. SIGINT,
SIGTERM and SIGHUP wait while sbatch runs and its answer is recorded (a second one stops at once, saying
which job may exist); a record that cannot be written (disk full) is reported with the job id.
Slurm's refusals are explained and recorded in `rejected.json`. Slurm is reached only through the
backend (`frenzy_slurm.slurm`): one queue query (and, for earlier jobs that left the queue, one accounting
query) for the duplicate check, one submission.
"""

from __future__ import annotations

import getpass
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import EXIT_ALREADY_SUBMITTED, EXIT_FAILURE, EXIT_SLURM_REJECTED, FrenzyError, InputError
from frenzy_slurm.core.records import read_json_or_none, write_json
from frenzy_slurm.jobdir import safety as jobdir
from frenzy_slurm.planning import JobRequest
from frenzy_slurm.slurm import AccountingRecord, BatchJob, ComponentRequest, Job, SlurmBackend, SlurmCommandError
from frenzy_slurm.slurm.parse import SlurmUnexpected
from frenzy_slurm.slurm.run import SlurmUnavailable
from frenzy_slurm.slurm.view import ACTIVE_JOB_STATES, job_phase

if TYPE_CHECKING:  # planning imports jobdir; the runtime imports jobdir without planning's stages
    from frenzy_slurm.planning import JobRequest


class AlreadySubmitted(FrenzyError):
    exit_code = EXIT_ALREADY_SUBMITTED


class SlurmRejected(FrenzyError):
    exit_code = EXIT_SLURM_REJECTED


class Unrecorded(FrenzyError):
    """The job was submitted (its id is known) but its record could not be written (disk full, quota, a
    read-only file system): the message names the job and what to do; a later fsbatch adopts it by its tag."""

    exit_code = EXIT_FAILURE


class Interrupted(FrenzyError):
    """A SIGINT/SIGTERM/SIGHUP arrived during the submission; exit 128 + the signal's number, as a shell does."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# Slurm's refusal messages, and what to do about each.
_EXPLAIN = [
    (
        "invalid account",
        "the account is not valid for this partition or user; list yours with "
        "`sacctmgr show assoc user=$USER format=account,partition,qos`",
    ),
    ("invalid qos", "the QOS does not exist or is not allowed for your account (`sacctmgr show assoc user=$USER`)"),
    ("invalid partition", "the partition does not exist; see `fsinfo` and check the site file"),
    (
        "requested node configuration is not available",
        "the partition cannot provide these nodes/GPUs (GRES type "
        "or count): compare `fsinfo` with `frenzy-slurm site validate`",
    ),
    ("invalid generic resource", "the GRES request is not valid on this cluster: check gres_type in the site file"),
    (
        "time limit",
        "the requested --time exceeds the partition or QOS limit: lower slurm.time or use another partition",
    ),
    ("qos", "the job violates a QOS or association limit (GPUs, jobs or time): check `sacctmgr show qos`"),
    ("node count specification invalid", "more nodes than the partition allows (MaxNodes)"),
    ("partition", "the partition refuses this job (down, drained or restricted): check `sinfo -p <partition>`"),
]


def explain(stderr: str) -> str:
    low = stderr.lower()
    return next((why for key, why in _EXPLAIN if key in low), "see Slurm's message above")


# How long after sbatch answered an earlier job that neither squeue nor sacct shows still counts as alive.
# slurmctld creates the job before sbatch returns, so squeue lists it at once on a healthy controller; what
# lags is the rest: accounting (slurmdbd receives records asynchronously, and queues them for minutes while it
# is down or busy), a controller that fails over to its backup and reloads an older state save, a federation's
# sibling cluster. Five minutes covers those hiccups (and equals Slurm's default MinJobAge, the time a finished
# job stays in squeue), while a user who reruns a job that really vanished waits at most that long or uses --force.
SUBMIT_GRACE_S = 300.0


@dataclass(frozen=True)
class Followed:
    """The earlier job of the same submission that a rerun follows: it has ended (`state` says how Slurm or the
    job directory knows: COMPLETED, FAILED, ..., or "gone" when Slurm no longer knows it)."""

    job_id: int
    job_dir: Path
    state: str

    def as_json(self) -> dict[str, Any]:
        return {"job_id": self.job_id, "job_dir": str(self.job_dir), "state": self.state}


@dataclass(frozen=True)
class Submitted:
    job_id: int
    cluster: str | None
    job_dir: Path
    script: str = ""  # job.sbatch as written: the request's, with the job directory's identity recorded
    follows: Followed | None = None  # the ended earlier job of this submission, for a rerun


@dataclass(frozen=True)
class EarlierJob:
    """A job this submission was submitted as before (the user's registry, or the request's own directory), and
    whether it still lives: `alive` is why it blocks a new submission ("is RUNNING", "is not yet visible ..."),
    None once it has ended; `state` is what Slurm (or the job directory) says."""

    job_id: int
    job_dir: Path
    submitted_at: float | None
    state: str
    alive: str | None


def tagged_jobs(req: JobRequest, backend: SlurmBackend | None) -> list[Job]:
    """This user's queued jobs carrying this submission's tag, whatever their directory (one queue query)."""
    if backend is None:
        return []
    tag = f"frenzy:{req.submission}"
    return [j for j in backend.jobs(user=getpass.getuser()) if j.comment == tag]


def earlier_jobs(
    req: JobRequest,
    tagged: list[Job],
    backend: SlurmBackend | None,
    earlier: list[dict[str, Any]] | None = None,
    now: float | None = None,
) -> list[EarlierJob]:
    """Every earlier job of this submission the user's registry (`jobdir.registered`) or the request's directory
    records, each judged alive or ended, oldest first.

    The queue is the authority on live jobs (`tagged`: this user's jobs with the tag, one query; a job id that a
    rebuilt cluster gave to another job carries no such tag). A job the queue no longer lists is asked of
    accounting, one query for all, believed only where its working directory is the job's own: a non-terminal
    state there still blocks; a terminal one, or none at all, means ended, except within `SUBMIT_GRACE_S` of
    sbatch's answer, when it may not be visible yet. The job directory's finished.json of that very job also
    says it ended.
    """
    now = time.time() if now is None else now
    entries = list(earlier or [])
    record = read_json_or_none(req.job_dir / "submission.json")
    if isinstance(record, dict) and isinstance(record.get("job_id"), int):
        if all(Path(str(e["job_dir"])) != req.job_dir for e in entries):
            entries.append(
                {"job_id": record["job_id"], "job_dir": str(req.job_dir), "submitted_at": record.get("submitted_at")}
            )
    queued = {j.het_job_id or j.job_id: j for j in tagged}
    gone = [int(e["job_id"]) for e in entries if int(e["job_id"]) not in queued]
    accounting = None
    if gone and backend is not None:
        try:
            accounting = backend.accounting(gone)
        except (SlurmUnavailable, SlurmUnexpected):
            accounting = None  # the queue answered; without accounting the grace window and records decide
    out = []
    for e in entries:
        job_id, job_dir = int(e["job_id"]), Path(str(e["job_dir"]))
        at = e.get("submitted_at")
        at = float(at) if isinstance(at, int | float) else None
        out.append(_judge(job_id, job_dir, at, queued.get(job_id), (accounting or {}).get(job_id), now))
    return sorted(out, key=lambda e: (e.submitted_at or 0.0, e.job_id))


def _judge(
    job_id: int, job_dir: Path, at: float | None, queued: Job | None, acct: AccountingRecord | None, now: float
) -> EarlierJob:
    """One earlier job, alive or ended: by the queue, then its directory's finished.json, then accounting,
    then the grace window."""
    if queued is not None:
        phase = queued.phase
        alive = None if phase not in ACTIVE_JOB_STATES and phase != "unknown" else f"is {queued.state}"
        return EarlierJob(job_id, job_dir, at, queued.state, alive)
    finished = read_json_or_none(job_dir / "finished.json")
    if isinstance(finished, dict) and str(finished.get("job_id", "")) == str(job_id):
        return EarlierJob(job_id, job_dir, at, "COMPLETED" if finished.get("exit_code") == 0 else "FAILED", None)
    state = acct.state if acct is not None else None
    # a rebuilt cluster may have given the id to another job: accounting is believed for the job's own directory
    if acct is not None and state and (acct.work_dir is None or Path(acct.work_dir) == job_dir):
        if job_phase(state) in ACTIVE_JOB_STATES or job_phase(state) == "unknown":
            return EarlierJob(
                job_id, job_dir, at, state, f"is {state} in Slurm's accounting (though the queue no longer lists it)"
            )
        return EarlierJob(job_id, job_dir, at, state, None)
    if at is None or now - at < SUBMIT_GRACE_S:
        age = f"{now - at:.0f} s ago" if at is not None else "at a time its record does not say"
        return EarlierJob(
            job_id,
            job_dir,
            at,
            "not visible",
            f"was submitted {age} and is not yet visible to Slurm (it counts as alive for "
            f"{SUBMIT_GRACE_S:.0f} s after sbatch answered)",
        )
    return EarlierJob(job_id, job_dir, at, "gone", None)


def existing_job(req: JobRequest, tagged: list[Job], earlier: list[EarlierJob] | None = None) -> str | None:
    """Why this submission has a live job already, or None: an earlier job (`earlier_jobs`) that is still
    alive, or a live job with its tag in the queue that no record names (submitted from another login node
    with another registry, or whose answer was lost)."""
    for e in earlier or []:
        if e.alive is not None:
            return (
                f"job {e.job_id} was already submitted from {e.job_dir} with the same submission "
                f"({req.submission}) and {e.alive}"
            )
    known = {e.job_id for e in earlier or []}
    for j in tagged:
        if (j.het_job_id or j.job_id) not in known and j.phase in ("pending", "running", "suspended"):
            where = f" (job directory {j.workdir})" if j.workdir else ""
            return f"job {j.het_job_id or j.job_id} with the same submission ({req.submission}) is {j.state}{where}"
    return None


def _record(req: JobRequest, job_id: int, cluster: str | None, argv: list[str], backend: str, **extra: str) -> None:
    """submission.json in the job directory and the user's registry entry; an OSError (disk full, quota,
    read-only) becomes Unrecorded, naming the job that exists and how a later fsbatch finds it."""
    record = req.job_dir / "submission.json"
    what = str(record)
    try:
        write_json(
            record,
            {
                "job_id": job_id,
                "cluster": cluster,
                "submission": req.submission,
                "argv": argv,
                "backend": backend,
                "submitted_at": time.time(),
                **extra,
            },
        )
        what = f"the registry of your submissions ({jobdir.lock_dir()})"
        jobdir.register(req.submission, job_id, req.job_dir)
    except OSError as exc:
        raise Unrecorded(
            f"job {job_id} was submitted (tag frenzy:{req.submission}), but recording it in {what} failed: "
            f"{exc.strerror or exc}.\nThe job exists and runs: `squeue -j {job_id}` follows it, `scancel {job_id}` "
            "cancels it. Once there is space (or quota) again, running the same fsbatch finds the job by its "
            "tag and records it instead of submitting again."
        ) from None


def _refuse_ended_in_place(req: JobRequest, earlier: list[EarlierJob]) -> None:
    """A request planned into a directory that a job of this submission has used since (and that ended): the
    rerun needs a new directory, which planning again chooses (InputError, exit 2, never an overwrite)."""
    for e in earlier:
        if e.job_dir == req.job_dir and e.alive is None:
            raise InputError(
                f"job {e.job_id} of this submission ran in {req.job_dir} and has ended ({e.state}); this request "
                "was planned into that directory before it was used, and frenzy-slurm never writes over a job's "
                "files. Run fsbatch again: the rerun is planned into a new job directory."
            )


def _adopt(req: JobRequest, tagged: list[Job], backend: SlurmBackend) -> None:
    """A live job of this submission in this very directory without its record (an earlier fsbatch lost the
    answer to a timeout): record it now, so fsqueue and later checks see it."""
    if (req.job_dir / "submission.json").exists():
        return
    for j in tagged:
        if j.workdir and Path(j.workdir) == req.job_dir and j.phase in ("pending", "running", "suspended"):
            _record(req, j.het_job_id or j.job_id, None, [], backend.name, recovered="found in the queue by its tag")
            return


def find_after_timeout(
    req: JobRequest, backend: SlurmBackend, known: set[int], waits: tuple[float, ...] = (2.0, 5.0, 10.0)
) -> Job | None:
    """After sbatch ended without a job id, the job may exist all the same: look for a new job with this
    submission's tag after each wait (a paused or busy controller answers late)."""
    for wait in waits:
        time.sleep(wait)
        try:
            found = [j for j in tagged_jobs(req, backend) if (j.het_job_id or j.job_id) not in known]
        except (SlurmUnavailable, SlurmUnexpected):
            continue  # the controller is still not answering (or answers garbage): wait longer
        if found:
            return min(found, key=lambda j: j.het_job_id or j.job_id)
    return None


def batch_job(req: JobRequest) -> BatchJob:
    """The request as the Slurm seam takes it: the script, its components in structured form, and the umask
    of the files Slurm creates for it (as private as the job directory)."""
    alloc = req.plan.decision.chosen
    comps = [
        ComponentRequest(
            partition=c.partition,
            gpu_type=c.gpu_type,
            nodes=c.nodes,
            gpus_per_node=c.gpus_per_node,
            time_min=req.plan.time_min,
            cpus_per_gpu=c.cpus_per_task,
        )
        for c in alloc.components
    ]
    return BatchJob(
        script=req.job_dir / "job.sbatch",
        workdir=req.job_dir,
        components=comps,
        name=req.name,
        comment=f"frenzy:{req.submission}",
        umask=req.umask,
    )


def submit(
    req: JobRequest,
    backend: SlurmBackend,
    *,
    timeout_waits: tuple[float, ...] = (2.0, 5.0, 10.0),
    after: int | None = None,
) -> Submitted:
    """Submit `req` (planning.plan_job's request, nothing else) once per submission and user: refuse a
    duplicate (any directory) unless it was planned with --force.

    `after`: a job this one starts only once it has ended (`afterany`, with the plan's own dependency if any),
    given to sbatch on its command line: a sweep's --max-running chain, whose job ids exist only as it submits.

    With `req.force`, plan_job has planned into a fresh directory (`jobdir.next_free_dir`): nothing an
    earlier job wrote is touched. A timeout from sbatch is answered by looking the job up by its tag.
    """
    if not isinstance(req, JobRequest):
        raise TypeError(f"submit() takes the JobRequest of frenzy_slurm.planning.plan_job, not {type(req).__name__}")
    script = req.entry_script
    if script is not None and not script.is_file():
        raise InputError(
            f"{req.plan.spec_path}: entry.script {script} does not exist; fix the path (relative "
            "paths are taken from model.yaml's directory)."
        )
    jobdir.check_private_dir(jobdir.make_private_dir(req.job_dir.parent, "jobs directory"), "jobs directory")
    with jobdir.user_lock(req.submission):
        tagged = tagged_jobs(req, backend)
        _adopt(req, tagged, backend)
        earlier = earlier_jobs(req, tagged, backend, jobdir.registered(req.submission))
        why = existing_job(req, tagged, earlier)
        if why and not req.force:
            raise AlreadySubmitted(
                f"{why}; not submitting it again while it lives. Use --force for another job (in a new job "
                f"directory), `fsqueue` to follow the existing one, or `fscancel` to cancel it."
            )
        _refuse_ended_in_place(req, earlier)
        jobdir.create_job_dir(req.job_dir, req.group_readable, submission=req.submission)
        written = jobdir.write_files(req.job_dir, req.files, req.group_readable)
        job = batch_job(req)
        if after is not None:
            own = req.plan.slurm.dependency if req.plan.slurm is not None else None
            job = replace(job, dependency=f"afterany:{after}" + (f",{own}" if own else ""))
        known = {j.het_job_id or j.job_id for j in tagged}
        with held_signals(req) as caught:
            done = _sbatch_and_record(req, backend, job, known, timeout_waits)
        ended = [e for e in earlier if e.alive is None and e.job_dir != req.job_dir]
        follows = Followed(ended[-1].job_id, ended[-1].job_dir, ended[-1].state) if ended else None
        done = replace(done, script=written["job.sbatch"], follows=follows)
        if caught:
            name = signal.Signals(caught[0]).name
            raise Interrupted(
                f"stopped by {name} after job {done.job_id} was submitted and recorded in "
                f"{req.job_dir / 'submission.json'}; `scancel {done.job_id}` if it should not run.",
                caught[0],
            )
        return done


def _sbatch_and_record(
    req: JobRequest, backend: SlurmBackend, job: BatchJob, known: set[int], timeout_waits: tuple[float, ...]
) -> Submitted:
    """sbatch, then the record. Whatever ends sbatch without a job id (our timeout, sbatch's own MessageTimeout
    after a paused slurmctld, an error exit, an answer that is no job id), the queue is asked for a job with
    this submission's tag before a failure is reported: the controller may have created it."""
    argv = list(req.plan.sbatch_argv)  # what the backend runs (slurm.cli.sbatch_argv), as plan.json recorded it
    try:
        done = backend.submit(job)
    except SlurmCommandError as exc:
        # a refusal, as a rule; one look (no waiting) catches an error exit that came after the job was made
        found = find_after_timeout(req, backend, known, (0.0,))
        if found is not None:
            return _recovered(req, found, argv, backend, f"sbatch failed (exit {exc.returncode})")
        why = explain(exc.stderr)
        write_json(
            req.job_dir / "rejected.json", {"argv": argv, "stderr": exc.stderr, "explanation": why, "at": time.time()}
        )
        raise SlurmRejected(
            f"Slurm refused the job: {exc.stderr.strip()[:2000]}\n{why}.\n"
            f"The rendered files are in {req.job_dir} (rejected.json records this)."
        ) from None
    except (SlurmUnavailable, SlurmUnexpected) as exc:  # SlurmTimeout, sbatch's own timeout, a garbled answer
        found = find_after_timeout(req, backend, known, timeout_waits)
        if found is None:
            raise type(exc)(
                f"{exc.message} The job may still have been created: once Slurm answers, `fsqueue` shows it "
                f"(tag frenzy:{req.submission}), and running the same fsbatch again finds it instead of "
                "submitting twice."
            ) from None
        what = "sbatch timed out" if isinstance(exc, SlurmUnavailable) else "sbatch's answer was unreadable"
        return _recovered(req, found, argv, backend, what)
    extra = {"dependency": job.dependency} if job.dependency is not None else {}
    _record(req, done.job_id, done.cluster, done.argv or argv, backend.name, **extra)
    return Submitted(done.job_id, done.cluster, req.job_dir)


def _recovered(req: JobRequest, found: Job, argv: list[str], backend: SlurmBackend, what: str) -> Submitted:
    job_id = found.het_job_id or found.job_id
    _record(req, job_id, None, argv, backend.name, recovered=f"{what}; found in the queue by its tag")
    return Submitted(job_id, None, req.job_dir)


@contextmanager
def held_signals(req: JobRequest) -> Iterator[list[int]]:
    """While sbatch runs and its answer is recorded, hold SIGINT, SIGTERM and SIGHUP: a job that exists must
    be recorded (or named) before fsbatch exits. The first signal is noted (the caller stops once the record
    is written); a second one stops at once, naming the tag by which the job, if it was created, is found.
    Only the main thread can take signals; elsewhere nothing is held."""
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return

    def hold(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if caught:
            restore()
            raise Interrupted(
                f"stopped by {name} while submitting: a job may have been created. `fsqueue` shows it (tag "
                f"frenzy:{req.submission}), and running the same fsbatch again finds it by its tag and records it "
                f"in {req.job_dir} instead of submitting twice.",
                signum,
            )
        caught.append(signum)
        # os.write, not print: a handler may run while the interpreter is inside a write to stderr
        os.write(
            2,
            f"fsbatch: {name} received: finishing the submission first (the job is recorded before "
            "exiting; send it again to stop at once)\n".encode(),
        )

    previous = {s: signal.signal(s, hold) for s in HELD_SIGNALS}

    def restore() -> None:
        for s, h in previous.items():
            signal.signal(s, h)

    try:
        yield caught
    finally:
        restore()
