"""`frenzy-slurm watch`: move this user's preemptible jobs as the cluster changes (frenzy_slurm/track/watch.py).

    frenzy-slurm watch [--once] [--interval SECONDS] [--dry-run] [--json] [--site FILE] [--backend ...]
    frenzy-slurm watch --all-users [...]     # an operator account: every user's opted-in waiting jobs, jointly

Runs on a login node as the user whose jobs it moves (in tmux or screen, from cron with --once, or as a
systemd user service). Each pass prints the moves it made, one line each (`--json`: one JSON object per pass).
With --all-users (track/replan_site.py) it only changes every user's waiting `slurm.replan` jobs in place, and
also prints the jobs it skipped (a directory it cannot read or trust), each once.
Exit codes: 0; 2 bad input (site file, flags); 4 Slurm did not answer (with --once; the loop says so and tries
again at the next pass); 5 (--all-users) Slurm refused to change another user's job: the account is no operator.
"""

from __future__ import annotations

import json
import signal
import time
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import click

from frenzy_slurm.cli.common import backend_options, echo, reports_errors
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.version import __version__
from frenzy_slurm.slurm.run import SlurmUnavailable

if TYPE_CHECKING:
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.slurm.backend import SlurmBackend

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
    "--all-users",
    is_flag=True,
    help="Site-wide mode, for a Slurm operator account (AdminLevel=Operator): re-plan every user's waiting jobs "
    "marked slurm.replan jointly, in place (scontrol update; nothing is submitted, held, cancelled or moved). Only "
    "jobs whose directory you can read and that pass the trust checks are considered; the others are listed as "
    "skipped. Changes are recorded in $XDG_STATE_HOME/frenzy-slurm/replanned/JOBID.json, never in users' "
    "directories. Exit 5 where Slurm refuses you another user's job.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object per pass: {'at': ..., 'moves': [...], 'finished': [...], 'reshaped': [...]}; with "
    "--all-users {'at': ..., 'all_users': true, 'reshaped': [...], 'skipped': [...]}.",
)
@click.version_option(__version__, prog_name="frenzy-slurm watch")
@reports_errors("frenzy-slurm watch", json_errors=True)
def watch(
    site: Path | None,
    backend: str,
    snapshot: Path | None,
    once: bool,
    interval: int,
    dry_run: bool,
    all_users: bool,
    as_json: bool,
) -> None:
    """Move your preemptible jobs (fsbatch --preemptible) where they finish sooner.

    A pending job that another allocation finishes sooner is submitted there anew and the old job cancelled;
    a running one gets its successor submitted to start when it ends, then a SIGTERM: it saves a checkpoint,
    and the successor resumes from it. Only jobs you marked preemptible are touched, each at most once
    (moved.json in its job directory says where it went).

    With --all-users, run by a Slurm operator account, it does only the in-place part, for everyone: each pass
    solves one joint assignment of every user's waiting jobs marked slurm.replan (fsbatch --replan) whose job
    directory it can read and trust, and changes a job with scontrol update only where it is predicted to finish
    sooner by more than the site's replan margin. No job is submitted, held, cancelled or made bigger than it
    asked for, and nothing is written in users' directories (docs/admin.md, "Re-planning waiting jobs in place").
    """
    from frenzy_slurm.api import open_backend, open_site
    from frenzy_slurm.track.replan_watch import Reshape
    from frenzy_slurm.track.watch import watch_once

    site_file = open_site(site)
    if all_users:
        _watch_all_users(site_file.config, open_backend(backend, snapshot), once, interval, dry_run, as_json)
        return
    if site_file.config.preemption is None:
        where = f"site file {site_file.path}" if site_file.path is not None else "the site file"
        raise InputError(
            f"{where} has no preemption: block, so no job can be marked preemptible and nothing would be moved. "
            'Ask the site\'s admins (docs/admin.md, "Preemptible jobs").'
        )
    slurm = open_backend(backend, snapshot)
    stop: list[int] = []
    _on_stop_signals(stop)
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
        if once or _slept(interval, stop):
            return


def _on_stop_signals(stop: list[int]) -> None:
    """SIGTERM and SIGHUP end the loop after the pass under way (a pass holds the lock and may be updating jobs)."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.append(signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)


def _slept(interval: int, stop: list[int]) -> bool:
    """Wait `interval` seconds, or until a stop signal; whether one came."""
    deadline = time.monotonic() + interval
    while not stop and time.monotonic() < deadline:
        time.sleep(min(1.0, deadline - time.monotonic()))
    return bool(stop)


def _watch_all_users(
    site: SiteConfig, slurm: SlurmBackend, once: bool, interval: int, dry_run: bool, as_json: bool
) -> None:
    """The site-wide loop (track/replan_site.py): each skipped job is said once per reason, each change each time."""
    from frenzy_slurm.track.replan_site import replan_site

    stop: list[int] = []
    _on_stop_signals(stop)
    said: set[tuple[int, str]] = set()
    while True:
        try:
            reshaped, skipped = replan_site(slurm, site, dry_run=dry_run, now=time.time())
        except SlurmUnavailable as exc:
            if once:
                raise
            echo(f"frenzy-slurm watch: {exc.message} (trying again in {interval} s)", err=True)
            reshaped, skipped = [], []
        if as_json:
            record = {"at": time.time(), "dry_run": dry_run, "all_users": True}
            click.echo(
                json.dumps(
                    record | {"reshaped": [asdict(r) for r in reshaped], "skipped": [asdict(s) for s in skipped]}
                )
            )
        else:
            for s in skipped:
                if (s.job_id, s.reason) not in said:
                    echo(s.line())
            for r in reshaped:
                echo(r.line())
        said |= {(s.job_id, s.reason) for s in skipped}
        if once or _slept(interval, stop):
            return
