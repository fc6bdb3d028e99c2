"""`fscancel`: cancel your frenzy-slurm jobs, a heterogeneous job as one job; job directories are kept.

    fscancel JOBID...            # 1234, or 1234+1 (a hetjob component names its whole job)
    fscancel --name NAME         # your frenzy-slurm jobs of that name that are pending or running
    fscancel --mine              # all your frenzy-slurm jobs that are pending or running
    fscancel JOBID --signal USR2 # send a signal to the job's steps instead (USR2: checkpoint and requeue)

One queue query, then one `scancel` per job through the Slurm seam. Exit codes: 0 done (also when a job had
already ended, or nothing matched --name/--mine), 1 Slurm refused to cancel one of the jobs, 2 a job id that
is not in the queue or not your frenzy-slurm job, 4 Slurm unreachable.
"""

from __future__ import annotations

import signal as signals
from pathlib import Path

import click

from frenzy_slurm.cli.common import QuietPipeCommand, backend_options, echo, print_json, printable, reports_errors
from frenzy_slurm.core.errors import EXIT_FAILURE, InputError
from frenzy_slurm.core.version import __version__


def signal_name(text: str) -> str:
    """USR2, SIGUSR2, usr2 or 12 -> the name scancel takes (USR2); an unknown one is an InputError."""
    raw = text.strip().upper()
    try:
        sig = (
            signals.Signals(int(raw))
            if raw.isdigit()
            else signals.Signals[raw if raw.startswith("SIG") else f"SIG{raw}"]
        )
    except (KeyError, ValueError):
        raise InputError(f"--signal {text}: not a signal; give a name such as USR2, TERM or INT") from None
    return sig.name.removeprefix("SIG")


_SAID = {
    "cancelled": "cancelled",
    "signalled": "signalled",
    "ended": "had already ended",
    "not running": "is not running",
    "failed": "could not be cancelled",
}


@click.command(cls=QuietPipeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("jobids", nargs=-1, metavar="[JOBID]...")
@click.option("-n", "--name", help="Cancel your pending and running frenzy-slurm jobs of this name.")
@click.option("--mine", is_flag=True, help="Cancel all your pending and running frenzy-slurm jobs.")
@click.option("-s", "--signal", "sig", help="Send this signal (USR2, TERM, ...) to the jobs' steps instead.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@backend_options
@click.version_option(__version__, prog_name="fscancel")
@reports_errors("fscancel", json_errors=True)
def main(
    jobids: tuple[str, ...],
    name: str | None,
    mine: bool,
    sig: str | None,
    as_json: bool,
    backend: str,
    snapshot: Path | None,
) -> None:
    """Cancel frenzy-slurm jobs (a heterogeneous job as one job); their job directories are kept."""
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.track.jobs import cancel_jobs, parse_job_ref

    if sum(bool(x) for x in (jobids, name, mine)) != 1:
        raise InputError("name the jobs to cancel: JOBID..., --name NAME or --mine (one of them)")
    ids = [parse_job_ref(j) for j in jobids]
    sig_name = signal_name(sig) if sig is not None else None
    done = cancel_jobs(open_backend(backend, snapshot), ids or None, name=name, mine=mine, signal=sig_name)
    failed = [c for c in done if c.outcome == "failed"]
    if as_json:
        print_json({"jobs": [c.as_json() for c in done], "signal": sig_name})
    else:
        if not done:
            echo(f"no pending or running frenzy-slurm job of yours {'is named ' + name if name else 'to cancel'}")
        for c in done:
            what = f"job {c.job_id} {printable(c.name)}"
            if c.components > 1:
                what += f" (heterogeneous, {c.components} components)"
            said = f"{_SAID[c.outcome]} ({c.state})" if c.outcome in ("ended", "not running") else _SAID[c.outcome]
            if c.outcome == "signalled":
                said += f" with {sig_name}"
            echo(f"{what}: {said}" + (f": {printable(c.detail)}" if c.detail else ""))
            if c.job_dir is not None and c.outcome != "failed":
                echo(f"  job directory kept: {c.job_dir}")
    if failed:
        raise SystemExit(EXIT_FAILURE)
