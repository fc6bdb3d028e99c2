"""Planning one job: model.yaml, the site file and Slurm's view in, the frozen JobRequest out.

    job = load_job(Path("model.yaml"))
    req = plan_job(job, find_site_file(None), open_backend("auto"), PlanOptions(slurm=job.spec.slurm))
    submit(req, backend)            # what `--dry-run` printed (req.as_json()) is what is submitted

`plan_job` is the only chain of the stages, each a named step usable alone:
`calibrate` (the site file as MARP and HAS see it for this job) -> `decide_job` (MARP and HAS: the
decision; the simulator and benchmarks call this step, without rendering) -> `choose_job_dir` (where
the job goes; a fresh sibling of a directory an earlier job used, the same for --dry-run)
-> `render_job` (the job directory's files, calibration.json among them). The CLI parses and prints.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from frenzy_slurm.calibration import Applied, for_job, job_record
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.has import Decision, Requirements, decide
from frenzy_slurm.has.decide import short_time_note
from frenzy_slurm.has.fallback import oom_fallbacks
from frenzy_slurm.has.pools import (
    check_gpu_types,
    check_site_types,
    missing_partition_notes,
    undescribed_type_notes,
    unmapped_untyped_notes,
)
from frenzy_slurm.has.qos import qos_wait_note
from frenzy_slurm.jobdir.paths import default_job_dir
from frenzy_slurm.jobdir.planfile import MovedFrom, PlanFile
from frenzy_slurm.jobdir.safety import job_outputs, next_free_dir
from frenzy_slurm.jobspec import JobSpec, ResolvedModel, load_job_spec, resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.jobspec.sbatch_env import check_sbatch_env
from frenzy_slurm.marp import search_space_from_spec, with_exact_params, workload_from_spec
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.frameworks import profile_summary
from frenzy_slurm.marp.plan import Workload
from frenzy_slurm.render import Rendered, render_job, submission_hash
from frenzy_slurm.render.environment import EnvCheck, check_environment
from frenzy_slurm.site.config import SiteConfig, load_site, require_measured_memory
from frenzy_slurm.site.tools import find_site
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.view import ClusterView


@dataclass(frozen=True)
class JobFile:
    """A model.yaml as read: its path (relative paths in it are taken from its directory), the validated
    spec, and the resolved model."""

    path: Path
    spec: JobSpec
    model: ResolvedModel


@dataclass(frozen=True)
class SiteFile:
    """The site file and where it was read from (its calibration lives beside it); `path` is None for a
    site built in memory (tests, the simulator), which has no calibration."""

    config: SiteConfig
    path: Path | None = None


@dataclass(frozen=True)
class PlanOptions:
    """What fsbatch's flags add to model.yaml."""

    slurm: SlurmOptions  # model.yaml's slurm: block with the sbatch-style flags on top
    job_dir: Path | None = None  # --job-dir; default $FRENZY_JOBS_DIR or ./frenzy-jobs, /<name>-<hash>
    templates: Path | None = None  # --templates
    calibration: bool = True  # False: --no-calibration
    force: bool = False  # --force: another job of this submission, in a fresh job directory
    now: float | None = None  # the decision's "now" (default: the clock)
    env_check: EnvCheck = "note"  # the job's Python and packages (render/environment.py): "refuse" (exit 2) to
    # submit, "note" for a dry run, "off" for --no-env-check


@dataclass(frozen=True)
class JobRequest:
    """Everything one submission consists of, final: `--dry-run` prints it, `submit` writes and submits it.

    `files` cannot be changed; submit records the job directory's inode in the copy it writes."""

    job_dir: Path
    submission: str
    files: Mapping[str, str]
    plan: PlanFile
    kind: str
    name: str
    entry_script: Path | None  # entry.script (absolute) for trainer: script, checked to exist before submitting
    force: bool = False
    earlier_job_dir: Path | None = None  # a rerun or --force moved the job here from this used directory, kept as is
    group_readable: bool = False  # the site lets the user's group read job directories
    notes: tuple[str, ...] = ()  # what the user should know though nothing was refused (fsbatch prints each)

    @property
    def script(self) -> str:
        return self.files["job.sbatch"]

    @property
    def umask(self) -> int:
        """What the job creates: private, or group-readable where the site says."""
        return 0o027 if self.group_readable else 0o077

    @property
    def decision(self) -> Decision:
        return self.plan.decision

    @property
    def calibration(self) -> dict[str, Any] | None:
        text = self.files.get("calibration.json")
        return json.loads(text) if text is not None else None

    def as_json(self) -> dict[str, Any]:
        """The request as `fsbatch --json` prints it (`--dry-run` adds nothing, submitting adds the job id)."""
        out: dict[str, Any] = {
            "job": self.plan.spec.name,
            "submission": self.submission,
            "job_dir": str(self.job_dir),
            "decision": json.loads(self.decision.model_dump_json()),
            "user_code_ran": self.plan.exact_params is not None,
            "calibration": self.calibration,
            # which framework profile predicted the job and the defaults it took (marp/frameworks.py)
            "framework": profile_summary(self.plan.spec),
            "sbatch_argv": list(self.plan.sbatch_argv),
            "script": self.script,
        }
        if self.earlier_job_dir is not None:
            out["earlier_job_dir"] = str(self.earlier_job_dir)
        if self.notes:
            out["notes"] = list(self.notes)
        return out


