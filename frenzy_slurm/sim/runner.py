"""The simulation loop: arrivals, policy decisions, the simulated Slurm's clock, truth, resubmissions.

    result = simulate(workload, cluster, "has", seed=1)

Events come from a heap (arrivals, resubmissions, policy rounds) and from the simulated Slurm (job
ends). At an arrival the policy decides (timed: that is the per-decision overhead) and submits through
`SimSlurm.submit` with a BatchJob, as fsbatch submits through the Slurm backend. When a job starts,
the truth decides how long it runs: OOM after the start-up time if its true peak exceeds the GPU,
else start-up + true step time x steps, cut at the time limit (TIMEOUT: the runtime checkpoints at
the time-limit signal; a frenzy-slurm job then requeues itself, the same request for the steps left, as
`in_job.exit_for_requeue` does, and any other job's rest is resubmitted by its policy).
"""

from __future__ import annotations

import heapq
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.sim.base import RoundPolicy
from frenzy_slurm.sim.calibrating import SiteCalibration
from frenzy_slurm.sim.clusters import SimCluster
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, Placement
from frenzy_slurm.sim.policies import make_policy
from frenzy_slurm.sim.slurm import SimJob, SimSlurm
from frenzy_slurm.sim.truth import ErrorModel, Truth
from frenzy_slurm.sim.workload import WorkloadFile, reference_rate
from frenzy_slurm.site.config import SiteConfig
from frenzy_slurm.slurm.backend import BatchJob

MAX_ATTEMPTS = 8
# the earlier period a calibrated site ran before the one measured: the same cluster, jobs drawn with this seed offset
WARMUP_SEED_OFFSET = 1000


@dataclass
class JobRecord:
    id: int
    submit: float
    end: float | None = None
    first_start: float | None = None
    state: str = "pending"  # done, unplaceable (fits nowhere), gave-up (too many failures), unfinished
    attempts: int = 0
    ooms: int = 0
    timeouts: int = 0
    run_s: float = 0.0  # time spent running, all attempts
    gpu_s: float = 0.0  # GPU-seconds held, all attempts
    label: str = ""
    kind: str = ""
    gpus: int = 0
    components: list = field(default_factory=list)  # the last attempt's Slurm request (ComponentRequest)
    last_run_s: float = 0.0  # how long the completed attempt ran
    plain: bool = False  # a user who does not use frenzy-slurm (placed as slurm-multi, whatever the policy)

    @property
    def jct(self) -> float | None:
        return None if self.end is None or self.state != "done" else self.end - self.submit


@dataclass
class RunResult:
    policy: str
    seed: int
    gpus: int
    cluster: str
    records: list[JobRecord]
    timeline: list[tuple[float, int]]
    decision_ms: list[float]
    sim_wall_s: float
    load: float | None
    extra: dict = field(default_factory=dict)


def time_scale(wl: WorkloadFile, cluster: SimCluster, load: float) -> float:
    """Factor on arrival times that makes the offered load `load`: the workload's reference-GPU work
    over the cluster's reference-equivalent capacity (each GPU at its rate for the jobs' precisions)
    and the arrival span."""
    span = max(j.submit_s for j in wl.jobs) - min(j.submit_s for j in wl.jobs)
    if span <= 0 or load <= 0:
        return 1.0
    work = sum(j.trace_gpu_time_s for j in wl.jobs)  # reference GPU-seconds
    ref = reference_rate(wl.reference_gpu)
    weights: dict[str, float] = {}
    for j in wl.jobs:
        weights[j.precision] = weights.get(j.precision, 0.0) + j.trace_gpu_time_s
    total_w = sum(weights.values()) or 1.0
    cap = 0.0
    for p in cluster.partitions:
        spec = catalog()[p.gpu]
        rate = sum(w / total_w * spec.peak_tflops(prec) * 1e12 * spec.efficiency for prec, w in weights.items())
        cap += p.gpus * rate / ref
    return work / (cap * load) / span


