"""Where a job marked preemptible should move: the decisions of the watcher beside fsbatch.

`frenzy-slurm watch` (frenzy_slurm/track/watch.py) and the simulator's `has-preempt` call these, so what the
simulator measures is what the watcher does. Each is HAS's own decision (`decide`), on the cluster as it is
now, compared with staying:

- `pending_move`: a pending job (never started, or requeued after a preemption) is decided again with itself
  left out of the queue; another allocation is taken only where it finishes sooner than the job's own by
  more than HAS's tie tolerance. The watcher moves it by submitting the new plan and cancelling the old job,
  so it joins the queue anew: the decision is made as for a new submission.
- `running_move`: a running job is decided again for the steps it has left, on the cluster with its own GPUs
  free; the move is taken only where the new allocation, plus the restart (the checkpoint's save, the new
  job's start-up and restore), finishes more than `gain` of the remaining time sooner than staying.

A job that has trained resumes from its checkpoint on the new plan, so only plans that can load that
checkpoint are searched (`resumable`).
"""

from __future__ import annotations

from dataclasses import replace

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.has.decide import TIE_FRACTION, TIE_SECONDS, decide
from frenzy_slurm.has.model import Allocation
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.memory_states import checkpoint_bytes
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.site.config import Preemption, SiteConfig
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.view import ClusterView

# A running job moves only where that finishes it this share of its remaining time sooner, restart included: a
# move costs a restart and a new place in the queue, and predictions err by about that much (the simulator's
# has_preempt_gain, tuned on the tuning set: docs/simulation-model.md).
MOVE_GAIN = 0.2
# The watcher's re-decisions of pending jobs considered per change (oldest first): bounds the cost of one pass.
MAX_PER_PASS = 20
ALTERNATIVES = 16  # the alternatives a re-decision keeps: the job's current allocation must be among them


def _of_job(job_id: int, j_id: int, het_id: int | None) -> bool:
    return job_id in (j_id, het_id)


def without_job(view: ClusterView, job_id: int) -> ClusterView:
    """The view with the job (every component of a heterogeneous job) left out of the queue."""
    return view.model_copy(update={"jobs": [j for j in view.jobs if not _of_job(job_id, j.job_id, j.het_job_id)]})


def with_own_gpus_free(view: ClusterView, job_id: int) -> ClusterView:
    """The view as if the running job had ended: left out of the queue, its GPUs free on its nodes."""
    freed: dict[str, int] = {}
    for j in view.jobs:
        if _of_job(job_id, j.job_id, j.het_job_id) and j.state == "RUNNING":
            for name in j.nodes:
                freed[name] = freed.get(name, 0) + j.gpus_per_node
    nodes = [
        n.model_copy(update={"gpus_used": max(0, n.gpus_used - freed[n.name])}) if n.name in freed else n
        for n in view.nodes
    ]
    return without_job(view, job_id).model_copy(update={"nodes": nodes})


def anything_pending(view: ClusterView) -> bool:
    return any(j.state == "PENDING" for j in view.jobs)


def resumable(
    space: SearchSpace, requirements: Requirements, plan: ParallelPlan, universal: bool
) -> tuple[SearchSpace, Requirements] | None:
    """The plans that can resume a checkpoint `plan` wrote, as the search space and limits to decide in; None
    where no other plan can.

    DeepSpeed's engine checkpoints, measured with DeepSpeed 0.19 on the CPU (docs/runtime.md, "Moved jobs"):
    a ZeRO-0 checkpoint loads at any data-parallel degree but not at another pipeline depth or split (the
    optimizer's groups differ), into no other stage, and has no optimizer shards to convert; a ZeRO 1-3
    checkpoint loads only with the layout it was saved with, or, converted to DeepSpeed's universal checkpoint
    (`universal`: the built-in trainer converts), at any data-parallel and pipeline degree, ZeRO 1 and 2 into
    each other but neither into ZeRO 3 nor back (their files differ). Without the conversion (a framework's own
    checkpoints) the layout is kept and only the GPU type may change, but for ZeRO 0's width. Tensor and
    context parallelism are always kept (context parallelism is model.yaml's)."""
    tp = (plan.tp,)
    if universal and plan.zero >= 1:
        return replace(space, tp_degrees=tp, zero_stages=(3,) if plan.zero == 3 else (1, 2)), requirements
    if plan.pp > 1:
        return None  # optimizer states per stage: only the same depth and split load them
    flat = replace(space, tp_degrees=tp, zero_stages=(plan.zero,), pp_degrees=(1,), heterogeneous=False)
    if plan.zero == 0:
        return flat, requirements
    return flat, replace(requirements, min_gpus=plan.world, max_gpus=plan.world)


