"""`frenzy-slurm watch`: move this user's preemptible jobs as the cluster changes (frenzy_slurm/track/watch.py).

    frenzy-slurm watch [--once] [--interval SECONDS] [--dry-run] [--json] [--site FILE] [--backend ...]

Runs on a login node as the user whose jobs it moves (in tmux or screen, from cron with --once, or as a
systemd user service). Each pass prints the moves it made, one line each (`--json`: one JSON object per pass).
Exit codes: 0; 2 bad input (site file, flags); 4 Slurm did not answer (with --once; the loop says so and tries
again at the next pass).
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType

import click

from frenzy_slurm.cli.common import backend_options, echo, reports_errors
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.version import __version__
from frenzy_slurm.slurm.run import SlurmUnavailable

MIN_INTERVAL_S = 10  # slurmctld is shared: a pass reads the queue and the nodes once


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Site file (default: $FRENZY_SITE, /etc/frenzy-slurm/site.yaml); its preemption: block says what a move "
    "costs (restart_s) and how far a job may grow (move_share).",
)
@backend_options
@click.option("--once", is_flag=True, help="One pass, then exit (for cron or a scrontab line).")
@click.option(
    "--interval",
    type=click.IntRange(min=MIN_INTERVAL_S),
    default=60,
    show_default=True,
    help="Seconds between passes.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be moved; submit, hold and cancel nothing.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per pass: {'at': ..., 'moves': [...], 'finished': [...]}.",
)
@click.version_option(__version__, prog_name="frenzy-slurm watch")
@reports_errors("frenzy-slurm watch", json_errors=True)
def watch(
    site: Path | None, backend: str, snapshot: Path | None, once: bool, interval: int, dry_run: bool, as_json: bool
) -> None:
    """Move your preemptible jobs (fsbatch --preemptible) where they finish sooner.

    A pending job that another allocation finishes sooner is submitted there anew and the old job cancelled;
    a running one gets its successor submitted to start when it ends, then a SIGTERM: it saves a checkpoint,
    and the successor resumes from it. Only jobs you marked preemptible are touched, each at most once
    (moved.json in its job directory says where it went).
    """
    from frenzy_slurm.api import open_backend, open_site
    from frenzy_slurm.track.replan_watch import Reshape
    from frenzy_slurm.track.watch import watch_once

    site_file = open_site(site)
    if site_file.config.preemption is None:
        where = f"site file {site_file.path}" if site_file.path is not None else "the site file"
        raise InputError(
            f"{where} has no preemption: block, so no job can be marked preemptible and nothing would be moved. "
            'Ask the site\'s admins (docs/admin.md, "Preemptible jobs").'
        )
    slurm = open_backend(backend, snapshot)
    stop: list[int] = []

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    while True:
        finished: list[str] = []  # moves an earlier pass left open (killed, a lost reply, a full disk)
        reshaped: list[Reshape] = []  # waiting jobs marked slurm.replan, changed in place
        try:
            moves = watch_once(site_file, slurm, dry_run=dry_run, finished=finished, reshaped=reshaped)
        except SlurmUnavailable as exc:
            if once:
                raise
            echo(f"frenzy-slurm watch: {exc.message} (trying again in {interval} s)", err=True)
            moves = []
        if as_json:
            pass_record = {"at": time.time(), "dry_run": dry_run, "moves": [m.as_json() for m in moves]}
            reshapes = [asdict(r) for r in reshaped]
            click.echo(json.dumps(pass_record | {"finished": finished, "reshaped": reshapes}))
        else:
            for line in finished:
                click.echo(line)
            for m in moves:
                echo(m.line())
            for r in reshaped:
                echo(r.line())
        if once:
            return
        deadline = time.monotonic() + interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(1.0, deadline - time.monotonic()))
        if stop:
            return
