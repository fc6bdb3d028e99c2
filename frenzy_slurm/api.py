"""The Python API: plan, submit, follow, wait for and read a training job, as fsbatch and fsqueue do.

    import frenzy_slurm as fs
    plan = fs.plan("model.yaml", overrides={"training.learning_rate": 1e-4}, site="site.yaml")
    print(plan)                      # the chosen allocation, plan, memory per GPU, start and run time
    job = fs.submit(plan)            # what `print(plan)` showed is what is submitted (plan.request)
    job.job_id, job.state            # Slurm's id; its state now (PENDING, RUNNING, COMPLETED, ...)
    job.wait()                       # until it ends: its final state (WaitTimeout after `timeout` seconds)
    job.metrics()                    # what the built-in trainer recorded: steps, step time, loss, peak memory
    job.logs(), job.stdout()         # its output per rank (as fsqueue JOBID --log), its output file as written
    job.cancel()                     # scancel, the job directory kept
    plans = fs.sweep("model.yaml", {"training.learning_rate": [1e-4, 3e-4]})   # one plan per combination

Every step is the one fsbatch runs: `planning.plan_job` plans, `submission.submit` submits, `track` says the
state. fsbatch is this module's caller (`plan_jobs`, `submit`, `Job.wait`, `summary_line`); errors are the
typed exceptions of `frenzy_slurm.core.errors` and the stages (each with its `exit_code`), never `sys.exit`.
Imports of the stages are deferred to the calls: `import frenzy_slurm` stays cheap and never imports torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import frenzy_slurm.slurm as seam
from frenzy_slurm.core.errors import EXIT_FAILURE, FrenzyError, InputError
from frenzy_slurm.core.records import read_job_record_or_none
from frenzy_slurm.core.units import fmt_gib
from frenzy_slurm.jobdir.safety import user_lock
from frenzy_slurm.jobspec.sweeps import check_max_running, combinations, grid_of, waits_for
from frenzy_slurm.slurm.dependency import parse_dependency
from frenzy_slurm.slurm.job import ENDED, job_phase
from frenzy_slurm.slurm.timefmt import format_slurm_time as hms
from frenzy_slurm.track.jobs import (
    cancel_jobs,
    frenzy_jobs,
    from_job_dirs,
    job_logs,
    output_files,
    output_streams,
    read_tail,
    submitted_job_id,
)

if TYPE_CHECKING:
    from frenzy_slurm.jobspec import ResolvedModel
    from frenzy_slurm.jobspec.sweeps import Combination
    from frenzy_slurm.planning import JobFile, JobRequest, SiteFile
    from frenzy_slurm.render.environment import EnvCheck
    from frenzy_slurm.slurm import SlurmBackend
    from frenzy_slurm.submission import Submitted
    from frenzy_slurm.track.jobs import Cancelled, TrackedJob

__all__ = ["Job", "Metrics", "Plan", "WaitTimeout", "job", "plan", "submit", "sweep", "wait_all"]

FIRST_POLL_S = 2.0  # as sbatch --wait: the first look after 2 s, each later wait longer
POLL_GROWTH = 2.0
DEFAULT_POLL_S = 30.0  # the longest wait between two looks: slurmctld is shared, and a job's end is rarely urgent
MAX_API_LOG_BYTES = 64 << 20  # Job.logs/stdout/stderr read the last 64 MiB of a file: a whole run's log, bounded
UNSEEN_LOOKS = 3  # a job neither in the queue nor recorded anywhere this many looks in a row is taken as gone
SLURM_FLAGS = (
    "account",
    "qos",
    "time",
    "constraint",
    "exclusive",
    "preemptible",
    "oom_retry",
    "replan",
    "mail_type",
    "mail_user",
    "job_name",
    "output",
    "error",
    "dependency",
    "extra",
)


class WaitTimeout(FrenzyError):
    """`Job.wait(timeout=...)` ran out before the job ended; the job keeps running."""

    exit_code = EXIT_FAILURE


@dataclass(frozen=True, repr=False)
class Plan:
    """One planned job: the frozen request fsbatch --dry-run prints (`request`), the backend it was planned
    on (which submits it), and the sweep values it was planned with (`overrides`, as written)."""

    request: JobRequest
    backend: SlurmBackend = field(repr=False)
    overrides: Mapping[str, Any] = field(default_factory=dict)
    label: str = ""  # the sweep combination, `key=value ...`; empty for a single job
    model: ResolvedModel | None = field(default=None, repr=False)  # the model as planned (exact_params if traced)
    max_running: int | None = None  # the sweep's cap on its jobs running at once (--max-running)
    waits_for: Plan | None = field(default=None, repr=False)  # the sweep's job this one starts after (afterany)

    @property
    def name(self) -> str:
        return self.request.name

    @property
    def job_dir(self) -> Path:
        return self.request.job_dir

    @property
    def script(self) -> str:
        return self.request.script

    @property
    def notes(self) -> tuple[str, ...]:
        return self.request.notes

    @property
    def gpus(self) -> int:
        """GPUs of the chosen allocation (all components)."""
        return sum(c.nodes * c.gpus_per_node for c in self.request.decision.chosen.components)

    @property
    def predicted_peak_gib(self) -> list[float]:
        """MARP's predicted peak memory per GPU, one figure per component (GiB)."""
        return [c.peak_gib for c in self.request.decision.chosen.components]

    @property
    def predicted_run_time_s(self) -> float:
        return self.request.decision.chosen.run_time_s

    @property
    def summary(self) -> str:
        return summary_line(self.request)

    def as_json(self) -> dict[str, Any]:
        """What `fsbatch --dry-run --json` prints for this job (and the sweep values, if any)."""
        out = self.request.as_json()
        if self.overrides:
            out["overrides"] = dict(self.overrides)
        if self.max_running is not None:
            out["max_running"] = self.max_running
            out["waits_for"] = None if self.waits_for is None else self.waits_for.chain_json()
        return out

    def chain_json(self) -> dict[str, Any]:
        """This job as another job of the sweep waits for it: its name and job directory."""
        return {"name": self.name, "job_dir": str(self.job_dir)}

    @property
    def chain_line(self) -> str | None:
        """What --max-running makes of this job, in words (fsbatch --dry-run and --explain print it)."""
        if self.max_running is None:
            return None
        if self.waits_for is None:
            return (
                f"--max-running {self.max_running}: starts as its resources allow (one of the first {self.max_running})"
            )
        return (
            f"--max-running {self.max_running}: starts after job {self.waits_for.name} ends "
            f"(sbatch --dependency=afterany:ITS_JOB_ID, any end state)"
        )

    def __str__(self) -> str:
        return self.summary

    def __repr__(self) -> str:  # the request's files are long; the summary says what the plan is
        return f"<Plan {self.summary} job_dir={str(self.job_dir)!r}>"


