"""Slurm backend over the command-line tools: `sinfo`, `squeue`, `scontrol`, `sbatch`, `scancel`, `sacct`.

Version-specific behaviour is decided once, from `sinfo --version` (its answer kept per sinfo binary, so a
command asks it once per Slurm installation: `version_answer`), by the FEATURES table; the text
formats (`sinfo -O ...:|`, `squeue -o ...|`) serve versions without JSON and can be forced for tests.
A view is one command per kind of data (nodes, jobs, partitions, run in parallel) plus the cluster
name, never one per node; a job-state query is one `squeue`, accounting one `sacct` for many jobs.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.units import GiB
from frenzy_slurm.slurm.backend import (
    AccountingRecord,
    BatchJob,
    ComponentRequest,
    SbatchAnswer,
    StartEstimate,
)
from frenzy_slurm.slurm.commands import component_options, update_pending_argv
from frenzy_slurm.slurm.job import Job
from frenzy_slurm.slurm.parse import (
    SlurmUnexpected,
    default_qos,
    expand_hostlist,
    num,
    parse_gpu_gres,
    parse_parsable,
    parse_qos_rows,
    parse_test_only,
    parse_time_minutes,
    parse_tres_gpus,
    reading,
)
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable, raise_for_status, run

if TYPE_CHECKING:  # the view's pydantic models, imported where a node, partition or QOS is read: a plain `fsqueue`
    # listing reads only jobs and so never imports pydantic (start-up time, benchmarks/fsbatch_latency.py --listing)
    from frenzy_slurm.slurm.view import ClusterView, GpuLimit, Node, Partition, PoolKey, QosLimits


def sbatch_argv(script: Path) -> list[str]:
    """The one sbatch command line of a submission (plan.json records it, submission.json too):
    `sbatch --parsable SCRIPT`, the script's own #SBATCH lines saying everything else."""
    return ["sbatch", "--parsable", str(script)]


@dataclass(frozen=True)
class Features:
    json: bool  # sinfo/squeue --json (21.08+)
    numbers_are_objects: bool  # JSON numbers as {"set", "infinite", "number"} (23.02+)
    nodes_json: tuple[str, ...] = ("sinfo", "--json")  # the command whose {"nodes": [...]} lists every node


SCONTROL_NODES = ("scontrol", "--json", "show", "nodes")
# (major, minor) from which each set of features applies; the last row at or below the version wins.
# Rows from 22.05 on are facts read off the real answers recorded in tests/data/slurm-*/ (index.json says
# which command gave each file); tests/test_seam_slurm_versions.py checks every recorded version against this table.
FEATURES = [
    ((0, 0), Features(json=False, numbers_are_objects=False)),
    ((21, 8), Features(json=True, numbers_are_objects=False)),
    ((23, 2), Features(json=True, numbers_are_objects=True)),
    # sinfo --json answers {"sinfo": [...]} grouped by partition and state, without a node list; scontrol --json
    # (absent in 22.05) lists nodes with gres, gres_used and state as a list of flags. Recorded in 23.11, 24.11,
    # 25.05, 25.11 and 26.05; 23.02 (not recorded here) keeps the row above
    ((23, 11), Features(json=True, numbers_are_objects=True, nodes_json=SCONTROL_NODES)),
]
# times in text answers (squeue -o %S, sacct, sbatch --test-only) follow SLURM_TIME_FORMAT: ask for ISO
TIME_ENV = {"SLURM_TIME_FORMAT": "standard"}
# Caps on answers that are small by nature (run.MAX_ANSWER_BYTES bounds the listings of nodes and jobs)
SMALL_ANSWER = 1 << 20  # sinfo --version, sbatch --parsable and --test-only, scontrol ping
CONFIG_ANSWER = 16 << 20  # scontrol show config / show partition
# sbatch gives up by itself after slurm.conf's MessageTimeout (10 s by default) and retries a busy controller
SUBMIT_TIMEOUT_S = 60.0


MAX_VERSION_ANSWER = 256  # `slurm-wlm 22.05.8`