def find_site_file(explicit: Path | None) -> SiteFile:
    """--site, else $FRENZY_SITE, else /etc/frenzy-slurm/site.yaml, found once and read; none is refused."""
    path = find_site(explicit)
    if path is None:
        raise InputError("no site file: pass --site FILE or set FRENZY_SITE (write one with `frenzy-slurm site init`).")
    site = load_site(path)
    require_measured_memory(site, path)  # a guessed GPU memory plans jobs that run out of it
    return SiteFile(site, path)


def load_job(path: Path, overrides: Mapping[str, Any] | None = None, name: str | None = None) -> JobFile:
    """model.yaml and its model, without running any user code; `overrides` (dotted key -> value) replace
    values of the file before it is validated, `name` its name (a sweep's combination, `jobspec.sweeps`)."""
    spec = load_job_spec(path, overrides)
    if name is not None:
        spec = spec.model_copy(update={"name": name})  # sweeps.Combination.name makes only names the field accepts
    return JobFile(path, spec, resolve_model(spec, path.parent))


def traced(job: JobFile, site: SiteFile | None) -> JobFile:
    """The job with model.factory imported and called here to count its parameters exactly: the user's
    --trace-factory, consent to run that code (docs/security.md). The factory must be the user's own code
    or in the site file's trusted_factories."""
    if job.spec.model.factory is None:
        return job
    trusted = tuple(site.config.trusted_factories) if site else ()
    return JobFile(job.path, job.spec, with_exact_params(job.spec, job.model, trusted))


def submission_of(job: JobFile, options: PlanOptions) -> str:
    """The submission hash (the idempotency key) `plan_job` gives this job with these options."""
    return submission_hash(job.spec, job.model, options.slurm)


def calibrate(job: JobFile, site: SiteFile, options: PlanOptions) -> tuple[SiteConfig, Applied | None]:
    """The site file as MARP and HAS see it for this job (calibrated unless --no-calibration), and what
    was applied."""
    return for_job(
        site.config, site.path, job.spec.training.precision, job.spec.training.method, enabled=options.calibration
    )


def start_estimator(backend: SlurmBackend | None) -> SlurmBackend | None:
    """The backend HAS may ask when Slurm would start a request: none for a saved snapshot (a read-only
    backend), whose own estimate is the timeline HAS has already searched."""
    return None if backend is None or backend.snapshot is not None else backend


def decide_job(
    requirements: Requirements,
    workload: Workload,
    space: SearchSpace,
    view: ClusterView,
    site: SiteConfig,
    backend: SlurmBackend | None,
    now: float,
    alternatives: int = 5,
) -> Decision:
    """The decision step: MARP's plans per pool and HAS's choice, start estimates from `backend` (if any).
    The simulator and the benchmarks call this step alone (they render nothing)."""
    return decide(requirements, workload, view, site, space, backend=backend, now=now, alternatives=alternatives)


@dataclass(frozen=True)
class PreemptibleDecision:
    """HAS's decision for a job marked preemptible, and the QOS it runs in (None: its own, with `note` why)."""

    decision: Decision
    qos: str | None
    note: str | None = None


