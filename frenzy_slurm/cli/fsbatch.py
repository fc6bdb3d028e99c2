"""`fsbatch`: plan and submit a training job without choosing GPUs.

    fsbatch examples/tiny-cpu.yaml --site site_configs/devcluster.yaml [--dry-run] [--explain] [--json]

Validates model.yaml, predicts memory per plan (MARP), reads the cluster, picks the allocation that
finishes soonest (HAS), renders job.sbatch / ds_config.json / plan.json and submits with sbatch.
sbatch-style flags (-A, -q, -t, -C, --exclusive, --mail-*, -J, -o, -e, --sbatch FLAG) override model.yaml.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import cluster_options, existing_file, print_json, reports_errors, table
from frenzy_slurm.cli.plan_view import factory_note, fmt_gib, hms, load
from frenzy_slurm.errors import InputError


def explain_rows(decision) -> tuple[list[str], list[list[str]]]:
    now = decision.decided_at

    def row(mark: str, a, why: str) -> list[str]:
        if a is None:
            return [mark, "-", "-", "-", "-", "-", "-", why]
        mem = " + ".join(f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" for c in a.components)
        start = "now" if a.start_source == "now" else f"+{hms(a.start - now)} ({a.start_source})"
        return [mark, a.label(), a.plan.short(), mem, start, hms(a.run_time_s), f"+{hms(a.completion - now)}", why]

    rows = [row("*", decision.chosen, "chosen: earliest completion")]
    for alt in decision.alternatives:
        rows.append(row(" ", alt.allocation, f"{alt.description}: {alt.lost_because}" if alt.allocation is None
                        else alt.lost_because))
    header = ["", "allocation", "plan", "memory/GPU used/usable", "start", "run time", "completion", "why"]
    return header, rows


def _force_turn(submission: str, force: bool):
    """The lock that serialises `--force` runs of one submission (nothing for any other run)."""
    from contextlib import nullcontext

    from frenzy_slurm.submit.jobdir import user_lock

    return user_lock(f"{submission}-force") if force else nullcontext()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_yaml", type=existing_file)
@click.option("--dry-run", is_flag=True, help="Do everything but submit: print the script that would run.")
@click.option("--explain", is_flag=True, help="Show the chosen allocation beside the best alternatives and why they lost.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@cluster_options
@click.option("--job-dir", type=click.Path(file_okay=False, path_type=Path), help="Job directory (default: $FRENZY_JOBS_DIR or ./frenzy-jobs, /<name>-<hash>).")
@click.option("--templates", type=click.Path(file_okay=False, path_type=Path), help="Directory of templates overriding the shipped ones.")
@click.option("--trace-factory", is_flag=True,
              help="Import and call model.factory on this machine to count its parameters exactly. This RUNS ARBITRARY "
                   "CODE (the module's and the function's) as you: only your own files, or the site's trusted_factories.")
@click.option("--force", is_flag=True, help="Submit even if this submission already has a job.")
@click.option("--no-calibration", is_flag=True,
              help="Plan with raw predictions, ignoring the site's calibration file (frenzy-slurm calibrate).")
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
@click.option("--sbatch", "extra", multiple=True, metavar="FLAG", help="Any other sbatch flag, e.g. --sbatch=--reservation=big (repeatable).")
@click.version_option(__version__, prog_name="fsbatch")
@reports_errors("fsbatch")
def main(model_yaml: Path, dry_run: bool, explain: bool, as_json: bool, backend: str, snapshot: Path | None,
         site: Path | None, job_dir: Path | None, templates: Path | None, trace_factory: bool, force: bool, no_calibration: bool, account, qos, time_, constraint,
         exclusive, mail_type, mail_user, job_name, output, error, extra) -> None:
    """Plan the training job in MODEL_YAML and submit it to Slurm."""
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.calibration import explain_lines, for_job, job_record
    from frenzy_slurm.cluster.site_tools import find_site, maybe_load_site
    from frenzy_slurm.has import Requirements, decide
    from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
    from frenzy_slurm.render import render_job

    spec, model = load(model_yaml, trace=trace_factory, site=site)
    site_cfg = maybe_load_site(site)
    if site_cfg is None:
        raise InputError("no site file: pass --site FILE or set FRENZY_SITE (write one with `frenzy-slurm site init`).")
    # fsbatch's flags override model.yaml's slurm: block; one options model for both
    options = spec.slurm.overridden(account=account, qos=qos, time=time_, constraint=constraint, exclusive=exclusive,
                                    mail_type=mail_type, mail_user=mail_user, output=output, error=error,
                                    job_name=job_name, extra=list(extra))
    cluster = open_backend(backend, snapshot)
    view = cluster.load()
    w = workload_from_spec(spec, model)
    # calibration: one explicit step; MARP and HAS then see the calibrated site file
    raw_site = site_cfg
    site_cfg, applied = for_job(site_cfg, find_site(site), spec.training.precision, spec.training.method,
                                enabled=not no_calibration)
    decision = decide(Requirements.from_spec(spec, time=options.time), w, view, site_cfg, search_space_from_spec(spec),
                      backend=None if cluster.name == "static" else cluster, now=time.time())
    shared = site_cfg.job_dirs_group_readable  # the site may let the user's group read job directories
    req = render_job(spec, model_yaml, model, w, decision, options, job_dir, templates, group_readable=shared)
    # Concurrent --force runs of one submission take turns from choosing the directory to submitting, so each
    # sees the directory the other took (both used to choose NAME.2, and the second was told to use --force).
    with _force_turn(req.submission, force and not dry_run):
        kept: Path | None = None
        if force and not dry_run:
            from frenzy_slurm.submit.jobdir import job_outputs, next_free_dir

            if job_outputs(req.job_dir):  # an earlier job's directory is never reused: plan into a fresh one
                kept = req.job_dir
                req = render_job(spec, model_yaml, model, w, decision, options, next_free_dir(req.job_dir), templates,
                                 group_readable=shared)
        calibration = job_record(applied, raw_site, w, decision, spec.training.global_batch)
        req.files["calibration.json"] = json.dumps(calibration, indent=2) + "\n"  # fsqueue JOBID shows it
        chosen = decision.chosen
        memory = " + ".join(f"{fmt_gib(c.peak_gib)}/{fmt_gib(c.capacity_gib)}" for c in chosen.components)
        start = "now" if chosen.start_source == "now" else hms(chosen.start - decision.decided_at) + " from now"
        summary = (f"{spec.name}: {chosen.kind} {chosen.label()}, plan {chosen.plan.short()}, {memory} per GPU, "
                   f"start {start}, "
                   f"run time {hms(chosen.run_time_s)} (decided in {decision.decision_ms:.0f} ms)")
        result: dict = {"job": spec.name, "submission": req.submission, "job_dir": str(req.job_dir), "dry_run": dry_run,
                        "decision": json.loads(decision.model_dump_json()),
                        "user_code_ran": model.exact_params is not None, "calibration": calibration}
        if kept is not None:
            result["earlier_job_dir"] = str(kept)  # --force planned into a fresh directory; this one is untouched
        if not dry_run:
            from frenzy_slurm.submit import submit

            done = submit(req, cluster, force=force, group_readable=shared)
            result["job_id"] = done.job_id
    if as_json:
        if dry_run:
            result["script"] = req.script
        print_json(result)
        return
    click.echo(summary)
    if explain:
        header, rows = explain_rows(decision)
        click.echo(table(rows, header))
        for line in explain_lines(calibration):
            click.echo(line)
        if (note := factory_note(spec, model)) is not None:
            click.echo(note)
    if dry_run:
        click.echo(f"--- {req.job_dir}/job.sbatch (not submitted) ---")
        click.echo(req.script, nl=False)
    else:
        click.echo(f"Submitted batch job {result['job_id']} (job directory {req.job_dir})")
        if kept is not None:
            click.echo(f"The earlier job's directory {kept} is kept as it was (--force never touches it).")
