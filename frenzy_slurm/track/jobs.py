"""Stage 7, track: frenzy-slurm jobs as users see them, from one queue query (cached briefly).

A job of the user's is a frenzy-slurm job when what fsbatch recorded confirms it (`recorded_by_fsbatch`): its
comment `frenzy:<submission>` and its id match the submission.json of its working directory, a directory of the
user's. A tag anyone can type on any job (`sbatch --comment frenzy:x`) is not enough. Another user's job is
shown by its tag only, marked unverified: fsqueue never reads other users' directories. Hetjob components
show as one job. The
job directory (the job's working directory) gives the plan, and after the run `finished.json` and
`metrics.json`. Slurm is asked through the backend only: one `jobs()` query per invocation (for one
user, or for the ids asked about), and one `accounting()` query for all jobs that have left the queue
(MinJobAge), if the site keeps accounting; otherwise the job directory's own record is used.
"""

from __future__ import annotations

import errno
import getpass
import hashlib
import json
import os
import re
import stat
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import read_config_text
from frenzy_slurm.core.records import read_job_record_or_none, write_atomic
from frenzy_slurm.jobdir.checkpoints import latest_step
from frenzy_slurm.slurm import AccountingRecord, Job, SlurmBackend, SlurmCommandError, SlurmUnavailable, group_het_jobs
from frenzy_slurm.slurm.job import ACTIVE_JOB_STATES

if TYPE_CHECKING:  # plan.json's models (the spec, MARP's plan, HAS's decision) are imported when one is read:
    from frenzy_slurm.jobdir.planfile import PlanFile  # a plain `fsqueue` listing needs none of them

CACHE_SECONDS = 5.0
MAX_CACHE_BYTES = 64 << 20  # a queue of tens of thousands of jobs


def _cache_text(key: str, jobs: list[Job]) -> bytes:
    """The queue cache file: which question it answers (`user=NAME` or `user=None`), when the answer was received
    (epoch seconds; its age is judged by this, not only by the file's mtime), and Slurm's answer, each job's fields
    as the backend returned them. Plain JSON, no pydantic: the listing's start-up time."""
    return json.dumps({"key": key, "written_at": time.time(), "jobs": [asdict(j) for j in jobs]}).encode()


