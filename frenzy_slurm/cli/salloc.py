"""`frenzy-slurm salloc MODEL_YAML [-- COMMAND...]`: an interactive allocation of the shape fsbatch would plan.

Plans through fsbatch's path (api.plan_jobs: planning.plan_job and its JobRequest), writes the job directory,
then replaces itself by `salloc` with the planned partition, nodes, GRES, CPUs and time limit (a hetjob plan
as salloc's `:`-separated components). In the allocation, `bash $FRENZY_JOB_DIR/job.sbatch` runs the planned
job; a COMMAND after `--` runs instead of the shell, as `salloc OPTIONS COMMAND` does. `--dry-run` prints the
salloc command line and writes nothing.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from frenzy_slurm.cli.common import cluster_options, reports_errors, unchecked_file


@click.command("salloc", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_yaml", type=unchecked_file)
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@click.option("--dry-run", is_flag=True, help="Print the salloc command line; allocate nothing, write nothing.")
@cluster_options
@click.option(
    "--job-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Job directory (default: $FRENZY_JOBS_DIR or ./frenzy-jobs, /<name>-<hash>).",
)
@click.option(
    "--templates", type=click.Path(file_okay=False, path_type=Path), help="Templates overriding the shipped ones."
)
@click.option("--no-calibration", is_flag=True, help="Plan with raw predictions (no calibration file).")
@click.option("--no-env-check", is_flag=True, help="Do not check the job's Python or container (docs/runtime.md).")
@click.option("-A", "--account", help="salloc --account.")
@click.option("-q", "--qos", help="salloc --qos.")
@click.option("-t", "--time", "time_", help="salloc --time (default: predicted run time + 25% + 10 min).")
@click.option("-C", "--constraint", help="salloc --constraint (HAS plans only on those nodes).")
@click.option("--exclusive", is_flag=True, default=None, help="salloc --exclusive (whole nodes).")
@click.option("-J", "--job-name", help="salloc --job-name (default: model.yaml's name).")
@reports_errors("frenzy-slurm salloc")
def salloc(
    model_yaml: Path,
    command: tuple[str, ...],
    dry_run: bool,
    backend: str,
    snapshot: Path | None,
    site: Path | None,
    job_dir: Path | None,
    templates: Path | None,
    no_calibration: bool,
    no_env_check: bool,
    account: str | None,
    qos: str | None,
    time_: str | None,
    constraint: str | None,
    exclusive: bool | None,
    job_name: str | None,
) -> None:
    """An interactive allocation of the shape planned for MODEL_YAML; COMMAND (after --) runs in it instead of
    your shell. Inside, `bash $FRENZY_JOB_DIR/job.sbatch` runs the planned job."""
    from frenzy_slurm.api import plan_jobs, summary_line
    from frenzy_slurm.slurm.commands import exec_salloc
    from frenzy_slurm.submission.interactive import salloc_command, write_for_allocation

    flags = {"account": account, "qos": qos, "time": time_, "constraint": constraint, "exclusive": exclusive}
    (plan,) = plan_jobs(
        model_yaml,
        site=site,
        backend=backend,
        snapshot=snapshot,
        slurm={**flags, "job_name": job_name},
        job_dir=job_dir,
        templates=templates,
        calibration=not no_calibration,
        env_check="off" if no_env_check else "note" if dry_run else "refuse",
    )
    req = plan.request
    for line in req.notes:
        click.echo(f"frenzy-slurm salloc: note: {line}", err=True)
    argv = salloc_command(req, list(command))
    click.echo(summary_line(req), err=True)
    launcher = req.job_dir / "job.sbatch"
    if dry_run:
        click.echo(
            f"frenzy-slurm salloc: --dry-run: nothing allocated (job directory would be {req.job_dir})", err=True
        )
        click.echo(shlex.join(argv))
        return
    write_for_allocation(req)
    click.echo(
        f"frenzy-slurm salloc: job directory {req.job_dir}; in the allocation run the job with "
        f'`bash {shlex.quote(str(launcher))}` (or `bash "$FRENZY_JOB_DIR/job.sbatch"`)',
        err=True,
    )
    exec_salloc(argv, {**os.environ, "FRENZY_JOB_DIR": str(req.job_dir)})
