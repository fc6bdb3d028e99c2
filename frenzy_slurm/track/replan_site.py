"""`frenzy-slurm watch --all-users`: one joint re-planning of every user's waiting jobs marked `slurm.replan`.

The per-user watcher (replan_watch.py) solves the assignment of one user's waiting jobs; this pass, run by an
operator account, solves it for every opted-in job of every user at once, as Sia's ILP does over all jobs. Each
pass, under the operator's lock (`user_lock("watch-all-users")`):

1. lists every user's pending jobs (one queue query through the Slurm seam) and keeps those tagged `frenzy:`;
2. keeps a job only where its directory can be trusted and read (jobdir/foreign.py: owned by the job's user,
   writable by no one else, every directory above it safe, readable by the operator) and its submission.json,
   a file of the job's user's, names the job's id and submission, as fsbatch wrote it. Any other is skipped with
   its reason (`Skipped`). Its plan.json is read the same way;
3. runs the per-user pass (`replan_pending`) over all of them together: one solve, the site's margins, so no
   job is made slower than it is predicted now. Slurm applies an operator's update without the limits and the
   partition rules it checks for the job's user (`WAITS_FOR_ITS_TURN`), and plan.json is the user's word, so: a
   job Slurm holds back for a limit is not touched, and a shape is offered only where it asks for no more than
   the job already asked Slurm for (`_within_request`: GPUs, CPUs per GPU within the pool's, same GPU type, one
   of the site file's pools; the time limit is never changed);
4. records each change Slurm accepted in the operator's own state directory (`state_dir()/JOBID.json`), never in
   the user's directory (an operator usually cannot write there, and a privileged writer in a directory another
   user controls is how symlink attacks work).

Without operator rights Slurm refuses the first update of another user's job (`SlurmCommandError.not_permitted`):
the pass stops with `NotOperator`, one line naming the `sacctmgr` command that grants the right.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm.core.errors import EXIT_SLURM_REJECTED, FrenzyError, InputError
from frenzy_slurm.core.records import read_job_record
from frenzy_slurm.jobdir.foreign import foreign_dir_problem, user_uid
from frenzy_slurm.jobdir.planfile import Shape, read_job_plan
from frenzy_slurm.jobdir.safety import make_private_dir, user_lock
from frenzy_slurm.slurm import Job, group_het_jobs
from frenzy_slurm.slurm.run import SlurmCommandError
from frenzy_slurm.track.jobs import TAG, TrackedJob, my_user_name, names_job
from frenzy_slurm.track.replan_watch import Reshape, append_change, replan_pending

if TYPE_CHECKING:
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.slurm.backend import SlurmBackend


# The pending reasons of a job that waits only for GPUs or for its turn. Any other (AssocGrpCpuLimit, QOSMaxGRESPerUser,
# PartitionTimeLimit, ...) means Slurm holds it back for its user's limits or the partition's rules, which an
# operator's update would lift: slurmctld skips those checks for an operator and marks the job's CPU and node counts
# ADMIN_SET_LIMIT, which the limits then ignore (Slurm 23.11.11 src/slurmctld/job_mgr.c `_update_job`, the
# `operator` branches; acct_policy.c `_validate_tres_usage_limits`). A held job is left quietly (`eligible`).
WAITS_FOR_ITS_TURN = frozenset({"None", "Resources", "Priority"})


class NotOperator(FrenzyError):
    """Slurm refused to change another user's job: this account is not a Slurm operator (exit 5)."""

    exit_code = EXIT_SLURM_REJECTED


@dataclass(frozen=True)
class Skipped:
    """A waiting frenzy-slurm job of some user that this pass did not consider, and why."""

    job_id: int
    user: str
    reason: str

    def line(self) -> str:
        return f"job {self.job_id} ({self.user}): skipped: {self.reason}"


def state_dir() -> Path:
    """Where the operator's watcher records the changes it made: `$XDG_STATE_HOME/frenzy-slurm/replanned`, else
    `~/.local/state/frenzy-slurm/replanned` (created 0700, checked as a job directory is)."""
    base = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return base / "frenzy-slurm" / "replanned"


