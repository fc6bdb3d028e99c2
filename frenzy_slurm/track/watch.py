"""`frenzy-slurm watch`: the watcher beside fsbatch that moves this user's preemptible jobs as the cluster changes.

Only jobs the user marked preemptible (`fsbatch --preemptible`, model.yaml's `slurm.preemptible`) are touched:
that mark is the user's consent to checkpoint-and-move. Each pass reads the cluster once and decides each such
job again with HAS (has/moves.py, the decisions the simulator's `has-preempt` measures):

- a pending job (never started, or requeued after a preemption) that another allocation finishes sooner is
  held (`scontrol hold`; a job that started meanwhile refuses, and is left), the new plan is submitted as a
  new job, and the held one is cancelled; if the submission fails the job is released;
- a running job that another allocation finishes sooner, restart included, gets a new job submitted with
  `--dependency=afterany:JOB`, then SIGTERM on its steps: the runtime saves a checkpoint and exits, and the new
  job starts once it has ended.

The new job continues the old one's training: its plan.json names it (`moved_from`) and the runtime resumes its
newest checkpoint (runtime/trainer.py; `in_job.latest_checkpoint()` for a script), on a plan chosen among those
that can load it (`has.moves.resumable`). The old job's directory gets `moved.json` (what moved where), which
also keeps a job from being moved twice; nothing there is deleted.

A move is crash-safe (watch_journal.py): before each step an intent record says which job, which step and the
successor's tag; each pass first finishes the moves an earlier one left open (released where nothing was
submitted, stopped where the successor exists), so no job stays held and no run has two live copies.
"""

from __future__ import annotations

import contextlib
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Literal

from frenzy_slurm.core.errors import FrenzyError, NoFitError
from frenzy_slurm.has.model import Allocation, Decision
from frenzy_slurm.has.moves import (
    MAX_PER_PASS,
    growth_site,
    move_cost_s,
    pending_move,
    restore_s,
    resumable,
    running_move,
    with_own_gpus_free,
    without_job,
)
from frenzy_slurm.jobdir.planfile import MovedFrom, PlanFile
from frenzy_slurm.jobdir.safety import next_free_dir, user_lock
from frenzy_slurm.jobspec import ResolvedModel
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.planning import JobFile, JobRequest, PlanOptions, Prepared, SiteFile, finish, prepare, start_estimator
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import TrackedJob, frenzy_jobs, my_user_name, output_files, read_tail
from frenzy_slurm.track.replan_watch import Reshape, eligible, replan_pending
from frenzy_slurm.track.watch_journal import (
    MOVED,
    MoveIntent,
    drop,
    moved_record,
    open_intents,
    resume,
    resume_all,
    save,
    stop_old,
)

__all__ = ["MOVED", "Action", "moved_record", "watch_once"]
_STEP_LINE = re.compile(r"frenzy-slurm: step (\d+)/\d+")  # the built-in trainer's progress line


@dataclass(frozen=True)
class Action:
    """One move the watcher made (or, in a dry run, would make)."""

    job_id: int
    kind: Literal["pending", "running"]
    from_allocation: str
    to_allocation: str
    steps_left: int
    predicted_end_staying: float  # epoch seconds
    predicted_end_moved: float
    new_job_id: int | None = None  # None in a dry run, or where the submission failed
    new_job_dir: str | None = None
    note: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        gain = (self.predicted_end_staying - self.predicted_end_moved) / 3600
        to = f"job {self.new_job_id}" if self.new_job_id is not None else "(dry run)"
        return (
            f"job {self.job_id} ({self.kind}, {self.steps_left} steps left): {self.from_allocation} -> "
            f"{self.to_allocation} {to}, predicted {gain:.2f} h sooner" + (f"; {self.note}" if self.note else "")
        )


def _job_file(plan: PlanFile) -> JobFile:
    """The job as fsbatch planned it, from its plan.json (the spec as submitted, not model.yaml as it is now)."""
    model = ResolvedModel(arch=plan.arch, name=plan.model_name, exact_params=plan.exact_params)
    return JobFile(Path(plan.spec_path), plan.spec, model)


