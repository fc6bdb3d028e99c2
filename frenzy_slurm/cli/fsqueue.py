"""`fsqueue`: frenzy-slurm jobs, one line each (hetjob components as one job), or one job in detail.

    fsqueue [-u USER | --all] [--json]
    fsqueue JOBID [--json]
    fsqueue JOBID --log [--tail N] [--rank R] [--component C] [--json]
    fsqueue JOBID --log --follow [--tail N] [--rank R] [--component C]

One job-state query per invocation (your jobs, or the one asked about), cached for a few seconds; no
cluster view. A job that has left the queue is read from its job directory, with accounting if the site
keeps it. `--log` prints the job's output file (as its job.sbatch names it) split per rank, grouped by
component, the batch script's own lines first (srun --label marks each rank's lines); bounded reads of
regular files of your own job directory only. `--follow` keeps printing new lines as they are written (a
header where the rank changes, as `tail -f` does between files) until the job ends, then exits with the job's
status as `fsbatch --wait` does (0 for COMPLETED, else the job's exit code, 1 where that is 0 or unknown);
Ctrl-C stops following (exit 130), never the job (frenzy_slurm/follow.py).
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import (
    QuietPipeCommand,
    backend_options,
    echo,
    print_json,
    printable,
    reports_errors,
    table,
)
from frenzy_slurm.errors import InputError
from frenzy_slurm.slurm.timefmt import format_slurm_time as hms

if TYPE_CHECKING:  # track is imported when a command runs
    from frenzy_slurm.slurm import SlurmBackend, SlurmUnavailable
    from frenzy_slurm.track import TrackedJob


def _job_json(t: TrackedJob) -> dict:
    return {
        "job_id": t.job_id,
        "name": t.name,
        "user": t.user,
        "state": t.state,
        "gpus": t.gpus_label,
        "components": [
            {
                "job_id": c.job_id,
                "partition": c.partition,
                "gpu_type": c.gpu_type,
                "gpus": c.gpus,
                "nodes": c.nodes,
                "state": c.state,
            }
            for c in t.components
        ],
        "elapsed_s": t.elapsed_s,
        "predicted_remaining_s": t.predicted_remaining_s,
        "job_dir": str(t.job_dir) if t.job_dir else None,
        "plan": t.plan.decision.chosen.plan.short() if t.plan else None,
        "finished": t.finished,
        "metrics": t.metrics,
        "restarts": t.restarts,
        "last_checkpoint_step": t.last_checkpoint_step,
        "notes": t.notes,
        "recorded": t.recorded,
    }


@click.command(cls=QuietPipeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("jobid", required=False, type=int)
@click.option("-u", "--user", help="Show this user's jobs (default: yours).")
@click.option("--all", "all_users", is_flag=True, help="Show every user's frenzy-slurm jobs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--log", "show_log", is_flag=True, help="JOBID's output, per component and rank.")
@click.option("--tail", type=click.IntRange(min=0), help="With --log: the last N lines of each rank.")
@click.option("--rank", type=click.IntRange(min=0), help="With --log: only this (global) rank.")
@click.option("--component", type=click.IntRange(min=0), help="With --log: only this component's ranks (0, 1, ...).")
@click.option(
    "-f",
    "--follow",
    is_flag=True,
    help="With --log: keep printing new lines until the job ends (then exit with its status, 0 for COMPLETED).",
)
@backend_options
@click.version_option(__version__, prog_name="fsqueue")
@reports_errors("fsqueue", json_errors=True)
def main(
    jobid: int | None,
    user: str | None,
    all_users: bool,
    as_json: bool,
    show_log: bool,
    tail: int | None,
    rank: int | None,
    component: int | None,
    follow: bool,
    backend: str,
    snapshot: Path | None,
) -> None:
    """Track frenzy-slurm jobs: state, GPUs per component, elapsed and predicted remaining time."""
    if (tail is not None or rank is not None or component is not None or follow) and not show_log:
        raise InputError("--tail, --rank, --component and --follow go with --log (fsqueue JOBID --log --tail 20)")
    if follow and as_json:
        raise InputError("--follow prints lines as they are written; --json prints the output once: drop one")
    if show_log and jobid is None:
        raise InputError("--log needs a job: fsqueue JOBID --log")
    from frenzy_slurm.slurm import SlurmUnavailable, open_backend
    from frenzy_slurm.track import comparison, frenzy_jobs, query_jobs_cached

    cluster = open_backend(backend, snapshot)
    unreachable: SlurmUnavailable | None = None
    if jobid is not None:
        try:
            jobs = frenzy_jobs(cluster.jobs(job_ids=[jobid]))  # one query for this job (all its components)
        except SlurmUnavailable as exc:  # the job directory still knows the plan, progress and checkpoints
            jobs, unreachable = [], exc
    else:
        # the plain table shows nothing a job directory holds but the predicted run time: no other file is read
        queue = query_jobs_cached(cluster, None if all_users else (user or getpass.getuser()))
        jobs = frenzy_jobs(queue, files=as_json)
    if jobid is None:
        _print_table(jobs, as_json)
        return
    t = _tracked(jobid, jobs, cluster, unreachable)
    if show_log and follow:
        _follow_logs(t, cluster, tail, rank, component)
    if show_log:
        _print_logs(t, tail, rank, component, as_json)
        return
    if as_json:
        print_json(_job_json(t) | {"comparison": comparison(t), "calibration": t.calibration})
        return
    _print_job(t)


def _print_table(jobs: list[TrackedJob], as_json: bool) -> None:
    """The user's (or everyone's) frenzy-slurm jobs in the queue, one line each."""
    if as_json:
        print_json([_job_json(t) for t in jobs])
        return
    rows = [
        [
            str(t.job_id),
            t.name,
            t.state,
            t.gpus_label,
            hms(t.elapsed_s) if t.elapsed_s is not None else "-",
            hms(t.predicted_remaining_s) if t.predicted_remaining_s is not None else "-",
            str(t.job_dir or "-"),
        ]
        for t in jobs
    ]
    echo(table(rows, ["JOBID", "NAME", "STATE", "GPUS", "ELAPSED", "REMAINING(pred)", "JOBDIR"]))


def _tracked(
    jobid: int, jobs: list[TrackedJob], cluster: SlurmBackend, unreachable: SlurmUnavailable | None
) -> TrackedJob:
    """The job `jobid` names (a component's id names its job): from the queue, else from the job directory that
    records it (what Slurm says of it where Slurm answers); InputError where neither knows it."""
    from frenzy_slurm.track import find_job_dir, from_job_dirs

    t = next((t for t in jobs if t.job_id == jobid or any(c.job_id == jobid for c in t.components)), None)
    if t is None:
        roots = [Path(os.environ.get("FRENZY_JOBS_DIR", "frenzy-jobs")).absolute()]
        job_dir = find_job_dir(jobid, roots)
        if job_dir is None:
            if unreachable is not None:
                raise unreachable
            raise InputError(
                f"job {jobid} is not a frenzy-slurm job in the queue, and no job directory under "
                f"{', '.join(map(str, roots))} records it (set FRENZY_JOBS_DIR)"
            )
        t = from_job_dirs([job_dir], None if unreachable else cluster)[0]
        if unreachable is not None:
            t.notes.insert(
                0,
                f"Slurm did not answer ({unreachable.message.split(': ', 1)[-1]}); shown is what "
                "the job directory records",
            )
    return t


def _print_job(t: TrackedJob) -> None:
    """One job: its plan, components, progress, predictions against measurements, calibration and notes."""
    from frenzy_slurm.track import comparison

    echo(
        f"job {t.job_id} {printable(t.name)}: {t.state}"
        + (f", exit code {t.finished.get('exit_code', '?')}" if t.finished else "")
    )
    if t.plan is not None:
        a = t.plan.decision.chosen
        echo(
            f"  plan: {a.kind} {a.label()} | {a.plan.short()} | predicted step {a.step_time_s:.3g} s, "
            f"run time {hms(a.run_time_s)}"
        )
    for c in t.components:
        echo(
            f"  component {c.display_id}: {c.state} partition={c.partition} {c.gpus}x{c.gpu_type} "
            f"nodes={','.join(c.nodes) or '-'}" + (f" reason={printable(c.reason)}" if c.reason else "")
        )
    if t.elapsed_s is not None:
        echo(f"  elapsed {hms(t.elapsed_s)}, predicted remaining {hms(t.predicted_remaining_s or 0)}")
    echo(f"  job directory: {t.job_dir or '-'}")
    progress = []
    if t.metrics and t.metrics.get("step") is not None:
        progress.append(f"step {t.metrics['step']}/{t.metrics.get('total_steps', '?')} (metrics.json)")
    if t.last_checkpoint_step is not None:
        progress.append(f"last checkpoint at step {t.last_checkpoint_step}")
    if t.restarts is not None:
        progress.append(f"restarts {t.restarts}")
    if progress:
        echo("  " + ", ".join(progress))
    compared = comparison(t)
    if compared:
        from frenzy_slurm.cli.plan_view import fmt_gib  # planning's modules: only where a comparison is shown

        def show(value: float | None, unit: str) -> str:
            if value is None:
                return "-"
            return fmt_gib(value) if unit == "GiB" else f"{value:.3g} {unit}"

        out = [
            [
                r["what"],
                show(r.get("raw_predicted"), r["unit"]),
                show(r["predicted"], r["unit"]),
                show(r["measured"], r["unit"]),
                f"{1 - abs(r['predicted'] - r['measured']) / r['measured']:.0%}"
                if r["predicted"] and r["measured"]
                else "-",
            ]
            for r in compared
        ]
        echo(table(out, ["predicted vs measured", "raw", "predicted", "measured", "accuracy"]))
    if t.calibration is not None:
        from frenzy_slurm.calibration import explain_lines

        for line in explain_lines(t.calibration):
            echo(f"  {line}")
    for n in t.notes:
        echo(f"  note: {n}")


def _print_logs(t: TrackedJob, tail: int | None, rank: int | None, component: int | None, as_json: bool) -> None:
    """fsqueue JOBID --log: each section under a header, or one JSON object (paths, lines, notes)."""
    from frenzy_slurm.track import tracked_logs

    logs = tracked_logs(t, tail=tail, rank=rank, component=component)
    if as_json:
        print_json(logs.as_json() | {"state": t.state})
        return
    echo(f"job {t.job_id} {printable(t.name)}: {t.state}; output {', '.join(map(str, logs.files)) or '-'}")
    for s in logs.sections:
        echo(f"==> {s.title} <==")
        for line in s.lines:
            echo(printable(line.replace("\t", "    ")))
    for n in logs.notes:
        echo(f"note: {n}", err=True)


def _follow_logs(
    t: TrackedJob, cluster: SlurmBackend, tail: int | None, rank: int | None, component: int | None
) -> None:
    """fsqueue JOBID --log --follow: what --log prints, then each new line as it is written (a section header
    where the rank changes), until the job ends: exits with the job's status (sys.exit), 130 on Ctrl-C."""
    import sys

    from frenzy_slurm.api import Job
    from frenzy_slurm.follow import OutputReader, follow_job
    from frenzy_slurm.track import group_lines, own_job_dir

    reader = OutputReader(own_job_dir(t), t.job_id, rank, component, t.name)
    job = Job(t.job_id, own_job_dir(t), cluster)
    current = None  # the section whose lines are being printed

    def emit(lines: list[tuple[int | None, str]]) -> None:
        nonlocal current
        for r, text in lines:
            if reader.title(r) != current:
                current = reader.title(r)
                echo(f"==> {current} <==")
            echo(printable(text.replace("\t", "    ")))

    try:
        first = reader.poll()
        echo(f"job {t.job_id} {printable(t.name)}: {t.state}; output {', '.join(map(str, reader.files)) or '-'}")
        for s in group_lines(first, reader.ranks, rank, component) if reader.files else []:
            current = s.title
            echo(f"==> {current} <==")
            for line in s.lines if tail is None else s.lines[-tail:] if tail > 0 else []:
                echo(printable(line.replace("\t", "    ")))
        if not reader.files:
            echo(f"fsqueue: job {t.job_id} is {t.state}; waiting for its output (Ctrl-C stops)", err=True)
        state = follow_job(job, reader, emit, state=t.state)
    except KeyboardInterrupt:  # as tail -f: Ctrl-C ends the follow quietly; the job runs on
        sys.exit(130)
    if not reader.files:
        reader.notes.append("the job wrote no output file (it never started, or Slurm writes it elsewhere)")
    for n in reader.notes:
        echo(f"note: {n}", err=True)
    code = job.wait_exit_code(state)
    echo(f"fsqueue: job {t.job_id} ended {state}, exit code {code}", err=True)
    sys.exit(code)
