"""Cluster backend over pyslurm, used where `import pyslurm` works and matches the running Slurm.

Written to pyslurm 25.11's API as observed on a real cluster (shared/docs/pyslurm-25.11.md):
- node GPU allocation (`Node.allocated_gres`) is filled only where accounting tracks GPU TRES
  (`AccountingStorageTRES` names gres/gpu); there it is used, elsewhere it is derived from running jobs
  (which misses jobs that asked with `--gpus`: their `gres_per_node` is empty);
- `import pyslurm` ends the process on a missing or unusable slurm.conf and stalls about 10 s when the
  controller is down, so it is first done in a child process (verdict cached per pyslurm version and
  slurm.conf), only where the pyslurm release matches the running Slurm's (`sinfo --version`), and only
  after `scontrol ping` (answers in milliseconds) says the controller is up;
- pyslurm decodes Slurm's strings as strict UTF-8 when an attribute is read: a job named with other bytes
  (`sbatch -J $'caf\\xe9'`) raises UnicodeDecodeError; `_attr` reads such text with U+FFFD instead, and a
  load that fails on it is read through the CLI backend (which decodes the same way), never an outage;
- heterogeneous jobs cannot be submitted through it, so submission, cancellation, requeue, start estimates
  and accounting go through the CLI backend.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable  # pyslurm is untyped: its objects are Any here
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.slurm.backend import (
    AccountingRecord,
    BatchJob,
    ComponentRequest,
    SbatchAnswer,
    StartEstimate,
)
from frenzy_slurm.slurm.cli import SlurmCliBackend, node_features, node_state, parse_version
from frenzy_slurm.slurm.job import Job
from frenzy_slurm.slurm.parse import SlurmUnexpected, expand_hostlist, parse_gpu_gres, parse_time_minutes, reading
from frenzy_slurm.slurm.run import SlurmUnavailable, run

if TYPE_CHECKING:  # the view's pydantic models, imported where a view is built (`_view`): `open_backend` imports
    # this module to probe pyslurm, and a plain `fsqueue` listing builds no view (start-up time)
    from frenzy_slurm.slurm.view import ClusterView, PoolKey, QosLimits

PROBE_TIMEOUT = 30.0


def slurm_conf() -> Path | None:
    conf = Path(os.environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
    return conf if conf.is_file() else None


def slurm_config_present() -> bool:
    return slurm_conf() is not None


def pyslurm_version() -> str | None:
    """The installed pyslurm's version, read from its metadata (no import)."""
    import importlib.util

    # where no pyslurm is on the path (most sites), say so without scanning every installed distribution's
    # metadata: a look-up in the path finders' caches, not the tens of milliseconds of importlib.metadata
    if importlib.util.find_spec("pyslurm") is None:
        return None
    from importlib import metadata

    try:
        return metadata.version("pyslurm")
    except metadata.PackageNotFoundError:
        return None


