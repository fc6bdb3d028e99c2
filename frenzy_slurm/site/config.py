"""Site files: what each partition's GPUs are (site_configs/*.yaml), joined to the GPU catalog.

A pool is one (partition, GRES type) pair; a partition with two GPU types has two pools. A partition whose
GRES is untyped (`Gres=gpu:4`, no type) has one pool with `untyped: true`: Slurm cannot say which GPU it is,
so the site file does (issue 21: such clusters used to look as if they had no GPUs).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic.config import JsonDict

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import GpuSpec, catalog, match_gpu
from frenzy_slurm.core.inputfile import check_trusted
from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.slurm.view import pool_label

# Per-GPU, one-direction bandwidth in GB/s (NVIDIA NVLink generations; PCIe x16 per generation).
LINK_GBS: dict[str, float] = {
    "nvlink1": 80.0,
    "nvlink2": 150.0,
    "nvlink3": 300.0,
    "nvlink4": 450.0,
    "nvlink5": 900.0,
    "pcie3": 16.0,
    "pcie4": 32.0,
    "pcie5": 64.0,
}
IntraLink = Literal["nvlink1", "nvlink2", "nvlink3", "nvlink4", "nvlink5", "pcie3", "pcie4", "pcie5"]


class _M(BaseModel):
    # finite numbers only: an infinite memory or bandwidth would break the planner's arithmetic
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


# Upper bounds far beyond any GPU or network (a B200 has 180 GiB, 2.25 PFLOP/s dense BF16 and 8 TB/s; NVLink 5
# is 900 GB/s): a value past them is a typo (GB for MB), and would only make every plan look free.
_MAX_GIB = 16_384.0
_MAX_TFLOPS = 1e6
_MAX_GBS = 1e6
_MAX_S = 3600.0
_MAX_GPUS_PER_NODE = 256
_MAX_CPUS_PER_GPU = 1024
_MAX_OVERHEAD_MIN = 525_600.0  # one year, in minutes
# units, shown with a value's allowed range when it is out of it (yamlfile.allowed_range)
IN_GIB: JsonDict = {"unit": "GiB"}
IN_TFLOPS: JsonDict = {"unit": "TFLOP/s"}
IN_GBS: JsonDict = {"unit": "GB/s"}
IN_SECONDS: JsonDict = {"unit": "s"}
IN_FRACTION: JsonDict = {"unit": "(a fraction)"}
IN_GPUS_PER_NODE: JsonDict = {"unit": "GPUs per node"}
IN_CPUS_PER_GPU: JsonDict = {"unit": "CPUs per GPU"}
# Slurm partition and GRES type names reach job.sbatch (`#SBATCH --partition=`, `--gres=gpu:TYPE:N`): plain
# words, matched in full (a trailing newline would end the #SBATCH line)
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.+@%-]{1,256}\Z")


def _slurm_name(what: str, value: str) -> str:
    """A partition or GRES type name as it may appear in an #SBATCH line."""
    if not _SLURM_NAME.fullmatch(value):
        raise ValueError(
            f"{what} {value!r} is not a Slurm name this tool can pass to sbatch: use letters, digits "
            "and _.+@%- only (as `sinfo` shows it)"
        )
    return value


class GpuOverrides(_M):
    """Any catalog value, replaced for this site (e.g. a power-capped part)."""

    memory_gib: float | None = Field(
        None, gt=0, le=_MAX_GIB, json_schema_extra=IN_GIB, description="Device memory, GiB."
    )
    fp32: float | None = Field(
        None, gt=0, le=_MAX_TFLOPS, json_schema_extra=IN_TFLOPS, description="Peak FP32 TFLOP/s."
    )
    tf32: float | None = Field(
        None, gt=0, le=_MAX_TFLOPS, json_schema_extra=IN_TFLOPS, description="Peak TF32 TFLOP/s."
    )
    bf16: float | None = Field(
        None, gt=0, le=_MAX_TFLOPS, json_schema_extra=IN_TFLOPS, description="Peak BF16 TFLOP/s."
    )
    fp16: float | None = Field(
        None, gt=0, le=_MAX_TFLOPS, json_schema_extra=IN_TFLOPS, description="Peak FP16 TFLOP/s."
    )
    mem_bw_gbs: float | None = Field(
        None, gt=0, le=_MAX_GBS, json_schema_extra=IN_GBS, description="Memory bandwidth, GB/s."
    )
    efficiency: float | None = Field(
        None, ge=0.01, le=1, json_schema_extra=IN_FRACTION, description="Training utilisation assumed for step time."
    )
    step_overhead_s: float | None = Field(
        None,
        ge=0,
        le=_MAX_S,
        json_schema_extra=IN_SECONDS,
        description="Fixed seconds per optimizer step (usually written by `frenzy-slurm calibrate`).",
    )
    microbatch_overhead_s: float | None = Field(
        None, ge=0, le=_MAX_S, json_schema_extra=IN_SECONDS, description="Fixed seconds per micro-batch slot."
    )


