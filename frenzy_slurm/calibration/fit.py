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

Memory, per framework mode: each user's vote is the median over that user's jobs of each job's median
measured/predicted peak; the factor is the median of the votes, after leaving out votes far from the others
(median/MAD): a few fabricated or broken measurements cannot move it.

One user, one vote: a job directory's files and processes are its owner's (calibration/verify.py), so one
user's many jobs must not outvote the others'. In the memory factor each user's jobs are one vote; in the
step-time fit each user's jobs together weigh as one job. And a correction the previous calibration applied
moves by at most `max_change` either way per calibration (its efficiency factor, its nonzero overheads, its
memory factor): the output says where the fit wanted more, and the next calibration may go on if new jobs
agree.

A correction outside its bounds (limits) or resting on fewer than `min_jobs` jobs is reported in
`not_applied`, never written as applied.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass

from frenzy_slurm.calibration.model import (
    SITE_WIDE,
    CalibrationFile,
    FitBounds,
    MemoryCorrection,
    StepTimeCorrection,
)
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


@dataclass(frozen=True)
class Finding:
    """One thing a fit says about a group: a correction it did not apply (`refused`: outside its bounds, or
    on too few jobs), or a note on how it fitted one. `text` is the line the output and the file show."""

    text: str
    refused: bool = False

    def __str__(self) -> str:
        return self.text


def _refused(text: str) -> Finding:
    return Finding(text, refused=True)


def _note(text: str) -> Finding:
    return Finding(text)


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


def voter(o: Observation) -> str:
    """Whose vote a job is: its directory's owner (a job whose owner is unknown votes alone)."""
    return o.user or str(o.job_dir)


def _user_weights(obs: list[Observation]) -> list[float]:
    """Each job's weight in a fit: 1 / the jobs of its user there, so each user's jobs weigh as one job (scaled
    so the largest weight is 1: jobs all of one user, or one each, fit exactly as unweighted)."""
    counts = Counter(voter(o) for o in obs)
    fewest = min(counts.values())
    return [fewest / counts[voter(o)] for o in obs]


def bounded(value: float, previous: float | None, max_change: float) -> float:
    """`value` held within `max_change` either way of the previous calibration's (none or 0: not held)."""
    if previous is None or previous <= 0:
        return value
    return min(max(value, previous / max_change), previous * max_change)


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
    # one user's jobs weigh as one job: each squared relative residual times 1 / that user's job count
    w = np.sqrt(np.array(_user_weights(obs)))
    mat = np.stack(cols, axis=1) / y[:, None] * w[:, None]
    rhs = target / y * w
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
    obs: list[Observation], gpu: str, precision: str, limits: FitBounds, previous: StepTimeCorrection | None = None
) -> tuple[StepTimeCorrection | None, list[Finding]]:
    """One group's correction (or None) and its findings (`Finding.refused`: not applied); `previous`: the
    previous calibration's correction of this group, which the new one moves from by at most `limits.max_change`."""
    where = f"step time {gpu if gpu != SITE_WIDE else 'site-wide'}/{precision}"
    if len(obs) < limits.min_jobs:
        return None, [_refused(f"{where}: {len(obs)} job(s), fewer than min_jobs({limits.min_jobs}); not applied")]
    meas = [_known(o.measured_step_s) for o in obs]
    comp = [_known(o.compute_s) for o in obs]
    slots = {o.slots for o in obs}
    free_m = len(slots) > 1
    free_k = (
        max(comp) > MIN_SPREAD * min(comp) and max(c / m for c, m in zip(comp, meas, strict=True)) >= MIN_COMPUTE_SHARE
    )
    notes: list[Finding] = []
    k, t, m = _solve(obs, free_k, free_m)
    factor = 1.0 / k
    if free_k and not (1 / limits.max_efficiency_factor <= factor <= limits.max_efficiency_factor):
        notes.append(
            _refused(
                f"{where}: efficiency would move x{factor:.3g}, outside the bound "
                f"x{1 / limits.max_efficiency_factor:.3g}"
                f"..x{limits.max_efficiency_factor:g}; not applied (check the site file's GPU model and peaks)"
            )
        )
        k, t, m = _solve(obs, False, free_m)
        factor = 1.0
    if t > limits.max_step_overhead_s or m > limits.max_microbatch_overhead_s:
        notes.append(
            _refused(
                f"{where}: fixed overhead {t:.3g} s/step + {m:.3g} s/micro-batch exceeds the bound "
                f"({limits.max_step_overhead_s:g} s, {limits.max_microbatch_overhead_s:g} s); not applied "
                "(are the jobs waiting on I/O or data loading?)"
            )
        )
        return None, notes
    if not free_m and len(obs) > 1:
        notes.append(
            _note(
                f"{where}: every job ran {next(iter(slots))} micro-batch slot(s) per step, so the per-micro-batch "
                "overhead cannot be told apart from the per-step one; fitted as per-step only"
            )
        )
    if not free_k:
        notes.append(
            _note(
                f"{where}: the jobs' predicted compute does not vary (or is negligible), so the FLOP-rate "
                "efficiency keeps its catalog value"
            )
        )
    if previous is not None:
        factor, t, m, moved = _held(where, (factor, t, m), previous, limits.max_change)
        notes += moved
        k = 1.0 / factor
    users = len({voter(o) for o in obs})
    if users < len(obs):
        notes.append(_note(f"{where}: {len(obs)} job(s) of {users} user(s); each user's jobs weigh as one job"))
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


