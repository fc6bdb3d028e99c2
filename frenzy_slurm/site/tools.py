"""Writing a site file from the live cluster, and checking a site file against it."""

from __future__ import annotations

import os
from pathlib import Path

from frenzy_slurm.gpus import match_gpu
from frenzy_slurm.site.config import SiteConfig, load_site
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
    path = find_site(explicit)
    return load_site(path) if path else None


def _link_guess(model: str) -> str:
    if "SXM" in model or model.startswith(("H100-SXM", "H200", "A100")):
        return {"A100": "nvlink3", "H100": "nvlink4", "H200": "nvlink4"}.get(model.split("-")[0], "nvlink3")
    if model.startswith("V100"):
        return "nvlink2"
    return "pcie4"


def propose_site(view: ClusterView) -> tuple[str, list[str]]:
    """A commented site file for every (partition, GRES type) with GPUs, and the entries the admin must check."""
    flagged: list[str] = []
    lines = [
        f"# Site file proposed by `frenzy-slurm site init` from the live cluster ({view.backend} backend,",
        f"# Slurm {view.slurm_version}). Check every `gpu:` and `intra_node:` line, "
        "then run `frenzy-slurm site validate`.",
        f"cluster: {view.cluster or 'unnamed'}",
        "defaults:",
        "  inter_node_gbs: 25        # network GB/s per GPU between nodes (25 = 200 Gb/s)",
        "  usable_fraction: 0.95",
        "pools:",
    ]
    for pool in view.pools():
        spec = match_gpu(pool.gpu_type) if pool.gpu_type else None
        if pool.gpu_type is None:  # Slurm cannot say which GPU an untyped GRES is
            flagged.append(
                f"{pool.key}: the GRES has no type (gpu:{pool.gpus_per_node}); set gpu: to the model "
                "(or run `frenzy-slurm site detect`, which asks NVML)"
            )
            gpu, note = "UNKNOWN", "  # TODO: untyped GRES; name the catalog GPU (frenzy-slurm site catalog)"
        elif spec is None:
            flagged.append(f"{pool.key}: GRES type not in the catalog; set gpu: to the model")
            gpu, note = "UNKNOWN", f"  # TODO: '{pool.gpu_type}' matches no catalog GPU (frenzy-slurm site catalog)"
        else:
            gpu, note = spec.name, f"  # matched from GRES type '{pool.gpu_type}'; check the memory variant"
        lines += [
            f"  - partition: {pool.partition}",
            f"    gres_type: {pool.gpu_type}" if pool.gpu_type else "    untyped: true",
            f"    gpu: {gpu}{note}",
            f"    gpus_per_node: {pool.gpus_per_node}",
            f"    intra_node: {_link_guess(gpu) if spec else 'pcie4'}  # nvlink1-5 or pcie3-5 or GB/s",
        ]
    if len(lines) == 7:
        flagged.append("no node has GPU GRES; is GresTypes=gpu set and gres.conf in place?")
    return "\n".join(lines) + "\n", flagged


def _gres(gres_type: str | None) -> str:
    """A GRES as validate names it: `gpu:a100`, or `untyped gpu` (Gres=gpu:N)."""
    return f"gpu:{gres_type}" if gres_type else "untyped gpu"


def validate_site(site: SiteConfig, view: ClusterView) -> list[str]:
    """Every disagreement between the site file and the live cluster, as one line each."""
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
    for part, gtype in live:
        if site.pool(part, gtype) is None:
            fix = " (add a pool with untyped: true and gpu: MODEL)" if gtype is None else ""
            problems.append(
                f"partition {part} has {_gres(gtype)} GPUs that the site file does not describe; "
                f"frenzy-slurm will not use them{fix}"
            )
    return problems
