"""Simulated clusters: a YAML file or the compact form `A100-80GB:2x8,V100-32GB:4x8,T4:6x4`.

One partition per entry (nodes x GPUs per node of one catalog GPU model). From it come the nodes the
simulated Slurm schedules on and the site file HAS and MARP read, so both see the same hardware.
"""

from __future__ import annotations

import math
import random
import re
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, model_validator

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import catalog, match_gpu
from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.site.config import IntraLink, Pool, SiteConfig, SiteDefaults

if TYPE_CHECKING:
    from frenzy_slurm.slurm.view import ClusterView

# Intra-node link a node of this GPU family usually has (SXM boards: NVLink; PCIe cards: the PCIe generation).
_DEFAULT_LINK: dict[str, IntraLink] = {
    "V100": "nvlink2",
    "A100": "nvlink3",
    "H100": "nvlink4",
    "H200": "nvlink4",
    "B200": "nvlink5",
}


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SimPartition(_M):
    name: str = Field(description="Partition name (also the node name prefix).", pattern=r"^[A-Za-z0-9_-]+$")
    gpu: str = Field(description="Catalog GPU model (`frenzy-slurm site catalog`), e.g. A100-80GB.")
    nodes: int = Field(gt=0, description="Nodes in the partition.")
    gpus_per_node: int = Field(gt=0, description="GPUs per node.")
    gres_type: str | None = Field(None, description="Slurm GRES type name; default: the GPU model in lower case.")
    intra_node: IntraLink | None = Field(None, description="GPU-to-GPU link in a node; default by GPU family.")
    max_time_min: int | None = Field(None, gt=0, description="Partition MaxTime in minutes; null = unlimited.")

    @model_validator(mode="after")
    def _known(self) -> SimPartition:
        if self.gpu not in catalog():
            close = match_gpu(self.gpu)
            hint = f" (did you mean {close.name}?)" if close else ""
            raise ValueError(f"gpu '{self.gpu}' is not in the catalog{hint}; known: {', '.join(catalog())}")
        return self

    @property
    def gres(self) -> str:
        return self.gres_type or self.gpu.lower().replace("-", "_")

    @property
    def link(self) -> IntraLink:
        return self.intra_node or _DEFAULT_LINK.get(self.gpu.split("-")[0], "pcie4")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


class SimCluster(_M):
    """A cluster for the simulator."""

    name: str = Field("sim", description="Cluster name.")
    inter_node_gbs: float = Field(25.0, gt=0, description="Network bandwidth per GPU between nodes, GB/s.")
    partitions: list[SimPartition] = Field(min_length=1, description="One entry per partition (one GPU model each).")

    @model_validator(mode="after")
    def _unique(self) -> SimCluster:
        names = [p.name for p in self.partitions]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"partition names must be unique; repeated: {', '.join(sorted(dup))}")
        return self

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.partitions)

    def site(self) -> SiteConfig:
        """The site file HAS and MARP read for this cluster."""
        return SiteConfig(
            cluster=self.name,
            defaults=SiteDefaults(inter_node_gbs=self.inter_node_gbs),
            pools=[
                Pool(partition=p.name, gres_type=p.gres, gpu=p.gpu, gpus_per_node=p.gpus_per_node, intra_node=p.link)
                for p in self.partitions
            ],
        )

    @classmethod
    def from_view(cls, view: ClusterView, site: SiteConfig) -> SimCluster:
        """The same partitions, node counts and GPUs as a live cluster (one partition per GPU pool)."""
        parts: list[SimPartition] = []
        for pool in view.pools():
            sp = site.pool(pool.partition, pool.gpu_type)
            if sp is None:
                raise InputError(f"{pool.partition}/{pool.gpu_type} is not described in the site file {site.cluster}")
            parts.append(
                SimPartition(
                    name=pool.partition,
                    gpu=sp.gpu,
                    nodes=pool.nodes_up + pool.nodes_down,
                    gpus_per_node=pool.gpus_per_node,
                    gres_type=pool.gpu_type,
                    intra_node=sp.intra_node if isinstance(sp.intra_node, str) else None,
                )
            )
        return cls(name=view.cluster or site.cluster, inter_node_gbs=site.defaults.inter_node_gbs, partitions=parts)

    def describe(self) -> str:
        return ", ".join(f"{p.name}: {p.nodes}x{p.gpus_per_node} {p.gpu}" for p in self.partitions)


_COMPACT = re.compile(r"^(?P<gpu>[A-Za-z0-9_.-]+?):(?P<nodes>\d+)x(?P<gpn>\d+)\Z")


