"""Cluster backend over pyslurm, used where `import pyslurm` works and matches the running Slurm.

Written to pyslurm 25.11's API as observed on a real cluster (shared/docs/pyslurm-25.11.md):
node GPU allocation is empty without accounting, so it is derived from running jobs'
`gres_per_node` and `allocated_nodes`; importing pyslurm without a Slurm configuration ends the
process, so the configuration is checked first; heterogeneous jobs cannot be submitted through it,
so submission, cancellation, requeue, start estimates and accounting go through the CLI backend.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from typing import Iterable

from frenzy_slurm.slurm.backend import AccountingRecord, BatchJob, ComponentRequest, StartEstimate, Submitted
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.slurm.model import ClusterView, Job, Node, Partition
from frenzy_slurm.slurm.parse import expand_hostlist, parse_gpu_gres, parse_time_minutes
from frenzy_slurm.slurm.run import SlurmUnavailable


def slurm_config_present() -> bool:
    conf = os.environ.get("SLURM_CONF")
    return Path(conf).is_file() if conf else Path("/etc/slurm/slurm.conf").is_file()


def try_import():
    """The pyslurm module, or None (missing, no Slurm configuration, or a version mismatch)."""
    if not slurm_config_present():
        return None  # importing pyslurm here would end the process
    try:
        import pyslurm  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        daemon = pyslurm.slurmctld.Config.load().version
    except Exception:  # noqa: BLE001 - pyslurm raises its own RPCError types; any failure means "not usable"
        return None
    if str(pyslurm.__version__).split(".")[:2] != str(daemon).split(".")[:2]:
        return None
    return pyslurm


def _gres_dict_to_str(d: dict | None) -> str:
    return ",".join(f"{k.replace('gres/', '')}:{v}" for k, v in (d or {}).items())


class PyslurmBackend:
    name = "pyslurm"

    def __init__(self, module=None):
        self.pyslurm = module or try_import()
        if self.pyslurm is None:
            raise SlurmUnavailable("the pyslurm backend needs pyslurm matching the running Slurm (and a slurm.conf); "
                                   "use --backend cli")
        self._cli = SlurmCliBackend()  # for what pyslurm cannot do (hetjob submission, --test-only, sacct)

    @staticmethod
    def _job(j) -> Job:
        gtype, gpn = parse_gpu_gres(_gres_dict_to_str(j.gres_per_node))
        het = j.heterogeneous_id
        return Job(job_id=j.id, het_job_id=het, het_job_offset=(j.heterogeneous_offset or 0) if het else None,
                   name=j.name or "", user=j.user_name or "", state=str(j.state), reason=j.state_reason or None,
                   partition=j.partition or "", nodes=expand_hostlist(j.allocated_nodes), node_count=j.num_nodes or 0,
                   gpu_type=gtype, gpus_per_node=gpn, start_time=j.start_time or None, end_time=j.end_time or None,
                   time_limit_min=j.time_limit if isinstance(j.time_limit, int) else parse_time_minutes(j.time_limit),
                   comment=j.comment or "", workdir=getattr(j, "working_directory", None) or None)

    def load(self) -> ClusterView:
        ps = self.pyslurm
        try:
            nodes_raw = ps.Nodes.load()
            parts_raw = ps.Partitions.load()
            jobs_raw = ps.Jobs.load()
            version = ps.slurmctld.Config.load().version
        except Exception as exc:  # noqa: BLE001 - RPCError and friends
            raise SlurmUnavailable(f"pyslurm could not reach slurmctld: {exc}") from None
        jobs = []
        used: dict[str, int] = defaultdict(int)
        for j in jobs_raw.values():
            job = self._job(j)
            jobs.append(job)
            if job.phase == "running":
                for n in job.nodes:
                    used[n] += job.gpus_per_node
        nodes = []
        for n in nodes_raw.values():
            gtype, total = parse_gpu_gres(_gres_dict_to_str(n.configured_gres))
            state = str(n.state).lower()
            base, *flags = state.split("+")
            nodes.append(Node(name=n.name, partitions=list(n.partitions or []), state=base,
                              flags=[f.upper() for f in flags], reason=n.reason or None, gpu_type=gtype,
                              gpus_total=total, gpus_used=min(total, used.get(n.name, 0)), cpus=n.total_cpus or 0,
                              cpus_alloc=n.allocated_cpus or 0, memory_mb=n.real_memory or 0,
                              memory_alloc_mb=n.allocated_memory or 0))
        parts = [Partition(name=p.name, state=str(p.state), nodes=expand_hostlist(p.nodes),
                           is_default=bool(p.is_default), default_time_min=p.default_time or None,
                           max_time_min=parse_time_minutes(str(p.max_time)) if p.max_time is not None else None,
                           max_nodes=p.max_nodes if isinstance(p.max_nodes, int) else None)
                 for p in parts_raw.values()]
        return ClusterView(backend=self.name, slurm_version=str(version), partitions=parts,
                           nodes=sorted(nodes, key=lambda n: n.name), jobs=sorted(jobs, key=lambda j: j.job_id))

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        try:
            raw = self.pyslurm.Jobs.load()
        except Exception as exc:  # noqa: BLE001 - RPCError and friends
            raise SlurmUnavailable(f"pyslurm could not reach slurmctld: {exc}") from None
        wanted = set(job_ids) if job_ids is not None else None
        out = []
        for j in raw.values():
            job = self._job(j)
            if wanted is not None and job.job_id not in wanted and (job.het_job_id or 0) not in wanted:
                continue
            if user is not None and job.user != user:
                continue
            out.append(job)
        return sorted(out, key=lambda j: j.job_id)

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        return self._cli.expected_start(components)  # pyslurm has no test-only submission

    def submit(self, job: BatchJob) -> Submitted:
        return self._cli.submit(job)  # pyslurm cannot submit hetjobs nor keep the script's own #SBATCH lines

    def cancel(self, job_id: int) -> None:
        self._cli.cancel(job_id)

    def requeue(self, job_id: int) -> None:
        self._cli.requeue(job_id)

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        return self._cli.accounting(job_ids)

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        return self._cli.gpu_memory_peaks(job_ids)

    def run_step(self, pool, gpus: int, argv: list[str], timeout: float) -> str:
        return self._cli.run_step(pool, gpus, argv, timeout)  # job steps are srun's
