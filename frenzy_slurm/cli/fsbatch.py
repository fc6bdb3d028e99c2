"""`fsbatch`: plan and submit a training job without choosing GPUs.

    fsbatch examples/tiny-cpu.yaml --site site_configs/devcluster.yaml [--dry-run] [--explain] [--json]

Validates model.yaml, predicts memory per plan (MARP), reads the cluster, picks the allocation that
finishes soonest (HAS), renders job.sbatch / ds_config.json / plan.json and submits with sbatch.
sbatch-style flags (-A, -q, -t, -C, --exclusive, --mail-*, -J, -o, -e, --sbatch FLAG) override model.yaml.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import cluster_options, print_json, reports_errors, table, unchecked_file
from frenzy_slurm.cli.plan_view import factory_note, fmt_gib, hms

if TYPE_CHECKING:  # planning is imported when the command runs
    from frenzy_slurm.has.model import Allocation, Decision
    from frenzy_slurm.planning import JobRequest
    from frenzy_slurm.submit import Submitted


def explain_rows(decision: Decision) -> tuple[list[str], list[list[str]]]:
    now = decision.decided_at

    def row(mark: str, a: Allocation | None, why: str) -> list[str]:
        if a is None:
            return [mark, "-", "-", "-", "-", "-", "-", why]
        mem = " + ".join(f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" for c in a.components)
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
    header = ["", "allocation", "plan", "memory/GPU used/usable", "start", "run time", "completion", "why"]
    return header, rows


def summary_line(req: JobRequest) -> str:
    """One line: the chosen allocation, plan, memory per GPU, start and run time."""
    decision = req.decision
    chosen = decision.chosen
    memory = " + ".join(f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" for c in chosen.components)
    start = "now" if chosen.start_source == "now" else hms(chosen.start - decision.decided_at) + " from now"
    return (
        f"{req.plan.spec.name}: {chosen.kind} {chosen.label()}, plan {chosen.plan.short()}, {memory} per GPU, "
        f"start {start}, run time {hms(chosen.run_time_s)} (decided in {decision.decision_ms:.0f} ms)"
    )


def _force_turn(submission: str, force: bool) -> AbstractContextManager[object]:
    """The lock that serialises `--force` runs of one submission (nothing for any other run)."""
    from contextlib import nullcontext

    from frenzy_slurm.submit.jobdir import user_lock

    return user_lock(f"{submission}-force") if force else nullcontext()


def _print_parsable(req: JobRequest, done: Submitted | None) -> None:
    """--parsable: stdout holds only `JOBID` or `JOBID;CLUSTER`, as sbatch --parsable prints; the summary goes to
    stderr. A dry run prints nothing on stdout and exits 0, as `sbatch --test-only --parsable` does (its answer
    is on stderr), so `jobid=$(fsbatch --parsable ...)` is empty exactly when nothing was submitted."""
    click.echo(summary_line(req), err=True)
    if done is None:
        click.echo(f"fsbatch: --dry-run: nothing submitted (job directory would be {req.job_dir})", err=True)
        return
    click.echo(f"{done.job_id};{done.cluster}" if done.cluster else str(done.job_id))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("-A", "--account", help="sbatch --account.")
@click.option("-q", "--qos", help="sbatch --qos.")
@click.option("-t", "--time", "time_", help="sbatch --time (default: predicted run time + 25% + 10 min).")
@click.option("-C", "--constraint", help="sbatch --constraint.")
@click.option("--exclusive", is_flag=True, default=None, help="sbatch --exclusive.")
@click.option("--mail-type", help="sbatch --mail-type.")
@click.option("--mail-user", help="sbatch --mail-user.")
@click.option("-J", "--job-name", help="sbatch --job-name (default: model.yaml's name).")
@click.option("-o", "--output", help="sbatch --output (default: JOBDIR/slurm-%j.out).")
@click.option("-e", "--error", help="sbatch --error.")
@click.option(
    "--sbatch",
    "extra",
    multiple=True,
    metavar="FLAG",
    help="Any other sbatch flag, e.g. --sbatch=--reservation=big (repeatable).",
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
    account: str | None,
    qos: str | None,
    time_: str | None,
    constraint: str | None,
    exclusive: bool | None,
    mail_type: str | None,
    mail_user: str | None,
    job_name: str | None,
    output: str | None,
    error: str | None,
    extra: tuple[str, ...],
) -> None:
    """Plan the training job in MODEL_YAML and submit it to Slurm."""
    from frenzy_slurm.calibration import explain_lines
    from frenzy_slurm.errors import InputError
    from frenzy_slurm.planning import PlanOptions, find_site_file, load_job, plan_job, submission_of, traced
    from frenzy_slurm.slurm import open_backend

    if parsable and (as_json or explain):
        raise InputError(
            f"--parsable prints only the job id and cannot be combined with {'--json' if as_json else '--explain'}: "
            "drop one of them."
        )
    job = load_job(model_yaml)
    site_file = find_site_file(site)
    if trace_factory:
        job = traced(job, site_file)
    spec = job.spec
    # fsbatch's flags override model.yaml's slurm: block; one options model for both
    slurm = spec.slurm.overridden(
        account=account,
        qos=qos,
        time=time_,
        constraint=constraint,
        exclusive=exclusive,
        mail_type=mail_type,
        mail_user=mail_user,
        output=output,
        error=error,
        job_name=job_name,
        extra=list(extra),
    )
    options = PlanOptions(
        slurm=slurm, job_dir=job_dir, templates=templates, calibration=not no_calibration, force=force
    )
    cluster = open_backend(backend, snapshot)
    # Concurrent --force runs of one submission take turns from choosing the directory to submitting, so each
    # sees the directory the other took (both used to choose NAME.2, and the second was told to use --force).
    with _force_turn(submission_of(job, options), force and not dry_run):
        req = plan_job(job, site_file, cluster, options)
        # on stderr, so --json and the summary stay parseable; before submitting, so a refused sbatch keeps them
        for line in req.notes:
            click.echo(f"fsbatch: note: {line}", err=True)
        if not dry_run:
            from frenzy_slurm.submit import submit

            done = submit(req, cluster)
    if parsable:
        _print_parsable(req, None if dry_run else done)
        return
    if as_json:
        result = {**req.as_json(), "dry_run": dry_run}
        if not dry_run:
            del result["script"]  # the script was written to the job directory; --dry-run shows it
            result["job_id"] = done.job_id
        print_json(result)
        return
    click.echo(summary_line(req))
    if explain:
        header, rows = explain_rows(req.decision)
        click.echo(table(rows, header))
        if (calibration := req.calibration) is not None:  # plan_job always records one
            for line in explain_lines(calibration):
                click.echo(line)
        if (note := factory_note(spec, job.model)) is not None:
            click.echo(note)
    if dry_run:
        click.echo(f"--- {req.job_dir}/job.sbatch (not submitted) ---")
        click.echo(req.script, nl=False)
    else:
        click.echo(f"Submitted batch job {done.job_id} (job directory {req.job_dir})")
        if req.earlier_job_dir is not None:
            click.echo(
                f"The earlier job's directory {req.earlier_job_dir} is kept as it was (--force never touches it)."
            )