def _cache_jobs(raw: bytes, key: str) -> tuple[float, list[Job]] | None:
    """The cache file's time and jobs where it answers `key` and every job is well formed (Job checks its
    fields), else None: a cache that is not exactly ours is asked again, never shown."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or set(data) != {"key", "written_at", "jobs"} or data["key"] != key:
            return None
        written, rows = data["written_at"], data["jobs"]
        if isinstance(written, bool) or not isinstance(written, int | float) or not isinstance(rows, list):
            return None
        return float(written), [Job(**row) for row in rows]
    except (ValueError, TypeError):  # not JSON, a row that is not an object, an unknown or ill-typed field
        return None


def _cache_path(backend: SlurmBackend, key: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "frenzy-slurm"
    # keyed by cluster, backend and question: a --backend cli call right after a pyslurm one asks Slurm again
    digest = hashlib.sha256(f"{os.environ.get('SLURM_CONF', 'default')}|{backend.name}|{key}".encode()).hexdigest()[:16]
    return base / f"jobs-{digest}.json"


def _cache_dir_ok(directory: Path) -> bool:
    """The cache directory is ours and nobody else can write into it (else the cache is neither read nor written:
    someone else could plant a queue we would show)."""
    try:
        st = os.lstat(directory)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _read_cache(path: Path, key: str, max_age: float) -> list[Job] | None:
    """The cached answer if it is ours, private, for this question and younger than `max_age` by the time written
    inside it (an mtime can be set to the future with `touch`; the content is checked as well), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (
            not stat.S_ISREG(st.st_mode)
            or st.st_uid != os.geteuid()
            or st.st_mode & 0o077
            or st.st_size > MAX_CACHE_BYTES
        ):
            return None
        raw = os.read(fd, MAX_CACHE_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    cached = _cache_jobs(raw, key)
    if cached is None:
        return None
    written_at, jobs = cached
    if not 0 <= time.time() - written_at < max_age or not 0 <= time.time() - st.st_mtime < max_age + 1:
        return None
    return jobs


def query_jobs_cached(backend: SlurmBackend, user: str | None, max_age: float = CACHE_SECONDS) -> list[Job]:
    """One queue query per invocation; repeated calls within a few seconds (watch loops) reuse the last answer."""
    key = f"user={user}"
    path = _cache_path(backend, key)
    usable = _cache_dir_ok(path.parent)
    cached = _read_cache(path, key, max_age) if usable else None
    if cached is not None:
        return cached
    jobs = backend.jobs(user=user)
    try:
        if not path.parent.exists():
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            usable = _cache_dir_ok(path.parent)
        if usable:
            write_atomic(path, _cache_text(key, jobs))
    except OSError:
        pass  # a read-only home only costs the cache
    return jobs


@dataclass
class TrackedJob:
    job_id: int
    name: str
    user: str
    state: str
    components: list[Job]
    job_dir: Path | None
    plan: PlanFile | None = None
    finished: dict | None = None
    metrics: dict | None = None
    calibration: dict | None = None  # calibration.json: the calibration fsbatch applied, raw and calibrated step
    started: dict | None = None  # started.json: the current run's start and restart count
    last_checkpoint_step: int | None = None
    notes: list[str] = field(default_factory=list)
    recorded: bool = True  # fsbatch's record in the job directory confirms the job (else another user's, unverified)
    planned_run_time_s: float | None = None  # plan.json's predicted run time, where the plan itself was not read

    @property
    def restarts(self) -> int | None:
        """How often Slurm requeued the job (SLURM_RESTART_COUNT of its latest run), as the job directory knows."""
        recorded = [r.get("restart") for r in (self.started, self.finished, self.metrics) if r]
        counts = [c for c in recorded if isinstance(c, int)]
        return max(counts) if counts else None

    @property
    def gpus_label(self) -> str:
        return "+".join(f"{c.gpus}x{c.gpu_type or 'gpu'}" for c in self.components) or "-"

    @property
    def elapsed_s(self) -> float | None:
        starts = [c.start_time for c in self.components if c.start_time]
        if not starts or self.state in ("PENDING",):
            return None
        end = (
            max((c.end_time or 0) for c in self.components)
            if self.state not in ("RUNNING", "SUSPENDED")
            else time.time()
        )
        return max(0.0, min(end, time.time()) - min(starts))

    @property
    def predicted_remaining_s(self) -> float | None:
        total = self.plan.decision.chosen.run_time_s if self.plan is not None else self.planned_run_time_s
        if total is None:
            return None
        return max(0.0, total - (self.elapsed_s or 0.0)) if self.state in ("RUNNING", "PENDING") else 0.0


def my_user_name() -> str:
    """The user running this command, by uid (USER/LOGNAME can say anything)."""
    try:
        import pwd

        return pwd.getpwuid(os.geteuid()).pw_name
    except (KeyError, ImportError):
        return getpass.getuser()


def _foreign_dir(t: TrackedJob) -> str | None:
    """Why this job's directory is not read (another user's job, a directory not yours), or None.

    fsqueue reads only the caller's own job directories: another user's job shows what Slurm reports, and
    nothing in a directory someone else controls (a FIFO for `checkpoints/latest`, a link to /dev/zero) is
    ever opened.
    """
    assert t.job_dir is not None
    if t.user and t.user != my_user_name():
        return (
            f"job directory {t.job_dir} is not readable by you: it is {t.user}'s job, and fsqueue reads only "
            "your own job directories (shown is what Slurm reports)"
        )
    try:
        st = os.lstat(t.job_dir)
    except OSError as exc:
        return f"job directory {t.job_dir} is not readable by you ({exc.strerror})"
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        what = "is not a directory" if not stat.S_ISDIR(st.st_mode) else f"belongs to uid {st.st_uid}, not to you"
        return f"job directory {t.job_dir} {what}: not read (fsqueue reads only your own job directories)"
    if not os.access(t.job_dir, os.R_OK | os.X_OK):
        return f"job directory {t.job_dir} is not readable by you"
    return None


def _read_plan(path: Path) -> PlanFile:
    from frenzy_slurm.jobdir.planfile import read_job_plan  # plan.json's models: not for a plain listing

    return read_job_plan(path)


def _attach_files(t: TrackedJob) -> None:
    if t.job_dir is None:
        return
    why = _foreign_dir(t)
    if why is not None:
        t.notes.append(why)
        return
    # every read bounded, of regular files only, never through a link: see read_job_record
    if os.path.lexists(t.job_dir / "plan.json"):
        try:
            t.plan = _read_plan(t.job_dir / "plan.json")
        except InputError as exc:
            t.notes.append(str(exc))
    t.finished = read_job_record_or_none(t.job_dir / "finished.json")
    t.metrics = read_job_record_or_none(t.job_dir / "metrics.json")
    t.calibration = read_job_record_or_none(t.job_dir / "calibration.json")
    t.started = read_job_record_or_none(t.job_dir / "started.json")
    for name in ("finished", "metrics", "calibration", "started"):
        if getattr(t, name) is not None and not isinstance(getattr(t, name), dict):
            setattr(t, name, None)  # a record that is JSON but not an object is no record
    t.last_checkpoint_step = latest_step(t.job_dir / "checkpoints")
    moved = read_job_record_or_none(
        t.job_dir / "moved.json"
    )  # frenzy-slurm watch moved it (frenzy_slurm/track/watch.py)
    if isinstance(moved, dict) and str(moved.get("moved_to_job", "")).isdigit():
        t.notes.append(
            f"moved by frenzy-slurm watch to job {moved['moved_to_job']} ({moved.get('to', '?')}), which continues "
            f"its training in {moved.get('moved_to_dir', '?')}"
        )
    if (oom := oom_note(read_job_record_or_none(t.job_dir / "oom.json"))) is not None:
        t.notes.append(oom)
    run = (t.started or {}).get("restart")
    if t.finished is not None and isinstance(run, int) and (t.finished.get("restart") or 0) < run:
        t.notes.append(
            f"finished.json of an earlier run (restart {t.finished.get('restart', 0)}) ignored: "
            f"the job was requeued and is on restart {run}"
        )
        t.finished = None


def oom_note(record: object) -> str | None:
    """fsqueue's line for oom.json (runtime/oom_retry.py): the run ran out of memory, and what came of it."""
    if not isinstance(record, dict):
        return None
    what = "ran out of host memory (Slurm's OUT_OF_MEMORY)" if record.get("kind") == "host" else "ran out of GPU memory"
    retry = record.get("retry_job")
    if isinstance(retry, int):
        step = record.get("from_step")
        start = f"from step {step}" if isinstance(step, int) else "from the start"
        return (
            f"{what}; submitted again as job {retry} on {record.get('to', '?')} ({record.get('plan', '?')}), "
            f"{start}, in {record.get('retry_dir', '?')}"
        )
    return f"{what}; {record.get('note', '')}"


def _drop_stale_finished(t: TrackedJob) -> None:
    """A job still in the queue (running, or pending after a requeue) has not finished, whatever a file says."""
    if t.finished is not None and t.components and any(c.phase in ACTIVE_JOB_STATES for c in t.components):
        t.notes.append(
            f"finished.json of an earlier run (restart {t.finished.get('restart', 0)}) ignored: "
            f"the job is {t.state} again"
        )
        t.finished = None


TAG = "frenzy:"  # the comment fsbatch gives a job: frenzy:<submission>


def _own(job: Job) -> bool:
    return not job.user or job.user == my_user_name()


def recorded_by_fsbatch(lead: Job) -> bool:
    """Whether fsbatch recorded this job (a hetjob's leader): its working directory is the user's own, and the
    submission.json there (a bounded read of a regular file, no link) names this job id and the submission its
    comment carries. A plain `sbatch --comment frenzy:...` job has no such record; neither has another user's
    job as far as this user can tell (their directories are never read)."""
    if not lead.comment.startswith(TAG) or not lead.workdir or not _own(lead):
        return False
    job_dir = Path(lead.workdir)
    try:
        st = os.lstat(job_dir)
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return False
    return names_job(read_job_record_or_none(job_dir / "submission.json", max_bytes=1 << 16), lead)


def names_job(record: object, lead: Job) -> bool:
    """Whether a submission.json's content (a few hundred bytes) names this job (a hetjob's leader): its id, and the
    submission its comment `frenzy:<submission>` carries."""
    return (
        isinstance(record, dict)
        and record.get("job_id") == (lead.het_job_id or lead.job_id)
        and record.get("submission") == lead.comment[len(TAG) :]
    )


def _attach_run_time(t: TrackedJob) -> None:
    """Only plan.json's predicted run time (a plain listing's REMAINING): its JSON, without building the plan's
    models, from the user's own job directory as `_attach_files` reads it."""
    if t.job_dir is None or _foreign_dir(t) is not None:
        return
    raw = read_job_record_or_none(t.job_dir / "plan.json")
    chosen = ((raw or {}).get("decision") or {}).get("chosen") if isinstance(raw, dict) else None
    value = chosen.get("run_time_s") if isinstance(chosen, dict) else None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0:
        t.planned_run_time_s = float(value)


def frenzy_jobs(jobs: list[Job], user: str | None = None, files: bool = True) -> list[TrackedJob]:
    """The frenzy-slurm jobs among `jobs` (of `user`, if given; hetjob components as one): the user's own that
    fsbatch recorded (`recorded_by_fsbatch`), and other users' jobs tagged `frenzy:`, marked unverified
    (`recorded` False); each with what its job directory records, or with `files=False` only the predicted run
    time (the plain listing, which shows nothing else of them)."""
    out = []
    for jid, comps in sorted(group_het_jobs(jobs).items()):
        lead = comps[0]
        if not lead.comment.startswith(TAG):
            continue
        if user is not None and lead.user != user:
            continue
        recorded = recorded_by_fsbatch(lead)
        if not recorded and _own(lead):
            continue  # the user's own job with a tag but no record of fsbatch's: not a frenzy-slurm job
        t = TrackedJob(
            job_id=jid,
            name=lead.name,
            user=lead.user,
            state=lead.state,
            components=comps,
            job_dir=Path(lead.workdir) if lead.workdir else None,
            recorded=recorded,
        )
        if not recorded:
            t.notes.append(
                f"{lead.user}'s job, tagged {TAG} in its comment: not verified as a frenzy-slurm job (only your "
                "own jobs are checked against fsbatch's record)"
            )
        if files:
            _attach_files(t)
            _drop_stale_finished(t)
        else:
            _attach_run_time(t)
        out.append(t)
    return out


def submitted_job_id(job_dir: Path) -> int:
    """The job id a job directory's submission.json records."""
    sub = read_job_record_or_none(job_dir / "submission.json")
    if not isinstance(sub, dict) or not str(sub.get("job_id", "")).isdigit():
        raise InputError(f"{job_dir}: no readable submission.json; not a submitted frenzy-slurm job directory")
    return int(sub["job_id"])


def from_job_dirs(job_dirs: list[Path], backend: SlurmBackend | None) -> list[TrackedJob]:
    """Jobs that have left the queue, from their directories, with one accounting query for all of them."""
    tracked = []
    for d in job_dirs:
        t = TrackedJob(job_id=submitted_job_id(d), name=d.name, user="", state="UNKNOWN", components=[], job_dir=d)
        _attach_files(t)
        tracked.append(t)
    records: dict[int, AccountingRecord] | None = None
    if backend is not None and tracked:
        try:
            records = backend.accounting([t.job_id for t in tracked])
        except SlurmUnavailable as exc:  # accounting down: the job directories still know what they know
            for t in tracked:
                t.notes.append(f"accounting did not answer ({exc.message.split(': ', 1)[-1]})")
    for t in tracked:
        rec = (records or {}).get(t.job_id)
        if rec is not None:
            t.state = rec.state
        elif t.finished is not None:  # no accounting: the job directory is the record
            t.state = "COMPLETED" if t.finished.get("exit_code") == 0 else "FAILED"
    return tracked


def find_job_dir(job_id: int, roots: list[Path]) -> Path | None:
    """The job directory whose submission.json names `job_id`, under the usual jobs directories."""
    for root in roots:
        if not root.is_dir():
            continue
        for sub in root.glob("*/submission.json"):
            data = read_job_record_or_none(sub, max_bytes=1 << 16)  # a submission record is a few hundred bytes
            if isinstance(data, dict) and str(data.get("job_id", "")) == str(job_id):
                return sub.parent
    return None


def comparison(t: TrackedJob) -> list[dict[str, Any]]:
    """Predicted versus measured per GPU type (the largest rank of each), and step time, from metrics.json.

    Memory is compared like for like: each rank's MARP prediction of the quantity it measured
    (allocated bytes), as recorded by the runtime; step time against the plan's prediction for the GPU
    type (on a CPU-emulated cluster the measured time is the CPU's).
    """
    if t.plan is None or not t.metrics:
        return []
    worst: dict[str, dict] = {}
    for r in t.metrics.get("ranks", []):
        if r.get("peak_gib") is None:
            continue
        key = r.get("gpu_model") or r.get("gpu_type") or "?"
        if key not in worst or r["peak_gib"] > worst[key]["peak_gib"]:
            worst[key] = r
    # a calibration's memory factor multiplied what HAS planned with; the runtime records MARP's raw figure
    factor = ((t.calibration or {}).get("calibration") or {}).get("memory_factor", 1.0)
    rows = []
    for gpu, r in worst.items():
        raw = r.get("predicted_allocated_gib", r.get("predicted_gib"))
        rows.append(
            {
                "what": f"peak memory {gpu} ({r.get('metric', 'allocated')}, {r.get('device', '?')})",
                "predicted": raw * factor if raw else raw,
                "measured": r["peak_gib"],
                "unit": "GiB",
                "raw_predicted": raw,
            }
        )
    device = "cpu" if any(r.get("device") == "cpu" for r in t.metrics.get("ranks", [])) else "gpu"
    rows.append(
        {
            "what": f"step time ({device})",
            "predicted": t.plan.decision.chosen.step_time_s,
            "measured": t.metrics.get("step_time_s"),
            "unit": "s",
            "raw_predicted": (t.calibration or {}).get("raw_step_time_s"),
        }
    )
    return rows


# -- cancelling: fscancel ----------------------------------------------------------------------------------------

_JOB_REF = re.compile(r"(\d{1,18})(?:\+(\d{1,6}))?")


def parse_job_ref(text: str) -> int:
    """A job as users write it: `1234`, or a hetjob component `1234+1`, which names its whole job (the leader
    1234): frenzy-slurm cancels a heterogeneous job as one job. Anything else is an InputError naming the form."""
    m = _JOB_REF.fullmatch(text.strip())
    if not m:
        raise InputError(f"job '{text}': not a job id; give one as squeue shows it (1234, or 1234+1 for a hetjob)")
    return int(m.group(1))


@dataclass(frozen=True)
class Cancelled:
    """One job fscancel acted on: its leader id, name, state before, job directory (kept as it is, always) and
    outcome: `cancelled`, `signalled`, `ended` (it had already ended: nothing to do), `not running` (a signal
    for a job that has no processes yet), or `failed` (Slurm refused; `detail` says why)."""

    job_id: int
    name: str
    state: str
    job_dir: Path | None
    components: int
    outcome: str
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "name": self.name,
            "state": self.state,
            "job_dir": str(self.job_dir) if self.job_dir else None,
            "components": self.components,
            "outcome": self.outcome,
            "detail": self.detail,
        }


