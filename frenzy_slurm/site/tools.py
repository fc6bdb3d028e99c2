"""Writing a site file from the live cluster, and checking a site file against it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm.core.gpus import GpuSpec, gpu_candidates

if TYPE_CHECKING:  # site.config (and through it the planning stages) is imported where a site file is read:
    from frenzy_slurm.site.config import SiteConfig  # `fsinfo` without one (find_site) never needs it
    from frenzy_slurm.slurm.view import ClusterView

DEFAULT_SITE_PATHS = (Path("/etc/frenzy-slurm/site.yaml"),)


def find_site(explicit: Path | None) -> Path | None:
    """--site, else $FRENZY_SITE, else /etc/frenzy-slurm/site.yaml, else none."""
    if explicit is not None:
        return explicit
    env = os.environ.get("FRENZY_SITE")
    if env:
        return Path(env)
    return next((p for p in DEFAULT_SITE_PATHS if p.is_file()), None)


def maybe_load_site(explicit: Path | None) -> SiteConfig | None:
    from frenzy_slurm.site.config import load_site  # start-up time: see the imports above

    path = find_site(explicit)
    return load_site(path) if path else None


CATALOG_HINT = "run `frenzy-slurm site detect` on a node with NVML, or set gpu: to one of `frenzy-slurm site catalog`"


def link_name(spec: GpuSpec) -> str | float:
    """The catalog's link for this model as a site file writes it: the name of that speed, else GB/s. A T4's
    is PCIe 3 (16 GB/s), an A100's NVLink 3."""
    from frenzy_slurm.site.config import LINK_GBS  # start-up time: see the imports above

    return next((name for name, gbs in LINK_GBS.items() if gbs == spec.link_gbs), spec.link_gbs)


def guess_from_gres(gres_type: str | None) -> tuple[GpuSpec | None, str]:
    """The one catalog model Slurm's GRES type names (a guess: the type is whatever the admin called it), or
    None where it names none or several ('a100' is a 40 or an 80 GB card); and a comment for the site file
    saying what was guessed or what the admin must fill in."""
    if gres_type is None:
        return None, f"gpu model unknown: the GRES has no type (gpu:N); {CATALOG_HINT}"
    hits = gpu_candidates(gres_type)
    if len(hits) == 1:
        return hits[0], (
            f"guessed from Slurm's GRES type '{gres_type}', never measured: check gpu: and intra_node:, "
            "then delete this line"
        )
    which = f" (it may be {' or '.join(h.name for h in hits)})" if hits else ""
    return None, f"gpu model unknown: Slurm calls it '{gres_type}'{which}; {CATALOG_HINT}"


def propose_site(view: ClusterView) -> tuple[str, list[str]]:
    """A commented site file for every (partition, GRES type) with GPUs, and the entries the admin must check.
    A model the GRES type does not pin down is left out with a comment (the file then does not load until
    the admin names it); one it does is written with `unconfirmed:` (no plan on it until confirmed)."""
    flagged: list[str] = []
    lines = [
        f"# Site file proposed by `frenzy-slurm site init` from the live cluster ({view.backend} backend,",
        f"# Slurm {view.slurm_version}). Slurm names GPUs, it does not measure them: fill in every pool whose",
        "# gpu model is unknown, check and confirm the guessed ones, then run `frenzy-slurm site validate`.",
        f"cluster: {view.cluster or 'unnamed'}",
        "defaults:",
        "  inter_node_gbs: 25        # network GB/s per GPU between nodes (25 = 200 Gb/s)",
        "  usable_fraction: 0.95",
        "pools:",
    ]
    header = len(lines)
    for pool in view.pools():
        spec, comment = guess_from_gres(pool.gpu_type)
        lines += [
            f"  - partition: {pool.partition}",
            f"    gres_type: {pool.gpu_type}" if pool.gpu_type else "    untyped: true",
        ]
        if spec is None:
            flagged.append(f"{pool.key}: {comment}")
            lines += [
                f"    # {comment}",
                f"    gpus_per_node: {pool.gpus_per_node}",
                "    # intra_node unknown: nvlink1-5, pcie3-5 or GB/s between the node's GPUs",
            ]
        else:
            flagged.append(f"{pool.key}: gpu {spec.name} and intra_node {link_name(spec)} are guesses; confirm them")
            lines += [
                f"    gpu: {spec.name}",
                f"    gpus_per_node: {pool.gpus_per_node}",
                f"    intra_node: {link_name(spec)}  # nvlink1-5 or pcie3-5 or GB/s",
                f"    unconfirmed: [gpu, intra_node]  # {comment}",
            ]
    if len(lines) == header:
        flagged.append("no node has GPU GRES; is GresTypes=gpu set and gres.conf in place?")
    return "\n".join(lines) + "\n", flagged


def _gres(gres_type: str | None) -> str:
    """A GRES as validate names it: `gpu:a100`, or `untyped gpu` (Gres=gpu:N)."""
    return f"gpu:{gres_type}" if gres_type else "untyped gpu"


def validate_site(site: SiteConfig, view: ClusterView) -> list[str]:
    """Every disagreement between the site file and the live cluster, as one line each."""
    from frenzy_slurm.site.config import unconfirmed_values  # start-up time: see the imports above

    problems = []
    if site.cluster and view.cluster and site.cluster != view.cluster:
        problems.append(f"cluster: site file says '{site.cluster}', Slurm says '{view.cluster}'")
    live = {(p.partition, p.gpu_type): p for p in view.pools()}
    partitions = {p.name for p in view.partitions} | {p for n in view.nodes for p in n.partitions}
    for pool in site.pools:
        where = f"pool {pool.label}"
        if pool.partition not in partitions:
            problems.append(
                f"{where}: partition '{pool.partition}' does not exist (Slurm has: {', '.join(sorted(partitions))})"
            )
            continue
        lp = live.get((pool.partition, pool.gres_type))
        if lp is None:
            found = sorted(_gres(t) for (p, t) in live if p == pool.partition)
            problems.append(
                f"{where}: no node of partition '{pool.partition}' has GRES {_gres(pool.gres_type)} "
                f"(found: {', '.join(found) or 'no GPUs'})"
            )
            continue
        if lp.gpus_per_node != pool.gpus_per_node:
            problems.append(f"{where}: gpus_per_node is {pool.gpus_per_node}, Slurm's nodes have {lp.gpus_per_node}")
    problems += unconfirmed_values(site)  # a guess is not a match, however well it agrees with Slurm
    for part, gtype in live:
        if site.pool(part, gtype) is None:
            fix = " (add a pool with untyped: true and gpu: MODEL)" if gtype is None else ""
            problems.append(
                f"partition {part} has {_gres(gtype)} GPUs that the site file does not describe; "
                f"frenzy-slurm will not use them{fix}"
            )
    return problems
