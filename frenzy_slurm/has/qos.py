"""HAS within the QOS's GPU limits (the view's `qos`, read by `SlurmBackend.qos_limits`).

Slurm accepts a job its QOS limits hold back and leaves it pending (QOSMaxGRESPerJob, QOSMaxGRESPerUser,
QOSGrpGRES), and `sbatch --test-only` ignores those limits (docs/slurm-notes.md): so HAS checks them itself.
A plan needing more GPUs than the QOS ever lets one job have is not proposed (`cap` bounds the search, and
`within_qos` refuses hetjob totals past it); one the QOS lets run only after some of the user's running jobs
(MaxTRESPerUser) or of the QOS's (GrpTRES) have ended gets its start pushed to that moment.
"""

from __future__ import annotations

from frenzy_slurm.has.model import Allocation
from frenzy_slurm.slurm.view import ClusterView, GpuLimit, Job, QosLimits

QOS_START_SOURCE = "qos"  # Allocation.start_source of a start pushed until the QOS's limits let the job run


def cap(qos: QosLimits | None, gres_type: str | None) -> int | None:
    """The most GPUs of this GRES type one job may ever have under the QOS (None: no limit)."""
    if qos is None:
        return None
    caps = [c for lim in (qos.per_job, qos.per_user, qos.group) if (c := lim.cap(gres_type)) is not None]
    return min(caps) if caps else None


def qos_lines(qos: QosLimits | None) -> list[str]:
    """The QOS's GPU limits in words, for messages (empty without limits)."""
    if qos is None:
        return []
    named = (("MaxTRESPerJob", qos.per_job), ("MaxTRESPerUser", qos.per_user), ("GrpTRES", qos.group))
    parts = [f"{field} {lim.describe()}" for field, lim in named if not lim.unlimited]
    return (
        [f"QOS {qos.name}: {', '.join(parts)} (`sacctmgr show qos {qos.name}`; fsbatch -q picks another)"]
        if parts
        else []
    )


def _running(jobs: list[Job], qos: QosLimits, per_user: bool) -> list[Job]:
    """Running jobs counted against the limit: the user's in this QOS (a job whose QOS the backend does not say
    counts too: better a late estimate than a job held back), or every user's in it for GrpTRES."""
    out = []
    for j in jobs:
        if j.phase != "running" or not j.gpus:
            continue
        if per_user and j.user == qos.user and j.qos in (None, qos.name):
            out.append(j)
        elif not per_user and j.qos == qos.name:
            out.append(j)
    return out


def _keys(limit: GpuLimit) -> list[tuple[str | None, int]]:
    """(GRES type or None for all GPUs, allowed) for each GPU count the limit sets."""
    return ([(None, limit.gpus)] if limit.gpus is not None else []) + sorted(limit.by_type.items())


def _need(alloc: Allocation, gres_type: str | None) -> int:
    return sum(c.gpus for c in alloc.components if gres_type is None or c.gpu_type == gres_type)


def _held(j: Job, gres_type: str | None) -> int:
    return j.gpus if gres_type is None or j.gpu_type == gres_type else 0


def _earliest(limit: GpuLimit, what: str, qos: QosLimits, jobs: list[Job], alloc: Allocation) -> float | str:
    """When the running `jobs` leave room for `alloc` under `limit` (at alloc.start at the earliest), or why
    they never do."""
    start = alloc.start
    for gres_type, allowed in _keys(limit):
        need = _need(alloc, gres_type)
        if not need:
            continue
        tres = f"gres/gpu{':' + gres_type if gres_type else ''}={allowed}"
        if need > allowed:
            return f"uses {need} GPUs > QOS {qos.name} {what} {tres}"
        holding = [j for j in jobs if _held(j, gres_type)]
        times = sorted({start} | {float(j.end_time) for j in holding if j.end_time and j.end_time > start})
        for t in times:
            used = sum(_held(j, gres_type) for j in holding if j.end_time is None or j.end_time > t)
            if used + need <= allowed:
                start = t
                break
        else:
            return (
                f"QOS {qos.name} {what} {tres}: running jobs hold GPUs with no end time known, and this plan's "
                f"{need} would pass it"
            )
    return start


def within_qos(view: ClusterView, alloc: Allocation) -> tuple[Allocation, str | None]:
    """`alloc` with its start pushed to when the QOS lets it run, or the reason the QOS never lets it run.

    MaxTRESPerJob applies to the whole allocation (a hetjob's components together, the safe reading); the
    running jobs' end times (their time limits) say when MaxTRESPerUser and GrpTRES leave room."""
    qos = view.qos
    if qos is None:
        return alloc, None
    for gres_type, allowed in _keys(qos.per_job):
        if (need := _need(alloc, gres_type)) > allowed:
            tres = f"gres/gpu{':' + gres_type if gres_type else ''}={allowed}"
            return alloc, f"uses {need} GPUs > QOS {qos.name} MaxTRESPerJob {tres}"
    start = alloc.start
    for limit, what, per_user in ((qos.per_user, "MaxTRESPerUser", True), (qos.group, "GrpTRES", False)):
        if limit.unlimited:
            continue
        found = _earliest(limit, what, qos, _running(view.jobs, qos, per_user), alloc)
        if isinstance(found, str):
            return alloc, found
        start = max(start, found)
    if start > alloc.start:
        return alloc.model_copy(update={"start": start, "start_source": QOS_START_SOURCE}), None
    return alloc, None


def qos_wait_note(view: ClusterView, alloc: Allocation) -> str | None:
    """A line for fsbatch when the chosen plan waits on the QOS rather than on free GPUs."""
    if alloc.start_source != QOS_START_SOURCE or view.qos is None:
        return None
    mine = sum(j.gpus for j in _running(view.jobs, view.qos, True))
    return (
        f"QOS {view.qos.name}: the plan's {alloc.gpus} GPUs wait for the QOS's GPU limits (your running jobs hold "
        f"{mine}); its start estimate is when enough of the running jobs reach their time limits. "
        + " ".join(qos_lines(view.qos))
    )