def pending_move(
    requirements: Requirements,
    workload: Workload,
    space: SearchSpace,
    view: ClusterView,
    site: SiteConfig,
    backend: SlurmBackend | None,
    now: float,
    current: str,
    staying: float | None = None,
) -> Allocation | None:
    """The allocation a pending job should move to, or None to leave it. `view`: the cluster without the job
    (`without_job`); `current`: its allocation's label (`Allocation.label()`); `staying`: when it is predicted to
    end where it waits (Slurm's expected start + its run), the measure where its own allocation is not among the
    candidates."""
    try:
        d = decide(requirements, workload, view, site, space, backend=backend, now=now, alternatives=ALTERNATIVES)
    except NoFitError:
        return None
    if d.chosen.label() == current:
        return None
    stay = next((x.allocation for x in d.alternatives if x.description == current and x.allocation), None)
    # its own allocation is not among the candidates listed: a pipeline over the share (a preempted job requeued at
    # the width it grew to, which then waited for those pools again) or a pool gone; Slurm's expected start
    # measures it
    end = stay.completion if stay is not None else staying
    if end is None:
        return None
    tol = max(TIE_SECONDS, TIE_FRACTION * (end - now))
    return d.chosen if d.chosen.completion < end - tol else None


def restore_s(preemption: Preemption | None, w: Workload) -> float:
    """Seconds reading the job's checkpoint takes at a start that resumes it: its size
    (`marp.memory_states.checkpoint_bytes`) over the site's `preemption.checkpoint_gbs`; 0 without one."""
    if preemption is None or preemption.checkpoint_gbs is None:
        return 0.0
    return checkpoint_bytes(w) / (preemption.checkpoint_gbs * 1e9)


def move_cost_s(preemption: Preemption | None, w: Workload) -> float:
    """What moving the running job costs, seconds: the site's `preemption.restart_s` (its default where the site has
    no preemption block), plus, with `preemption.checkpoint_gbs`, writing the job's checkpoint at the stop and reading
    it at the new start (twice `restore_s`)."""
    if preemption is None:
        return float(Preemption.model_fields["restart_s"].default)
    return preemption.restart_s + 2.0 * restore_s(preemption, w)


def running_move(
    requirements: Requirements,
    workload: Workload,
    space: SearchSpace,
    view: ClusterView,
    site: SiteConfig,
    backend: SlurmBackend | None,
    now: float,
    current: str,
    stay_until: float,
    restart_s: float,
    gain: float = MOVE_GAIN,
) -> Allocation | None:
    """The allocation a running job should move to, or None to leave it. `requirements` and `workload` carry
    the steps it has left, `view` has its GPUs free (`with_own_gpus_free`), `stay_until` is when it is
    predicted to end where it runs, `restart_s` what a move costs it."""
    try:
        d = decide(requirements, workload, view, site, space, backend=backend, now=now)
    except NoFitError:
        return None
    if d.chosen.label() == current:
        return None
    go = d.chosen.completion + restart_s
    return d.chosen if go < stay_until - gain * (stay_until - now) else None


def growth_site(site: SiteConfig, view: ClusterView, in_preemptible_qos: bool) -> SiteConfig:
    """The site a running job is decided on. A job in the preemptible QOS may take `preemption.max_job_share` of
    a pool, as fsbatch decided it (`planning.decide_preemptible`), and while no job waits anywhere up to
    `preemption.move_share`: idle GPUs, which a job that arrives later takes back by preempting it. Taking GPUs
    a waiting job could start on now would only delay that job."""
    p = site.preemption
    if p is None or not in_preemptible_qos:
        return site
    share = max(site.max_job_share, p.max_job_share or 0.0)
    if p.move_share is not None and not anything_pending(view):
        share = max(share, p.move_share)
    return site.model_copy(update={"max_job_share": share})
