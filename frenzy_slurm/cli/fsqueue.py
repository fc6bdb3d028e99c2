"""`fsqueue`: show frenzy-slurm jobs (components, GPU types, state, predicted remaining time).

    fsqueue [JOBID] [-u USER] [--all] [--json]
"""

from __future__ import annotations

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import reports_errors
from frenzy_slurm.errors import FrenzyError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("jobid", required=False)
@click.option("-u", "--user", help="Show this user's jobs (default: yours).")
@click.option("--all", "all_users", is_flag=True, help="Show every user's frenzy-slurm jobs.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.version_option(__version__, prog_name="fsqueue")
@reports_errors("fsqueue")
def main(jobid: str | None, user: str | None, all_users: bool, as_json: bool) -> None:
    """Track frenzy-slurm jobs: one line per job, or JOBID's plan, live state and measured metrics."""
    raise FrenzyError("job tracking is not available in this release (it needs the Slurm submit/track stages).")