class SiteDefaults(_M):
    inter_node_gbs: float = Field(
        25.0,
        gt=0,
        le=_MAX_GBS,
        json_schema_extra=IN_GBS,
        description="Network bandwidth per GPU between nodes, GB/s (25 = 200 Gb/s).",
    )
    usable_fraction: float = Field(
        0.95, gt=0.5, le=1.0, json_schema_extra=IN_FRACTION, description="Share of GPU memory plans may use."
    )


class Pool(_M):
    partition: str = Field(description="Slurm partition name.")
    gres_type: str | None = Field(
        None, description="Slurm GRES type of the GPUs (gpu:TYPE:N in gres.conf); leave out with `untyped: true`."
    )
    untyped: bool = Field(
        False,
        description="The partition's GPUs have no GRES type (Gres=gpu:N, gres.conf without Type=): `gpu` says "
        "which model they are, and jobs ask for them as --gres=gpu:N.",
    )
    gpu: str = Field(description="GPU model from the catalog (`frenzy-slurm site catalog`), e.g. A100-80GB.")
    gpus_per_node: int = Field(
        gt=0, le=_MAX_GPUS_PER_NODE, json_schema_extra=IN_GPUS_PER_NODE, description="GPUs per node."
    )
    intra_node: IntraLink | float = Field(description="GPU-to-GPU link in a node: nvlink1-5, pcie3-5, or GB/s.")
    cpus_per_gpu: int = Field(
        4,
        gt=0,
        le=_MAX_CPUS_PER_GPU,
        json_schema_extra=IN_CPUS_PER_GPU,
        description="CPUs requested per GPU (one task per GPU).",
    )
    inter_node_gbs: float | None = Field(
        None, gt=0, le=_MAX_GBS, json_schema_extra=IN_GBS, description="Network GB/s per GPU; default from `defaults`."
    )
    usable_fraction: float | None = Field(
        None, gt=0.5, le=1.0, json_schema_extra=IN_FRACTION, description="Default from `defaults`."
    )
    overrides: GpuOverrides = Field(default_factory=GpuOverrides, description="Catalog values replaced for this site.")
    unconfirmed: list[Literal["gpu", "intra_node"]] = Field(
        default_factory=list,
        description="Values `frenzy-slurm site init`/`site detect` guessed from Slurm's names and nobody measured "
        "(NVML) or confirmed: `site validate` lists them, and no job is planned while `gpu` is here (its memory "
        "is a guess) unless overrides.memory_gib states the memory. Check them, then delete them from the list.",
    )
    overheads: Overheads = Field(
        default_factory=Overheads,
        description="Per-GPU memory beside the tensors, measured on this pool's nodes: CUDA context, NCCL buffers, "
        "cuBLAS workspaces, the caching allocator's excess (docs/marp.md, Overheads by metric).",
    )

    @field_validator("partition", "gres_type")
    @classmethod
    def _names(cls, v: str | None, info: ValidationInfo) -> str | None:
        assert info.field_name is not None  # a field validator is always told its field
        return None if v is None else _slurm_name(info.field_name, v)

    @field_validator("intra_node", mode="before")
    @classmethod
    def _link_speed(cls, v: object) -> object:
        """A link name, or a GB/s figure that is a real link speed: 0 would divide the planner's transfer times
        by zero, infinity (`1e999`, which YAML reads as a string) would make every transfer free."""
        if isinstance(v, str) and v not in LINK_GBS:
            try:
                v = float(v)
            except ValueError:
                raise ValueError(
                    f"intra_node {v!r} is not a link: give nvlink1-5, pcie3-5, or GB/s (0 < value <= {_MAX_GBS:g})"
                ) from None
        if isinstance(v, int | float) and not isinstance(v, bool) and not (math.isfinite(v) and 0 < v <= _MAX_GBS):
            raise ValueError(
                f"intra_node {v} GB/s is not a link speed; give GB/s between 0 and {_MAX_GBS:g} "
                "(exclusive of 0), or a link name: nvlink1-5, pcie3-5"
            )
        return v

    @model_validator(mode="after")
    def _known_gpu(self) -> Pool:
        if self.gpu not in catalog():
            close = match_gpu(self.gpu)
            hint = f" (did you mean {close.name}?)" if close else ""
            raise ValueError(f"gpu '{self.gpu}' is not in the catalog{hint}; known: {', '.join(catalog())}")
        return self

    @model_validator(mode="after")
    def _typed_or_not(self) -> Pool:
        """Exactly one of gres_type and `untyped: true`: a forgotten gres_type must not silently mean untyped."""
        if self.untyped and self.gres_type is not None:
            raise ValueError(
                f"pool partition={self.partition} has both gres_type: {self.gres_type} and untyped: true; "
                "keep gres_type if Slurm shows gpu:TYPE:N (sinfo -o %G), untyped: true if it shows gpu:N"
            )
        if not self.untyped and self.gres_type is None:
            raise ValueError(
                f"pool partition={self.partition} needs gres_type (Slurm's gpu:TYPE:N, `sinfo -o %G`), or "
                "untyped: true where the GRES has no type (gpu:N)"
            )
        return self

    @property
    def memory_guessed(self) -> bool:
        """The GPU model was guessed and not confirmed, and no one wrote the memory: it may be twice the real."""
        return "gpu" in self.unconfirmed and self.overrides.memory_gib is None

    @property
    def label(self) -> str:
        """partition/GRES type, as notes and calibration name the pool."""
        return pool_label(self.partition, self.gres_type)

    def spec(self) -> GpuSpec:
        base = catalog()[self.gpu]
        changes = {k: v for k, v in self.overrides.model_dump().items() if v is not None}
        return base.model_copy(update=changes) if changes else base

    @property
    def intra_node_gbs(self) -> float:
        return LINK_GBS[self.intra_node] if isinstance(self.intra_node, str) else float(self.intra_node)