def trusted_job(lead: Job, comps: list[Job]) -> TrackedJob | str:
    """Another user's (or the operator's own) waiting job with its plan, read from a directory that passes
    jobdir/foreign.py's checks and whose submission.json names it; else why not."""
    if not lead.workdir:
        return "Slurm reports no working directory"
    uid = user_uid(lead.user)
    if uid is None:
        return f"user {lead.user!r} has no account on this host"
    job_dir = Path(lead.workdir)
    why = foreign_dir_problem(job_dir, uid)
    if why is not None:
        return why
    try:
        record = read_job_record(job_dir / "submission.json", "submission record", 1 << 16, owner=uid)
    except InputError as exc:
        return exc.message
    if not names_job(record, lead):
        return f"{job_dir / 'submission.json'} does not name this job: not a job fsbatch submitted from there"
    try:
        plan = read_job_plan(job_dir / "plan.json", owner=uid)
    except InputError as exc:
        return exc.message
    return TrackedJob(
        job_id=lead.het_job_id or lead.job_id,
        name=lead.name,
        user=lead.user,
        state=lead.state,
        components=comps,
        job_dir=job_dir,
        plan=plan,
    )


def site_jobs(jobs: list[Job]) -> tuple[list[TrackedJob], list[Skipped]]:
    """Every user's waiting frenzy-slurm jobs marked slurm.replan that this operator can trust and read and may
    change, and the others with their reason (a job it could read and that is not marked is left unsaid)."""
    kept: list[TrackedJob] = []
    skipped: list[Skipped] = []
    for jid, comps in sorted(group_het_jobs(jobs).items()):
        lead = comps[0]
        if not lead.comment.startswith(TAG) or lead.state != "PENDING":
            continue
        got = trusted_job(lead, comps)
        if isinstance(got, str):
            skipped.append(Skipped(jid, lead.user, " ".join(got.split())))  # one line, whatever a path holds
        elif got.plan is None or got.plan.slurm is None or not got.plan.slurm.replan:
            continue
        elif (lead.reason or "None") not in WAITS_FOR_ITS_TURN and "held" not in (lead.reason or "").lower():
            skipped.append(
                Skipped(
                    jid,
                    lead.user,
                    f"it waits for Reason={lead.reason}, not for its turn: "
                    "an operator's update would lift its user's limits or the partition's rules",
                )
            )
        else:
            kept.append(got)
    return kept, skipped


def _within_request(site: SiteConfig) -> Callable[[TrackedJob, Shape], bool]:
    def allowed(t: TrackedJob, s: Shape) -> bool:
        """The shape is one of the site's pools, of the GPU type the job asked for, no more GPUs than it asked
        for (Slurm checked that request against the user's limits) and no more CPUs per GPU than the pool's."""
        lead = t.components[0]
        pool = site.pool(s.partition, s.gpu_type)
        return (
            pool is not None
            and s.gpu_type == lead.gpu_type
            and s.nodes * s.gpus_per_node <= lead.node_count * (lead.gpus_per_node or 0)
            and all(c.cpus_per_task <= pool.cpus_per_gpu for c in s.allocation.components)
        )

    return allowed


def replan_site(
    backend: SlurmBackend, site: SiteConfig, *, dry_run: bool, now: float
) -> tuple[list[Reshape], list[Skipped]]:
    """One site-wide pass: the changes made (or, with `dry_run`, that would be made) and the jobs skipped."""
    from frenzy_slurm.slurm.oneview import OneView

    records = state_dir()
    me = my_user_name()

    def record(t: TrackedJob, change: Reshape) -> None:
        make_private_dir(records, "the watcher's record directory")
        head = {"job_id": t.job_id, "user": t.user, "job_dir": str(t.job_dir)}
        append_change(records / f"{t.job_id}.json", head, change)

    with user_lock("watch-all-users"):  # two operators' watchers take turns
        view = OneView(backend).load()  # one query: the nodes and every user's jobs
        tracked, skipped = site_jobs(view.jobs)
        allowed = _within_request(site)
        try:
            reshaped = replan_pending(
                tracked, view, backend, site, dry_run=dry_run, now=now, record=record, allowed=allowed, operator=True
            )
        except SlurmCommandError as exc:
            if not exc.not_permitted:
                raise
            said = " ".join(exc.stderr.split())[:200]  # one line
            raise NotOperator(
                f"Slurm refused to change another user's job ({said}): only Slurm operators and "
                f"administrators may; an administrator grants it with `sacctmgr modify user {me} set "
                'AdminLevel=Operator` (docs/admin.md, "Re-planning waiting jobs in place")'
            ) from None
    users = {t.job_id: t.user for t in tracked}
    return [replace(r, user=users.get(r.job_id, "")) for r in reshaped], skipped