def steps_done(t: TrackedJob) -> int:
    """How far a job has trained: the built-in trainer's last progress line in its output, else its newest
    checkpoint, else its running time over the predicted step time (a script's job)."""
    assert t.plan is not None and t.job_dir is not None
    done = t.last_checkpoint_step or 0
    try:
        files, _ = output_files(t.job_dir, t.job_id, t.name, t.user)
        text = read_tail(files[0], 1 << 20)[0] if files else ""
    except FrenzyError:
        text = ""  # no output yet, or not a file of the user's
    steps = _STEP_LINE.findall(text)
    if steps:
        return max(done, int(steps[-1]))
    if t.plan.spec.entry.trainer == "script" and t.elapsed_s:
        step_s = t.plan.decision.chosen.step_time_s
        done = max(done, int(t.elapsed_s // step_s) if step_s > 0 else 0)
    return done


def _resumes_from(t: TrackedJob) -> MovedFrom | None:
    """The checkpoints a move of `t` continues from: its own, else those it was moved with itself."""
    assert t.plan is not None and t.job_dir is not None
    if t.last_checkpoint_step is not None or t.state == "RUNNING":  # a running job saves one when it stops
        return MovedFrom(job_id=t.job_id, job_dir=str(t.job_dir), plan=t.plan.decision.chosen.plan)
    return t.plan.moved_from


def _eligible(t: TrackedJob) -> bool:
    plan = t.plan
    return (
        plan is not None
        and plan.slurm is not None  # submitted by a frenzy-slurm that records the user's options
        and plan.slurm.preemptible
        and t.job_dir is not None
        and t.state in ("PENDING", "RUNNING")
        and len(t.components) == 1  # a heterogeneous job is not moved (its stages are laid out across types)
        and moved_record(t.job_dir) is None
    )


def watch_once(
    site: SiteFile,
    backend: SlurmBackend,
    *,
    dry_run: bool = False,
    now: float | None = None,
    finished: list[str] | None = None,
    reshaped: list[Reshape] | None = None,
) -> list[Action]:
    """One pass over this user's preemptible jobs: the moves made (or, with `dry_run`, that would be made);
    `finished` gets a line for each move an earlier pass left open and this one finished, `reshaped` (where given)
    the in-place changes of waiting jobs marked slurm.replan."""
    from frenzy_slurm.jobdir.safety import user_lock
    from frenzy_slurm.slurm.oneview import OneView

    me = my_user_name()
    actions: list[Action] = []
    with user_lock("watch"):  # two watchers of one user take turns; moved.json stops a second move
        if not dry_run:
            done = resume_all(backend, me)  # the moves an earlier pass left open, finished first
            if finished is not None:
                finished += done
        unfinished = {i.job_id for i in open_intents()}  # ones Slurm could not finish now wait for the next pass
        cluster = OneView(backend)  # one view of the cluster for the rest of the pass
        mine = [t for t in frenzy_jobs(cluster.load().jobs, user=me) if _eligible(t) and t.job_id not in unfinished]
        for t in sorted(mine, key=lambda x: x.job_id)[:MAX_PER_PASS]:
            if t.job_dir is not None and moved_record(t.job_dir) is not None:
                continue
            try:
                action = _consider(t, site, cluster, backend, dry_run, now if now is not None else time.time())
            except NoFitError:
                continue
            if action is not None:
                actions.append(action)
                if not dry_run:
                    # the cluster as this move left it: on the view the pass began with, every job that would
                    # finish sooner on GPUs just freed was moved onto them, all but the first for nothing
                    cluster = OneView(backend)
        if reshaped is not None:  # slurm.replan: waiting jobs changed in place (replan_watch.py), not moved above
            moved = {a.job_id for a in actions} | unfinished
            tracked = [t for t in frenzy_jobs(cluster.load().jobs, user=me) if t.job_id not in moved]
            reshaped += replan_pending(
                tracked,
                cluster.load(),
                backend,
                site.config,
                dry_run=dry_run,
                now=now or time.time(),
                # only an operator may change a job's tasks per node (asked only where a job may change)
                operator=any(eligible(t) for t in tracked) and backend.is_operator(),
            )
    return actions


def _consider(
    t: TrackedJob, site: SiteFile, cluster: SlurmBackend, backend: SlurmBackend, dry_run: bool, now: float
) -> Action | None:
    assert t.plan is not None and t.plan.slurm is not None and t.job_dir is not None
    plan, lead = t.plan, t.components[0]
    job = _job_file(plan)
    running = t.state == "RUNNING"
    total = plan.spec.training.total_steps
    done = steps_done(t) if running else (t.last_checkpoint_step or 0)
    left = max(1, total - done)
    source = _resumes_from(t)
    options = PlanOptions(slurm=t.plan.slurm, force=True, now=now, env_check="off")  # checked at submission
    ready = prepare(job, site, cluster, options)
    p = ready.site.preemption
    in_qos = p is not None and lead.qos == p.qos
    requirements = replace(ready.requirements, steps=left)
    rest = plan.spec.model_copy(update={"training": plan.spec.training.model_copy(update={"total_steps": left})})
    workload = workload_from_spec(rest, job.model, device=ready.site.device)
    space = search_space_from_spec(plan.spec)
    if source is not None:  # it has trained: only plans that can load its checkpoint, with the time to read it
        where = resumable(space, requirements, source.plan, universal=plan.spec.entry.trainer == "builtin")
        if where is None:
            return None
        space, requirements = where
        requirements = replace(requirements, resume_s=restore_s(p, workload))
    view = ready.view
    if in_qos and p is not None:
        view = view.model_copy(update={"qos": backend.qos_limits(p.qos)})  # the limits it runs under
    current = plan.decision.chosen.label()
    estimator = start_estimator(cluster)
    if running:
        restart = move_cost_s(p, workload)
        if lead.start_time is None or now - lead.start_time < restart:
            return None  # still starting: a move now would cost more than it could save
        view = with_own_gpus_free(view, t.job_id)
        stay = now + left * plan.decision.chosen.step_time_s
        chosen = running_move(
            requirements,
            workload,
            space,
            view,
            growth_site(ready.site, view, in_qos),
            estimator,
            now,
            current,
            stay_until=stay,
            restart_s=restart,
        )
        moved_end = None if chosen is None else chosen.completion + restart
    else:
        view = without_job(view, t.job_id)
        stay = _staying(plan, lead.start_time, now)
        chosen = pending_move(requirements, workload, space, view, ready.site, estimator, now, current, stay)
        moved_end = None if chosen is None else chosen.completion
    if chosen is None or moved_end is None:
        return None
    action = Action(t.job_id, "running" if running else "pending", current, chosen.label(), left, stay, moved_end)
    if dry_run:
        return action
    return _move(t, job, site, options, ready, chosen, in_qos, source, backend, action)


def _staying(plan: PlanFile, expected_start: int | None, now: float) -> float:
    """When a pending job is predicted to end where it waits: Slurm's expected start, else the plan's."""
    start = expected_start if expected_start and expected_start > now else max(now, plan.decision.chosen.start)
    return start + plan.decision.chosen.run_time_s


def _move(
    t: TrackedJob,
    job: JobFile,
    site: SiteFile,
    options: PlanOptions,
    ready: Prepared,
    chosen: Allocation,
    in_qos: bool,
    source: MovedFrom | None,
    backend: SlurmBackend,
    action: Action,
) -> Action:
    """Submit the new job and stop the old one, in the order that never runs both nor loses either."""
    assert t.plan is not None and t.plan.slurm is not None and t.job_dir is not None
    running = action.kind == "running"
    user = t.plan.slurm
    # a running job's successor waits for it to save and end; a pending job's keeps the user's dependency
    slurm = user.model_copy(update={"dependency": f"afterany:{t.job_id}"}) if running else user
    options = replace(options, slurm=slurm, job_dir=next_free_dir(t.job_dir))
    qos = ready.site.preemption.qos if in_qos and ready.site.preemption is not None else user.qos
    decision = Decision(chosen=chosen, alternatives=[], decided_at=options.now or time.time(), decision_ms=0.0)
    with user_lock(f"{t.plan.submission}-force"):
        try:
            req = finish(job, site, options, ready, decision, slurm.model_copy(update={"qos": qos}), (), source)
            intent = _intent(t, action, req.submission, req.job_dir)
            save(intent)  # before acting: a pass that stops anywhere below is finished by the next one
        except (FrenzyError, OSError) as exc:
            return replace(action, note=f"not moved: {getattr(exc, 'message', None) or exc}")
        if not running:
            try:
                backend.hold(t.job_id)
            except SlurmCommandError:
                drop(intent)  # refused: not held, nothing submitted
                return replace(action, note="it started meanwhile: left where it is")
        return _submit_and_stop(intent, req, backend, action)


def _intent(t: TrackedJob, action: Action, submission: str, successor_dir: Path) -> MoveIntent:
    """The record of a move about to begin: a pending job is held first, a running one's successor submitted."""
    return MoveIntent(
        job_id=t.job_id,
        kind=action.kind,
        job_dir=str(t.job_dir),
        tag=f"frenzy:{submission}",
        successor_dir=str(successor_dir),
        step="submit" if action.kind == "running" else "hold",
        moved={
            "from": action.from_allocation,
            "to": action.to_allocation,
            "steps_left": action.steps_left,
            "while": t.state,
        },
        at=time.time(),
    )


def _submit_and_stop(intent: MoveIntent, req: JobRequest, backend: SlurmBackend, action: Action) -> Action:
    """Submit the successor, then record the move and stop the old job. A failure (Slurm's, a full disk) is
    settled at once as the next pass would settle it: released where nothing was submitted, else stopped (Ctrl-C
    too, where Slurm answers); a kill leaves the intent to the next pass."""
    try:
        if intent.step == "hold":
            save(intent := intent.model_copy(update={"step": "submit"}))
        done = submit(req, backend)
        stop_old(intent, backend, done.job_id)
        return replace(action, new_job_id=done.job_id, new_job_dir=str(req.job_dir))
    except KeyboardInterrupt:
        with contextlib.suppress(Exception):  # settled now where Slurm answers, else by the next pass
            resume(intent, backend, my_user_name())
        raise
    except Exception as exc:
        why = exc.message if isinstance(exc, FrenzyError) else str(exc)
        try:
            found = resume(intent, backend, my_user_name())
        except Exception:
            return replace(action, note=f"not finished: {why}; the next pass finishes the move")
        if found is not None:
            return replace(action, new_job_id=found, new_job_dir=str(req.job_dir), note=f"recorded late: {why}")
        if isinstance(exc, FrenzyError | OSError | SlurmUnavailable):
            return replace(action, note=f"not moved: {why}")
        raise