def _held(
    where: str, fitted: tuple[float, float, float], previous: StepTimeCorrection, max_change: float
) -> tuple[float, float, float, list[Finding]]:
    """(efficiency factor, step overhead, micro-batch overhead) held within max_change of the previous
    calibration's, and a note for each term the bound held."""
    names = ("efficiency", "s/step", "s/micro-batch")
    before = (previous.efficiency_factor, previous.step_overhead_s, previous.microbatch_overhead_s)
    held = tuple(bounded(v, p, max_change) for v, p in zip(fitted, before, strict=True))
    notes = [
        _note(
            f"{where}: {name} fitted {v:.4g}, previous calibration {p:.4g}: moved to {h:.4g}, at most x{max_change:g} "
            "per calibration (--max-change); calibrate again with new jobs to go further"
        )
        for name, v, p, h in zip(names, fitted, before, held, strict=True)
        if h != v
    ]
    return held[0], held[1], held[2], notes


def _votes(group: list[Observation]) -> list[tuple[str, list[int], float]]:
    """Each user's vote on a memory factor: (user, that user's jobs in `group`, median of their job medians)."""
    per_job = [statistics.median(meas / pred for pred, meas in o.memory) for o in group]
    jobs: dict[str, list[int]] = defaultdict(list)
    for i, o in enumerate(group):
        jobs[voter(o)].append(i)
    return [(user, idx, statistics.median(per_job[i] for i in idx)) for user, idx in jobs.items()]


def fit_memory(
    obs: list[Observation], limits: FitBounds, previous: CalibrationFile | None = None
) -> tuple[list[MemoryCorrection], list[Finding]]:
    """Each framework mode's factor: the median of its users' votes, held within `limits.max_change` of the
    previous calibration's factor; and the findings."""
    by_mode: dict[str, list[Observation]] = defaultdict(list)
    for o in obs:
        if o.memory:
            by_mode[o.mode].append(o)
    out: list[MemoryCorrection] = []
    notes: list[Finding] = []
    for mode, group in sorted(by_mode.items()):
        if len(group) < limits.min_jobs:
            notes.append(
                _refused(f"memory {mode}: {len(group)} job(s), fewer than min_jobs({limits.min_jobs}); not applied")
            )
            continue
        votes = _votes(group)
        kept, outliers = reject_outliers([v for _, _, v in votes])
        middle = statistics.median(v for _, _, v in votes)
        for i in outliers:
            user, idx, v = votes[i]
            notes.append(
                _note(
                    f"memory {mode}: {user if len(idx) > 1 else group[idx[0]].job_dir} measured/predicted x{v:.3g}"
                    f"{f' over {len(idx)} jobs' if len(idx) > 1 else ''}, far from the other users' median "
                    f"x{middle:.3g} (median/MAD test); left out"
                )
            )
        votes = [votes[i] for i in kept]
        group = [group[i] for _, idx, _ in votes for i in idx]
        if len(votes) < len(group):
            shown = ", ".join(f"{u} x{v:.3g} ({len(i)} job(s))" for u, i, v in votes)
            notes.append(_note(f"memory {mode}: one vote per user: {shown}"))
        if len(group) < limits.min_jobs:
            notes.append(
                _refused(
                    f"memory {mode}: {len(group)} job(s) without outliers, fewer than "
                    f"min_jobs({limits.min_jobs}); not applied"
                )
            )
            continue
        factor = statistics.median(v for _, _, v in votes)
        before = previous.memory_factor(mode) if previous is not None else None
        held = bounded(factor, before.factor if before else None, limits.max_change)
        if held != factor and before is not None:
            notes.append(
                _note(
                    f"memory {mode}: factor fitted x{factor:.3g}, previous calibration x{before.factor:.3g}: moved to "
                    f"x{held:.3g}, at most x{limits.max_change:g} per calibration (--max-change); calibrate again "
                    "with new jobs to go further"
                )
            )
            factor = held
        if not (1 / limits.max_memory_factor <= factor <= limits.max_memory_factor):
            notes.append(
                _refused(
                    f"memory {mode}: measured/predicted is x{factor:.3g}, outside the bound "
                    f"x{1 / limits.max_memory_factor:.3g}..x{limits.max_memory_factor:g}; not applied "
                    "(check the metric compared and the site's overheads)"
                )
            )
            continue
        out.append(MemoryCorrection(mode=mode, factor=factor, jobs=len(group), ranks=sum(len(o.memory) for o in group)))
    return out, notes


def fit(
    observations: list[Observation], limits: FitBounds, previous: CalibrationFile | None = None
) -> tuple[list[StepTimeCorrection], list[MemoryCorrection], list[Finding]]:
    """All corrections the observations support, and every finding (`Finding.refused`: not applied); `previous`: the
    calibration this one replaces, whose corrections each move by at most `limits.max_change`."""
    timed = [o for o in observations if o.measured_step_s and o.compute_s is not None]
    steps: list[StepTimeCorrection] = []
    notes: list[Finding] = []
    groups: dict[tuple[str, str], list[Observation]] = defaultdict(list)
    for o in timed:
        groups[(o.gpus[0], o.precision)].append(o)
        groups[(SITE_WIDE, o.precision)].append(o)
    for (gpu, precision), group in sorted(groups.items(), key=lambda kv: (kv[0][0] == SITE_WIDE, kv[0])):
        held = previous.step_time if previous is not None else []
        before = next((c for c in held if (c.gpu, c.precision) == (gpu, precision)), None)
        corr, why = fit_step_time(group, gpu, precision, limits, before)
        notes += why
        if corr is not None:
            steps.append(corr)
    memory, why = fit_memory(observations, limits, previous)
    return steps, memory, notes + why