def _select(
    backend: SlurmBackend, job_ids: list[int] | None, name: str | None, mine: bool, user: str
) -> list[list[Job]]:
    """The jobs to act on, each as its components (leader first), from one queue query. Named ids must be the
    user's own frenzy-slurm jobs (scancel is there for the rest); --name and --mine match only those."""
    if job_ids:
        found = group_het_jobs(backend.jobs(job_ids=job_ids))
        partial = [lead for lead, comps in found.items() if comps[0].het_job_id and comps[0].job_id != lead]
        if partial:  # a component's id showed only that component: ask for the whole job by its leader
            found |= group_het_jobs(backend.jobs(job_ids=partial))
        by_component = {c.job_id: lead for lead, comps in found.items() for c in comps}
        out: list[list[Job]] = []
        for jid in job_ids:
            lead = by_component.get(jid, jid if jid in found else None)
            if lead is None:
                raise InputError(
                    f"job {jid} is not in Slurm's queue: it has ended and left it (`fsqueue {jid}` shows "
                    "what its job directory records) or never existed; nothing to cancel"
                )
            comps = found[lead]
            if comps[0].user and comps[0].user != user:
                raise InputError(f"job {lead} is {comps[0].user}'s job, not yours; fscancel cancels only your own jobs")
            if not recorded_by_fsbatch(comps[0]):
                raise InputError(
                    f"job {lead} is not a frenzy-slurm job (no job directory of yours records it as fsbatch's "
                    f"submission); cancel it with `scancel {lead}`"
                )
            if comps not in out:
                out.append(comps)
        return out
    groups = group_het_jobs(backend.jobs(user=user))
    return [
        comps
        for _, comps in sorted(groups.items())
        if (not comps[0].user or comps[0].user == user)
        and comps[0].phase in ACTIVE_JOB_STATES
        and comps[0].state != "COMPLETING"  # ending already (just cancelled, say): nothing left to cancel
        and (mine or comps[0].name == name)
        and recorded_by_fsbatch(comps[0])
    ]