class Runner:
    def __init__(
        self,
        workload: WorkloadFile,
        cluster: SimCluster,
        policy: str,
        seed: int = 0,
        errors: ErrorModel | None = None,
        load: float | None = 0.8,
        reserve: int | None = None,
        estimates: str = "test-only",
        ilp_round_s: float = 60.0,
        progress: Callable[[int], None] | None = None,
        sched_interval_s: float = 0.0,
        max_gpus: int | None = None,
        max_job_share: float | None = None,
        knobs: dict[str, float] | None = None,
        plain_share: float = 0.0,
        calibrate_every_s: float | None = None,
        calibration: SiteCalibration | None = None,
    ):
        self.workload, self.cluster, self.seed, self.load = workload, cluster, seed, load
        self.max_gpus = max_gpus  # limits.max_gpus of every job (every policy honours it)
        self.policy = make_policy(policy, ilp_round_s, knobs)
        self.truth = Truth(errors or ErrorModel(), seed)
        self.sim = SimSlurm(
            cluster,
            now=0.0,
            reserve=reserve,
            estimates=estimates,
            outcome=self._outcome,
            on_end=self._on_end,
            sched_interval_s=sched_interval_s,
            # a site whose preemptible QOS the policy's jobs may be submitted in (has-preempt)
            preempt_exempt_s=getattr(self.policy, "preempt_exempt_s", None),
        )
        site = cluster.site()
        if max_job_share is not None:  # the site file's setting (validated: 0 < share <= 1)
            site = SiteConfig.model_validate({**site.model_dump(), "max_job_share": max_job_share})
        # knobs named `site.FIELD` are the site file's settings (e.g. site.price_weight), validated as the file is
        settings = {k.removeprefix("site."): v for k, v in (knobs or {}).items() if k.startswith("site.")}
        if settings:
            site = SiteConfig.model_validate({**site.model_dump(), **settings})
        self.ctx = Context(self.sim, site, self.truth)
        # a site that refits its calibration from the jobs that finished, every this many seconds (docs/admin.md
        # "Calibration"); it reaches the policies that plan with MARP, and only their own jobs are measured
        # (`calibration`: the site's as an earlier period left it, `warmed_calibration`; its cron goes on)
        if calibration is not None and self.policy.calibrates:
            self.ctx.calibration = calibration
            calibration.next_fit_s = calibration.every_s
        elif calibrate_every_s is not None and self.policy.calibrates:
            self.ctx.calibration = SiteCalibration(site, calibrate_every_s)
        self.scale = time_scale(workload, cluster, load) if load else 1.0
        # queue realism: this share of the jobs (seeded) comes from users who do not use frenzy-slurm; they
        # submit as slurm-multi does, with its loose whole-hour limits, under every policy
        self.plain_policy = make_policy("slurm-multi", knobs=knobs) if plain_share > 0 else None
        plain = {j.id for j in workload.jobs if random.Random(f"{seed}/plain/{j.id}").random() < plain_share}
        self.records = {j.id: JobRecord(j.id, j.submit_s * self.scale, plain=j.id in plain) for j in workload.jobs}
        self.running: dict[int, tuple[Attempt, Placement]] = {}
        self.events: list[tuple[float, int, str, object]] = []
        self._seq = 0
        self.decision_ms: list[float] = []
        self.progress = progress
        self._start_step: dict[int, float] = {}
        self._start_cost: dict[int, float] = {}  # sim job id -> its seconds to the first step
        self._round_queued = False
        self._moving: set[int] = set()  # sim job ids a re-planning policy (sia) is checkpointing to move
        self._moved: dict[int, Attempt] = {}  # workload job id -> the rest of a job stopped this round
        self._requeued: dict[int, float] = {}  # workload job id -> the queue place (submit time) of a preempted job
        self.policy_cpu_s = 0.0  # CPU seconds of this process inside the policy (decisions and rounds)
        self._marp_s = [0.0]  # MARP search seconds so far (run() times them)
        self.marp_ms: list[float] = []  # per arrival decision: the part of decision_ms spent in MARP's search
        self.decision_cpu_ms: list[float] = []  # per arrival decision: its CPU time

    def _push(self, t: float, kind: str, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self.events, (t, self._seq, kind, payload))

    # ---- truth ------------------------------------------------------------------------------------
    def _startup(self, a: Attempt) -> float:
        """Seconds to the first step: the start-up, plus the restart cost where the attempt resumes a checkpoint."""
        resumed = a.steps < a.job.steps
        return self.truth.model.startup_s + (self.truth.restart_s(a.params_b, a.job.method) if resumed else 0.0)

    def _outcome(self, sj: SimJob) -> tuple[float, str]:
        a, p = self.running[sj.job_id]
        if p.alternatives:  # a multi-partition job starts as one of its placements: the one Slurm chose
            p = next(x for x in p.alternatives if [c.request for c in x.components] == sj.components)
            self.running[sj.job_id] = (a, p)
            rec = self.records[a.job.id]
            rec.label, rec.kind, rec.gpus = p.label, p.kind, p.gpus
            rec.components = [c.request for c in p.components]
        startup = self._startup(a)
        self._start_cost[sj.job_id] = startup
        for c in p.components:
            if self.truth.peak_gib(a.job.id, c.predicted_peak_gib) > c.memory_gib:
                return startup, "OUT_OF_MEMORY"
        # the truth scales MARP's prediction on the site file, whatever calibration the policy planned with (a plain
        # user's placement was planned on the site file itself)
        cal = None if self.records[a.job.id].plain else self.ctx.calibration
        raw = cal.raw_step_s(a, p) if cal is not None else p.step_time_s
        step = self.truth.step_time(
            a.job.id,
            raw,
            [c.gpu_model for c in p.components],
            precision=a.job.precision,
            gpus=p.gpus,
            nodes=sum(c.request.nodes for c in p.components),
            partitions=len({c.request.partition for c in p.components}),
        )
        self._start_step[sj.job_id] = step
        return startup + step * a.steps, "COMPLETED"

    def _on_end(self, sj: SimJob) -> None:
        a, p = self.running.pop(sj.job_id)
        rec = self.records[a.job.id]
        assert sj.start is not None and sj.end is not None
        rec.run_s += sj.end - sj.start
        rec.gpu_s += (sj.end - sj.start) * p.gpus
        if rec.first_start is None:
            rec.first_start = sj.start
        if sj.job_id not in self._moving and not rec.plain:
            self.policy.ended(a)
        self._measure(a, p, sj)
        if sj.state == "COMPLETED":
            rec.end, rec.state, rec.last_run_s = sj.end, "done", sj.end - sj.start
            self._done()
            return
        if sj.state == "OUT_OF_MEMORY":
            rec.ooms += 1
            worst = max(
                self.truth.peak_gib(a.job.id, c.predicted_peak_gib) / c.predicted_peak_gib for c in p.components
            )
            nxt = _again(a, p, number=a.number + 1, mem_correction=max(a.mem_correction, worst * 1.05), ooms=a.ooms + 1)
        elif sj.state == "TIMEOUT":
            rec.timeouts += 1
            nxt = _again(
                a, p, steps=max(1, a.steps - self._steps_done(sj)), number=a.number + 1, timeouts=a.timeouts + 1
            )
            if self.policy.requeues_at_time_limit and not rec.plain and nxt.number <= MAX_ATTEMPTS:
                # frenzy-slurm's runtime checkpoints at the time-limit signal and runs `scontrol requeue`: Slurm
                # starts the same job again, the same request (its --time too), for the steps left
                self._requeued[a.job.id] = sj.submit
                self._push(self.sim.now, "requeue", (nxt, p))
                return
        elif sj.job_id in self._moving or sj.state == "PREEMPTED":
            # checkpointed and stopped by a re-planning policy, or preempted (the runtime checkpoints at the
            # signal): the rest is resubmitted, a preempted job's by the policy's decision on the cluster now
            self._moving.discard(sj.job_id)
            # (a move is not a failure: its number stays, and it does not count towards MAX_ATTEMPTS)
            moved = _again(a, p, steps=max(1, a.steps - self._steps_done(sj)))
            if sj.state == "PREEMPTED":  # requeued: it keeps its place in the queue
                # Slurm requeues the job as it was submitted: the same request, for the steps left; a watcher
                # may then move it as any pending job (the pass right after the requeue: _run)
                self._requeued[a.job.id] = sj.submit
                self._push(self.sim.now, "requeue", (moved, p))
                return
            self._moved[a.job.id] = moved
            self.policy.stopped(a, moved)
            return
        else:  # cancelled
            rec.state, rec.end = "unfinished", sj.end
            self._done()
            return
        if nxt.number > MAX_ATTEMPTS:
            rec.state, rec.end = "gave-up", sj.end
            self._done()
            return
        self._push(self.sim.now, "submit", nxt)

    def _measure(self, a: Attempt, p: Placement, sj: SimJob) -> None:
        """A run of a job the policy planned, measured as the trainer measures it (its steady step time, its peak
        memory), for the site's calibration; a run that took fewer than two steps measures nothing."""
        cal = None if self.records[a.job.id].plain else self.ctx.calibration  # plain users run no frenzy-slurm
        if cal is None or sj.state == "OUT_OF_MEMORY" or self._steps_done(sj) < 2:
            return
        peaks = [self.truth.peak_gib(a.job.id, c.predicted_peak_gib) for c in p.components]
        cal.observe(a, p, self._start_step[sj.job_id], peaks, user=a.job.group or f"job-{a.job.id}")

    def _steps_done(self, sj: SimJob) -> int:
        """Steps the run `sj` finished before it ended (its start-up and restore not counted)."""
        assert sj.start is not None and sj.end is not None
        step = self._start_step.get(sj.job_id) or 1.0
        return max(0, int((sj.end - sj.start - self._start_cost.get(sj.job_id, 0.0)) // step))

    def _done(self) -> None:
        if self.progress:
            self.progress(1)

    # ---- decisions ---------------------------------------------------------------------------------
    def _submit(self, a: Attempt, p: Placement) -> int:
        rec = self.records[a.job.id]
        rec.attempts += 1
        rec.label, rec.kind, rec.gpus = p.label, p.kind, p.gpus
        rec.components = [c.request for c in p.components]
        job = BatchJob(
            script=Path(f"sim-job-{a.job.id}/job.sbatch"),
            workdir=Path(f"sim-job-{a.job.id}"),
            components=[c.request for c in p.components],
            name=f"sim-job-{a.job.id}",
            comment=f"attempt {a.number}",
        )
        # a job can start inside submit(), and its outcome needs the plan: register it under the id it will get
        jid = self.sim.next_job_id
        self.running[jid] = (a, p)
        if p.alternatives:
            others = [[c.request for c in x.components] for x in p.alternatives[1:]]
            self.sim.submit_any(job, others)
        else:
            marks = getattr(self.policy, "preemptible", None)  # has-preempt: the jobs its users mark
            self.sim.submit_as(
                job,
                preemptible=bool(marks and not rec.plain and marks(a, p)),
                queued_since=self._requeued.pop(a.job.id, None),
            )
        return jid

    def _arrive(self, a: Attempt) -> None:
        if self.plain_policy is not None and self.records[a.job.id].plain:
            placed = self.plain_policy.place(a, self.ctx)
            if placed is None:
                rec = self.records[a.job.id]
                rec.state, rec.end = "unplaceable", self.sim.now
                self._done()
            else:
                self._submit(a, placed)
            return
        t0, c0, m0 = time.perf_counter(), time.process_time(), self._marp_s[0]
        p = self.policy.place(a, self.ctx)
        self.policy_cpu_s += time.process_time() - c0
        if self.policy.round_s is not None:
            if not self._round_queued:
                self._round_queued = True
                self._push(self.sim.now + self.policy.round_s, "round", None)
        else:
            self.decision_ms.append((time.perf_counter() - t0) * 1e3)
            self.marp_ms.append((self._marp_s[0] - m0) * 1e3)  # of which MARP's search (issue 20: shown apart)
            # the same decision in CPU time: on a shared machine wall time counts the other processes' turns too
            self.decision_cpu_ms.append((time.process_time() - c0) * 1e3)
            if p is None:
                rec = self.records[a.job.id]
                rec.state, rec.end = "unplaceable", self.sim.now
                self._done()
                return
            self._submit(a, p)

    def _round(self) -> None:
        self._round_queued = False
        c0 = time.process_time()
        placements = self.policy.tick(self.ctx)
        self.policy_cpu_s += time.process_time() - c0
        for jid in self.policy.stop_now():  # re-planning (sia): checkpoint and stop before the new placements
            if jid not in self.running:
                continue
            if self.sim.jobs_by_id[jid].state == "PENDING":  # not started yet: withdrawn, nothing to keep
                a, _p = self.running.pop(jid)
                self.sim.cancel(jid)
                self._moved[a.job.id] = a
                self.policy.stopped(a, a)
                continue
            self._moving.add(jid)
            self.sim.cancel(jid)
        for a, p in placements:
            a = self._moved.pop(a.job.id, a)  # a job moved this round resubmits the steps it has left
            jid = self._submit(a, p)
            self.policy.submitted(a, p, jid, self.ctx)
        self._moved.clear()
        for a in getattr(self.policy, "unplaceable", []):
            rec = self.records[a.job.id]
            if rec.state == "pending":
                rec.state, rec.end = "unplaceable", self.sim.now
                self._done()
        if self.policy.wants_round() and not self._round_queued:
            self._round_queued = True
            self._push(self.sim.now + (self.policy.round_s or 60.0), "round", None)

    def _replan(self) -> None:
        """The cluster changed: a re-planning policy (has-replan) may move its pending jobs (a new submission of
        the new plan, the old job cancelled)."""
        pending = [
            (jid, a, p)
            for jid, (a, p) in sorted(self.running.items())
            if self.sim.jobs_by_id[jid].state == "PENDING" and not self.records[a.job.id].plain
        ]
        if getattr(self.policy, "moves_running", False):
            self._move_running()
        if not pending:
            return
        t0, c0 = time.perf_counter(), time.process_time()
        # one job at a time, on the cluster as the moves before it left it (as _move_running)
        for entry in pending[: getattr(self.policy, "max_per_change", len(pending))]:
            if self.sim.jobs_by_id[entry[0]].state != "PENDING":
                continue  # started since the pass began
            for jid, p in self.policy.replan(self.ctx, [entry]):  # type: ignore[attr-defined]  # replans is True
                if self.sim.jobs_by_id[jid].state != "PENDING":
                    continue  # started meanwhile: the watcher's hold fails, and it leaves the job
                # the watcher submits the new plan and cancels the job: it joins the queue anew
                a, _old = self.running.pop(jid)
                self.sim.cancel(jid)
                self._requeued.pop(a.job.id, None)
                self._submit(a, p)
        self.policy_cpu_s += time.process_time() - c0
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)

    def _move_running(self) -> None:
        """The opt-in preemptible mode (has-preempt): running jobs the policy wants elsewhere are checkpointed,
        stopped and resubmitted there with the steps they have left (the runtime's checkpoint and requeue)."""
        running = []
        for jid, (a, p) in sorted(self.running.items()):
            sj = self.sim.jobs_by_id[jid]
            if sj.state != "RUNNING" or self.records[a.job.id].plain or sj.start is None:
                continue
            # progress as the job's own log shows it: the steps done since its first step
            step = self._start_step.get(jid) or p.step_time_s
            done = max(0, int((self.sim.now - sj.start - self._start_cost.get(jid, 0.0)) // step))
            running.append((jid, a, p, sj.start, max(1, a.steps - done)))
        if not running:
            return
        t0, c0 = time.perf_counter(), time.process_time()
        # one job at a time, each decided on the cluster as the moves before it left it (the watcher reads the
        # cluster again after each move it makes): on one view, every job that would run sooner on GPUs just
        # freed was moved onto them, and all but the first stopped for nothing (std64 seed 2: five at once)
        limit = getattr(self.policy, "max_per_change", len(running))
        for entry in running[:limit]:
            if self.sim.jobs_by_id[entry[0]].state != "RUNNING":
                continue  # ended since the pass began
            for jid, p in self.policy.move(self.ctx, [entry]):  # type: ignore[attr-defined]  # moves_running
                if jid not in self.running or self.sim.jobs_by_id[jid].state != "RUNNING":
                    continue
                a = self.running[jid][0]
                self._moving.add(jid)
                self.sim.cancel(jid)  # checkpointed at the signal: _on_end files the rest under self._moved
                rest = self._moved.pop(a.job.id, None)
                if rest is not None:
                    self._submit(rest, p)
        self.policy_cpu_s += time.process_time() - c0
        self.decision_ms.append((time.perf_counter() - t0) * 1e3)

    def run(self) -> RunResult:
        with _timing_marp_search() as marp_s:
            self._marp_s = marp_s
            result = self._run()
        result.extra["marp_search_s"] = marp_s[0]
        if len(self.marp_ms) == len(self.decision_ms):  # per-arrival decisions only (no re-planning's)
            pairs = zip(self.decision_ms, self.marp_ms, strict=True)
            result.extra["decision_ms_without_marp"] = [d - m for d, m in pairs]
            result.extra["decision_cpu_ms"] = list(self.decision_cpu_ms)
        result.extra["policy_cpu_s"] = self.policy_cpu_s
        return result

    def _run(self) -> RunResult:
        t0 = time.perf_counter()
        for j in self.workload.jobs:
            self._push(j.submit_s * self.scale, "submit", Attempt(j, j.steps, max_gpus=self.max_gpus))
        while True:
            t_ext = self.events[0][0] if self.events else float("inf")
            t_end = self.sim.next_end()
            t_end = float("inf") if t_end is None else t_end
            if t_ext == float("inf") and t_end == float("inf"):
                break
            cal = self.ctx.calibration
            if cal is not None and cal.next_fit_s < min(t_ext, t_end):
                # the site's refit runs between events (nothing is decided in between)
                self.sim.advance(cal.next_fit_s)
                cal.refit(self.sim.now)
                continue
            if t_end <= t_ext:
                ended = self.sim.advance(t_end)
                if ended and getattr(self.policy, "replans", False):
                    self._replan()
                continue
            self.sim.advance(t_ext)
            while self.events and self.events[0][0] <= self.sim.now:
                _, _, kind, payload = heapq.heappop(self.events)
                if kind == "submit":
                    self._arrive(payload)  # type: ignore[arg-type]  # a submit event carries its job
                elif kind == "requeue":
                    self._submit(*payload)  # type: ignore[misc]  # a requeue event carries the job and its request
                    if getattr(self.policy, "replans", False):
                        self._replan()
                else:
                    self._round()
        for rec in self.records.values():
            if rec.state == "pending":
                rec.state = "unfinished"
        extra: dict[str, Any] = {}
        extra["preempted"] = self.sim.preemptions
        for name in ("moves", "preemptions", "updates"):  # sia's re-planning, has-replan's updated requests
            if hasattr(self.policy, name):
                extra[name] = getattr(self.policy, name)
        if isinstance(self.policy, RoundPolicy):  # round-based policies time their rounds
            self.decision_ms = list(self.policy.round_ms)
            # per job: a round's time shared by the jobs its program decided (placed, kept, moved or held)
            extra["per_job_ms"] = [
                ms / max(1, n) for ms, n in zip(self.policy.round_ms, self.policy.round_jobs, strict=True)
            ]
            extra["ilp_vars_median"] = (
                sorted(self.policy.round_vars)[len(self.policy.round_vars) // 2] if self.policy.round_vars else 0
            )
            solve = sorted(self.policy.solve_ms)
            extra["ilp_solve_ms_median"] = solve[len(solve) // 2] if solve else 0.0
            extra["ilp_solve_ms_p95"] = solve[int(0.95 * (len(solve) - 1))] if solve else 0.0
        extra["schedule_s"] = self.sim.schedule_s
        if self.ctx.calibration is not None:
            extra["calibrations"] = self.ctx.calibration.fits
        return RunResult(
            self.policy.name,
            self.seed,
            self.cluster.gpus,
            self.cluster.describe(),
            sorted(self.records.values(), key=lambda r: r.id),
            list(self.sim.timeline),
            self.decision_ms,
            time.perf_counter() - t0,
            self.load,
            extra,
        )


@contextmanager
def _timing_marp_search() -> Iterator[list[float]]:
    """Wall seconds spent in MARP's candidate search during a run, by whatever policy calls it (HAS's
    decide, the baselines), so that the search can be shown apart from the scheduling decision. The
    modules' own `search` names are wrapped for the run and restored after it."""
    from importlib import import_module

    # by name: frenzy_slurm.has re-exports the function decide(), which hides the module of that name
    modules = [import_module(f"frenzy_slurm.{m}") for m in ("has.decide", "sim.policies", "sim.ilp", "sim.sia")]
    spent = [0.0]
    original = [getattr(m, "search") for m in modules]  # noqa: B009
    inner = original[0]

    def timed(*args: Any, **kw: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kw)
        finally:
            spent[0] += time.perf_counter() - t0

    for m in modules:
        setattr(m, "search", timed)  # noqa: B010  # same signature, timed
    try:
        yield spent
    finally:
        for m, f in zip(modules, original, strict=True):
            setattr(m, "search", f)  # noqa: B010


def _pool_of(p: Placement) -> str:
    c = p.components[0].request
    return f"{c.partition}/{c.gpu_type}"


def simulate(workload: WorkloadFile, cluster: SimCluster, policy: str, seed: int = 0, **kw: Any) -> RunResult:
    return Runner(workload, cluster, policy, seed, **kw).run()


def warmed_calibration(
    earlier: WorkloadFile, cluster: SimCluster, policy: str, seed: int, every_s: float, **kw: Any
) -> SiteCalibration | None:
    """The calibration a site has when a measured period begins: the same policy ran `earlier` (another period's
    jobs, their own truth: `seed`) on the same cluster, its site refitting every `every_s` and once at the end of
    the period, from the jobs the policy planned. None for a policy that does not plan with MARP."""
    runner = Runner(earlier, cluster, policy, seed, calibrate_every_s=every_s, **kw)
    runner.run()
    cal = runner.ctx.calibration
    if cal is not None:
        cal.refit(max(runner.sim.now, cal.next_fit_s))
    return cal


def _again(a: Attempt, p: Placement, **changes: Any) -> Attempt:
    """The next attempt of `a`'s job after its run on `p` (whose GPUs and pool it records), with `changes`."""
    return replace(a, last_gpus=p.gpus, last_pool=_pool_of(p), tried_pools=list(a.tried_pools), **changes)
