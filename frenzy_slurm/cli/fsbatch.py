"""`fsbatch`: plan and submit a training job without choosing GPUs.

    fsbatch examples/tiny-cpu.yaml --site site_configs/devcluster.yaml [--dry-run] [--explain] [--json]

    fsbatch model.yaml --set training.learning_rate=1e-4,3e-4 [--max-running N] [--wait]   # a sweep: one job per value

Validates model.yaml, predicts memory per plan (MARP), reads the cluster, picks the allocation that
finishes soonest (HAS), renders job.sbatch / ds_config.json / plan.json and submits with sbatch.
sbatch-style flags (-A, -q, -t, -C, --exclusive, --preemptible, --replan, --mail-*, -J, -o, -e, -d, --sbatch FLAG)
override model.yaml.
The work is frenzy_slurm.api's (plan_jobs, submit, Job.wait), which the Python API offers too; this module
parses flags and prints.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frenzy_slurm.api import summary_line
from frenzy_slurm.cli.common import (
    QuietPipeCommand,
    cluster_options,
    echo,
    print_json,
    reports_errors,
    table,
    unchecked_file,
)
from frenzy_slurm.cli.plan_view import factory_note, hms
from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.core.units import fmt_gib
from frenzy_slurm.core.version import __version__
from frenzy_slurm.jobspec.sweeps import MAX_COMBINATIONS

if TYPE_CHECKING:  # planning is imported when the command runs
    from frenzy_slurm.api import Job, Plan
    from frenzy_slurm.has.model import Allocation, Decision
    from frenzy_slurm.planning import JobRequest
    from frenzy_slurm.submission import Submitted


def explain_rows(decision: Decision) -> tuple[list[str], list[list[str]]]:
    now = decision.decided_at

    def row(mark: str, a: Allocation | None, why: str) -> list[str]:
        if a is None:
            return [mark, "-", "-", "-", "-", "-", "-", why]
        mem = " + ".join(
            f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" + (" (cache capped)" if c.capped_gib > 0 else "")
            for c in a.components
        )
        start = "now" if a.start_source == "now" else f"+{hms(a.start - now)} ({a.start_source})"
        return [mark, a.label(), a.plan.short(), mem, start, hms(a.run_time_s), f"+{hms(a.completion - now)}", why]

    rows = [row("*", decision.chosen, "chosen: earliest completion")]
    for alt in decision.alternatives:
        rows.append(
            row(
                " ",
                alt.allocation,
                f"{alt.description}: {alt.lost_because}" if alt.allocation is None else alt.lost_because,
            )
        )
    for f in decision.oom_fallbacks:  # where a run out of memory is submitted again (docs/runtime.md "Out of memory")
        resumes = "continues its checkpoint" if f.resumes else "restarts (before its first checkpoint)"
        why = f"if out of memory: fits predictions x{f.memory_factor:.3g}; {resumes}"
        rows.append(row("!", f.allocation, why))
    header = ["", "allocation", "plan", "memory/GPU used/usable", "start", "run time", "completion", "why"]
    return header, rows


def _print_parsable(req: JobRequest, done: Submitted | None) -> None:
    """--parsable: stdout holds only `JOBID` or `JOBID;CLUSTER`, as sbatch --parsable prints; the summary goes to
    stderr. A dry run prints nothing on stdout and exits 0, as `sbatch --test-only --parsable` does (its answer
    is on stderr), so `jobid=$(fsbatch --parsable ...)` is empty exactly when nothing was submitted."""
    echo(summary_line(req), err=True)
    if done is None:
        echo(f"fsbatch: --dry-run: nothing submitted (job directory would be {req.job_dir})", err=True)
        return
    echo(f"{done.job_id};{done.cluster}" if done.cluster else str(done.job_id))


@click.command(cls=QuietPipeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_yaml", type=unchecked_file)
@click.option("--dry-run", is_flag=True, help="Do everything but submit: print the script that would run.")
@click.option(
    "--explain", is_flag=True, help="Show the chosen allocation beside the best alternatives and why they lost."
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--parsable",
    is_flag=True,
    help="As sbatch --parsable: print only JOBID (or JOBID;CLUSTER) on stdout; with --dry-run, nothing.",
)
@cluster_options
@click.option(
    "--job-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Job directory (default: $FRENZY_JOBS_DIR or ./frenzy-jobs, /<name>-<hash>).",
)
@click.option(
    "--templates",
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of templates overriding the shipped ones.",
)
@click.option(
    "--trace-factory",
    is_flag=True,
    help="Import and call model.factory on this machine to count its parameters exactly. This RUNS ARBITRARY "
    "CODE (the module's and the function's) as you: only your own files, or the site's trusted_factories.",
)
@click.option("--force", is_flag=True, help="Submit even if this submission already has a job.")
@click.option(
    "--no-calibration",
    is_flag=True,
    help="Plan with raw predictions, ignoring the site's calibration file (frenzy-slurm calibrate).",
)
@click.option(
    "--no-env-check",
    is_flag=True,
    help="Do not check that the job's Python finds the framework's packages (torch, deepspeed, ...; "
    "docs/runtime.md). Without it a missing one refuses the submission (exit 2), and is a note under --dry-run.",
)
@click.option("-A", "--account", help="sbatch --account.")
@click.option("-q", "--qos", help="sbatch --qos.")
@click.option("-t", "--time", "time_", help="sbatch --time (default: predicted run time + 25% + 10 min).")
@click.option("-C", "--constraint", help="sbatch --constraint.")
@click.option("--exclusive", is_flag=True, default=None, help="sbatch --exclusive.")
@click.option(
    "--preemptible",
    is_flag=True,
    default=None,
    help="Run in the site's preemptible QOS: other jobs may preempt it (it checkpoints, requeues and resumes); "
    "HAS may give it more of a pool.",
)
@click.option(
    "--oom-retry/--no-oom-retry",
    default=None,
    help="Whether a run that ends out of memory is submitted again once, with more memory headroom, from its "
    "last checkpoint (default: model.yaml's slurm.oom_retry, on).",
)
@click.option(
    "--replan",
    is_flag=True,
    default=None,
    help="Let `frenzy-slurm watch` change the job's partition, nodes and GPUs per node while it waits, keeping its "
    "place in the queue (model.yaml's slurm.replan; built-in trainer, homogeneous jobs).",
)
@click.option("--mail-type", help="sbatch --mail-type.")
@click.option("--mail-user", help="sbatch --mail-user.")
@click.option("-J", "--job-name", help="sbatch --job-name (default: model.yaml's name).")
@click.option("-o", "--output", help="sbatch --output (default: JOBDIR/slurm-%j.out).")
@click.option("-e", "--error", help="sbatch --error.")
@click.option(
    "-d",
    "--dependency",
    help="sbatch --dependency, checked first: afterok:JOBID[:JOBID...], afterany, afternotok, aftercorr, "
    "after:JOBID[+MIN], singleton; joined by ',' (all) or '?' (any). The jobs must be known to Slurm.",
)
@click.option(
    "--sbatch",
    "extra",
    multiple=True,
    metavar="FLAG",
    help="Any other sbatch flag, e.g. --sbatch=--reservation=big (repeatable).",
)
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=V[,V...]",
    help="Override a model.yaml value by its dotted path (--set training.learning_rate=1e-4); several values "
    f"sweep: one job per combination of all --set values (at most {MAX_COMBINATIONS}), each its own name and "
    "directory (repeatable).",
)
@click.option(
    "--max-running",
    type=int,
    metavar="N",
    help="With a --set sweep: at most N of its jobs run at once (job i starts after job i-N ends, Slurm's "
    "afterany; as submitit's slurm_array_parallelism).",
)
@click.option(
    "--wait",
    is_flag=True,
    help="As sbatch --wait: return when the job (every job of a sweep) has ended, with its exit code (0 only "
    "for COMPLETED). Ctrl-C stops waiting, not the job.",
)
@click.version_option(__version__, prog_name="fsbatch")
@reports_errors("fsbatch", json_errors=True)
def main(
    model_yaml: Path,
    dry_run: bool,
    explain: bool,
    as_json: bool,
    parsable: bool,
    backend: str,
    snapshot: Path | None,
    site: Path | None,
    job_dir: Path | None,
    templates: Path | None,
    trace_factory: bool,
    force: bool,
    no_calibration: bool,
    no_env_check: bool,
    account: str | None,
    qos: str | None,
    time_: str | None,
    constraint: str | None,
    exclusive: bool | None,
    preemptible: bool | None,
    oom_retry: bool | None,
    replan: bool | None,
    mail_type: str | None,
    mail_user: str | None,
    job_name: str | None,
    output: str | None,
    error: str | None,
    dependency: str | None,
    extra: tuple[str, ...],
    settings: tuple[str, ...],
    max_running: int | None,
    wait: bool,
) -> None:
    """Plan the training job in MODEL_YAML and submit it to Slurm."""
    from contextlib import ExitStack

    from frenzy_slurm.api import plan_jobs
    from frenzy_slurm.jobspec.sweeps import combinations, parse_set

    _check_output_flags(parsable, as_json, explain, wait, dry_run)
    combos = combinations(parse_set(settings))
    # fsbatch's flags override model.yaml's slurm: block; one options model for both (api.SLURM_FLAGS)
    flags = {
        "account": account,
        "qos": qos,
        "time": time_,
        "constraint": constraint,
        "exclusive": exclusive,
        "preemptible": preemptible,
        "oom_retry": oom_retry,
        "replan": replan,
        "mail_type": mail_type,
        "mail_user": mail_user,
        "output": output,
        "error": error,
        "job_name": job_name,
        "dependency": dependency,
        "extra": list(extra),
    }
    # Concurrent --force runs of one submission take turns from choosing the directory to submitting, so each
    # sees the directory the other took (both used to choose NAME.2, and the second was told to use --force).
    with ExitStack() as turns:
        plans = plan_jobs(
            model_yaml,
            combos,
            site=site,
            backend=backend,
            snapshot=snapshot,
            slurm=flags,
            job_dir=job_dir,
            templates=templates,
            calibration=not no_calibration,
            env_check="off" if no_env_check else "note" if dry_run else "refuse",
            force=force,
            trace_factory=trace_factory,
            turns=None if dry_run else turns,
            max_running=max_running,
        )
        # on stderr, so --json and the summary stay parseable; before submitting, so a refused sbatch keeps them
        for p in plans:
            for line in p.notes:
                echo(f"fsbatch: note: {p.name + ': ' if p.label else ''}{line}", err=True)
        jobs: list[Job | None] = [None] * len(plans) if dry_run else _submit_all(plans)
    if as_json and len(plans) > 1:  # a sweep's --json: one list
        print_json([_json(p, job, dry_run) for p, job in zip(plans, jobs, strict=True)])
    else:
        for p, job in zip(plans, jobs, strict=True):
            _report(p, job, dry_run, as_json, parsable, explain)
    if wait:
        sys.exit(_wait_all([j for j in jobs if j is not None], as_json, parsable))


def _check_output_flags(parsable: bool, as_json: bool, explain: bool, wait: bool, dry_run: bool) -> None:
    """Refuse the flags that contradict each other."""

    if parsable and (as_json or explain):
        raise InputError(
            f"--parsable prints only the job id and cannot be combined with {'--json' if as_json else '--explain'}: "
            "drop one of them."
        )
    if wait and dry_run:
        raise InputError("--wait waits for a submitted job; --dry-run submits none: drop one of them.")


def _submit_all(plans: list[Plan]) -> list[Job | None]:
    """Submit each plan in order; where one is refused, the error names the sweep's jobs submitted before it."""
    from frenzy_slurm.api import submit

    jobs: list[Job | None] = [None] * len(plans)
    for i, p in enumerate(plans):
        try:
            jobs[i] = submit(p)
        except FrenzyError as exc:
            if i:  # the sweep's earlier jobs exist: say which, with the reason the rest was not submitted
                done = ", ".join(f"{j.job_id} ({q.name})" for q, j in zip(plans, jobs, strict=False) if j)
                exc.message = f"{p.name}: {exc.message}\nSubmitted before this one: {done}; the rest not."
            raise
    return jobs


