"""`frenzy-slurm watch`'s in-place pass: this user's waiting jobs marked `slurm.replan`, re-planned together.

Each such job carries a few pre-planned shapes in plan.json (render/shapes.py). Every pass of the watcher, under
its lock (`user_lock("watch")`, so two watchers of one user never update a job at once), this pass:

1. takes the user's pending single-component jobs with shapes, not held, not being moved (`moved.json`, an open
   move intent) and not moved by this pass already, oldest first (at most `has.moves.MAX_PER_PASS`);
2. prices each shape: its start as Slurm says (the job's own expected start for the shape it waits as, else
   `sbatch --test-only` of that shape, one query per shape) plus the plan's predicted run time;
3. solves the assignment of all of them jointly (`has.replan.assign`: summed completion, the GPUs free now,
   the site's `replan` margin);
4. applies each change with `scontrol update` (`SlurmBackend.update_pending`): the job keeps its id, priority
   and age. A job that started meanwhile refuses and is left. Each change is recorded in the job directory's
   `replanned.json` (what, when), after Slurm accepted it.

The site-wide mode (`watch --all-users`, track/replan_site.py) runs this same pass over every user's jobs it
could read and trust, recording each change in the operator's own state directory instead (`record`).

A change is idempotent (the same shape twice is no change) and a job that was changed waits as its new shape, so
a later pass changes it again only where that pays again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm.core.records import read_job_record_or_none, write_json
from frenzy_slurm.has.moves import MAX_PER_PASS
from frenzy_slurm.has.replan import Margin, Option, PendingJob, assign, free_gpus
from frenzy_slurm.jobdir.planfile import Shape
from frenzy_slurm.slurm.backend import ComponentRequest, SlurmBackend
from frenzy_slurm.slurm.run import SlurmCommandError
from frenzy_slurm.slurm.view import ClusterView
from frenzy_slurm.track.jobs import my_user_name

if TYPE_CHECKING:
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.track.jobs import TrackedJob

REPLANNED = "replanned.json"  # in the job directory: the in-place changes made, oldest first
STARTS_NOW_S = 60.0  # an estimate this close to now is a start now (Slurm's estimates are whole seconds, late)


@dataclass(frozen=True)
class Reshape:
    """One in-place change of a waiting job (or, in a dry run, one that would be made)."""

    job_id: int
    from_shape: str
    to_shape: str
    predicted_end_staying: float
    predicted_end_changed: float
    applied: bool
    note: str = ""
    user: str = ""  # the job's user, where the pass covers every user's jobs (replan_site.py)

    def line(self) -> str:
        gain = (self.predicted_end_staying - self.predicted_end_changed) / 3600
        how = "updated in place" if self.applied else "(dry run)" if not self.note else "not updated"
        whose = f"{self.user}'s " if self.user else ""
        return (
            f"{whose}job {self.job_id} (pending): {self.from_shape} -> {self.to_shape} {how}, "
            f"predicted {gain:.2f} h sooner" + (f"; {self.note}" if self.note else "")
        )


def _label(s: Shape) -> str:
    return f"{s.nodes}x{s.gpus_per_node} {s.gpu_type or 'gpu'}({s.partition})"


def eligible(t: TrackedJob) -> bool:
    from frenzy_slurm.track.watch_journal import moved_record

    plan = t.plan
    return (
        plan is not None
        and plan.slurm is not None
        and plan.slurm.replan
        and len(plan.shapes) > 1
        and t.job_dir is not None
        and t.state == "PENDING"
        and len(t.components) == 1
        and "held" not in (t.components[0].reason or "").lower()  # the user's hold stays the user's
        and moved_record(t.job_dir) is None
    )


def _current(t: TrackedJob) -> int | None:
    """The index of the shape the job waits as now (None: changed by hand to one not planned)."""
    assert t.plan is not None
    lead = t.components[0]
    got = (lead.partition, lead.node_count, lead.gpus_per_node)
    return next((i for i, s in enumerate(t.plan.shapes) if s.key() == got), None)


def _options(
    t: TrackedJob, estimator: SlurmBackend, now: float, allowed: Callable[[TrackedJob, Shape], bool] | None = None
) -> tuple[list[int], list[Option]] | None:
    """The job's shapes it may take (those `allowed`, where given), the current one first, each priced; None where
    it waits as none of them."""
    assert t.plan is not None
    cur = _current(t)
    if cur is None:
        return None
    order = [cur] + [i for i in range(len(t.plan.shapes)) if i != cur]
    kept, options = [], []
    for i in order:
        s = t.plan.shapes[i]
        if i != cur and allowed is not None and not allowed(t, s):
            continue
        own = t.components[0].start_time if i == cur else None
        start: float | None = float(own) if own else None
        if start is None or start < now:
            try:
                req = ComponentRequest(
                    partition=s.partition,
                    gpu_type=s.gpu_type,
                    nodes=s.nodes,
                    gpus_per_node=s.gpus_per_node,
                    time_min=t.plan.time_min,
                    cpus_per_gpu=s.allocation.components[0].cpus_per_task,
                )
                start = estimator.expected_start([req]).start
            except SlurmCommandError:
                if i == cur:
                    return None
                continue  # Slurm refuses this shape now (a limit, a partition down): not an option
        begin = max(now, start)
        kept.append(i)
        options.append(
            Option(
                s.partition,
                s.gpu_type,
                s.nodes,
                s.gpus_per_node,
                begin + s.allocation.run_time_s,
                begin <= now + STARTS_NOW_S,
            )
        )
    return kept, options


def replan_pending(
    tracked: list[TrackedJob],
    view: ClusterView,
    backend: SlurmBackend,
    site: SiteConfig,
    *,
    dry_run: bool,
    now: float,
    record: Callable[[TrackedJob, Reshape], None] | None = None,
    allowed: Callable[[TrackedJob, Shape], bool] | None = None,
    operator: bool = False,
) -> list[Reshape]:
    """The pass over `tracked` (the user's frenzy jobs, those `eligible` taken); the caller holds the lock.
    `allowed` (where given) keeps the shapes a job may change to; `record` keeps each change Slurm accepted
    (default: replanned.json in the job's directory). Where Slurm refuses because the caller may not change the
    job (`SlurmCommandError.not_permitted`) and the job is another user's, the error is raised: without operator
    rights no other user's job would fare better.

    `operator`: the caller has Slurm's operator rights (the site-wide watcher) and restates the tasks per node.
    A plain user may not change them (slurmctld refuses the update after applying the fields before, measured on
    22.05), so their update leaves them out, and the job then runs only with no more GPUs per node than it was
    submitted with (its first shape): the others are not offered."""
    jobs = sorted((t for t in tracked if eligible(t)), key=lambda x: x.job_id)[:MAX_PER_PASS]
    priced: dict[int, tuple[TrackedJob, list[int]]] = {}
    pending: list[PendingJob] = []
    may = allowed if operator else _within_submitted_tasks(allowed)
    for t in jobs:
        got = _options(t, backend, now, may)
        if got is None or len(got[1]) < 2:
            continue
        priced[t.job_id] = (t, got[0])
        pending.append(PendingJob(t.job_id, tuple(got[1])))
    margin = Margin(site.replan.margin_s, site.replan.margin_fraction)
    chosen = assign(pending, free_gpus(view), now, margin)
    out = []
    by_id = {p.job_id: p for p in pending}
    for jid, k in chosen.items():
        t, idx = priced[jid]
        assert t.plan is not None
        stay, go = t.plan.shapes[idx[0]], t.plan.shapes[idx[k]]
        change = Reshape(
            jid, _label(stay), _label(go), by_id[jid].options[0].completion, by_id[jid].options[k].completion, False
        )
        out.append(change if dry_run else _apply(t, go, change, backend, record or record_in_job_dir, operator))
    return out


def _within_submitted_tasks(
    allowed: Callable[[TrackedJob, Shape], bool] | None,
) -> Callable[[TrackedJob, Shape], bool]:
    """`allowed`, and no more GPUs (tasks) per node than the job's first shape, the one it was submitted as."""

    def may(t: TrackedJob, s: Shape) -> bool:
        assert t.plan is not None
        return s.gpus_per_node <= t.plan.shapes[0].gpus_per_node and (allowed is None or allowed(t, s))

    return may


def _apply(
    t: TrackedJob,
    go: Shape,
    change: Reshape,
    backend: SlurmBackend,
    record: Callable[[TrackedJob, Reshape], None],
    operator: bool,
) -> Reshape:
    """`scontrol update` the job to `go`; recorded once Slurm accepted it."""
    assert t.job_dir is not None
    req = ComponentRequest(
        partition=go.partition,
        gpu_type=go.gpu_type,
        nodes=go.nodes,
        gpus_per_node=go.gpus_per_node,
        time_min=t.plan.time_min if t.plan is not None else 1,
        cpus_per_gpu=go.allocation.components[0].cpus_per_task,
    )
    try:
        backend.update_pending(t.job_id, req, restate_tasks=operator)
    except SlurmCommandError as exc:
        if exc.not_permitted and t.user and t.user != my_user_name():
            raise  # another user's job: the site-wide pass says what right is missing
        return replace(change, note=f"Slurm refused: {exc.stderr.strip()[:200] or exc}")
    done = replace(change, applied=True)
    record(t, done)
    return done


def record_in_job_dir(t: TrackedJob, change: Reshape) -> None:
    """The change, appended to replanned.json in the job's own directory (the per-user watcher's record)."""
    assert t.job_dir is not None
    append_change(t.job_dir / REPLANNED, {"job_id": t.job_id}, change)


def append_change(path: Path, head: dict[str, object], change: Reshape) -> None:
    """`change` appended to the record at `path` (`head` and its `changes`, oldest first), written atomically."""
    history = read_job_record_or_none(path)
    entries = history.get("changes", []) if isinstance(history, dict) else []
    entries.append({"at": time.time(), "from": change.from_shape, "to": change.to_shape})
    write_json(path, head | {"changes": entries})