def decide_preemptible(
    requirements: Requirements,
    workload: Workload,
    space: SearchSpace,
    view: ClusterView,
    site: SiteConfig,
    backend: SlurmBackend | None,
    now: float,
    alternatives: int = 5,
) -> PreemptibleDecision:
    """The decision step for a job its user marked preemptible (`slurm.preemptible`, `fsbatch --preemptible`):
    in the site's preemptible QOS (`site.preemption`, which must be set), within that QOS's limits, and with up
    to `preemption.max_job_share` of a pool where the site sets one above its `max_job_share` (which leaves room
    for the jobs that arrive later; those may preempt this one instead). Where the allocation chosen that way is
    predicted to run less than `preemption.min_run_min`, the job is decided as any other and stays in its own
    QOS: preempting it would save the others little and cost it a restart. The simulator's `has-preempt` calls
    this step."""
    p = site.preemption
    if p is None:
        raise ValueError("decide_preemptible needs a site file with a preemption: block")
    wide = site.model_copy(update={"max_job_share": max(site.max_job_share, p.max_job_share or 0.0)})
    qview = view if backend is None else view.model_copy(update={"qos": backend.qos_limits(p.qos)})
    d = decide_job(requirements, workload, space, qview, wide, backend, now, alternatives)
    if d.chosen.run_time_s >= 60.0 * p.min_run_min:
        return PreemptibleDecision(d, p.qos)
    return PreemptibleDecision(
        decide_job(requirements, workload, space, view, site, backend, now, alternatives),
        None,
        f"not preemptible: its predicted run in the preemptible QOS, {d.chosen.run_time_s / 60:.0f} min, is under "
        f"the site's preemption.min_run_min ({p.min_run_min} min); the job runs in its own QOS",
    )


def choose_job_dir(job: JobFile, submission: str, options: PlanOptions) -> tuple[Path, Path | None]:
    """The job directory, and the used directory it moved from (or None). An earlier job's directory is
    never reused: a rerun, and --force (with or without --dry-run), go to the first free sibling NAME.2...;
    submit then refuses (exit 7) unless that earlier job has ended or --force says so."""

    job_dir = (options.job_dir or default_job_dir(job.spec.name, submission)).absolute()
    if job_outputs(job_dir):
        return next_free_dir(job_dir), job_dir
    return job_dir, None


@dataclass(frozen=True)
class Prepared:
    """What a decision for `job` is made from: the cluster (with the QOS's limits), the site file as MARP and HAS
    see it, MARP's workload, HAS's requirements, "now", and what the user is told about the job's setup."""

    view: ClusterView
    site: SiteConfig
    applied: Applied | None
    workload: Workload
    requirements: Requirements
    now: float
    env_notes: tuple[str, ...]


def prepare(job: JobFile, site: SiteFile, backend: SlurmBackend, options: PlanOptions) -> Prepared:
    """The inputs of the decision, as fsbatch reads them (plan_job; frenzy-slurm watch for a move)."""
    env_notes = check_sbatch_env(options.slurm)  # before asking Slurm: a refusal needs no cluster
    env_notes += check_environment(job.spec, job.path.parent, options.env_check)  # the job's Python finds torch...
    view = backend.load()
    check_site_types(view, site.config, view_source(backend, view), site_name(site))  # never plan on what is left
    # the QOS the job will run under (-q, model.yaml's slurm.qos, sbatch's SBATCH_QOS, else the default) limits
    # its GPUs; Slurm's --test-only ignores those limits, so HAS plans within them (has/qos.py)
    view = view.model_copy(update={"qos": backend.qos_limits(options.slurm.qos or os.environ.get("SBATCH_QOS"))})
    site_cfg, applied = calibrate(job, site, options)
    return Prepared(
        view=view,
        site=site_cfg,
        applied=applied,
        workload=workload_from_spec(job.spec, job.model, device=site_cfg.device),  # what the ranks compute on
        requirements=Requirements.from_spec(job.spec, slurm=options.slurm),
        now=options.now if options.now is not None else time.time(),
        env_notes=tuple(env_notes),
    )


def plan_job(job: JobFile, site: SiteFile, backend: SlurmBackend, options: PlanOptions) -> JobRequest:
    """The one planning path: the final request for `job` on the cluster `backend` shows."""
    ready = prepare(job, site, backend, options)
    slurm, extra_notes = options.slurm, []
    space = search_space_from_spec(job.spec)
    if slurm.replan:  # its shapes (render/shapes.py) are one partition's GPUs each: scontrol update changes one
        if job.spec.parallel.heterogeneous:
            raise InputError(
                "slurm.replan (fsbatch --replan) with parallel.heterogeneous: a job changed while it waits runs on "
                "one partition's GPUs, not a pipeline across GPU types; drop one of them"
            )
        space = replace(space, heterogeneous=False)
    inputs = (ready.requirements, ready.workload, space, ready.view, ready.site, start_estimator(backend), ready.now)
    if slurm.preemptible:
        if ready.site.preemption is None:
            where = f"site file {site.path}" if site.path is not None else "the site file"
            raise InputError(
                f"slurm.preemptible (fsbatch --preemptible): {where} names no preemptible QOS (preemption: qos: ...), "
                "so this site has none frenzy-slurm knows of. Ask the site's admins (docs/admin.md, "
                '"Preemptible jobs"), or drop --preemptible.'
            )
        found = decide_preemptible(*inputs)
        decision = found.decision
        if found.qos is not None:  # the #SBATCH --qos line (the options' validator refuses qos with preemptible)
            slurm = slurm.model_copy(update={"qos": found.qos})
        else:
            extra_notes.append(found.note or "")
    else:
        decision = decide_job(*inputs)
    if slurm.oom_retry:  # where a run that runs out of memory anyway is submitted again (has/fallback.py)
        decision = with_fallbacks(job, ready, space, decision)
    return finish(job, site, options, ready, decision, slurm, tuple(extra_notes))


