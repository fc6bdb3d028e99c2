"""Fitting per-site corrections from observations, within bounds and on enough jobs.

Step time, per GPU model and precision (and once over all GPU types of the site, for types without
their own jobs):

    measured ~ compute / efficiency_factor + other + step_overhead_s + microbatch_overhead_s * slots

`compute` and `other` are MARP's raw predictions; `slots` = grad_accum + pp - 1 micro-batch slots on
the critical path. A term is fitted only where the jobs tell it apart from the others: the FLOP-rate
term where the jobs' predicted compute differs (and matters), the per-micro-batch term where their
slot counts differ; otherwise it stays at its prior (factor 1, 0 s). The fit minimises relative
error with scipy's bounded least squares under a soft-L1 loss, so a 0.1 s job counts as much as a 10 s
one and a run slowed by a contended node does not drag the fit.

Memory, per framework mode: the median over jobs of each job's median measured/predicted peak, after
leaving out jobs far from the others (median/MAD): a few fabricated or broken measurements cannot move it.

A correction outside its bounds (limits) or resting on fewer than `min_jobs` jobs is reported in
`not_applied`, never written as applied.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from frenzy_slurm.calibration.model import SITE_WIDE, FitBounds, MemoryCorrection, StepTimeCorrection
from frenzy_slurm.calibration.observe import Observation

# a term is identifiable when its column varies by more than this (max/min) across the jobs
MIN_SPREAD = 1.5
# and the FLOP-rate term only where predicted compute is at least this share of some job's measured step
MIN_COMPUTE_SHARE = 0.05
# relative residual beyond which a job's influence on the fit grows only like its square root
ROBUST_SCALE = 0.1
# memory: a job's measured/predicted more than this many robust deviations from the median is an outlier
# (3.5, Iglewicz and Hoaglin's cut-off for the modified z-score), the deviation at least 2% of the median
OUTLIER_MADS = 3.5
MIN_SPREAD_REL = 0.02


def reject_outliers(values: list[float]) -> tuple[list[int], list[int]]:
    """(kept, rejected) indices: a value whose distance from the median exceeds OUTLIER_MADS robust standard
    deviations (1.4826 x MAD, at least MIN_SPREAD_REL of the median: identical honest jobs give MAD 0) is
    rejected. Needs three values; fewer are all kept (nothing to compare with)."""
    if len(values) < 3:
        return list(range(len(values))), []
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    scale = max(1.4826 * mad, MIN_SPREAD_REL * abs(med))
    kept = [i for i, v in enumerate(values) if abs(v - med) <= OUTLIER_MADS * scale]
    return kept, [i for i in range(len(values)) if i not in kept]


def _known(value: float | None) -> float:
    """A step-time field of an observation fit() passes on: it passes only those measured and predicted."""
    assert value is not None, "fit_step_time needs observations with a measured and a predicted step time"
    return value


def _median_rel_error(pred: list[float], meas: list[float]) -> float:
    return statistics.median(abs(p - m) / m for p, m in zip(pred, meas, strict=True))


def _solve(obs: list[Observation], free_k: bool, free_m: bool) -> tuple[float, float, float]:
    """(k = 1/efficiency_factor, step overhead, micro-batch overhead) minimising relative squared error."""
    import numpy as np
    from scipy.optimize import least_squares

    y = np.array([o.measured_step_s for o in obs])
    a = np.array([o.compute_s for o in obs])
    b = np.array([o.other_s for o in obs])
    s = np.array([o.slots for o in obs], dtype=float)
    cols, names = [np.ones_like(y)], ["t"]
    target = y - b - (0.0 if free_k else a)
    if free_m:
        cols.append(s)
        names.append("m")
    if free_k:
        cols.append(a)
        names.append("k")
    mat = np.stack(cols, axis=1) / y[:, None]
    rhs = target / y
    lower = [0.0 if n != "k" else 1e-9 for n in names]
    # soft-L1 loss: a step measured while the node was contended (shared login/compute nodes, a noisy
    # neighbour) weighs like its square root beyond ROBUST_SCALE relative error, not like its square
    x0 = [max(float(np.median(target)), 1e-6) if n == "t" else (1.0 if n == "k" else 0.0) for n in names]
    res = least_squares(
        lambda x: mat @ x - rhs, x0, bounds=(lower, [np.inf] * len(names)), loss="soft_l1", f_scale=ROBUST_SCALE
    )
    got = dict(zip(names, res.x, strict=True))
    return float(got.get("k", 1.0)), float(got["t"]), float(got.get("m", 0.0))


def fit_step_time(
    obs: list[Observation], gpu: str, precision: str, limits: FitBounds
) -> tuple[StepTimeCorrection | None, list[str]]:
    """One group's correction (or None) and the findings not applied."""
    where = f"step time {gpu if gpu != SITE_WIDE else 'site-wide'}/{precision}"
    if len(obs) < limits.min_jobs:
        return None, [f"{where}: {len(obs)} job(s), fewer than min_jobs({limits.min_jobs}); not applied"]
    meas = [_known(o.measured_step_s) for o in obs]
    comp = [_known(o.compute_s) for o in obs]
    slots = {o.slots for o in obs}
    free_m = len(slots) > 1
    free_k = (
        max(comp) > MIN_SPREAD * min(comp) and max(c / m for c, m in zip(comp, meas, strict=True)) >= MIN_COMPUTE_SHARE
    )
    notes: list[str] = []
    k, t, m = _solve(obs, free_k, free_m)
    factor = 1.0 / k
    if free_k and not (1 / limits.max_efficiency_factor <= factor <= limits.max_efficiency_factor):
        notes.append(
            f"{where}: efficiency would move x{factor:.3g}, outside the bound x{1 / limits.max_efficiency_factor:.3g}"
            f"..x{limits.max_efficiency_factor:g}; not applied (check the site file's GPU model and peaks)"
        )
        k, t, m = _solve(obs, False, free_m)
        factor = 1.0
    if t > limits.max_step_overhead_s or m > limits.max_microbatch_overhead_s:
        notes.append(
            f"{where}: fixed overhead {t:.3g} s/step + {m:.3g} s/micro-batch exceeds the bound "
            f"({limits.max_step_overhead_s:g} s, {limits.max_microbatch_overhead_s:g} s); not applied "
            "(are the jobs waiting on I/O or data loading?)"
        )
        return None, notes
    if not free_m and len(obs) > 1:
        notes.append(
            f"{where}: every job ran {next(iter(slots))} micro-batch slot(s) per step, so the per-micro-batch "
            "overhead cannot be told apart from the per-step one; fitted as per-step only"
        )
    if not free_k:
        notes.append(
            f"{where}: the jobs' predicted compute does not vary (or is negligible), so the FLOP-rate "
            "efficiency keeps its catalog value"
        )
    raw = [_known(o.raw_step_s) for o in obs]
    cal = [c * k + _known(o.other_s) + t + m * o.slots for c, o in zip(comp, obs, strict=True)]
    corr = StepTimeCorrection(
        gpu=gpu,
        precision=precision,
        efficiency_factor=factor,
        step_overhead_s=t,
        microbatch_overhead_s=m,
        jobs=len(obs),
        raw_error=_median_rel_error(raw, meas),
        calibrated_error=_median_rel_error(cal, meas),
    )
    return corr, notes