def _version_cache() -> tuple[Path, str] | None:
    """Where `sinfo --version`'s answer is kept, and the key it is kept under: the `sinfo` on PATH by path,
    inode, size and modification time (an upgrade replaces the binary, and the key with it); None where no
    sinfo is found (then it is run, and fails as it would)."""
    import hashlib
    import shutil

    sinfo = shutil.which("sinfo")
    try:
        st = os.stat(sinfo) if sinfo else None
    except OSError:
        st = None
    if sinfo is None or st is None:
        return None
    key = f"{os.path.realpath(sinfo)}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "frenzy-slurm"
    return base / f"slurm-version-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json", key


def _read_private(path: Path) -> bytes | None:
    """A small regular file of this user that no one else can write, never through a link; else None."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        return os.read(fd, 4 * MAX_VERSION_ANSWER)
    except OSError:
        return None
    finally:
        os.close(fd)


def version_answer(timeout: float) -> str:
    """`sinfo --version`'s answer, kept per sinfo binary (`_version_cache`): a command such as `fsqueue`
    asks Slurm one question (squeue), not two; the version is asked again once sinfo changes."""
    where = _version_cache()
    if where is not None:
        raw = _read_private(where[0])
        try:
            kept = json.loads(raw) if raw else None
        except ValueError:
            kept = None
        if isinstance(kept, dict) and kept.get("key") == where[1] and isinstance(kept.get("answer"), str):
            return kept["answer"][:MAX_VERSION_ANSWER]
    out = run(["sinfo", "--version"], timeout=timeout, max_bytes=SMALL_ANSWER).stdout
    if where is not None and len(out) <= MAX_VERSION_ANSWER:
        try:
            parse_version(out)  # only a readable answer is kept
            from frenzy_slurm.core.records import write_atomic

            where[0].parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_atomic(where[0], json.dumps({"key": where[1], "answer": out}))
        except (SlurmUnexpected, OSError):
            pass  # unreadable: parse_version's caller says so; a read-only home asks each time
    return out


def features_for(version: tuple[int, int]) -> Features:
    return [f for v, f in FEATURES if v <= version][-1]


def parse_version(text: str) -> tuple[int, int]:
    # (?<!\d): a match starts only where a run of digits starts, so a long run of digits costs linear time
    m = re.search(r"(?<!\d)(\d+)\.(\d+)", text)
    if not m:
        raise SlurmUnexpected(f"unexpected Slurm output: cannot read the Slurm version from '{text.strip()[:200]}'")
    return int(m.group(1)), int(m.group(2))


def _state_parts(state: object) -> tuple[str, list[str]]:
    """22.05: 'mixed' + state_flags; 23.02+: ['MIXED', 'DRAIN']; text: 'idle+drain', 'drained*'."""
    if isinstance(state, list):
        words = [str(s) for s in state]
    else:
        words = re.split(r"[+]", str(state))
    base = words[0].lower().rstrip("*~#!%$@^-") if words else "unknown"
    flags = [w.upper().rstrip("*~#!%$@^-") for w in words[1:]]
    if str(state).endswith("*") or (words and words[0].endswith("*")):
        flags.append("NOT_RESPONDING")
    return base, flags


def node_state(state: object, extra_flags: list[str] | None = None) -> tuple[str, list[str]]:
    """A node state as sinfo's StateLong names it, plus flags: 'IDLE+DRAIN' (pyslurm), ['IDLE', 'DRAIN']
    (23.02+ JSON) and 'idle' with state_flags ['DRAIN'] (22.05 JSON) all become ('drained', ['DRAIN'])."""
    base, flags = _state_parts(state)
    flags += [str(f).upper() for f in extra_flags or []]
    # PLANNED (backfill has planned a pending job here) is transient and absent from the text formats
    flags = [f for f in flags if f != "PLANNED"]
    if "DRAIN" in flags and base in ("idle", "mixed", "allocated"):
        base = "drained" if base == "idle" else "draining"  # as sinfo's StateLong prints it
    return base, flags


def node_from_json(n: dict[str, Any]) -> Node:
    from frenzy_slurm.slurm.view import Node  # see the TYPE_CHECKING import above

    base, flags = node_state(n.get("state", "unknown"), n.get("state_flags"))
    gtype, total = parse_gpu_gres(n.get("gres"))
    _, used = parse_gpu_gres(n.get("gres_used"))
    return Node(
        name=n["name"],
        partitions=list(n.get("partitions") or []),
        state=base,
        flags=sorted(set(flags)),
        reason=n.get("reason") or None,
        gpu_type=gtype,
        gpus_total=total,
        gpus_used=used,
        cpus=num(n.get("cpus")) or 0,
        cpus_alloc=num(n.get("alloc_cpus")) or 0,
        memory_mb=num(n.get("real_memory")) or 0,
        memory_alloc_mb=num(n.get("alloc_memory")) or 0,
        features=node_features(n.get("features")),
    )


def node_features(value: object) -> list[str] | None:
    """A node's available features: `"a,b"` (22.05's sinfo --json) or `["a", "b"]` (scontrol --json from 23.11,
    pyslurm); `(null)` and empty mean none, a missing field (None) that the answer does not say."""
    if value is None:
        return None
    items = value if isinstance(value, list) else str(value or "").split(",")
    return [f for f in (str(i).strip() for i in items) if f and f != "(null)"]


def job_gpus(tres_per_node: str | None, tres_per_job: str | None, node_count: int) -> tuple[str | None, int]:
    """GPU type and GPUs per node: `--gres` jobs fill tres_per_node, `--gpus` jobs tres_per_job (per job)."""
    gtype, gpn = parse_gpu_gres((tres_per_node or "").replace("gres/", "gres:"))
    if gpn == 0 and tres_per_job:
        gtype, total = parse_gpu_gres(tres_per_job.replace("gres/", "gres:"))
        gpn = -(-total // max(1, node_count))
    return gtype, gpn


def job_from_json(j: dict[str, Any]) -> Job:
    state = j.get("job_state", "UNKNOWN")
    state = (state[0] if state else "UNKNOWN") if isinstance(state, list) else str(state)
    het = num(j.get("het_job_id")) or None
    gtype, gpn = job_gpus(j.get("tres_per_node"), j.get("tres_per_job"), num(j.get("node_count")) or 1)
    limit = j.get("time_limit")
    return Job(
        job_id=num(j.get("job_id")) or 0,
        het_job_id=het,
        het_job_offset=num(j.get("het_job_offset")) if het else None,
        name=j.get("name") or "",
        user=j.get("user_name") or "",
        state=state,
        reason=None if j.get("state_reason") in (None, "", "None") else j["state_reason"],
        partition=j.get("partition") or "",
        nodes=expand_hostlist(j.get("nodes")),
        node_count=num(j.get("node_count")) or 0,
        gpu_type=gtype,
        gpus_per_node=gpn,
        start_time=num(j.get("start_time")) or None,
        end_time=num(j.get("end_time")) or None,
        time_limit_min=num(limit) if not isinstance(limit, str) else parse_time_minutes(limit),
        comment=j.get("comment") or "",
        workdir=j.get("current_working_directory") or None,
        qos=j.get("qos") or None,
    )


def qos_from_tres(name: str, user: str, per_job: str, per_user: str, group: str) -> QosLimits:
    """A QOS's GPU limits from its MaxTRESPerJob, MaxTRESPerUser and GrpTRES strings."""
    from frenzy_slurm.slurm.view import GpuLimit, QosLimits  # see the TYPE_CHECKING import above

    def limit(text: str) -> GpuLimit:
        total, by_type = parse_tres_gpus(text)
        return GpuLimit(gpus=total, by_type=by_type)

    return QosLimits(name=name, user=user, per_job=limit(per_job), per_user=limit(per_user), group=limit(group))


