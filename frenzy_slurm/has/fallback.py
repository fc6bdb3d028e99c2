"""The plans a job is submitted again on when it runs out of memory anyway (`slurm.oom_retry`).

A run of the chosen plan runs out of memory when its real use exceeds MARP's prediction by more than the
headroom the plan left: on the tightest component, by more than `capacity / predicted peak`. The plan to fall
back on is HAS's own decision again with every memory prediction multiplied by more than that (the model
calibration uses too: a memory factor divides the usable share of each GPU, calibration/apply.py), so it is
the allocation that finishes soonest among those that would have fitted an error of that size: more GPUs,
more sharding, activation checkpointing or a smaller micro-batch, whichever HAS finds fastest.

Each fallback is decided at fsbatch time, with the cluster fsbatch saw (its start is a prediction of then),
and stored in plan.json (`Decision.oom_fallbacks`): the job's own epilogue resubmits (frenzy_slurm/runtime/oom_retry.py)
without the site file or a second planning pass. A run that saved a checkpoint continues only on a plan that
can load it (`has.moves.resumable`, as the watcher's moves); one that saved none may take any.
"""

from __future__ import annotations

from dataclasses import replace

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.has.decide import decide
from frenzy_slurm.has.model import Allocation, Decision, Fallback
from frenzy_slurm.has.moves import resumable
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.plan import Workload
from frenzy_slurm.site.config import SiteConfig
from frenzy_slurm.slurm.view import ClusterView

# The error a fallback is planned for, as a multiple of the smallest one that makes the chosen plan fail: 15%
# beyond it, then half as much again. The measured peak of the failed run (jobdir/oom.py) picks the first that
# covers it (runtime/oom_retry.py). Two levels bound fsbatch's extra work to four decisions (each milliseconds on the
# clusters here, docs/has.md "Decision time"); a policy a site might tune, not configurable yet.
ERROR_STEPS = (1.15, 1.5)


def failing_factor(chosen: Allocation) -> float | None:
    """The smallest factor on every memory prediction at which the chosen plan no longer fits: the tightest
    component's usable memory over what decides its fit (its peak, less a variable-length cache the allocator gives
    back first). None where a component predicts no memory."""
    ratios = [c.capacity_gib / (c.needed_gib or c.peak_gib) for c in chosen.components if c.peak_gib > 0]
    return min(ratios) if len(ratios) == len(chosen.components) else None


def scaled_site(site: SiteConfig, factor: float) -> SiteConfig:
    """The site with every memory prediction multiplied by `factor`: each pool's usable share divided by it."""
    pools = [p.model_copy(update={"usable_fraction": site.usable_fraction(p) / factor}) for p in site.pools]
    return site.model_copy(update={"pools": pools})


def oom_fallbacks(
    decision: Decision,
    req: Requirements,
    w: Workload,
    space: SearchSpace,
    view: ClusterView,
    site: SiteConfig,
    now: float,
    universal: bool,
) -> list[Fallback]:
    """The fallbacks of `decision`, most preferred first: for each error step, the plan that loads the chosen
    plan's checkpoints (`universal`: the built-in trainer converts DeepSpeed's), then any plan where that one
    differs (for a run that failed before its first save). Empty where nothing fits."""
    first = failing_factor(decision.chosen)
    if first is None:
        return []
    if decision.chosen.kind == "homogeneous":
        # a homogeneous job falls back to a homogeneous allocation: the headroom comes from more GPUs, sharding or
        # checkpointing, and the search over pipelines across GPU types is most of a decision's time (fsbatch makes
        # up to four of these decisions after its own: `fsbatch --dry-run` 0.54 -> 0.75 s with it, README's example)
        space = replace(space, heterogeneous=False)
    spaces = [(True, resumable(space, req, decision.chosen.plan, universal)), (False, (space, req))]
    out: list[Fallback] = []
    for step in ERROR_STEPS:
        factor = first * step
        for resumes, where in spaces:
            if where is None:
                continue
            try:
                d = decide(where[1], w, view, scaled_site(site, factor), where[0], now=now, alternatives=0)
            except NoFitError:
                continue
            if all(_differs(d.chosen, f.allocation) for f in out):
                alloc = _real_capacity(d.chosen, factor)
                out.append(Fallback(memory_factor=round(factor, 4), resumes=resumes, allocation=alloc))
    return out


def _real_capacity(alloc: Allocation, factor: float) -> Allocation:
    """The allocation as plan.json keeps it: each component's usable memory as the site has it, not as the scaled
    site showed it (the predictions stay the model's own)."""
    comps = [c.model_copy(update={"capacity_gib": c.capacity_gib * factor}) for c in alloc.components]
    return alloc.model_copy(update={"components": comps})


def _differs(a: Allocation, b: Allocation) -> bool:
    return a.label() != b.label() or a.plan != b.plan


def pick(fallbacks: list[Fallback], has_checkpoint: bool, error: float | None) -> Fallback | None:
    """The fallback for a run that failed: one that can continue it (a run with a checkpoint needs one that
    loads it), planned for at least the `error` measured (its peak over the prediction; None: not measured),
    else the one planned for the largest error."""
    usable = [f for f in fallbacks if f.resumes or not has_checkpoint]
    if not usable:
        return None
    covering = [f for f in usable if error is None or f.memory_factor >= error]
    return covering[0] if covering else max(usable, key=lambda f: f.memory_factor)
