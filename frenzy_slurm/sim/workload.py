"""Workloads: LLM training jobs with arrival times, as files, sampled from the Philly trace.

A workload is a YAML file (`jobs:` list) or a CSV file with the same columns; both can be edited and
replayed. `sample_philly` builds one from `philly.csv` (Jeon et al., ATC'19; the Pollux/Sia form):

1. keep jobs of at least 60 s and under 1,000 GPU-hours (Sia's filter); take `jobs` consecutive
   submissions from a random point of the trace (seeded); arrival = submission minus the first one's;
2. each job's GPU-time is its work on a *reference GPU* (A100-40GB at its catalog bf16 peak x
   utilisation): work = gpu_time x rate, in FLOPs;
3. an LLM by GPU-time, as Sia assigns models (short jobs are small models or small fine-tunes, long
   ones 7B-70B full training or LoRA/QLoRA): a preset, method, sequence length and global batch,
   drawn (seeded) from the bin's choices below;
4. steps = work / (flops_per_token x global_batch x seq_len) with MARP's FLOPs-per-token model, so
   the job's work on the reference GPU matches its GPU-time in the trace;
5. precision: bf16-mixed, or fp16-mixed for a share of full and LoRA jobs (`fp16_share`; the teams
   that also run on V100/T4, which have no bf16 tensor cores); QLoRA computes in bf16.
The trace's GPU count is kept as `trace_gpus` (what the user is used to asking for), its virtual
cluster as `group` (a team; `user-fixed:usual` sends each team to its usual partition).
"""

from __future__ import annotations

import csv
import functools
import random
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import JobSpec
from frenzy_slurm.jobspec.presets import presets
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.speed import flops_per_token

if TYPE_CHECKING:
    from frenzy_slurm.jobspec.job import JobSpec, Method, Precision

REFERENCE_GPU = "A100-40GB"
# The utilisation the trace's GPU-time is turned into work at: the catalog's assumed value when the shipped workloads
# (sim/data) were drawn. A conversion of the trace, not MARP's estimate: it stays when the catalog's efficiencies are
# read anew (issue 29/30, docs/marp.md "Step time"), so a workload file stays its sample of the trace.
REFERENCE_UTILISATION = 0.45
MIN_DURATION_S = 60.0
MAX_GPU_HOURS = 1000.0

# GPU-hours bins -> (preset, method) choices. Upper bounds exclusive.
MODEL_BINS: list[tuple[float, list[tuple[str, Method]]]] = [
    (1.0, [("gpt2", "full"), ("gpt2-medium", "full"), ("qwen2-0.5b", "full"), ("llama-3.2-1b", "lora")]),
    (
        10.0,
        [
            ("gpt2-xl", "full"),
            ("llama-3.2-1b", "full"),
            ("qwen2-1.5b", "full"),
            ("llama-2-7b", "lora"),
            ("mistral-7b", "qlora"),
            ("llama-3-8b", "lora"),
        ],
    ),
    (
        100.0,
        [
            ("llama-3.2-3b", "full"),
            ("llama-2-7b", "full"),
            ("llama-3-8b", "full"),
            ("llama-2-13b", "lora"),
            ("llama-2-70b", "qlora"),
        ],
    ),
    (
        float("inf"),
        [("llama-2-13b", "full"), ("llama-3-8b", "full"), ("llama-2-70b", "lora"), ("llama-3-70b", "qlora")],
    ),
]
SEQ_LENS = (1024, 2048, 4096)
GLOBAL_BATCHES = (32, 64, 128, 256)
MIN_STEPS = 20