def cancel_jobs(
    backend: SlurmBackend,
    job_ids: list[int] | None = None,
    *,
    name: str | None = None,
    mine: bool = False,
    signal: str | None = None,
    user: str | None = None,
) -> list[Cancelled]:
    """Cancel (or, with `signal`, signal) the user's frenzy-slurm jobs: these ids (a hetjob component's id
    names its whole job), those named `name`, or all of them (`mine`); one queue query, then one scancel per
    job (a heterogeneous job by its leader's id, which takes every component). Job directories are never
    touched. A Slurm outage raises SlurmUnavailable (exit 4); a selector naming nothing an InputError (exit 2)."""
    if sum(bool(x) for x in (job_ids, name, mine)) != 1:
        raise InputError("name the jobs to cancel: JOBID..., --name NAME or --mine (one of them)")
    me = user or my_user_name()
    out = []
    for comps in _select(backend, job_ids, name, mine, me):
        lead = comps[0]
        jid = lead.het_job_id or lead.job_id
        if lead.phase not in ACTIVE_JOB_STATES:
            out.append(_cancelled(comps, "ended"))
        elif signal is not None and lead.phase != "running":
            out.append(_cancelled(comps, "not running", f"{signal} not sent"))
        else:
            try:
                backend.cancel(jid, signal)
            except SlurmCommandError as exc:
                why = exc.stderr.strip().splitlines()[-1] if exc.stderr.strip() else f"exit {exc.returncode}"
                out.append(_cancelled(comps, "failed", why[:500]))
                continue
            out.append(_cancelled(comps, "signalled" if signal else "cancelled"))
    return out


