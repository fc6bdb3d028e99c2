"""`fsinfo`: the GPU view of the cluster, per partition and GPU type.

    fsinfo [--site FILE] [--backend auto|cli|pyslurm|static] [--json]
"""

from __future__ import annotations

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import reports_errors
from frenzy_slurm.errors import FrenzyError


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--site", help="Site file describing partitions' GPUs.")
@click.option("--backend", type=click.Choice(["auto", "cli", "pyslurm", "static"]), default="auto", show_default=True,
              help="How to read the cluster.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.version_option(__version__, prog_name="fsinfo")
@reports_errors("fsinfo")
def main(site: str | None, backend: str, as_json: bool) -> None:
    """Per partition and GPU type: nodes up/down, GPUs total/free/pending, memory and peak TFLOP/s."""
    raise FrenzyError("the cluster view is not available in this release.")