class _M(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WorkloadJob(_M):
    id: int = Field(ge=0, description="Job number in the workload.")
    submit_s: float = Field(ge=0, description="Arrival, seconds after the workload's start.")
    model: str = Field(description="Model preset (`frenzy-slurm presets`).")
    method: Literal["full", "lora", "qlora"] = Field("full", description="Full training or a LoRA/QLoRA fine-tune.")
    precision: Literal["bf16-mixed", "fp16-mixed", "fp32", "bf16-pure"] = Field("bf16-mixed", description="Precision.")
    seq_len: int = Field(gt=0, description="Tokens per sample.")
    global_batch: int = Field(gt=0, description="Samples per optimizer step.")
    steps: int = Field(gt=0, description="Optimizer steps (the token budget is steps x global_batch x seq_len).")
    trace_gpus: int = Field(1, gt=0, description="GPUs the trace job held: what its user is used to asking for.")
    trace_gpu_time_s: float = Field(0.0, ge=0, description="GPU-seconds of the trace job (work on the reference GPU).")
    group: str = Field("", description="Team (the trace's virtual cluster); user-fixed:usual maps it to a partition.")


class WorkloadFile(_M):
    """A workload file."""

    source: str = Field("", description="Where the jobs came from (e.g. philly.csv, seed 1, 40 jobs).")
    reference_gpu: str = Field(REFERENCE_GPU, description="GPU whose GPU-time the work was matched to.")
    jobs: list[WorkloadJob] = Field(min_length=1, description="The jobs, any order.")


def load_workload(path: Path) -> WorkloadFile:
    if path.suffix == ".csv":
        try:
            with path.open(newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as exc:
            raise InputError(f"{path}: cannot read: {exc.strerror}") from None
        jobs = []
        for i, row in enumerate(rows, start=2):
            try:
                jobs.append(WorkloadJob.model_validate({k: v for k, v in row.items() if v not in ("", None)}))
            except ValidationError as exc:
                err = exc.errors()[0]
                field = ".".join(str(x) for x in err["loc"])
                raise InputError(f"{path}:{i}: {field}: {err['msg']}") from None
        if not jobs:
            raise InputError(f"{path}: no jobs; the CSV needs a header and one row per job")
        return WorkloadFile(source=str(path), jobs=jobs)
    return load_model_file(path, WorkloadFile)


def save_workload(wl: WorkloadFile, path: Path) -> None:
    if path.suffix == ".csv":
        fields = list(WorkloadJob.model_fields)
        import io

        f = io.StringIO(newline="")
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for j in wl.jobs:
            w.writerow(j.model_dump())
        text = f.getvalue()
    else:
        text = yaml.safe_dump(wl.model_dump(mode="json"), sort_keys=False, width=120)

    write_atomic(path, text, mode=0o644)  # O_EXCL temporary + rename: never through a planted link


def reference_rate(gpu: str = REFERENCE_GPU, precision: str = "bf16-mixed") -> float:
    """Effective FLOP/s of the reference GPU (catalog peak x REFERENCE_UTILISATION)."""
    return catalog()[gpu].peak_tflops(precision) * 1e12 * REFERENCE_UTILISATION


@functools.lru_cache(maxsize=2)
def _read_trace(path: Path) -> list[tuple[datetime, float, int, float, str]]:
    """The usable rows, in submission order (cached: the benchmark samples many windows of one trace)."""
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InputError(
            f"{path}: cannot read the Philly trace: {exc.strerror}. Pass --trace PATH "
            "(../shared/data/traces/philly.csv in the development checkout)"
        ) from None
    out = []
    for i, r in enumerate(rows, start=2):
        try:
            ts = datetime.fromisoformat(r["timestamp"])  # YYYY-MM-DD HH:MM:SS; much faster than strptime
            dur, gpus, gt = float(r["duration"]), int(r["num_gpus"]), float(r["gpu_time"])
        except (KeyError, ValueError) as exc:
            raise InputError(
                f"{path}:{i}: not a Philly row (timestamp,duration,num_gpus,gpu_time,cluster): {exc}"
            ) from None
        if dur >= MIN_DURATION_S and gt < MAX_GPU_HOURS * 3600:
            out.append((ts, dur, gpus, gt, r.get("cluster", "")))
    out.sort(key=lambda x: x[0])
    return out


def sample_philly(trace: Path, seed: int, jobs: int = 40, fp16_share: float = 0.5) -> WorkloadFile:
    """`jobs` consecutive Philly jobs from a seeded random point, mapped to LLM training jobs (see module doc)."""
    rows = _read_trace(trace)
    if len(rows) < jobs:
        raise InputError(f"{trace}: only {len(rows)} usable jobs, {jobs} asked for")
    rng = random.Random(seed)
    first = rng.randrange(0, len(rows) - jobs + 1)
    window = rows[first : first + jobs]
    t0 = window[0][0]
    rate = reference_rate()
    out = []
    for i, (ts, _dur, gpus, gpu_time, group) in enumerate(window):
        hours = gpu_time / 3600
        choices = next(c for top, c in MODEL_BINS if hours < top)
        model, method = rng.choice(choices)
        precision: Precision = "fp16-mixed" if method != "qlora" and rng.random() < fp16_share else "bf16-mixed"

        max_pos = presets()[model].arch.max_positions or 2048
        seq = rng.choice([s for s in SEQ_LENS if s <= max_pos])
        spec = job_spec(
            WorkloadJob(
                id=i, submit_s=0, model=model, method=method, precision=precision, seq_len=seq, global_batch=32, steps=1
            )
        )

        per_token = flops_per_token(workload_from_spec(spec, resolve_model(spec, Path("."))), "none")
        tokens = gpu_time * rate / per_token
        batches = [b for b in GLOBAL_BATCHES if tokens / (b * seq) >= MIN_STEPS] or [GLOBAL_BATCHES[0]]
        gb = rng.choice(batches)
        steps = max(1, round(tokens / (gb * seq)))
        out.append(
            WorkloadJob(
                id=i,
                submit_s=(ts - t0).total_seconds(),
                model=model,
                method=method,
                precision=precision,
                seq_len=seq,
                global_batch=gb,
                steps=steps,
                trace_gpus=gpus,
                trace_gpu_time_s=gpu_time,
                group=group,
            )
        )
    return WorkloadFile(source=f"philly.csv seed {seed}, {jobs} jobs from {t0:%Y-%m-%d %H:%M:%S}", jobs=out)


def job_spec(
    job: WorkloadJob, steps: int | None = None, max_gpus: int | None = None, gpu_types: list[str] | None = None
) -> JobSpec:
    """The model.yaml a user would write for this job (their own training script: any parallelism, pipeline stages
    across GPU types included: the script builds its stages from plan.json's layer_split as the built-in trainer
    does, `parallel.heterogeneous: true`). A script's framework leaves that off by default, which made `has` and
    `has-homogeneous` the same decision in every simulated run (issue 30); `has-homogeneous` turns it off."""
    return JobSpec.model_validate(
        {
            "name": f"sim-job-{job.id}",
            "model": {"preset": job.model},
            "training": {
                "seq_len": job.seq_len,
                "global_batch": job.global_batch,
                "steps": steps or job.steps,
                "method": job.method,
                "precision": job.precision,
            },
            "parallel": {"heterogeneous": True},
            "limits": {"max_gpus": max_gpus, "gpu_types": gpu_types},
            "entry": {"trainer": "script", "script": "train.py"},
        }
    )