def _json(p: Plan, job: Job | None, dry_run: bool) -> dict:
    """One job as --json shows it: the request, whether it was a dry run, and once submitted its job id."""
    result = {**p.as_json(), "dry_run": dry_run}
    if job is not None:
        del result["script"]  # the script was written to the job directory; --dry-run shows it
        result["job_id"] = job.job_id
        if job.submitted is not None and job.submitted.follows is not None:  # the ended job a rerun follows
            result["follows"] = job.submitted.follows.as_json()
        if p.waits_for is not None:  # --max-running: the job id it was submitted to wait for
            from frenzy_slurm.track.jobs import submitted_job_id

            result["waits_for"]["job_id"] = submitted_job_id(p.waits_for.job_dir)
    return result


def _report(p: Plan, job: Job | None, dry_run: bool, as_json: bool, parsable: bool, explain: bool) -> None:
    """What fsbatch prints for one job (a sweep prints this per job, its --json as one list afterwards)."""
    from frenzy_slurm.calibration import explain_lines
    from frenzy_slurm.marp.frameworks import profile_lines

    req = p.request
    if parsable:
        _print_parsable(req, None if job is None else job.submitted)
        return
    if as_json:
        print_json(_json(p, job, dry_run))
        return
    if p.label:  # a sweep: which combination this is
        echo(f"=== {p.name}: {p.label}")
    echo(summary_line(req))
    if p.chain_line is not None:
        echo(p.chain_line)
    if explain:
        header, rows = explain_rows(req.decision)
        echo(table(rows, header))
        for line in profile_lines(req.plan.spec):  # the framework profile MARP predicted with, its defaults taken
            echo(line)
        if (calibration := req.calibration) is not None:  # plan_job always records one
            for line in explain_lines(calibration):
                echo(line)
        if p.model is not None and (note := factory_note(req.plan.spec, p.model)) is not None:
            echo(note)
    if job is None:
        echo(f"--- {req.job_dir}/job.sbatch (not submitted) ---")
        echo(req.script, nl=False)
        return
    echo(f"Submitted batch job {job.job_id} (job directory {req.job_dir})")
    follows = job.submitted.follows if job.submitted is not None else None
    if follows is not None:
        echo(f"It follows job {follows.job_id} ({follows.state}, job directory {follows.job_dir}).")
    if req.earlier_job_dir is not None:
        echo(f"The earlier job's directory {req.earlier_job_dir} is kept as it was (--force never touches it).")