def _probe_cache(key: str) -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "frenzy-slurm"
    return base / f"pyslurm-probe-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def probe_import(conf: Path, version: str) -> str | None:
    """Import pyslurm in a child process: None if that works, else why not. The verdict is cached per
    (pyslurm version, interpreter, slurm.conf path and modification time), so this costs one child process
    once, not one per command."""
    stat = conf.stat()
    key = f"{version}|{sys.executable}|{conf.resolve()}|{stat.st_mtime_ns}|{stat.st_size}"
    cache = _probe_cache(key)
    try:
        return json.loads(cache.read_text())["problem"]
    except (OSError, ValueError, KeyError):
        pass
    env = dict(os.environ, SLURM_CONF=str(conf))
    try:
        # -P: a pyslurm.py in the working directory is not imported (docs/security.md)
        res = subprocess.run(
            [sys.executable, "-P", "-c", "import pyslurm; print(pyslurm.__version__)"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return f"importing pyslurm did not finish within {PROBE_TIMEOUT:.0f}s"  # not cached: may be an outage
    if res.returncode == 0:
        problem = None
    else:
        lines = (res.stderr or res.stdout).strip().splitlines()
        problem = f"importing pyslurm fails here ({lines[-1] if lines else f'exit {res.returncode}'})"
    try:
        cache.parent.mkdir(parents=True, exist_ok=True, mode=0o700)

        write_atomic(cache, json.dumps({"key": key, "problem": problem}))
    except OSError:
        pass  # a read-only home costs one probe per command
    return problem


def pyslurm_problem() -> str | None:
    """Why the pyslurm backend cannot be used here and now, or None if it can (then importing is safe)."""
    version = pyslurm_version()
    if version is None:
        return "pyslurm is not installed (pip install pyslurm; it exists for Slurm 25.11 only)"
    conf = slurm_conf()
    if conf is None:
        return "no slurm.conf (set SLURM_CONF); importing pyslurm without one would end the process"
    try:
        slurm = run(["sinfo", "--version"], timeout=15).stdout
        running = parse_version(slurm)
    except (SlurmUnavailable, SlurmUnexpected) as exc:
        return f"the running Slurm's version is unknown ({exc})"
    if parse_version(version) != running:
        return (
            f"pyslurm {version} does not match the running Slurm {slurm.split()[-1]} "
            "(pyslurm X.Y works only with Slurm X.Y)"
        )
    ping = run(["scontrol", "ping"], timeout=15, check=False)
    if " is UP" not in ping.stdout:
        said = ping.stdout.strip().splitlines()[0] if ping.stdout.strip() else ping.stderr.strip()
        return f"slurmctld does not answer (`scontrol ping`: {said})"
    return probe_import(conf, version)


def try_import() -> Any:
    """The pyslurm module, or None (missing, unusable configuration, controller down, or a version mismatch)."""
    if pyslurm_problem() is not None:
        return None
    try:
        import pyslurm
    except ImportError:
        return None
    try:
        daemon = pyslurm.slurmctld.Config.load().version
    except Exception:  # noqa: BLE001 - pyslurm raises its own RPCError types; any failure means "not usable"
        return None
    if str(pyslurm.__version__).split(".")[:2] != str(daemon).split(".")[:2]:
        return None
    return pyslurm


def _attr(obj: Any, name: str, default: Any = None) -> Any:
    """An attribute of a pyslurm object; text that is not UTF-8 (pyslurm's strict decoding raises
    UnicodeDecodeError, carrying the bytes) comes back decoded with U+FFFD for the invalid bytes."""
    try:
        value = getattr(obj, name, default)
    except UnicodeDecodeError as exc:
        return bytes(exc.object).decode("utf-8", errors="replace")
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def _gres_dict_to_str(d: dict | None) -> str:
    return ",".join(f"{k.replace('gres/', '')}:{v}" for k, v in (d or {}).items())


def _gpu_count(gres: dict | None) -> int:
    """{'gpu': 2, 'gpu:a100': 2} (the untyped total and the typed counts) -> 2."""
    gres = {k.replace("gres/", ""): v for k, v in (gres or {}).items()}
    if "gpu" in gres:
        return int(getattr(gres["gpu"], "count", gres["gpu"]) or 0)
    return sum(int(getattr(v, "count", v) or 0) for k, v in gres.items() if k.startswith("gpu:"))


def _gpu_type(gres: dict | None) -> str | None:
    return next((k.split(":", 1)[1] for k in (gres or {}) if k.replace("gres/", "").startswith("gpu:")), None)


class PyslurmBackend:
    name = "pyslurm"
    snapshot: Path | None = None  # asks Slurm

    def __init__(self, module: Any = None) -> None:
        self.pyslurm = module or try_import()
        if self.pyslurm is None:
            raise SlurmUnavailable(
                f"the pyslurm backend cannot be used: {pyslurm_problem() or 'pyslurm did not load'}; use --backend cli"
            )
        self._cli = SlurmCliBackend()  # for what pyslurm cannot do (hetjob submission, --test-only, sacct)

    @staticmethod
    def _job(j: Any) -> Job:
        with reading("pyslurm.Jobs.load()"):
            return PyslurmBackend._job_fields(j)

    @staticmethod
    def _job_fields(j: Any) -> Job:
        a = functools.partial(_attr, j)  # every text attribute may hold another user's bytes
        gtype, gpn = parse_gpu_gres(_gres_dict_to_str(a("gres_per_node")))
        nodes = a("num_nodes")
        if gpn == 0:  # asked with --gpus: gres_per_node is empty; the job's TRES (with accounting) has the total
            gpus = a("gpus") or {}
            total = _gpu_count(gpus)
            if total:
                gtype, gpn = _gpu_type(gpus), -(-total // max(1, nodes or 1))
        het = a("heterogeneous_id")
        reason = a("state_reason")
        limit = a("time_limit")
        return Job(
            job_id=a("id"),
            het_job_id=het,
            het_job_offset=(a("heterogeneous_offset") or 0) if het else None,
            name=a("name") or "",
            user=a("user_name") or "",
            state=str(a("state") or "UNKNOWN"),
            reason=None if reason in (None, "", "None") else reason,
            partition=a("partition") or "",
            nodes=expand_hostlist(a("allocated_nodes")),
            node_count=nodes or 0,
            gpu_type=gtype,
            gpus_per_node=gpn,
            start_time=a("start_time") or None,
            end_time=a("end_time") or None,
            time_limit_min=limit if isinstance(limit, int) else parse_time_minutes(limit),
            comment=a("comment") or "",
            workdir=a("working_directory") or None,
            qos=a("qos") or None,
        )

    def load(self) -> ClusterView:
        ps = self.pyslurm
        try:
            nodes_raw = ps.Nodes.load()
            parts_raw = ps.Partitions.load()
            jobs_raw = ps.Jobs.load()
            config = ps.slurmctld.Config.load()
        except UnicodeError:  # pyslurm decoded some text strictly while loading: the CLI tools read it all
            return self._cli.load()
        except Exception as exc:  # noqa: BLE001 - RPCError and friends
            raise SlurmUnavailable(f"pyslurm could not reach slurmctld: {exc}") from None
        # allocated_gres is reliable (and includes --gpus jobs) only where accounting tracks GPU TRES
        gpu_tres = any(str(t).startswith("gres/gpu") for t in (config.accounting_storage_tres or []))
        jobs = []
        used: dict[str, int] = defaultdict(int)
        for j in jobs_raw.values():
            job = self._job(j)
            jobs.append(job)
            if job.phase == "running":
                for n in job.nodes:
                    used[n] += job.gpus_per_node
        with reading("pyslurm.Nodes.load()"):
            return self._view(config, gpu_tres, jobs, used, nodes_raw, parts_raw)

    def _view(
        self, config: Any, gpu_tres: bool, jobs: list[Job], used: dict[str, int], nodes_raw: Any, parts_raw: Any
    ) -> ClusterView:
        """The view of one pyslurm load: its nodes and partitions, with the jobs already read."""
        from frenzy_slurm.slurm.view import ClusterView, Node, Partition  # see the TYPE_CHECKING import above

        nodes = []
        for n in nodes_raw.values():
            gtype, total = parse_gpu_gres(_gres_dict_to_str(n.configured_gres))
            base, flags = node_state(str(n.state or "unknown"))  # 'IDLE+DRAIN' -> drained, PLANNED dropped
            gpus_used = _gpu_count(n.allocated_gres) if gpu_tres else used.get(n.name, 0)
            nodes.append(
                Node(
                    name=n.name,
                    partitions=list(n.partitions or []),
                    state=base,
                    flags=sorted(set(flags)),
                    reason=_attr(n, "reason") or None,
                    gpu_type=gtype,
                    gpus_total=total,
                    gpus_used=min(total, gpus_used),
                    cpus=n.total_cpus or 0,
                    cpus_alloc=n.allocated_cpus or 0,
                    memory_mb=n.real_memory or 0,
                    memory_alloc_mb=n.allocated_memory or 0,
                    features=node_features(_attr(n, "available_features")),
                )
            )
        parts = [
            Partition(
                name=p.name,
                state=str(p.state),
                nodes=expand_hostlist(p.nodes),
                is_default=bool(p.is_default),
                default_time_min=p.default_time or None,
                max_time_min=parse_time_minutes(str(p.max_time)) if p.max_time is not None else None,
                max_nodes=p.max_nodes if isinstance(p.max_nodes, int) else None,
            )
            for p in parts_raw.values()
        ]
        return ClusterView(
            cluster=config.cluster_name or "",
            backend=self.name,
            slurm_version=str(config.version),
            partitions=parts,
            nodes=sorted(nodes, key=lambda n: n.name),
            jobs=sorted(jobs, key=lambda j: j.job_id),
        )

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        try:
            raw = self.pyslurm.Jobs.load()
        except UnicodeError:  # as in load(): the CLI tools read it all
            return self._cli.jobs(job_ids=job_ids, user=user)
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

    def submit(self, job: BatchJob) -> SbatchAnswer:
        return self._cli.submit(job)  # pyslurm cannot submit hetjobs nor keep the script's own #SBATCH lines

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        self._cli.cancel(job_id, signal)  # scancel: one tool for every Slurm version

    def requeue(self, job_id: int) -> None:
        self._cli.requeue(job_id)

    def hold(self, job_id: int) -> None:
        self._cli.hold(job_id)

    def release(self, job_id: int) -> None:
        self._cli.release(job_id)

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        self._cli.update_pending(
            job_id, component, restate_tasks
        )  # scontrol's update: one command, as for hold and release

    def is_operator(self) -> bool:
        return self._cli.is_operator()  # sacctmgr's answer, as for the QOS limits

    def preempted(self, job_id: int) -> bool:
        return self._cli.preempted(job_id)  # asked once per stop, from inside the job: scontrol is enough

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        return self._cli.accounting(job_ids)

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        return self._cli.gpu_memory_peaks(job_ids)

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        return self._cli.qos_limits(qos)  # sacctmgr's answer: pyslurm's QOS API differs between its releases

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        return self._cli.run_step(pool, gpus, argv, timeout)  # job steps are srun's
