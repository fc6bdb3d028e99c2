"""The GPU pools a job may use: site file x live view x user limits (and the QOS's) -> MARP GpuOptions."""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.has.qos import cap, qos_lines
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


def slurm_partitions(view: ClusterView) -> list[str]:
    """The partitions Slurm has, as the view shows them (its partition list and its nodes' partitions)."""
    return sorted({p.name for p in view.partitions} | {p for n in view.nodes for p in n.partitions})


def missing_partition_notes(view: ClusterView, site: SiteConfig, where: str = "the site file") -> list[str]:
    """A line for each pool of the site file (`where` names it) whose partition Slurm does not have.

    Such a pool is never used; it used to be dropped without a word, so a typo in a partition name looked like
    a cluster without those GPUs (issue 21)."""
    have = slurm_partitions(view)
    return [
        f"{sp.label}: {where} has a pool partition={sp.partition} "
        f"{f'gres_type={sp.gres_type}' if sp.gres_type else 'untyped: true'}, "
        f"but Slurm has no partition {sp.partition} (Slurm has: {', '.join(have) or 'none'}); the pool is not used"
        for sp in site.pools
        if sp.partition not in have
    ]


def untyped_note(live: GpuPool) -> str:
    """What to tell about a partition's untyped GPUs (`Gres=gpu:4`) that the site file does not map to a model:
    Slurm cannot say which GPU they are, so they are not used until it does (they used to be invisible)."""
    return (
        f"{live.key}: partition {live.partition} has {live.gpus_total} GPUs whose GRES has no type "
        f"(gpu:{live.gpus_per_node} per node); Slurm does not say which GPU they are, so they are not used. "
        f"To use them, add to the site file's pools: {{partition: {live.partition}, untyped: true, gpu: MODEL, "
        f"gpus_per_node: {live.gpus_per_node}, intra_node: LINK}} (MODEL from `frenzy-slurm site catalog`; "
        '`frenzy-slurm site detect` finds both with NVML; docs/admin.md, "Untyped GRES")'
    )


def unmapped_untyped_notes(view: ClusterView, site: SiteConfig) -> list[str]:
    """A line for each partition with untyped GPUs that the site file maps to no GPU model (fsbatch and fsinfo
    say so even when the job fits elsewhere)."""
    return [untyped_note(live) for live in view.pools() if live.gpu_type is None and site.pool(*live.key) is None]


def _gres(gres_type: str | None) -> str:
    return f"gpu:{gres_type}" if gres_type else "untyped gpu"


@dataclass(frozen=True)
class TypeDisagreement:
    """One partition whose GPUs the site file names by GRES types the cluster does not show there, while the
    cluster shows GRES types there that the site file does not describe (a100_40gb in Slurm, a100 in the site)."""

    partition: str
    cluster_types: tuple[str | None, ...]  # the partition's undescribed GRES types, as Slurm shows them
    site_types: tuple[str | None, ...]  # the site file's types for it that Slurm does not show there

    def line(self) -> str:
        return (
            f"partition {self.partition}: the cluster has {', '.join(map(_gres, self.cluster_types))}, "
            f"the site file describes {', '.join(map(_gres, self.site_types))}"
        )


def type_disagreements(view: ClusterView, site: SiteConfig) -> list[TypeDisagreement]:
    """The partitions where the site file and the cluster disagree on GPU types: the site describes the partition,
    but none of the GRES types it gives there is one Slurm shows, and Slurm shows types there it does not describe.

    Planning on the rest would silently put a job on the GPUs that are left (issue 28: Llama-2-7B on 16 T4s for 23
    days instead of 8 A100s). A partition the site file does not name at all is not a disagreement (a site may
    describe only the partitions frenzy-slurm is to use; `site validate` lists them), nor are GPUs of a type the
    site has not described beside a type it has (those stay unused with a note, `undescribed_type_notes`); nor
    untyped GPUs of a partition the site does not map (`unmapped_untyped_notes`)."""
    live: dict[str, set[str | None]] = {}
    for p in view.pools():
        live.setdefault(p.partition, set()).add(p.gpu_type)
    described: dict[str, set[str | None]] = {}
    for sp in site.pools:
        described.setdefault(sp.partition, set()).add(sp.gres_type)
    out = []
    for partition, site_types in described.items():
        cluster_types = live.get(partition, set())
        if cluster_types and not site_types & cluster_types:
            out.append(TypeDisagreement(partition, _sorted(cluster_types), _sorted(site_types)))
    return out


def _sorted(types: set[str | None]) -> tuple[str | None, ...]:
    return tuple(sorted(types, key=lambda t: (t is None, t or "")))


def check_site_types(view: ClusterView, site: SiteConfig, cluster_name: str, site_name: str) -> None:
    """InputError (exit 2) when the site file and the cluster disagree on GPU types (`type_disagreements`):
    `cluster_name` says where the view came from (a snapshot file, or the live cluster), `site_name` the site file."""
    found = type_disagreements(view, site)
    if not found:
        return
    raise InputError(
        f"{cluster_name} and {site_name} disagree on GPU types: {'; '.join(d.line() for d in found)}. "
        "Planning on the other GPUs would put the job on the wrong ones.\n"
        f"Fix: give each pool of {site_name} the gres_type Slurm shows for its partition (`sinfo -o '%P %G'`; "
        "`frenzy-slurm site validate` lists every difference), or plan against a snapshot of the cluster the site "
        "file describes (`fsinfo --json > FILE`)."
    )