def fit_memory(obs: list[Observation], limits: FitBounds) -> tuple[list[MemoryCorrection], list[str]]:
    by_mode: dict[str, list[Observation]] = defaultdict(list)
    for o in obs:
        if o.memory:
            by_mode[o.mode].append(o)
    out, notes = [], []
    for mode, group in sorted(by_mode.items()):
        if len(group) < limits.min_jobs:
            notes.append(f"memory {mode}: {len(group)} job(s), fewer than min_jobs({limits.min_jobs}); not applied")
            continue
        per_job = [statistics.median(meas / pred for pred, meas in o.memory) for o in group]
        kept, outliers = reject_outliers(per_job)
        for i in outliers:
            notes.append(
                f"memory {mode}: {group[i].job_dir} measured/predicted x{per_job[i]:.3g}, far from the other "
                f"jobs' median x{statistics.median(per_job):.3g} (median/MAD test); left out"
            )
        group, per_job = [group[i] for i in kept], [per_job[i] for i in kept]
        if len(group) < limits.min_jobs:
            notes.append(
                f"memory {mode}: {len(group)} job(s) without outliers, fewer than "
                f"min_jobs({limits.min_jobs}); not applied"
            )
            continue
        factor = statistics.median(per_job)
        if not (1 / limits.max_memory_factor <= factor <= limits.max_memory_factor):
            notes.append(
                f"memory {mode}: measured/predicted is x{factor:.3g}, outside the bound "
                f"x{1 / limits.max_memory_factor:.3g}..x{limits.max_memory_factor:g}; not applied "
                "(check the metric compared and the site's overheads)"
            )
            continue
        out.append(MemoryCorrection(mode=mode, factor=factor, jobs=len(group), ranks=sum(len(o.memory) for o in group)))
    return out, notes


def fit(
    observations: list[Observation], limits: FitBounds
) -> tuple[list[StepTimeCorrection], list[MemoryCorrection], list[str]]:
    """All corrections the observations support, and every finding that was not applied."""
    timed = [o for o in observations if o.measured_step_s and o.compute_s is not None]
    steps: list[StepTimeCorrection] = []
    notes: list[str] = []
    groups: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for o in timed:
        groups[(o.gpus[0], o.precision)].append(o)
        groups[(SITE_WIDE, o.precision)].append(o)
    for (gpu, precision), group in sorted(groups.items(), key=lambda kv: (kv[0][0] == SITE_WIDE, kv[0])):
        corr, why = fit_step_time(group, gpu, precision, limits)
        notes += why
        if corr is not None:
            steps.append(corr)
    memory, why = fit_memory(observations, limits)
    return steps, memory, notes + why