def _wait_all(jobs: list[Job], as_json: bool, parsable: bool) -> int:
    """--wait: until every job has ended (one queue query per look for all of them, sbatch's back-off); the
    largest exit code, as sbatch --wait takes the largest over a job's records. On a terminal, stderr shows one
    progress line per job (state, elapsed, step and loss from the trainer's progress.json), redrawn in place;
    elsewhere nothing but the line each ended job gets. Ctrl-C leaves the jobs running and says so (exit 130)."""
    from frenzy_slurm import api
    from frenzy_slurm.slurm.job import ENDED, job_phase
    from frenzy_slurm.track.progress import ProgressDisplay, WaitLines

    out = sys.stderr if as_json or parsable else sys.stdout  # stdout holds only the JSON or the job ids
    display = ProgressDisplay(sys.stderr)
    lines = WaitLines(display)
    codes: dict[int, int] = {}

    def ended(job: Job, state: str) -> None:
        codes[job.job_id] = job.wait_exit_code(state)
        display.message(f"fsbatch: job {job.job_id} ended {state}, exit code {codes[job.job_id]}", to=out)

    def on_look(looked: Sequence[Job]) -> None:
        for j in looked:
            if j.last_look is not None and j.job_id not in codes and job_phase(j.last_look.state) in ENDED:
                ended(j, j.last_look.state)
        lines.update([j for j in looked if j.job_id not in codes])

    try:
        states = api.wait_all(jobs, on_look=on_look, sleep=lambda s: lines.sleep(s, api._sleep))
    except KeyboardInterrupt:
        display.close()
        ids = " ".join(str(j.job_id) for j in jobs)
        echo(
            f"fsbatch: interrupted: stopped waiting; the job(s) keep running (`fsqueue {jobs[0].job_id}` follows, "
            f"`scancel {ids}` cancels)",
            err=True,
        )
        return 130
    display.close()
    for job, state in zip(jobs, states, strict=True):
        if job.job_id not in codes:  # a job Slurm forgot (UNKNOWN)
            ended(job, state)
    return max(codes.values(), default=0)