class Preemption(_M):
    """The site's preemptible QOS, which jobs marked preemptible (`fsbatch --preemptible`, model.yaml's
    `slurm.preemptible`) run in. Slurm must say what it means: `PreemptType=preempt/qos`,
    `PreemptMode=REQUEUE`, the normal QOS with `Preempt=` this one, and a `GraceTime` long enough for a
    checkpoint (docs/admin.md, "Preemptible jobs")."""

    qos: str = Field(description="The preemptible QOS's name (sacctmgr show qos), e.g. preemptible.")
    min_run_min: int = Field(
        60,
        ge=0,
        le=_MAX_OVERHEAD_MIN,
        json_schema_extra={"unit": "minutes"},
        description="A job marked preemptible whose predicted run is shorter stays in its own QOS: preempting "
        "it would save the others little and cost it a restart (60: the best of 0-120 in simulation, "
        "docs/simulation-model.md).",
    )
    max_job_share: float | None = Field(
        None,
        gt=0,
        le=1,
        json_schema_extra=IN_FRACTION,
        description="The most of one pool's GPUs HAS gives a preemptible job; null: the site's max_job_share. "
        "A larger share lets it use idle GPUs, which the jobs that arrive later take back by preempting it "
        "(in simulation it measured no better than the site's share, docs/simulation-model.md).",
    )
    move_share: float | None = Field(
        None,
        gt=0,
        le=1,
        json_schema_extra=IN_FRACTION,
        description="The most of one pool's GPUs `frenzy-slurm watch` moves a running preemptible job onto while "
        "no job waits anywhere (idle GPUs; the next job to arrive preempts it); null: max_job_share holds it "
        "(1.0 measured best in simulation, docs/simulation.md).",
    )
    restart_s: float = Field(
        300.0,
        gt=0,
        le=86400,
        json_schema_extra=IN_SECONDS,
        description="What `frenzy-slurm watch` takes a move of a running job to cost, seconds: the checkpoint's "
        "save, the new job's start-up and the restore (with checkpoint_gbs: the start-up alone). A move is made "
        "only where it still finishes the job sooner.",
    )
    checkpoint_gbs: float | None = Field(
        None,
        gt=0,
        le=10000,
        description="GB/s at which a job's checkpoint is written and read on this site's storage, as the admin "
        "measured it (a job's checkpoint save and load times over its size). With it, a move also costs writing "
        "and reading the job's checkpoint, its size from MARP's model states (14 bytes per parameter for a "
        "mixed-precision full fine-tune, the adapters alone for LoRA): a 70B job's move then costs far more than "
        "a 1B job's. null: restart_s for every job.",
    )

    @field_validator("qos")
    @classmethod
    def _qos_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", v, re.ASCII):
            raise ValueError(f"{v!r} is not a QOS name: use letters, digits and _.-")
        return v