def summary_line(req: JobRequest) -> str:
    """One line: the chosen allocation, plan, memory per GPU, start and run time (fsbatch prints it)."""
    decision = req.decision
    chosen = decision.chosen
    memory = " + ".join(f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" for c in chosen.components)
    start = "now" if chosen.start_source == "now" else hms(chosen.start - decision.decided_at) + " from now"
    return (
        f"{req.plan.spec.name}: {chosen.kind} {chosen.label()}, plan {chosen.plan.short()}, {memory} per GPU, "
        f"start {start}, run time {hms(chosen.run_time_s)} (decided in {decision.decision_ms:.0f} ms)"
    )


def open_backend(backend: str | SlurmBackend = "auto", snapshot: str | Path | None = None) -> SlurmBackend:
    """A backend by name (`auto`, `cli`, `pyslurm`, `static` with a snapshot), or the one given."""
    if not isinstance(backend, str):
        return backend
    return seam.open_backend(backend, Path(snapshot) if snapshot is not None else None)


def open_site(site: str | Path | SiteFile | None) -> SiteFile:
    """The site file: given, else $FRENZY_SITE, else /etc/frenzy-slurm/site.yaml (planning.find_site_file)."""
    # planning's stages load only to plan: Job and fsqueue --follow use this module without them
    from frenzy_slurm.planning import SiteFile, find_site_file

    if isinstance(site, SiteFile):
        return site
    return find_site_file(Path(site) if site is not None else None)


def check_dependency_jobs(dependency: str | None, backend: SlurmBackend) -> None:
    """The jobs a --dependency names exist in Slurm (one queue query); sbatch refuses one it cannot find
    (afterok/afternotok: a job that left the queue more than MinJobAge ago is not found either). A saved
    snapshot cannot say: nothing is checked there."""
    if dependency is None:
        return
    ids = parse_dependency(dependency).job_ids
    if not ids or backend.snapshot is not None:
        return
    known = {i for j in backend.jobs(job_ids=ids) for i in (j.job_id, j.het_job_id) if i is not None}
    missing = [i for i in ids if i not in known]
    if missing:
        which = ", ".join(map(str, missing))
        raise InputError(
            f"--dependency {dependency}: Slurm knows no job {which} (never submitted, or it ended more than "
            f"MinJobAge ago); sbatch would refuse it. Check the id with `squeue -j {missing[0]}` or "
            f"`sacct -j {missing[0]}`, or drop the dependency."
        )


def plan_jobs(
    model_yaml: str | Path,
    combinations: Sequence[Combination] = (),
    *,
    site: str | Path | SiteFile | None = None,
    backend: str | SlurmBackend = "auto",
    snapshot: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    slurm: Mapping[str, Any] | None = None,
    job_dir: str | Path | None = None,
    templates: str | Path | None = None,
    calibration: bool = True,
    force: bool = False,
    trace_factory: bool = False,
    turns: ExitStack | None = None,
    now: float | None = None,
    env_check: EnvCheck = "refuse",
    max_running: int | None = None,
) -> list[Plan]:
    """The plans of model.yaml's combinations (none given: the file as it is, with `overrides`), all planned
    before any is submitted, on one view of the cluster. fsbatch and `plan`/`sweep` call this.

    `slurm` holds fsbatch's sbatch-style flags (SLURM_FLAGS: account, time, dependency, extra, ...), which
    override model.yaml's slurm: block. With `turns`, each --force submission's lock is taken into it before
    that job is planned (fsbatch holds them until it has submitted: see `_force_turn`). `env_check`: whether the
    job's Python finding the framework's packages is checked, a miss refusing the plan (exit 2) or a note
    (docs/runtime.md, "The job's environment"). `max_running`: at most this many of the sweep's jobs run at
    once; each job past the first N waits for the one N before it (`Plan.waits_for`, afterany at submission).
    """
    # planning's stages load only to plan: Job and fsqueue --follow use this module without them
    from frenzy_slurm.planning import PlanOptions, plan_job, submission_of, traced

    unknown = sorted(set(slurm or {}) - set(SLURM_FLAGS))
    if unknown:
        raise InputError(f"slurm options {', '.join(unknown)} are not known; use {', '.join(SLURM_FLAGS)}.")
    # in fsbatch's order: every model.yaml (combination) read first, then the site file, the flags, Slurm
    loaded = _load_combinations(Path(model_yaml), combinations, overrides, job_dir)
    site_file = open_site(site)
    prepared = []
    for combo, job in loaded:
        if trace_factory:
            job = traced(job, site_file)
        flags = {**(slurm or {}), "extra": list((slurm or {}).get("extra") or [])}
        options = PlanOptions(
            slurm=job.spec.slurm.overridden(**flags),
            job_dir=Path(job_dir) if job_dir is not None else None,
            templates=Path(templates) if templates is not None else None,
            calibration=calibration,
            force=force,
            now=now,
            env_check=env_check,
        )
        prepared.append((combo, job, options))
    for _, _, options in prepared:
        check_max_running(max_running, len(prepared), options.slurm.dependency)
    opened = open_backend(backend, snapshot)
    # a saved snapshot is one view already, and planning must still see it as read-only (planning.start_estimator)
    from frenzy_slurm.slurm.oneview import OneView

    cluster = opened if opened.snapshot is not None else OneView(opened)
    # fsbatch -d, model.yaml's slurm.dependency, or a --set of it: each checked once, before anything is planned
    for dependency in dict.fromkeys(options.slurm.dependency for _, _, options in prepared):
        check_dependency_jobs(dependency, cluster)
    plans: list[Plan] = []
    for combo, job, options in prepared:
        if turns is not None and force:
            turns.enter_context(_force_turn(submission_of(job, options)))
        request = plan_job(job, site_file, cluster, options)
        label = combo.label() if combo.total > 1 else ""
        before = waits_for(len(plans), max_running)
        waits = plans[before] if before is not None else None
        plans.append(Plan(request, cluster, combo.overrides, label, job.model, max_running, waits))
    return plans


def _load_combinations(
    path: Path, combinations: Sequence[Combination], overrides: Mapping[str, Any] | None, job_dir: str | Path | None
) -> list[tuple[Combination, JobFile]]:
    """model.yaml read once per combination (none: the file as it is, with `overrides`); a sweep's jobs are named
    after the file's own name. A sweep cannot share one --job-dir."""
    from frenzy_slurm.planning import load_job

    if not combinations:
        from frenzy_slurm.jobspec.sweeps import combinations as product

        combinations = product({})
    if len(combinations) > 1 and job_dir is not None:
        raise InputError(
            "--job-dir names one job's directory; a sweep's jobs each get their own under $FRENZY_JOBS_DIR "
            "(or ./frenzy-jobs): set that instead."
        )
    loaded = []
    base_name: str | None = None
    for combo in combinations:
        values = {**(overrides or {}), **combo.overrides}
        if combo.total > 1 and base_name is None:
            base_name = load_job(path, values).spec.name
        loaded.append((combo, load_job(path, values, combo.name(base_name) if base_name is not None else None)))
    return loaded


def _force_turn(submission: str) -> Any:
    """The lock that serialises `--force` runs of one submission, from choosing the directory to submitting,
    so each sees the directory the other took."""
    return user_lock(f"{submission}-force")


def plan(
    model_yaml: str | Path,
    overrides: Mapping[str, Any] | None = None,
    *,
    site: str | Path | SiteFile | None = None,
    backend: str | SlurmBackend = "auto",
    snapshot: str | Path | None = None,
    slurm: Mapping[str, Any] | None = None,
    job_dir: str | Path | None = None,
    templates: str | Path | None = None,
    calibration: bool = True,
    force: bool = False,
    trace_factory: bool = False,
    env_check: EnvCheck = "refuse",
) -> Plan:
    """Plan the job of `model_yaml` as `fsbatch --dry-run` does: `overrides` (dotted key -> value, validated
    as model.yaml's own) change the file's values; `slurm` are fsbatch's sbatch-style flags (`{"time": "1:00:00",
    "dependency": "afterok:1234"}`). Raises InputError (exit 2), NoFitError (3), SlurmUnavailable (4), ..."""
    (one,) = plan_jobs(
        model_yaml,
        site=site,
        backend=backend,
        snapshot=snapshot,
        overrides=overrides,
        slurm=slurm,
        job_dir=job_dir,
        templates=templates,
        calibration=calibration,
        force=force,
        trace_factory=trace_factory,
        env_check=env_check,
    )
    return one


def sweep(
    model_yaml: str | Path,
    grid: Mapping[str, Sequence[Any]],
    *,
    overrides: Mapping[str, Any] | None = None,
    site: str | Path | SiteFile | None = None,
    backend: str | SlurmBackend = "auto",
    snapshot: str | Path | None = None,
    slurm: Mapping[str, Any] | None = None,
    templates: str | Path | None = None,
    calibration: bool = True,
    force: bool = False,
    env_check: EnvCheck = "refuse",
    max_running: int | None = None,
) -> list[Plan]:
    """One plan per combination of `grid`'s values (`{"training.learning_rate": [1e-4, 3e-4]}`), as
    `fsbatch --set training.learning_rate=1e-4,3e-4` plans them: each its own name and job directory, at
    most sweeps.MAX_COMBINATIONS. Submit each with `submit`, in order. `max_running=N` (as fsbatch
    --max-running, submitit's slurm_array_parallelism): at most N of them run at once, each job past the
    first N starting after the one N before it ends (Slurm's afterany: nothing waits on the login node)."""
    return plan_jobs(
        model_yaml,
        combinations(grid_of(grid)),
        site=site,
        backend=backend,
        snapshot=snapshot,
        overrides=overrides,
        slurm=slurm,
        templates=templates,
        calibration=calibration,
        force=force,
        env_check=env_check,
        max_running=max_running,
    )


@dataclass(frozen=True)
class Metrics:
    """What the job recorded in metrics.json (the built-in trainer's; a script's job has GPU memory only)."""

    step: int | None
    total_steps: int | None
    step_time_s: float | None
    tokens_per_s: float | None
    loss: tuple[tuple[int, float], ...]  # (step, loss) as the trainer logged them
    peak_gib: float | None  # the largest per-rank peak memory measured
    raw: Mapping[str, Any]  # the whole metrics.json


@dataclass
class Job:
    """A submitted job: its id, directory and the backend that follows it. Each `state` is one queue query."""

    job_id: int
    job_dir: Path
    backend: SlurmBackend = field(repr=False)
    cluster: str | None = None
    submitted: Submitted | None = field(default=None, repr=False)  # submit's answer, where this process submitted
    _last: TrackedJob | None = field(default=None, repr=False)

    def tracked(self) -> TrackedJob:
        """What fsqueue JOBID shows: the queue's view (every hetjob component), else the job directory's with
        accounting once the job has left the queue."""
        found = frenzy_jobs(self.backend.jobs(job_ids=[self.job_id]))
        t = next((t for t in found if t.job_id == self.job_id), None)
        if t is None:
            t = from_job_dirs([self.job_dir], self.backend)[0]
        self._last = t
        return t

    @property
    def last_look(self) -> TrackedJob | None:
        """The tracker's answer of the last look (`tracked()`, `state`, `wait`, `wait_all`), None before one."""
        return self._last

    @property
    def state(self) -> str:
        """Slurm's state of the job now (PENDING, RUNNING, COMPLETED, FAILED, ...; UNKNOWN once it has left
        the queue where the site keeps no accounting and the job wrote no record)."""
        return self.tracked().state

    def done(self) -> bool:

        return job_phase(self.state) in ENDED

    def wait(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> str:
        """Until the job ends: its final state. Looks after 2 s, then ever less often up to every `poll` seconds
        (one queue query each). WaitTimeout after `timeout` seconds (the job keeps running); Ctrl-C
        (KeyboardInterrupt) stops waiting, not the job. A job that is neither in the queue nor recorded for
        UNSEEN_LOOKS looks is returned as UNKNOWN. `wait_all` waits for several."""
        return wait_all([self], timeout, poll)[0]

    @property
    def exit_code(self) -> int | None:
        """The job's exit code as sbatch --wait gives it: the job script's status (finished.json; for a hetjob
        the one srun step over all components), else accounting's (a signal counts as 1); None while unknown."""
        t = self._last or self.tracked()
        code = (t.finished or {}).get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            return code
        records = self.backend.accounting([self.job_id]) or {}
        rec = records.get(self.job_id)
        if rec is None or not rec.exit_code:
            return None
        status, _, signal = rec.exit_code.partition(":")
        if signal not in ("", "0"):
            return 1
        return int(status) if status.isdigit() else None

    def wait_exit_code(self, state: str) -> int:
        """fsbatch --wait's exit status for a job that ended in `state`: 0 only for COMPLETED, else the job's
        own exit code, or 1 where that is 0 or unknown (a job cancelled before it started)."""
        code = self.exit_code
        if state == "COMPLETED":
            return code or 0
        return code if code else 1

    def metrics(self) -> Metrics | None:
        """metrics.json as the job wrote it (at its end; None before then, or where it wrote none)."""
        raw = read_job_record_or_none(self.job_dir / "metrics.json")
        if not isinstance(raw, dict):
            return None
        ranks = [r for r in raw.get("ranks") or [] if isinstance(r, dict)]
        peaks = [r["peak_gib"] for r in ranks if isinstance(r.get("peak_gib"), (int, float))]
        return Metrics(
            step=raw.get("step"),
            total_steps=raw.get("total_steps"),
            step_time_s=raw.get("step_time_s"),
            tokens_per_s=raw.get("tokens_per_s"),
            loss=tuple(
                (int(x[0]), float(x[1]))
                for x in raw.get("loss") or []
                if isinstance(x, list) and len(x) == 2 and all(isinstance(v, (int, float)) for v in x)
            ),
            peak_gib=max(peaks) if peaks else None,
            raw=raw,
        )

    def logs(
        self,
        *,
        rank: int | None = None,
        component: int | None = None,
        tail: int | None = None,
        merged: bool = False,
        max_bytes: int = MAX_API_LOG_BYTES,
    ) -> str:
        """The job's output as text, as `fsqueue JOBID --log` prints it: a `==> rank R <==` section per rank
        (grouped by component, the batch script's own lines first), only `rank` or the ranks of `component`,
        the last `tail` lines of each. `merged=True`: the output files as Slurm wrote them (every rank's lines
        interleaved, srun's `R: ` labels kept). "" before the job has written anything. Reads the last
        `max_bytes` of each file (regular files of your own job directory only); InputError otherwise."""
        if merged:
            if rank is not None or component is not None or tail is not None:
                raise InputError("logs(merged=True) is the files as written: rank, component and tail select sections")
            files, _ = output_files(self.job_dir, self.job_id)
            return "".join(read_tail(f, max_bytes)[0] for f in files if f.exists() or f.is_symlink())
        logs = job_logs(self.job_dir, self.job_id, tail=tail, rank=rank, component=component, max_bytes=max_bytes)
        if not logs.files:
            return ""
        return "".join(f"==> {s.title} <==\n" + "".join(f"{line}\n" for line in s.lines) for s in logs.sections)

    def stdout(self, max_bytes: int = MAX_API_LOG_BYTES) -> str | None:
        """The job's output file (`#SBATCH --output`) as text, as submitit's `job.stdout()`: None while it does
        not exist (the job has not started). It holds stderr too unless the job names a separate --error."""
        return self._read_stream("output", max_bytes)

    def stderr(self, max_bytes: int = MAX_API_LOG_BYTES) -> str | None:
        """The job's error file (`#SBATCH --error`) as text, None while it does not exist. Slurm writes stderr
        into the output file unless the job names another (fsbatch -e): then this is the same text as
        `stdout()`, both streams interleaved."""
        return self._read_stream("error", max_bytes)

    def _read_stream(self, kind: str, max_bytes: int) -> str | None:

        streams, notes = output_streams(self.job_dir, self.job_id)
        path = streams.get(kind)
        if path is None:
            raise InputError(f"job {self.job_id}: {'; '.join(notes) or f'its job.sbatch names no --{kind} file'}")
        if not path.exists() and not path.is_symlink():
            return None
        return read_tail(path, max_bytes)[0]

    def cancel(self, signal: str | None = None) -> Cancelled:
        """Cancel the job (every component of a hetjob; with `signal`, send it that signal instead) as fscancel
        JOBID does (track.cancel_jobs); its directory is kept. The outcome says what happened: cancelled,
        signalled, ended (nothing to do), not running, or failed (Slurm refused: SlurmRejected is raised)."""
        # submission imports planning's stages: loaded only to tell a refusal
        from frenzy_slurm.submission import SlurmRejected

        (done,) = cancel_jobs(self.backend, [self.job_id], signal=signal)
        if done.outcome == "failed":
            raise SlurmRejected(f"Slurm did not cancel job {self.job_id}: {done.detail}")
        return done


def wait_all(
    jobs: Sequence[Job],
    timeout: float | None = None,
    poll: float = DEFAULT_POLL_S,
    *,
    on_look: Callable[[Sequence[Job]], None] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> list[str]:
    """Until every job has ended: their final states, in order (fsbatch --wait of a sweep). Each look is one
    queue query for the jobs still waited for (and one accounting query for those that left the queue), after
    2 s, then ever less often up to every `poll` seconds; `on_look(jobs)` is called after each (each job's
    `tracked()` answer is then `job._last`), `sleep` waits between looks. WaitTimeout after `timeout` seconds;
    a job neither in the queue nor recorded for UNSEEN_LOOKS looks in a row ends as UNKNOWN."""
    if poll <= 0 or (timeout is not None and timeout < 0):
        raise InputError(f"wait(timeout={timeout}, poll={poll}): poll must be > 0 and timeout >= 0.")
    deadline = None if timeout is None else time.monotonic() + timeout
    final: dict[int, str] = {}
    unseen = {j.job_id: 0 for j in jobs}
    for delay in _delays(poll):
        for j in _look([j for j in jobs if j.job_id not in final]):
            state = j._last.state if j._last is not None else "UNKNOWN"
            unseen[j.job_id] = unseen[j.job_id] + 1 if state == "UNKNOWN" else 0
            if job_phase(state) in ENDED or unseen[j.job_id] >= UNSEEN_LOOKS:
                final[j.job_id] = state
        if on_look is not None:
            on_look(jobs)
        if len(final) == len({j.job_id for j in jobs}):
            return [final[j.job_id] for j in jobs]
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                waiting = [j for j in jobs if j.job_id not in final]
                states = ", ".join(j._last.state if j._last else "UNKNOWN" for j in waiting)
                ids = " ".join(str(j.job_id) for j in waiting)
                raise WaitTimeout(
                    f"job {ids} is still {states} after {timeout:g} s; it keeps running (`fsqueue {waiting[0].job_id}` "
                    "follows it)."
                )
            delay = min(delay, left)
        (sleep or _sleep)(delay)
    raise AssertionError("unreachable: _delays never ends")


def _look(jobs: Sequence[Job]) -> Sequence[Job]:
    """Each job's state now into `job._last`: one queue query per backend for all of them, then their job
    directories (with one accounting query) for those that have left the queue."""
    by_backend: dict[int, list[Job]] = {}
    for j in jobs:
        by_backend.setdefault(id(j.backend), []).append(j)
    for group in by_backend.values():
        backend = group[0].backend
        found = {t.job_id: t for t in frenzy_jobs(backend.jobs(job_ids=[j.job_id for j in group]))}
        gone = [j for j in group if j.job_id not in found]
        if gone:
            found |= {j.job_id: t for j, t in zip(gone, from_job_dirs([j.job_dir for j in gone], backend), strict=True)}
        for j in group:
            j._last = found[j.job_id]
    return jobs


def _delays(longest: float) -> Iterator[float]:
    delay = min(FIRST_POLL_S, longest)
    while True:
        yield delay
        delay = min(delay * POLL_GROWTH, longest)


def _sleep(seconds: float) -> None:
    """time.sleep; tests replace it with a fake Slurm's clock."""
    time.sleep(seconds)


def submit(plan: Plan | JobRequest, backend: str | SlurmBackend | None = None) -> Job:
    """Submit a plan (`plan`, `sweep`) through submission.submit, once per submission: AlreadySubmitted (exit 7)
    if it already has a job, unless planned with force=True. A JobRequest needs the backend to submit to."""
    # planning's stages load only to plan: Job and fsqueue --follow use this module without them
    from frenzy_slurm.planning import JobRequest
    from frenzy_slurm.submission import submit as submit_request

    after = None
    if isinstance(plan, Plan):
        request, cluster = plan.request, open_backend(backend) if backend is not None else plan.backend
        after = _chained_after(plan)
    elif isinstance(plan, JobRequest):
        if backend is None:
            raise InputError("submit(request): a JobRequest needs backend=; or pass the Plan that fs.plan returned.")
        request, cluster = plan, open_backend(backend)
    else:
        raise InputError(f"submit() takes the Plan of fs.plan or fs.sweep, not {type(plan).__name__}.")
    from frenzy_slurm.slurm.oneview import OneView

    follows = cluster.inner if isinstance(cluster, OneView) else cluster
    done = submit_request(request, follows, after=after)
    return Job(done.job_id, done.job_dir, follows, done.cluster, done)


def _chained_after(plan: Plan) -> int | None:
    """The job id a --max-running sweep's plan waits for: the job submitted for `plan.waits_for`, as its job
    directory records it (a sweep is submitted in order); InputError if that one has not been submitted."""
    if plan.waits_for is None:
        return None

    try:
        return submitted_job_id(plan.waits_for.job_dir)
    except InputError:
        raise InputError(
            f"{plan.name} waits for {plan.waits_for.name} (max_running={plan.max_running}), which has not been "
            "submitted: submit a sweep's plans in order."
        ) from None


def job(job_dir: str | Path, backend: str | SlurmBackend = "auto", snapshot: str | Path | None = None) -> Job:
    """The job a job directory records (submission.json), to follow from another process."""
    path = Path(job_dir).absolute()
    return Job(submitted_job_id(path), path, open_backend(backend, snapshot))
