"""The GPU pools a job may use: site file x live view x user limits -> MARP GpuOptions."""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.marp.candidates import GpuOption
from frenzy_slurm.site.config import Pool, SiteConfig
from frenzy_slurm.slurm.view import ClusterView, GpuPool, Node, PoolKey


@dataclass(frozen=True)
class UsablePool:
    live: GpuPool
    site: Pool
    option: GpuOption
    free_by_node: tuple[int, ...]  # free GPUs of each available node, largest first
    max_time_min: int | None

    @property
    def key(self) -> PoolKey:
        return self.live.key


def usable_pools(req: Requirements, view: ClusterView, site: SiteConfig) -> tuple[list[UsablePool], list[str]]:
    """Pools the job may use, and a line for each pool left out (and why)."""
    allowed = set(req.gpu_types) if req.gpu_types else None
    limit = req.max_gpus
    out, skipped = [], []
    up: dict[tuple[str, str | None], list[Node]] = {}  # available nodes per (partition, GRES type), in view order
    for n in view.nodes:
        if n.available:
            for p in dict.fromkeys(n.partitions):
                up.setdefault((p, n.gpu_type), []).append(n)
    for live in view.pools():
        sp = site.pool(live.partition, live.gpu_type)
        where = str(live.key)
        if sp is None:
            skipped.append(f"{where}: not described in the site file")
            continue
        spec_gpu = sp.spec()
        if allowed is not None and not (
            {live.gpu_type.lower(), spec_gpu.name.lower(), live.partition.lower()} & allowed
        ):
            skipped.append(f"{where}: not in limits.gpu_types")
            continue
        part = view.partition(live.partition)
        if part is not None and part.state.upper() != "UP":
            skipped.append(f"{where}: partition is {part.state}")
            continue
        if live.nodes_up == 0:
            skipped.append(f"{where}: no node is up")
            continue
        nodes = up.get((live.partition, live.gpu_type), [])
        total_up = sum(n.gpus_total for n in nodes)
        option = GpuOption(
            name=live.key,
            spec=spec_gpu,
            max_gpus=min(total_up, limit or total_up),
            gpus_per_node=sp.gpus_per_node,
            usable_fraction=site.usable_fraction(sp),
            inter_node_gbs=site.inter_node_gbs(sp),
            intra_node_gbs=sp.intra_node_gbs,
            overheads=sp.overheads,
        )
        free = tuple(sorted((n.gpus_free for n in nodes), reverse=True))
        out.append(UsablePool(live, sp, option, free, part.max_time_min if part else None))
    return out, skipped


def node_layout(gpus: int, gpus_per_node: int) -> tuple[int, int] | None:
    """(nodes, GPUs per node) spreading `gpus` evenly over the fewest nodes, or None if impossible."""
    nodes = -(-gpus // gpus_per_node)
    while nodes <= gpus:
        if gpus % nodes == 0 and gpus // nodes <= gpus_per_node:
            return nodes, gpus // nodes
        nodes += 1
    return None


def fits_free_now(pool: UsablePool, nodes: int, per_node: int) -> bool:
    """At least `nodes` nodes have `per_node` free GPUs (free_by_node is sorted largest first)."""
    return len(pool.free_by_node) >= nodes and pool.free_by_node[nodes - 1] >= per_node