def _cancelled(comps: list[Job], outcome: str, detail: str = "") -> Cancelled:
    lead = comps[0]
    return Cancelled(
        job_id=lead.het_job_id or lead.job_id,
        name=lead.name,
        state=lead.state,
        job_dir=Path(lead.workdir) if lead.workdir else None,
        components=len(comps),
        outcome=outcome,
        detail=detail,
    )


# -- a job's output: fsqueue JOBID --log -------------------------------------------------------------------------

# How much of an output file is read: its last 4 MiB (a long run's log can be gigabytes; what a user asks
# for is its end). --json prints at most this much too, however many sections.
MAX_LOG_BYTES = 4 << 20
# srun --label (templates/_launch.j2) starts each line of a task with its rank, padded to the widest: " 3: ".
_LABEL = re.compile(r" *(\d{1,7}): ?(.*)", re.DOTALL)
_OUTPUT_LINE = re.compile(r"#SBATCH --(output|error)=(\S+)")
_NAME_LINE = re.compile(r"^#SBATCH --job-name=(\S+)", re.MULTILINE)


@dataclass
class LogSection:
    """The lines of one rank (with its component), or of the batch script itself (`rank` None): what the
    script and srun print, and every line of a job rendered before ranks were labelled."""

    rank: int | None
    component: int | None
    partition: str | None
    lines: list[str]

    @property
    def title(self) -> str:
        if self.rank is None:
            return "batch script and srun"
        where = f"component {self.component} ({self.partition}) " if self.component is not None else ""
        return f"{where}rank {self.rank}"

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "component": self.component, "partition": self.partition, "lines": self.lines}