def json_list(text: str, key: str, argv: list[str]) -> list[dict[str, Any]]:
    """The `key` list of a Slurm JSON answer, every item an object. Slurm 22.05 answers a controller outage with
    exit 0, an `errors` list and an empty list (tests/data/slurm-22.05/down-*.out): that is an outage, not an
    empty cluster. Any other shape is SlurmUnexpected (exit 6).

    strict=False: control characters (a tab or newline in a job name) are taken as they are inside strings."""
    payload = json.loads(text, strict=False)
    if not isinstance(payload, dict):
        raise SlurmUnexpected(
            f"unexpected Slurm output: '{' '.join(argv)}' answered a JSON "
            f'{type(payload).__name__}, not an object with a "{key}" list'
        )
    items = payload.get(key)
    errors = payload.get("errors")
    errors = [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else []
    if items is not None and (not isinstance(items, list) or not all(isinstance(i, dict) for i in items)):
        bad = items if not isinstance(items, list) else next(i for i in items if not isinstance(i, dict))
        raise SlurmUnexpected(
            f"unexpected Slurm output: '{' '.join(argv)}' answered a \"{key}\" list with "
            f"{type(bad).__name__} {str(bad)[:80]!r} where an object was expected"
        )
    if items is None and not errors:
        raise SlurmUnexpected(f"unexpected Slurm output: '{' '.join(argv)}' answered JSON without a \"{key}\" list")
    if errors and not items:
        what = "; ".join(str(e.get("description") or e.get("error") or e) for e in errors)
        raise SlurmUnavailable(
            f"Slurm is unreachable: '{' '.join(argv)}' answered with errors ({what}) and no {key}. "
            "Check that slurmctld runs (`scontrol ping`) and SLURM_CONF."
        )
    assert items is not None  # no list and no errors, or errors and no list, raised above
    return items


def config_value(text: str, key: str) -> str:
    """One value of `scontrol show config` ('' when absent)."""
    for line in text.splitlines():
        k, eq, value = line.partition("=")
        if eq and k.strip() == key:
            return value.strip()
    return ""


def enforces_qos_limits(config: str) -> bool:
    """Whether slurmctld applies QOS limits: accounting through slurmdbd and AccountingStorageEnforce with
    `limits` (or `safe`, which implies it); without them Slurm ignores MaxTRES* and GrpTRES (slurm.conf(5))."""
    enforce = {w.strip().lower() for w in config_value(config, "AccountingStorageEnforce").split(",")}
    return "slurmdbd" in config_value(config, "AccountingStorageType") and bool(enforce & {"limits", "safe"})


def cluster_name_from_config(text: str) -> str:
    """`scontrol -o show config` -> ClusterName ('' when absent)."""
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and key.strip() == "ClusterName":
            return value.strip().split()[0][:200] if value.strip() else ""
    return ""


_KEY = re.compile(r"\w+")


def scontrol_fields(line: str) -> dict[str, str]:
    """`Key=Value Key2=Value2 ...` of one `scontrol -o` line, in linear time (a regex such as `(\\w+)=(\\S*)`
    backtracks quadratically over a long run of word characters: 150 s for a 4 MB line)."""
    out: dict[str, str] = {}
    for token in line.split():
        key, eq, value = token.partition("=")
        if eq and _KEY.fullmatch(key):
            out[key] = value
    return out


def partitions_from_scontrol(text: str) -> list[Partition]:
    from frenzy_slurm.slurm.view import Partition  # see the TYPE_CHECKING import above

    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kv = scontrol_fields(line)
        if "PartitionName" not in kv:
            raise SlurmUnexpected(f"scontrol show partition printed an unexpected line: {line[:200]}")
        out.append(
            Partition(
                name=kv["PartitionName"],
                state=kv.get("State", "UP"),
                nodes=expand_hostlist(kv.get("Nodes")),
                is_default=kv.get("Default") == "YES",
                default_time_min=parse_time_minutes(kv.get("DefaultTime")),
                max_time_min=parse_time_minutes(kv.get("MaxTime")),
                max_nodes=None if kv.get("MaxNodes", "UNLIMITED") == "UNLIMITED" else int(kv["MaxNodes"]),
            )
        )
    return out


# The text format reads no node features (Node.features stays None, "not known"): it serves Slurm before 21.08
# and forced-text tests, and its recorded answers (tests/data/slurm-*/sinfo-text.out) are of these fields
SINFO_TEXT_FIELDS = "NodeList:|,Partition:|,StateLong:|,CPUsState:|,Memory:|,AllocMem:|,Gres:|,GresUsed:|,Reason:|"
SQUEUE_TEXT_FORMAT = "%A|%i|%j|%u|%T|%r|%P|%N|%D|%b|%S|%e|%l|%k|%Z"


def _rows(text: str, fields: int, tool: str) -> Iterator[list[str]]:
    """The `|`-separated rows of a text format, each with at least `fields` fields."""
    for line in text.splitlines():
        if line.strip():
            f = line.split("|")
            if len(f) < fields:
                raise SlurmUnexpected(f"{tool} printed an unexpected line: {line[:200]}")
            yield f


def nodes_from_text(text: str) -> list[Node]:
    from frenzy_slurm.slurm.view import Node  # see the TYPE_CHECKING import above

    nodes: dict[str, Node] = {}
    for f in _rows(text, 9, "sinfo"):
        name, part, state, cpus_state, mem, alloc_mem, gres, gres_used, reason = f[:9]
        part = part.rstrip("*")
        if name in nodes:
            nodes[name].partitions.append(part)
            continue
        base, flags = _state_parts(state)
        if base in ("drained", "draining"):
            flags.append("DRAIN")
        alloc, _idle, _other, total = (int(x) for x in cpus_state.split("/"))
        gtype, gtotal = parse_gpu_gres(gres)
        _, gused = parse_gpu_gres(gres_used)
        nodes[name] = Node(
            name=name,
            partitions=[part],
            state=base,
            flags=sorted(set(flags)),
            reason=None if reason in ("none", "(null)", "") else reason,
            gpu_type=gtype,
            gpus_total=gtotal,
            gpus_used=gused,
            cpus=total,
            cpus_alloc=alloc,
            memory_mb=int(mem.rstrip("+") or 0),
            memory_alloc_mb=int(alloc_mem or 0),
        )
    return list(nodes.values())


def _epoch(text: str) -> int | None:
    if not text or text in ("N/A", "Unknown", "(null)", "None"):
        return None
    return int(time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S")))


def jobs_from_text(text: str) -> list[Job]:
    jobs = []
    for f in _rows(text, 14, "squeue"):
        own, shown, name, user, state, reason, part, nodes, count, gres, start, end, limit, comment = f[:14]
        workdir = f[14] if len(f) > 14 and f[14] not in ("", "(null)") else None
        het = off = None
        if "+" in shown:
            leader, offset = shown.split("+", 1)
            het, off = int(leader), int(offset)
        gtype, gpn = job_gpus(gres, None, int(count or 1))
        jobs.append(
            Job(
                job_id=int(own),
                het_job_id=het,
                het_job_offset=off,
                name=name,
                user=user,
                state=state,
                reason=None if reason in ("None", "(null)") else reason,
                partition=part,
                nodes=expand_hostlist(nodes),
                node_count=int(count or 0),
                gpu_type=gtype,
                gpus_per_node=gpn,
                start_time=_epoch(start),
                end_time=_epoch(end),
                time_limit_min=parse_time_minutes(limit),
                comment="" if comment == "(null)" else comment,
                workdir=workdir,
            )
        )
    return jobs


class SlurmCliBackend:
    name = "cli"
    snapshot: Path | None = None  # asks Slurm

    def __init__(self, force_text: bool = False, timeout: float = 20.0):
        self.force_text = force_text
        self.timeout = timeout
        self._features: Features | None = None
        self.version: str | None = None

    def features(self) -> Features:
        if self._features is None:
            conf = os.environ.get("SLURM_CONF")
            if conf and not Path(conf).is_file():  # the tools would spend ~20 s on DNS SRV look-ups first
                raise SlurmUnavailable(f"SLURM_CONF={conf} does not exist; point it at the cluster's slurm.conf.")
            out = version_answer(self.timeout)
            version = parse_version(out)
            self.version = out.strip().split()[-1][:40] if out.strip() else None
            self._features = features_for(version)
        return self._features

    def _use_json(self) -> bool:
        return self.features().json and not self.force_text

    def _squeue_argv(self, extra: list[str]) -> list[str]:
        if self._use_json():
            return ["squeue", "--json", "--states=all", *extra]
        return ["squeue", "-h", "--states=all", "-o", SQUEUE_TEXT_FORMAT, *extra]

    def _parse_jobs(self, text: str) -> list[Job]:
        use_json = self._use_json()
        with reading("squeue --json" if use_json else "squeue -o", self.version):
            if use_json:
                return [job_from_json(j) for j in json_list(text, "jobs", ["squeue", "--json"])]
            return jobs_from_text(text)

    def load(self) -> ClusterView:
        from frenzy_slurm.slurm.view import ClusterView  # see the TYPE_CHECKING import above

        use_json = self._use_json()
        if use_json:
            cmds = {"nodes": list(self.features().nodes_json)}
        else:
            cmds = {"nodes": ["sinfo", "-N", "-h", "-O", SINFO_TEXT_FIELDS]}
        cmds["jobs"] = self._squeue_argv([])
        cmds["partitions"] = ["scontrol", "-o", "show", "partition"]
        from concurrent.futures import ThreadPoolExecutor  # here: fsqueue, which asks only squeue, never loads it

        with ThreadPoolExecutor(max_workers=3) as pool:
            env = dict(os.environ, **TIME_ENV)
            futures = {
                k: pool.submit(run, argv, self.timeout, env=env, max_bytes=CONFIG_ANSWER if k == "partitions" else None)
                for k, argv in cmds.items()
            }
            out = {k: f.result().stdout for k, f in futures.items()}
        with reading(" ".join(cmds["nodes"]), self.version):
            if use_json:
                nodes = [node_from_json(n) for n in json_list(out["nodes"], "nodes", cmds["nodes"])]
            else:
                nodes = nodes_from_text(out["nodes"])
        jobs = self._parse_jobs(out["jobs"])
        with reading("scontrol -o show partition", self.version):
            partitions = partitions_from_scontrol(out["partitions"])
        nodes.sort(key=lambda n: n.name)
        jobs.sort(key=lambda j: j.job_id)
        config = run(
            ["scontrol", "-o", "show", "config"], timeout=self.timeout, check=False, max_bytes=CONFIG_ANSWER
        ).stdout
        with reading("scontrol -o show config", self.version):
            return ClusterView(
                cluster=cluster_name_from_config(config),
                backend=self.name,
                slurm_version=self.version,
                partitions=partitions,
                nodes=nodes,
                jobs=jobs,
            )

    def expected_start(self, components: list[ComponentRequest]) -> StartEstimate:
        argv = ["sbatch", "--test-only"]
        for i, c in enumerate(components):
            if i:
                argv.append(":")
            argv += component_options(c.partition, c.nodes, c.gpus_per_node, c.gpu_type, c.cpus_per_gpu)
            argv += [f"--mem-per-cpu={c.mem_per_gpu_mb}M", f"--time={c.time_min}"]
            argv += [f"--constraint={c.constraint}"] if c.constraint else []
            argv += ["--exclusive"] if c.exclusive else []
        # the answer is on stderr; a refused request fails with the reason, which run() reports
        res = run(argv, timeout=self.timeout, input_text="#!/bin/sh\ntrue\n", env=dict(os.environ, **TIME_ENV))
        with reading("sbatch --test-only", self.version):
            start, nodes, _ = parse_test_only(res.stderr + res.stdout)
        return StartEstimate(start=start, nodes=nodes, source="test-only")

    def submit(self, job: BatchJob) -> SbatchAnswer:
        """`sbatch --parsable SCRIPT` (`sbatch_argv`): the script's own #SBATCH lines say it all. Run under
        the job's umask, so that Slurm creates the job's output files private too, and in its own
        process group, so that a Ctrl-C at the terminal reaches fsbatch (which finishes recording) and not
        sbatch halfway through sending the job."""
        argv = sbatch_argv(job.script)
        if job.dependency is not None:  # options before the script: sbatch reads the command line over #SBATCH
            argv[-1:-1] = [f"--dependency={job.dependency}"]
        res = run(argv, timeout=SUBMIT_TIMEOUT_S, umask=job.umask, max_bytes=SMALL_ANSWER, own_process_group=True)
        with reading("sbatch --parsable", self.version):
            job_id, cluster = parse_parsable(res.stdout)
        return SbatchAnswer(job_id=job_id, cluster=cluster, argv=argv)

    def jobs(self, job_ids: Iterable[int] | None = None, user: str | None = None) -> list[Job]:
        extra = []
        ids = sorted(set(job_ids)) if job_ids is not None else None
        if ids is not None:
            if not ids:
                return []
            extra.append("--jobs=" + ",".join(map(str, ids)))
        if user is not None:
            extra.append(f"--user={user}")
        res = run(self._squeue_argv(extra), timeout=self.timeout, check=False, env=dict(os.environ, **TIME_ENV))
        if res.returncode != 0 and ids is not None and "invalid job id" in res.stderr.lower():
            return []  # none of them is known any more (they left the queue after MinJobAge)
        raise_for_status(res)
        found = self._parse_jobs(res.stdout)
        # filtered here too: 22.05's `squeue --json` ignores --user and --jobs and prints every job
        if user is not None:
            found = [j for j in found if j.user == user]
        if ids is None:
            return found
        wanted = set(ids)  # a hetjob asked for by its leader id brings all its components
        return [j for j in found if j.job_id in wanted or (j.het_job_id or 0) in wanted]

    def cancel(self, job_id: int, signal: str | None = None) -> None:
        # a hetjob leader's id cancels every component; --signal without --full reaches the job's steps (the
        # trainer's srun step), not the batch shell, which a USR2 would end
        argv = ["scancel", *([f"--signal={signal}"] if signal else []), str(job_id)]
        run(argv, timeout=self.timeout)

    def requeue(self, job_id: int) -> None:
        run(["scontrol", "requeue", str(job_id)], timeout=self.timeout)

    def hold(self, job_id: int) -> None:
        run(["scontrol", "hold", str(job_id)], timeout=self.timeout)

    def release(self, job_id: int) -> None:
        run(["scontrol", "release", str(job_id)], timeout=self.timeout)

    def update_pending(self, job_id: int, component: ComponentRequest, restate_tasks: bool = True) -> None:
        c = component
        argv = update_pending_argv(
            job_id, c.partition, c.nodes, c.gpus_per_node, c.gpu_type, c.cpus_per_gpu, restate_tasks
        )
        run(argv, timeout=self.timeout)

    def is_operator(self) -> bool:
        """root, or AdminLevel Operator/Administrator in `sacctmgr show user` (False where accounting does not
        answer: nothing is then tried that only an operator may do)."""
        import pwd

        if os.geteuid() == 0:
            return True  # Slurm's super user
        user = pwd.getpwuid(os.getuid()).pw_name
        try:
            res = run(["sacctmgr", "-n", "-P", "show", "user", user, "format=AdminLevel"], timeout=self.timeout)
        except (SlurmCommandError, SlurmUnavailable):
            return False
        return res.stdout.strip().splitlines()[:1] in (["Operator"], ["Administrator"])

    def preempted(self, job_id: int) -> bool:
        """scontrol's PreemptTime (`None` until a preemption starts; every Slurm version since 2.x has it), of
        any component of a hetjob."""
        out = run(["scontrol", "show", "job", "-o", str(job_id)], timeout=self.timeout).stdout
        return any(t not in ("None", "Unknown", "") for t in re.findall(r"\bPreemptTime=(\S*)", out))

    def accounting(self, job_ids: Iterable[int]) -> dict[int, AccountingRecord] | None:
        """One `sacct` for all the jobs; None where the site has no accounting (or it does not answer)."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        argv = [
            "sacct",
            "-n",
            "-X",
            "-P",
            "-j",
            ",".join(map(str, ids)),
            "-o",
            "JobIDRaw,JobID,State,ExitCode,Start,End,ElapsedRaw,NNodes,AllocTRES,User,WorkDir",
        ]
        try:
            res = run(argv, timeout=self.timeout, env=dict(os.environ, **TIME_ENV))
        except (SlurmCommandError, SlurmUnavailable):
            return None  # accounting disabled or slurmdbd down: callers fall back to the job directory
        with reading("sacct", self.version):
            return parse_sacct(res.stdout)

    def gpu_memory_peaks(self, job_ids: Iterable[int]) -> dict[int, float] | None:
        """One `sacct` over the jobs' steps: the largest gres/gpumem in TRESUsageInMax per job."""
        ids = sorted(set(job_ids))
        if not ids:
            return {}
        argv = ["sacct", "-n", "-P", "--noconvert", "-j", ",".join(map(str, ids)), "-o", "JobID,TRESUsageInMax"]
        try:
            res = run(argv, timeout=self.timeout)
        except (SlurmCommandError, SlurmUnavailable):
            return None  # accounting disabled or slurmdbd down
        with reading("sacct TRESUsageInMax", self.version):
            return parse_gpumem(res.stdout)

    def qos_limits(self, qos: str | None = None) -> QosLimits | None:
        """The QOS's GPU limits from `sacctmgr` (three short queries); None where Slurm enforces no QOS limits
        (no slurmdbd, AccountingStorageEnforce without `limits`) or accounting does not answer."""
        import pwd

        try:
            config = run(["scontrol", "show", "config"], timeout=self.timeout, max_bytes=CONFIG_ANSWER).stdout
            if not enforces_qos_limits(config):
                return None
            user = pwd.getpwuid(os.getuid()).pw_name
            if qos is None:
                fields = "format=DefaultAccount,Account,Partition,QOS,DefaultQOS"
                res = run(["sacctmgr", "-n", "-P", "show", "user", user, "withassoc", fields], timeout=self.timeout)
                with reading("sacctmgr show user withassoc", self.version):
                    qos = default_qos(res.stdout)
                if qos is None:
                    return None  # no association: Slurm refuses the job itself, with its own message
            argv = ["sacctmgr", "-n", "-P", "show", "qos", "where", f"name={qos}"]
            res = run([*argv, "format=Name,MaxTRESPerJob,MaxTRESPerUser,GrpTRES"], timeout=self.timeout)
        except (SlurmCommandError, SlurmUnavailable):
            return None  # slurmdbd down or sacctmgr missing: plan as without limits (sbatch still checks)
        with reading("sacctmgr show qos", self.version):
            rows = parse_qos_rows(res.stdout)
            if qos not in rows:
                return None  # an unknown QOS: sbatch refuses it with "Invalid qos specification"
            return qos_from_tres(qos, user, *rows[qos])

    def run_step(self, pool: PoolKey, gpus: int, argv: list[str], timeout: float) -> str:
        """`srun` on one node of the pool; --immediate so a busy pool fails fast instead of queueing."""
        wait = max(5, int(timeout / 3))
        gres = f"gpu:{pool.gres_type}:{gpus}" if pool.gres_type else f"gpu:{gpus}"
        srun = [
            "srun",
            f"--partition={pool.partition}",
            "--nodes=1",
            "--ntasks=1",
            f"--gres={gres}",
            f"--immediate={wait}",
            f"--time={max(1, int(-(-timeout // 60)))}",
            "--job-name=frenzy-site-probe",
            "--chdir=/",
            "--quiet",
            *argv,
        ]  # from /: nothing of the caller's directory (or /tmp) is picked up
        return run(srun, timeout=timeout).stdout


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}


def parse_gpumem(text: str) -> dict[int, float]:
    """`sacct -P --noconvert -o JobID,TRESUsageInMax` rows -> {job id: GiB}, the max over its steps and
    hetjob components (JobID `123`, `123.0`, `123+1.batch`). gres/gpumem is bytes, or a number with a
    K/M/G/T suffix where the site's sacct converts units; rows without it (Slurm < 23.02, no GPU
    accounting, the allocation line) are skipped."""
    out: dict[int, float] = {}
    for line in text.splitlines():
        job, _, tres = line.partition("|")
        m = re.match(r"\s*(\d+)", job, re.ASCII)
        g = re.search(r"(?:^|,)gres/gpumem=(\d+(?:\.\d+)?)([KMGTP]?)(?:,|$)", tres, re.ASCII)
        if not m or not g:
            continue
        gib = float(g.group(1)) * _UNITS[g.group(2)] / GiB
        jid = int(m.group(1))
        out[jid] = max(out.get(jid, 0.0), gib)
    return out


def parse_sacct(text: str) -> dict[int, AccountingRecord]:
    """`sacct -n -X -P -o JobIDRaw,JobID,State,ExitCode,Start,End,ElapsedRaw,NNodes,AllocTRES,User,WorkDir` rows,
    keyed by job id (the last four may be absent; WorkDir is last, so a `|` in a path stays in it).

    A heterogeneous job's components (JobID `123+0`, `123+1`) are also filed under the leader's id
    (the first component's record), as users know the job by that id.
    """
    out: dict[int, AccountingRecord] = {}
    for line in text.splitlines():
        f = line.split("|")
        if len(f) < 7 or not (f[0].isascii() and f[0].strip().isdigit()):
            continue
        state = f[2].split()[0] if f[2].strip() else "UNKNOWN"  # "CANCELLED by 0" -> CANCELLED
        rec = AccountingRecord(
            job_id=int(f[0]),
            state=state,
            exit_code=f[3] or None,
            start=_epoch(f[4]),
            end=_epoch(f[5]),
            elapsed_s=int(f[6]) if f[6].isascii() and f[6].isdigit() else None,
            nodes=int(f[7]) if len(f) > 7 and f[7].isascii() and f[7].isdigit() else None,
            alloc_gpus=parse_tres_gpus(f[8])[0] if len(f) > 8 else None,
            user=(f[9].strip() or None) if len(f) > 9 else None,
            work_dir=("|".join(f[10:]) or None) if len(f) > 10 else None,
        )
        out[rec.job_id] = rec
        leader, plus, offset = f[1].partition("+")
        if plus and leader.isascii() and leader.isdigit() and offset.split(".")[0] == "0":
            out.setdefault(int(leader), rec)
    return out