class Replan(_M):
    """How much an in-place change of a waiting job (model.yaml's slurm.replan) must gain: `frenzy-slurm watch`
    changes a job's shape only where the new one is predicted to finish it sooner by more than both."""

    margin_s: float = Field(
        600.0,
        ge=0,
        le=86400,
        json_schema_extra=IN_SECONDS,
        description="The least a change must gain, seconds (predictions err by minutes; each change is an update "
        "Slurm must take and a plan the job picks anew).",
    )
    margin_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        json_schema_extra=IN_FRACTION,
        description="The least a change must gain, as a share of the time the job is predicted to take from now "
        "as it waits (the same tolerance HAS's own ties use).",
    )


class SiteConfig(_M):
    cluster: str = Field(description="Cluster name (informational; `site validate` compares it).")
    defaults: SiteDefaults = Field(default_factory=SiteDefaults, description="Values every pool inherits.")
    pools: list[Pool] = Field(min_length=1, description="One entry per (partition, GPU type).")
    job_dirs_group_readable: bool = Field(
        False,
        description="Job directories and what jobs write there readable by the user's group (0750/0640, "
        "umask 027) instead of private (0700/0600, umask 077); never writable by anyone but the user.",
    )
    device: Literal["cuda", "cpu"] = Field(
        "cuda",
        description="What the jobs' ranks compute on: cuda (NVIDIA GPUs), or cpu where the GRES stand for CPU "
        "processes (the local dev cluster's fake GPUs, site_configs/devcluster-cpu.yaml). MARP predicts the "
        "tensors torch's CPU kernels keep there (per-tensor optimizer steps, composite norms, full-width "
        "dropout masks; docs/marp.md).",
    )
    max_job_share: float = Field(
        0.5,
        gt=0,
        le=1,
        json_schema_extra=IN_FRACTION,
        description="The most of one pool's GPUs HAS gives one job, unless it needs more to fit "
        "(or asks for more with limits.min_gpus): the rest stays for the jobs that arrive while it runs. "
        "1.0 lets one job take a whole pool when that finishes it soonest.",
    )
    pipeline_margin: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="A pipeline across GPU types (one heterogeneous job) is chosen only where it is predicted to "
        "finish this share of the time to completion sooner than every allocation of one type: it runs at its "
        "slowest stage, so an error in any one type's speed slows all of it, and its stages send across "
        "partitions. In simulation 0.2 still chose pipelines that finished later than one type alone, 0.3 "
        "only ones that broke even; 0 chooses it wherever it is predicted sooner (docs/has.md, cross-type "
        "pipelines).",
    )
    price_weight: float = Field(
        2.0,
        ge=0,
        le=1000,
        description="How much HAS weighs the delay an allocation causes the other jobs (those queued for its "
        "GPU type and those expected to arrive while it runs, from Slurm's view) against the job's own completion: "
        "1 is the sum of completion times in HAS's model of the queue, which leaves out the jobs' speed-ups "
        "(Slurm's view does not have them), so the default weighs the delay twice; 0 is earliest completion "
        'alone (docs/has.md, "GPU-type prices").',
    )
    arrival_room: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="How much HAS weighs, for a job that starts now, the jobs expected to arrive at its pool while "
        "it runs (the pool's running jobs over their time limits, from Slurm's view) and find no GPU free there: "
        "Slurm starts a job that lists several partitions on the first with room, so each runs on a slower type "
        "while another pool has a free GPU, counted as half a typical run there times the share of speed it "
        "loses (catalog rates). 0, the default, leaves it out: 1 passed the tuning shapes but not the judging set "
        '(docs/has.md, "Plain users: room for arrivals").',
    )
    preemption: Preemption | None = Field(
        None,
        description="The site's preemptible QOS for jobs their users mark preemptible; none: such jobs are "
        "refused (exit 2).",
    )

    replan: Replan = Field(
        default_factory=Replan,
        description="In-place re-planning of waiting jobs marked slurm.replan by `frenzy-slurm watch`: the gain a "
        "change must bring.",
    )

    trusted_factories: list[str] = Field(
        default_factory=list,
        description="model.factory values `fsbatch --trace-factory` may import and call "
        "although they are not the user's own files (installed packages): `pkg.module:function` exactly, or "
        "`pkg` / `pkg.module` for every function in it. Default: none. Each one runs as the user on the login "
        "node; list only model builders (never torch.hub, setuptools or anything that runs what it is given).",
    )

    @field_validator("trusted_factories")
    @classmethod
    def _factory_names(cls, v: list[str]) -> list[str]:
        for entry in v:
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*(:[A-Za-z_]\w*)?", entry, re.ASCII):
                raise ValueError(f"{entry!r} is not a factory or module name; write pkg.module:function or pkg.module")
        return v

    @model_validator(mode="after")
    def _unique(self) -> SiteConfig:
        seen = set()
        for p in self.pools:
            key = (p.partition, p.gres_type)
            if key in seen:
                what = f"gres_type={p.gres_type}" if p.gres_type else "untyped: true"
                raise ValueError(f"pool partition={p.partition} {what} is listed twice")
            seen.add(key)
        return self

    def pool(self, partition: str, gres_type: str | None) -> Pool | None:
        """The pool of this partition and GRES type; gres_type None is the partition's untyped GPUs."""
        return next((p for p in self.pools if p.partition == partition and p.gres_type == gres_type), None)

    def inter_node_gbs(self, pool: Pool) -> float:
        return pool.inter_node_gbs or self.defaults.inter_node_gbs

    def usable_fraction(self, pool: Pool) -> float:
        return pool.usable_fraction or self.defaults.usable_fraction


