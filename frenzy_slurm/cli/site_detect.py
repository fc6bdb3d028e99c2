"""`frenzy-slurm site detect`: probe one node of every GPU pool with NVML and write or update the site file.

    frenzy-slurm site detect --site /etc/frenzy-slurm/site.yaml     # probes, then updates that file in place
    frenzy-slurm site detect --dry-run > site.yaml                  # prints the result instead (status on stderr)

For each (partition, GRES type), one short `srun` step (through the Slurm seam) on a node holding all
of that node's GPUs runs `python -m frenzy_slurm.runtime.nvml_probe`; the answers name the GPU model,
memory, GPUs per node, NVLink/PCIe links, driver and CUDA versions. Pools whose probe fails or has no
NVML are described from Slurm's own GRES, and say so.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from frenzy_slurm.cli.common import cluster_options, print_json, reports_errors
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import write_atomic

if TYPE_CHECKING:  # the command imports it when it runs
    from frenzy_slurm.site.detect import Detected


@click.command("detect")
@cluster_options
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site file to write or update (default: --site / $FRENZY_SITE / /etc/frenzy-slurm/site.yaml).",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the resulting site file on stdout (status on stderr) instead of writing it."
)
@click.option(
    "--python",
    "python",
    default=sys.executable,
    show_default=True,
    help="Python on the compute nodes that has frenzy-slurm and nvidia-ml-py.",
)
@click.option(
    "--timeout",
    type=click.IntRange(min=10),
    default=120,
    show_default=True,
    help="Seconds one probe step may take, waiting for a free node included.",
)
@click.option("--partition", "partitions", multiple=True, help="Probe only these partitions (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable report (and the file text).")
@reports_errors("frenzy-slurm site detect")
def site_detect(
    backend: str,
    snapshot: Path | None,
    site: Path | None,
    output: Path | None,
    dry_run: bool,
    python: str,
    timeout: int,
    partitions: tuple[str, ...],
    as_json: bool,
) -> None:
    """Detect each pool's GPUs with NVML on a compute node and write or update the site file."""
    from frenzy_slurm.site.detect import merge_site, probe_pools, read_text
    from frenzy_slurm.site.tools import find_site
    from frenzy_slurm.slurm import open_backend

    try:
        import ruamel.yaml  # noqa: F401
    except ImportError:
        raise InputError(
            "site detect edits the site file keeping its comments with ruamel.yaml: pip install 'frenzy-slurm[admin]'."
        ) from None
    path = output or find_site(site)
    if path is None and not dry_run:
        raise InputError("no site file to write: pass -o FILE (or --site FILE), or --dry-run to print it.")
    cluster = open_backend(backend, snapshot)
    view = cluster.load()
    pools = [p for p in view.pools() if not partitions or p.partition in partitions]
    if not pools:
        raise InputError(
            "no GPU pool to probe: no node has GPU GRES"
            + (f" in {', '.join(partitions)}" if partitions else "")
            + " (is GresTypes=gpu set?)"
        )
    detected = probe_pools(cluster, view, python, timeout, partitions)
    text, changes = merge_site(
        read_text(path) if path else None, view.cluster or "unnamed", detected, time.strftime("%Y-%m-%d")
    )
    if as_json:
        print_json(_report(path, dry_run, changes, detected, text))
    for d in detected:
        what = (
            f"{d.gpus_per_node} x {d.product} -> {d.gpu.name if d.gpu else 'NO CATALOG MATCH'}, {d.intra_node}, "
            f"driver {d.driver}, CUDA {d.cuda}"
            if d.source == "nvml"
            else "described from Slurm's GRES"
        )
        if not as_json:
            # status goes to stderr: stdout holds only the data (the YAML with --dry-run, the JSON with
            # --json), so `site detect --dry-run > site.yaml` captures a file that loads
            click.echo(f"{d.where}: {what}", err=True)
        for p in d.problems:
            click.echo(f"{d.where}: {p}", err=True)
    if dry_run:
        if not as_json:
            click.echo(text, nl=False)
        return
    assert path is not None
    _replace_site_file(path, text)
    for c in changes:
        click.echo(f"changed: {c}", err=True)
    click.echo(f"wrote {path} ({len(changes)} change(s))", err=True)


def _report(path: Path | None, dry_run: bool, changes: list[str], detected: list[Detected], text: str) -> dict:
    """--json's report: the site file, what changed, each pool as detected, and the file's text."""
    return {
        "site_file": str(path) if path else None,
        "written": not dry_run,
        "changes": changes,
        "pools": [
            {
                "pool": d.where,
                "source": d.source,
                "host": d.host,
                "product": d.product,
                "gpu": d.gpu.name if d.gpu else None,
                "memory_gib": d.memory_gib,
                "gpus_per_node": d.gpus_per_node,
                "intra_node": d.intra_node,
                "driver": d.driver,
                "cuda": d.cuda,
                "problems": d.problems,
            }
            for d in detected
        ],
        "text": text,
    }


def _replace_site_file(path: Path, text: str) -> None:
    """Write the detected site file over `path` only once it loads."""
    from frenzy_slurm.site.config import load_site

    # the candidate is written (O_EXCL temporary + rename, never through a planted link) beside the site file
    # as `.detected`, checked, and only then renamed over the site file: a file that does not load never
    # replaces a working one. Site files are read by every user's fsbatch: 0644.
    candidate = path.with_name(path.name + ".detected")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(candidate, text, mode=0o644)
    try:
        load_site(candidate)
    except Exception as exc:  # noqa: BLE001
        raise InputError(
            f"the detected site file does not validate yet ({getattr(exc, 'message', exc)}); it is in "
            f"{candidate}: fix the flagged pools there and move it to {path}."
        ) from None
    os.replace(candidate, path)
