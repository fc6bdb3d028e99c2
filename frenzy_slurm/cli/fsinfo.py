"""`fsinfo`: the GPU view of the cluster, per partition and GPU type.

    fsinfo [--site FILE] [--backend auto|cli|pyslurm|static [--snapshot FILE]] [--json]

`fsinfo --json > snap.json` writes a snapshot that `--backend static --snapshot snap.json` reads back.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from frenzy_slurm.cli.common import QuietPipeCommand, cluster_options, echo, reports_errors, table
from frenzy_slurm.core.gpus import match_gpu
from frenzy_slurm.core.version import __version__
from frenzy_slurm.site.tools import find_site
from frenzy_slurm.slurm import open_backend

if TYPE_CHECKING:
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.slurm.view import ClusterView


def summarize(view: ClusterView, site: SiteConfig | None) -> list[dict[str, Any]]:
    rows = []
    for pool in view.pools():
        sp = site.pool(pool.partition, pool.gpu_type) if site else None
        spec = sp.spec() if sp else (match_gpu(pool.gpu_type) if pool.gpu_type else None)  # untyped: the site says
        rows.append(
            {
                "partition": pool.partition,
                "gpu_type": pool.gpu_type,
                "gpu": spec.name if spec else None,
                "described": sp is not None,
                "nodes_up": pool.nodes_up,
                "nodes_down": pool.nodes_down,
                "gpus_total": pool.gpus_total,
                "gpus_free": pool.gpus_free,
                "gpus_pending": pool.gpus_pending,
                "gpu_memory_gib": spec.memory_gib if spec else None,
                "bf16_tflops": spec.bf16 if spec else None,
            }
        )
    return rows


@click.command(cls=QuietPipeCommand, context_settings={"help_option_names": ["-h", "--help"]})
@cluster_options
@click.option("--json", "as_json", is_flag=True, help="Print the cluster view (a reusable snapshot) with a summary.")
@click.version_option(__version__, prog_name="fsinfo")
@reports_errors("fsinfo", json_errors=True)
def main(backend: str, snapshot: Path | None, site: Path | None, as_json: bool) -> None:
    """Per partition and GPU type: nodes up/down, GPUs total/free/pending, memory and peak bf16 TFLOP/s."""
    view = open_backend(backend, snapshot).load()
    site_path = find_site(site)
    site_cfg = None
    if site_path is not None:
        # here, not at the top: the site file's models import the planning stages, which a listing without a
        # site file never needs (start-up time)
        from frenzy_slurm.site.config import load_site

        site_cfg = load_site(site_path)
    if site_cfg is not None:  # a pool whose partition Slurm lacks is in no row: say so (stderr keeps --json clean)
        from frenzy_slurm.has.pools import (
            missing_partition_notes,
            type_disagreements,
            undescribed_type_notes,
            unmapped_untyped_notes,
        )

        notes = missing_partition_notes(view, site_cfg, f"site file {site_path}")
        # what fsbatch refuses to plan on (exit 2), shown here as the rows it explains
        differ = type_disagreements(view, site_cfg)
        notes += [f"site file {site_path} disagrees with the cluster on GPU types: {d.line()}" for d in differ]
        for note in notes + unmapped_untyped_notes(view, site_cfg) + undescribed_type_notes(view, site_cfg):
            echo(f"fsinfo: note: {note}", err=True)
    rows = summarize(view, site_cfg)
    if as_json:
        click.echo(json.dumps(view.model_dump() | {"summary": rows}, indent=1))
        return
    out = []
    for r in rows:
        gpu = (r["gpu"] or "?") + ("" if r["described"] or not site_cfg else " (not in site file)")
        if not site_cfg and r["gpu"]:
            gpu += "~"
        out.append(
            [
                r["partition"],
                r["gpu_type"] or "(untyped)",
                gpu,
                f"{r['nodes_up']}/{r['nodes_down']}",
                f"{r['gpus_total']}/{r['gpus_free']}/{r['gpus_pending']}",
                f"{r['gpu_memory_gib']:.0f}" if r["gpu_memory_gib"] else "?",
                f"{r['bf16_tflops']:.0f}" if r["bf16_tflops"] else "?",
            ]
        )
    echo(table(out, ["PARTITION", "GRES", "GPU", "NODES(up/down)", "GPUS(tot/free/pend)", "MEM_GiB", "BF16_TF"]))
    if not site_cfg:
        echo("~ GPU model guessed from the GRES type; give --site FILE (frenzy-slurm site init writes one).")