@dataclass
class JobLogs:
    """A job's output files (as its job.sbatch names them) split per rank: sections in order, batch first."""

    job_id: int
    files: list[Path]
    sections: list[LogSection]
    truncated: bool = False  # a file was longer than MAX_LOG_BYTES: only its end was read
    notes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "files": [str(f) for f in self.files],
            "truncated": self.truncated,
            "max_bytes": MAX_LOG_BYTES,
            "sections": [s.as_json() for s in self.sections],
            "notes": self.notes,
        }


def read_own_file(path: Path, offset: int | None, max_bytes: int = MAX_LOG_BYTES) -> tuple[bytes, int, int]:
    """At most `max_bytes` of a regular file of this user, never through a link (a job directory's file may
    have been replaced by one to /dev/zero or a FIFO): from `offset` on, or (None) its last `max_bytes`.
    Returns the bytes, where they start, and the file's size now. InputError names the file otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        why = "it is a symbolic link, which is not followed" if exc.errno == errno.ELOOP else exc.strerror
        raise InputError(f"output file {path}: cannot read it ({why})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise InputError(f"output file {path} is not a regular file of yours: not read")
        start = max(0, st.st_size - max_bytes) if offset is None else offset
        if start >= st.st_size:
            return b"", start, st.st_size
        os.lseek(fd, start, os.SEEK_SET)
        chunks, left = [], min(max_bytes, st.st_size - start)
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks), start, st.st_size


def read_tail(path: Path, max_bytes: int = MAX_LOG_BYTES) -> tuple[str, bool]:
    """The last `max_bytes` of a regular file of this user (`read_own_file`): its text (invalid UTF-8
    replaced) and whether the start was cut (then from the first whole line)."""
    data, start, _ = read_own_file(path, None, max_bytes)
    if start > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return data.decode("utf-8", errors="replace"), start > 0


def output_files(job_dir: Path, job_id: int, name: str = "", user: str = "") -> tuple[list[Path], list[str]]:
    """The output (and a separate error) file of the job, from the `#SBATCH --output/--error` lines of its
    job.sbatch with %j, %x, %u and %% filled in; notes for a pattern that cannot be resolved."""
    streams, notes = output_streams(job_dir, job_id, name, user)
    return list(dict.fromkeys(streams.values())), notes


def output_streams(job_dir: Path, job_id: int, name: str = "", user: str = "") -> tuple[dict[str, Path], list[str]]:
    """`output_files` by stream: {"output": path, "error": path} (the same path where stderr goes into the
    output file, Slurm's default), each as job.sbatch names it; %x is the script's --job-name unless `name`."""
    script = read_config_text(job_dir / "job.sbatch", "job script", 1 << 20, follow_symlinks=False)
    found: dict[str, str] = {}
    for m in _OUTPUT_LINE.finditer(script):
        found.setdefault(m.group(1), m.group(2))
    if not name and (named := _NAME_LINE.search(script)):
        name = named.group(1)
    files: dict[str, Path] = {}
    notes = []
    for kind in ("output", "error"):
        pattern = found.get(kind)
        if pattern is None:
            continue
        text = pattern.replace("%%", "\0").replace("%j", str(job_id)).replace("%A", str(job_id))
        text = text.replace("%x", name).replace("%u", user or my_user_name())
        if "%" in text:  # %N, %t, %a ...: names that depend on more than the job
            notes.append(f"--{kind}={pattern}: a file name pattern fsqueue cannot fill in; read the file yourself")
            continue
        text = text.replace("\0", "%")
        files[kind] = Path(text) if Path(text).is_absolute() else job_dir / text
    return files, notes


def _rank_components(plan: PlanFile | None) -> list[tuple[int, str]]:
    """Per global rank, its component index and partition: components in order, one task per GPU."""
    if plan is None:
        return []
    return [(k, c.partition) for k, c in enumerate(plan.decision.chosen.components) for _ in range(c.gpus)]


def log_ranks(
    job_dir: Path, job_id: int, rank: int | None = None, component: int | None = None
) -> list[tuple[int, str]]:
    """Per global rank of the job's plan, its component and partition ([] without a readable plan.json);
    InputError for a `rank` or `component` the plan lacks."""
    plan = None
    if os.path.lexists(job_dir / "plan.json"):
        try:
            plan = _read_plan(job_dir / "plan.json")
        except InputError:
            plan = None
    ranks = _rank_components(plan)
    if plan is not None:
        comps = plan.decision.chosen.components
        if component is not None and not 0 <= component < len(comps):
            raise InputError(f"--component {component}: job {job_id} has components 0..{len(comps) - 1}")
        if rank is not None and not 0 <= rank < len(ranks):
            raise InputError(f"--rank {rank}: job {job_id} has ranks 0..{len(ranks) - 1}")
        if rank is not None and component is not None and ranks[rank][0] != component:
            raise InputError(f"--rank {rank} is in component {ranks[rank][0]}, not in --component {component}")
    return ranks


def rank_of_line(line: str, ranks: list[tuple[int, str]]) -> tuple[int | None, str]:
    """Which rank printed an output line (srun --label's prefix, a rank the plan has) and its text without
    the label; (None, line) for the batch script's and srun's own lines."""
    m = _LABEL.fullmatch(line)
    if m and (not ranks or int(m.group(1)) < len(ranks)):
        return int(m.group(1)), m.group(2)
    return None, line


def group_lines(
    lines: list[tuple[int | None, str]],
    ranks: list[tuple[int, str]],
    rank: int | None = None,
    component: int | None = None,
) -> list[LogSection]:
    """Output lines, each as (rank, text) from `rank_of_line`, as sections: the batch script's first (unless a
    rank or component is asked for), then one per rank of the plan (and any other labelled rank), each only if
    it is the `rank` or in the `component`."""
    batch: list[str] = []
    per_rank: dict[int, list[str]] = {}
    for r, text in lines:
        if r is None:
            batch.append(text)
        else:
            per_rank.setdefault(r, []).append(text)
    sections = []
    if rank is None and component is None:
        sections.append(LogSection(None, None, None, batch))
    for r in sorted(set(per_rank) | set(range(len(ranks)))):
        comp, part = ranks[r] if r < len(ranks) else (None, None)
        if (rank is not None and r != rank) or (component is not None and comp != component):
            continue
        sections.append(LogSection(r, comp, part, per_rank.get(r, [])))
    return sections


def job_logs(
    job_dir: Path,
    job_id: int,
    *,
    tail: int | None = None,
    rank: int | None = None,
    component: int | None = None,
    name: str = "",
    max_bytes: int = MAX_LOG_BYTES,
) -> JobLogs:
    """The job's output per rank, grouped by component, batch script's lines first: the last `tail` lines of
    each section, only `rank`, or only the ranks of `component`. Reads only regular files of the user's own
    job directory, each bounded to its last `max_bytes`. InputError for a rank or component the plan lacks."""
    ranks = log_ranks(job_dir, job_id, rank, component)
    files, notes = output_files(job_dir, job_id, name)
    lines: list[tuple[int | None, str]] = []
    truncated = False
    shown: list[Path] = []
    for path in files:
        if not path.exists() and not path.is_symlink():
            notes.append(f"{path} does not exist yet (the job has not started, or Slurm writes it elsewhere)")
            continue
        text, cut = read_tail(path, max_bytes)
        truncated |= cut
        shown.append(path)
        lines += [rank_of_line(line, ranks) for line in text.splitlines()]
    sections = group_lines(lines, ranks, rank, component)
    if tail is not None:
        for s in sections:
            s.lines = s.lines[-tail:] if tail > 0 else []
    if truncated:
        notes.append(f"only the last {max_bytes >> 20} MiB of each output file were read")
    return JobLogs(job_id, shown, sections, truncated, notes)


def tracked_logs(
    t: TrackedJob, *, tail: int | None = None, rank: int | None = None, component: int | None = None
) -> JobLogs:
    """`job_logs` of a tracked job: only of the user's own job directory (another user's job, or a directory
    not the user's, is refused naming why)."""
    return job_logs(own_job_dir(t), t.job_id, tail=tail, rank=rank, component=component, name=t.name)


def own_job_dir(t: TrackedJob) -> Path:
    """The job's directory where its output may be read: the user's own (InputError naming why not)."""
    if t.job_dir is None:
        raise InputError(f"job {t.job_id}: Slurm names no working directory for it, so its output is not known")
    why = _foreign_dir(t)
    if why is not None:
        raise InputError(why)
    return t.job_dir
