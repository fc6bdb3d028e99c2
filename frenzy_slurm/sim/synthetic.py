"""Synthetic static cluster views and site files, for the HAS decision benchmark and tests.

A view at one instant, without a clock; `slurm.SimSlurm` is the simulated controller over time.
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from frenzy_slurm.site.config import IntraLink, Pool, SiteConfig
from frenzy_slurm.slurm.view import ClusterView, Job, Node, Partition


def synthetic(
    pools: list[tuple[str, str, int, int]],
    busy: float = 0.0,
    seed: int = 0,
    now: float = 1.8e9,
    job_minutes: int = 60,
    gres_types: Mapping[str, str] | None = None,
) -> ClusterView:
    """pools: (partition, catalog GPU, nodes, GPUs per node). `busy` of the GPUs are held by running jobs
    that end at random times within `job_minutes`. A partition's GRES type is `gres_types[partition]` where given
    (the dev cluster names them after the partitions: gpu:a100), else the GPU's name (a100_40gb)."""
    rng = random.Random(seed)
    nodes, parts, jobs = [], [], []
    job_id = 1
    for partition, gpu, count, gpn in pools:
        gres = (gres_types or {}).get(partition) or gpu.lower().replace("-", "_")
        names = [f"{partition}-{i}" for i in range(1, count + 1)]
        parts.append(Partition(name=partition, nodes=names, default_time_min=60))
        for name in names:
            used = min(gpn, int(round(gpn * busy + rng.uniform(-0.5, 0.5)))) if busy else 0
            nodes.append(
                Node(
                    name=name,
                    partitions=[partition],
                    state="mixed" if used else "idle",
                    gpu_type=gres,
                    gpus_total=gpn,
                    gpus_used=used,
                    cpus=8 * gpn,
                    memory_mb=64000 * gpn,
                )
            )
            if used:
                end = now + rng.randint(1, job_minutes) * 60
                jobs.append(
                    Job(
                        job_id=job_id,
                        name="other",
                        user="someone",
                        state="RUNNING",
                        partition=partition,
                        nodes=[name],
                        node_count=1,
                        gpu_type=gres,
                        gpus_per_node=used,
                        start_time=int(now - 600),
                        end_time=int(end),
                        time_limit_min=job_minutes,
                    )
                )
                job_id += 1
    return ClusterView(cluster="synthetic", backend="static", taken_at=now, partitions=parts, nodes=nodes, jobs=jobs)


def with_queue(view: ClusterView, pools: list[tuple[str, str, int, int]], pending: int, seed: int) -> ClusterView:
    """`view` with `pending` jobs waiting in random partitions of `pools` (1-4 nodes of 1-8 GPUs, 1-24 h limits;
    every third job the user "me"'s): a deep queue for the decision benchmark and the release index's tests."""
    rng = random.Random(seed)
    first = max((j.job_id for j in view.jobs), default=0) + 1
    jobs = []
    for i in range(pending):
        part, gpu, _, gpn = rng.choice(pools)
        jobs.append(
            Job(
                job_id=first + i,
                name=f"queued-{i}",
                user="me" if i % 3 == 0 else "someone",
                state="PENDING",
                partition=part,
                node_count=rng.choice((1, 1, 1, 2, 4)),
                gpu_type=gpu.lower().replace("-", "_"),
                gpus_per_node=rng.choice([g for g in (1, 2, 4, 8) if g <= gpn]),
                time_limit_min=rng.choice((60, 240, 720, 1440)),
            )
        )
    return view.model_copy(update={"jobs": view.jobs + jobs})


def synthetic_site(pools: list[tuple[str, str, int, int]]) -> SiteConfig:
    links: dict[str, IntraLink] = {"V100": "nvlink2", "A100": "nvlink3", "H100": "nvlink4", "H200": "nvlink4"}
    return SiteConfig(
        cluster="synthetic",
        pools=[
            Pool(
                partition=p,
                gres_type=gpu.lower().replace("-", "_"),
                gpu=gpu,
                gpus_per_node=gpn,
                intra_node=links.get(gpu.split("-")[0], "pcie4"),
            )
            for p, gpu, _, gpn in pools
        ],
    )


# 2,048 GPUs in 8 GPU types (the HAS benchmark's cluster)
LARGE = [
    ("h100", "H100-SXM", 32, 8),
    ("a100x", "A100-80GB", 48, 8),
    ("a100", "A100-40GB", 48, 8),
    ("l40s", "L40S", 48, 4),
    ("a40", "A40", 32, 4),
    ("a10g", "A10G", 64, 4),
    ("v100", "V100-32GB", 32, 8),
    ("t4", "T4", 48, 4),
]