def with_fallbacks(job: JobFile, ready: Prepared, space: SearchSpace, decision: Decision) -> Decision:
    """The decision with the plans a run that runs out of memory is submitted again on (runtime/oom_retry.py)."""
    universal = job.spec.entry.trainer == "builtin"  # the built-in trainer converts DeepSpeed's checkpoints
    r = ready
    fallbacks = oom_fallbacks(decision, r.requirements, r.workload, space, r.view, r.site, r.now, universal)
    return decision.model_copy(update={"oom_fallbacks": fallbacks})


def finish(
    job: JobFile,
    site: SiteFile,
    options: PlanOptions,
    ready: Prepared,
    decision: Decision,
    slurm: SlurmOptions,
    extra_notes: tuple[str, ...] = (),
    moved_from: MovedFrom | None = None,
) -> JobRequest:
    """The request for a decision: the job directory chosen and its files rendered (`slurm`: the sbatch options
    with the QOS the decision chose; `moved_from`: the job this one continues, for a move)."""
    submission = submission_of(job, options)
    job_dir, earlier = choose_job_dir(job, submission, options)
    calibration = job_record(ready.applied, site.config, ready.workload, decision, job.spec.training.global_batch)
    shared = ready.site.job_dirs_group_readable
    rendered = render_job(
        job.spec,
        job.path,
        job.model,
        decision,
        slurm,
        job_dir,
        options.templates,
        group_readable=shared,
        calibration=calibration,
        moved_from=moved_from,
        user_options=options.slurm,
    )
    notes = plan_notes(site, ready.view, ready.requirements, decision) + extra_notes + ready.env_notes
    return request_of(rendered, force=options.force, earlier_job_dir=earlier, group_readable=shared, notes=notes)


def site_name(site: SiteFile) -> str:
    return f"site file {site.path}" if site.path is not None else "the site file"


def view_source(backend: SlurmBackend, view: ClusterView) -> str:
    """Where the cluster view came from, as messages name it: the snapshot file, or the live cluster."""
    if backend.snapshot is not None:
        return f"snapshot {backend.snapshot}"
    return f"Slurm cluster {view.cluster}" if view.cluster else "the Slurm cluster"


def site_notes(site: SiteFile, view: ClusterView) -> list[str]:
    """A line for each pool of the site file whose partition Slurm does not have, for each partition of untyped
    GPUs the site file maps to no model, and for each GRES type it does not describe on a partition it describes
    (fsbatch and fsinfo say so)."""
    notes = missing_partition_notes(view, site.config, site_name(site)) + unmapped_untyped_notes(view, site.config)
    return notes + undescribed_type_notes(view, site.config)


def plan_notes(site: SiteFile, view: ClusterView, requirements: Requirements, decision: Decision) -> tuple[str, ...]:
    """What the user is told beside the plan: site pools Slurm does not have, limits.gpu_types models this cluster
    lacks, a --time shorter than the predicted run."""
    notes = site_notes(site, view) + check_gpu_types(requirements, view, site.config)
    if (waits := qos_wait_note(view, decision.chosen)) is not None:
        notes.append(waits)
    if (short := short_time_note(requirements, decision.chosen)) is not None:
        notes.append(short)
    return tuple(notes)


def request_of(
    rendered: Rendered,
    force: bool = False,
    earlier_job_dir: Path | None = None,
    group_readable: bool = False,
    notes: tuple[str, ...] = (),
) -> JobRequest:
    """The frozen request of rendered files."""
    return JobRequest(
        job_dir=rendered.job_dir,
        submission=rendered.submission,
        files=MappingProxyType(dict(rendered.files)),
        plan=rendered.plan,
        kind=rendered.kind,
        name=rendered.name,
        entry_script=rendered.entry_script,
        force=force,
        earlier_job_dir=earlier_job_dir,
        group_readable=group_readable,
        notes=notes,
    )