def undescribed_type_notes(view: ClusterView, site: SiteConfig) -> list[str]:
    """A line for each pool of typed GPUs that the site file does not describe, on a partition whose other GPUs
    it does describe (a GRES type added to a partition after the site file was written): they are not used.
    A partition where the two disagree altogether is `type_disagreements`' (an error for planning)."""
    named = {sp.partition for sp in site.pools} - {d.partition for d in type_disagreements(view, site)}
    return [
        f"{live.key}: partition {live.partition} has {live.gpus_total} GPUs of GRES type {live.gpu_type}, which the "
        f"site file does not describe, so they are not used (add a pool for them: `frenzy-slurm site validate`)"
        for live in view.pools()
        if live.gpu_type is not None and live.partition in named and site.pool(*live.key) is None
    ]


def known_gpu_types(view: ClusterView, site: SiteConfig) -> dict[str, list[str]]:
    """What limits.gpu_types may name, per kind: GRES types, catalog GPU models and partitions of the site
    file's pools and of the cluster's GPU pools (as written; matching is case-insensitive)."""
    live = view.pools()
    typed = {p.gres_type for p in site.pools} | {p.gpu_type for p in live}
    return {
        "GRES types": sorted(t for t in typed if t is not None),
        "GPU models": sorted({p.spec().name for p in site.pools}),
        "partitions": sorted({p.partition for p in site.pools} | {p.partition for p in live}),
    }


def check_gpu_types(req: Requirements, view: ClusterView, site: SiteConfig) -> list[str]:
    """InputError (exit 2) for a limits.gpu_types entry that names no GPU type, model or partition known here nor
    a catalog GPU model (a typo), or when no entry names anything here; a typo used to be ignored, or made every
    pool "not in limits.gpu_types" (exit 3, as if nothing fit). Returns a line for each entry that is a catalog
    model this cluster does not have: a model.yaml may list GPUs of several clusters, so that one is only said."""
    if not req.gpu_types:
        return []
    known = known_gpu_types(view, site)
    here = {name.lower() for names in known.values() for name in names}
    absent = [t for t in req.gpu_types if t not in here]
    if not absent:
        return []
    models = {name.lower() for name in catalog()}  # read only here: the simulator decides thousands of times
    elsewhere = [t for t in absent if t in models]
    unknown = [t for t in absent if t not in models]
    if unknown or len(elsewhere) == len(req.gpu_types):
        bad = unknown or elsewhere
        listed = "; ".join(f"{kind}: {', '.join(names) or 'none'}" for kind, names in known.items())
        raise InputError(
            f"limits.gpu_types: {', '.join(bad)} {'is' if len(bad) == 1 else 'are'} not a GPU type of this cluster "
            f"or its site file. Known ({listed}). Fix: name one of these in limits.gpu_types."
        )
    return [f"limits.gpu_types: {t} is a GPU model this cluster does not have (not used here)" for t in elsewhere]


def usable_pools(
    req: Requirements, view: ClusterView, site: SiteConfig, live_pools: list[GpuPool] | None = None
) -> tuple[list[UsablePool], list[str]]:
    """Pools the job may use, and a line for each pool left out (and why), site-file pools whose partition
    Slurm does not have among them. An unknown limits.gpu_types entry is refused (InputError). `live_pools`:
    `view.pools()` where the caller has it."""
    absent = check_gpu_types(req, view, site)
    allowed = set(req.gpu_types) if req.gpu_types else None
    limit = req.max_gpus
    out: list[UsablePool] = []
    skipped = missing_partition_notes(view, site) + absent
    up: dict[tuple[str, str | None], list[Node]] = {}  # available nodes per (partition, GRES type), in view order
    for n in view.nodes:
        if n.available:
            for p in dict.fromkeys(n.partitions):
                up.setdefault((p, n.gpu_type), []).append(n)
    for live in view.pools() if live_pools is None else live_pools:
        sp = site.pool(live.partition, live.gpu_type)
        where = str(live.key)
        if sp is None:
            skipped.append(untyped_note(live) if live.gpu_type is None else f"{where}: not described in the site file")
            continue
        spec_gpu = sp.spec()
        names = {spec_gpu.name.lower(), live.partition.lower()} | ({live.gpu_type.lower()} if live.gpu_type else set())
        if allowed is not None and not names & allowed:
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
        qos_cap = cap(view.qos, live.gpu_type)  # a plan the QOS never lets run is not searched for
        if qos_cap == 0 and view.qos is not None:
            skipped.append(f"{where}: QOS {view.qos.name} allows no GPUs of it ({' '.join(qos_lines(view.qos))})")
            continue
        option = GpuOption(
            name=live.key,
            spec=spec_gpu,
            max_gpus=min(c for c in (total_up, limit, qos_cap) if c is not None),
            gpus_per_node=sp.gpus_per_node,
            usable_fraction=site.usable_fraction(sp),
            inter_node_gbs=site.inter_node_gbs(sp),
            intra_node_gbs=sp.intra_node_gbs,
            overheads=sp.overheads.for_module_loading(req.eager_module_loading),  # the job's CUDA context
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