def load_site(path: Path) -> SiteConfig:
    """The site file, refused unless it is yours or root's and no one else can write it (or its directory)."""
    if os.path.lexists(path):  # a missing file gets read_yaml's own message
        check_trusted(path, "site file", "its pools, overheads and defaults decide every job's plan")
    return load_model_file(path, SiteConfig)


def unconfirmed_values(site: SiteConfig) -> list[str]:
    """One line per value of the site file that was guessed and never measured or confirmed (`unconfirmed:`)."""
    out = []
    for pool in site.pools:
        for key in pool.unconfirmed:
            value = pool.gpu if key == "gpu" else pool.intra_node
            what = "its memory is the catalog's for that model" if key == "gpu" else "it sets the link speed"
            out.append(
                f"pool {pool.label}: {key}: {value} was guessed from Slurm's names, never measured or confirmed "
                f"({what}): check it (`frenzy-slurm site detect` measures it with NVML on a node), then remove "
                f"'{key}' from the pool's unconfirmed: list"
            )
    return out


def require_measured_memory(site: SiteConfig, path: Path) -> None:
    """No plan on a pool whose GPU memory is a guess: a 40 GB card taken for an 80 GB one runs out of memory
    in every job placed there. InputError (exit 2) naming the pools and what to do."""
    guessed = [p for p in site.pools if p.memory_guessed]
    if guessed:
        names = ", ".join(f"{p.label} (gpu: {p.gpu})" for p in guessed)
        raise InputError(
            f"{path}: the GPU model, and so the memory, of pool(s) {names} was guessed by `frenzy-slurm site "
            "init`/`site detect` and never measured or confirmed; no job is planned on a guessed memory. To fix "
            "(the admin): check gpu: (`frenzy-slurm site catalog`, or `site detect` on a node with NVML), then "
            "remove 'gpu' from the pool's unconfirmed: list, or state the memory in overrides.memory_gib."
        )