def parse_compact(text: str) -> SimCluster:
    """`A100-80GB:2x8,V100-32GB:4x8,T4:6x4`: GPU model : nodes x GPUs per node, one partition each."""
    parts: list[SimPartition] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        m = _COMPACT.match(item)
        if not m:
            raise InputError(
                f"--cluster: '{item}' is not GPU:NODESxGPUS (e.g. A100-80GB:2x8); "
                "or give a YAML file (see docs/simulation.md)"
            )
        gpu = m["gpu"]
        if gpu not in catalog():
            close = match_gpu(gpu)
            if close is None:
                raise InputError(f"--cluster: GPU '{gpu}' is not in the catalog; known: {', '.join(catalog())}")
            gpu = close.name
        name = re.sub(r"[^a-z0-9]+", "", gpu.lower())
        base, k = name, 2
        while name in {p.name for p in parts}:
            name, k = f"{base}{k}", k + 1
        parts.append(SimPartition(name=name, gpu=gpu, nodes=int(m["nodes"]), gpus_per_node=int(m["gpn"])))
    if not parts:
        raise InputError("--cluster: empty; give e.g. A100-80GB:2x8,V100-32GB:4x8,T4:6x4 or a YAML file")
    return SimCluster(partitions=parts)


def load_cluster(arg: str) -> SimCluster:
    """A YAML file if `arg` names one, else the compact form."""
    path = Path(arg)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise InputError(f"--cluster: {arg}: no such file")
        return load_model_file(path, SimCluster)
    return parse_compact(arg)


# The standard clusters of the JCT benchmark: three GPU types at 64 GPUs, the same mix at 512, and the
# 2,048-GPU, eight-type cluster of the HAS decision benchmark.
SMALL = "A100-80GB:2x8,V100-32GB:4x8,T4:4x4"
MEDIUM = "A100-80GB:16x8,V100-32GB:32x8,T4:32x4"
LARGE = "H100-SXM:32x8,A100-80GB:48x8,A100-40GB:48x8,L40S:48x4,A40:32x4,A10G:64x4,V100-32GB:32x8,T4:48x4"


# The catalog's data-centre GPU models a generated shape draws from, with the GPUs per node such a node usually
# has (SXM boards 8, PCIe cards 4 or 8). Consumer cards are left out: no site buys nodes of them for training.
_GENERATED_TYPES: dict[str, tuple[int, ...]] = {
    "H200": (8,),
    "H100-SXM": (8,),
    "H100-PCIe": (4, 8),
    "A100-80GB": (8,),
    "A100-40GB": (8,),
    "L40S": (4, 8),
    "A40": (4, 8),
    "A10G": (4,),
    "L4": (4, 8),
    "V100-32GB": (8,),
    "V100-16GB": (8,),
    "T4": (4,),
}


def generated_shape(
    seed: int, min_gpus: int = 32, max_gpus: int = 512, types: tuple[int, int] = (3, 5), one_node: bool = False
) -> str:
    """A cluster shape drawn from `seed`, in the compact form: `types` (lo, hi) GPU models of the catalog, a size
    of `min_gpus`..`max_gpus` GPUs (log-uniform), split over the types by random weights (each type one node at
    least). `one_node`: one node of each type instead (the size is then the types' GPUs per node: drawn again
    until it is within the bounds). The JCT benchmark judges HAS on shapes drawn with seeds its tuning never saw
    (benchmarks/jct.py)."""
    rng = random.Random(f"shape/{seed}")
    if one_node:
        return _one_node_shape(rng, min_gpus, max_gpus, types)
    models = rng.sample(sorted(_GENERATED_TYPES), rng.randint(*types))
    target = round(math.exp(rng.uniform(math.log(min_gpus), math.log(max_gpus))))
    weights = [rng.uniform(0.5, 2.0) for _ in models]
    parts = []
    for model, w in zip(models, weights, strict=True):
        gpn = rng.choice(_GENERATED_TYPES[model])
        nodes = max(1, round(target * w / sum(weights) / gpn))
        parts.append((model, nodes, gpn))
    # rounding to whole nodes (one at least) may leave the size outside the bounds: the largest pool gives nodes
    # back, or the smallest gets more, until it is within them
    while sum(n * g for _, n, g in parts) > max_gpus and any(n > 1 for _, n, _ in parts):
        k = max(range(len(parts)), key=lambda i: parts[i][1] * parts[i][2])
        m, n, g = parts[k]
        parts[k] = (m, n - 1, g)
    while sum(n * g for _, n, g in parts) < min_gpus:
        k = min(range(len(parts)), key=lambda i: parts[i][1] * parts[i][2])
        m, n, g = parts[k]
        parts[k] = (m, n + 1, g)
    return ",".join(f"{m}:{n}x{g}" for m, n, g in parts)


def _one_node_shape(rng: random.Random, min_gpus: int, max_gpus: int, types: tuple[int, int]) -> str:
    """One node of each of `types` (lo, hi) catalog models, drawn with `rng` until the GPUs total
    `min_gpus`..`max_gpus` (a few one-node pools: the small clusters where one job can take a whole type)."""
    for _ in range(1000):
        models = rng.sample(sorted(_GENERATED_TYPES), rng.randint(*types))
        parts = [(m, rng.choice(_GENERATED_TYPES[m])) for m in models]
        if min_gpus <= sum(g for _, g in parts) <= max_gpus:
            return ",".join(f"{m}:1x{g}" for m, g in parts)
    raise ValueError(f"no {types[0]}-{types[1]} one-node types total {min_gpus}-{max_gpus} GPUs")
