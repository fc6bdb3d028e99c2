"""Ground truth, kept apart from prediction: each job's true step time and true peak memory.

Policies plan with MARP's predictions; the simulator runs jobs with the truth.

Step time, `truth="published"` (the default): the GPU types' relative training speeds come from published
benchmark results (`data/throughput_sources.yaml`: each source, what it measured and its figures; types
without a measured row derived from one of the same architecture by the rule written there), not from
the catalog's peak x utilisation that MARP plans with. A plan's true step time is

    predicted x (MARP's speed of the type / the published speed, both relative to the reference type)
              x (1 / in-node scaling per doubling) ^ log2(GPUs) x (1 + cross_node_loss if several nodes)
              x (1 + cross_partition_loss if several partitions) x r_job  +  step_overhead_s

with the per-doubling loss from the same source's 8-GPU rows, r_job ~ time_bias x LogNormal(0, time_sd)
per job; a heterogeneous pipeline runs at its slowest type's factor. So MARP errs per type, with width
and with spread as an analytic model does. `truth="marp"` is the older model: the prediction times r_job
and r_type ~ LogNormal(0, type_sd) per GPU type and seed.

Memory:

- memory: true peak = predicted peak x r_mem, one r_mem per job (MARP's error is systematic for a
  given model and setup, not per plan); r_mem ~ Normal(mem_bias, mem_sd). The default is MARP's
  measured signed error on the dev set (docs/accuracy.md; see docs/simulation.md for the command).
  A plan whose true peak exceeds the GPU's physical memory fails with OOM after the start-up time;
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

from frenzy_slurm.core.gpus import catalog

THROUGHPUT_SOURCES = Path(__file__).parent / "data" / "throughput_sources.yaml"

# measured / predicted peak over the dev set's high- and medium-confidence rows (37 rows; C03, B11 and the
# low-confidence rows, whose sources doubt their own device counts, left out), from
#   python benchmarks/marp_accuracy.py --data ../shared/data/memory_measurements_dev.csv --exclude C03,B11 \
#       --json out.json
# mean 1.030, standard deviation 0.067 (high confidence only: 1.002 and 0.016; all 44 predicted rows: 0.992 and
# 0.144). Re-measured after MARP's changes of 2026-12-02 (before them: 1.037 and 0.121).
DEV_SET_MEM_BIAS = 1.030
DEV_SET_MEM_SD = 0.067


class ErrorModel(BaseModel):
    """How far the truth is from MARP's predictions."""

    model_config = ConfigDict(extra="forbid")

    mem_bias: float = Field(DEV_SET_MEM_BIAS, gt=0, description="Mean of true/predicted peak memory.")
    mem_sd: float = Field(DEV_SET_MEM_SD, ge=0, description="Standard deviation of true/predicted peak memory.")
    time_bias: float = Field(1.0, gt=0, description="Median of true/predicted step time (1: the model is unbiased).")
    time_sd: float = Field(0.10, ge=0, description="Log-normal sigma of true/predicted step time, per job.")
    type_sd: float = Field(0.10, ge=0, description="Log-normal sigma of true/predicted step time, per GPU type.")
    startup_s: float = Field(
        120.0, ge=0, description="Seconds from start to the first step (load, init); an OOM comes then."
    )
    restart_s: float = Field(
        0.0,
        ge=0,
        description="Extra seconds of a start that resumes from a checkpoint (a move, a time-limit resume).",
    )
    checkpoint_gbs: float | None = Field(
        None,
        gt=0,
        le=1e4,
        description="GB/s at which a job's checkpoint is written when it stops and read when it resumes; each "
        "resumed start then also pays 2 x its checkpoint's bytes / this (None: restart_s alone).",
    )
    truth: Literal["published", "marp"] = Field(
        "published",
        description="Step times from published per-type speeds and scaling (published) or MARP's model x noise.",
    )
    step_overhead_s: float | None = Field(None, ge=0, description="Fixed seconds per step; None: the data file's.")
    cross_node_loss: float | None = Field(None, ge=0, description="Step-time share added across nodes; None: file.")
    cross_partition_loss: float | None = Field(
        None, ge=0, description="Step-time share added across partitions; None: the data file's."
    )

    @classmethod
    def exact(cls) -> ErrorModel:
        """Predictions are the truth (for tests and for isolating the scheduler)."""
        return cls(mem_bias=1.0, mem_sd=0.0, time_sd=0.0, type_sd=0.0, truth="marp")


@dataclass(frozen=True)
class SpeedTable:
    """Relative fp16 training speed per catalog GPU type (reference type = 1), with how each was obtained."""

    reference: str
    speed: dict[str, float]
    how: dict[str, str]
    per_doubling: float  # throughput kept per doubling of GPUs in one node (measured 8-GPU rows)
    cross_node_loss: float
    cross_partition_loss: float
    step_overhead_s: float

    def relative(self, gpu: str, precision: str) -> float:
        """The type's speed for `precision`: its fp16 speed, scaled down where the catalog says the type has
        no tensor-core rate for that precision (bf16 on V100 and T4 runs at the fp32 rate)."""
        spec = catalog()[gpu]
        return self.speed[gpu] * min(1.0, spec.peak_tflops(precision) / spec.peak_tflops("fp16-mixed"))


def _row_speed(row: dict, ref: dict, workloads: list[str]) -> float:
    """Geometric mean over the workloads of the row's throughput per GPU over the reference row's."""
    ratios = [(row[w] / row["gpus"]) / (ref[w] / ref["gpus"]) for w in workloads]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


@cache
def speed_table(path: Path = THROUGHPUT_SOURCES) -> SpeedTable:
    """The speed table derived from the data file (measured rows first, then the derived types)."""
    data = yaml.safe_load(path.read_text())
    (src,) = data["sources"]  # one source today; a second would need a rule for combining them
    ref_name = data["reference_gpu"]
    workloads = src["workloads"]
    rows = src["rows"]
    ref = rows[ref_name]
    speed: dict[str, float] = {}
    how: dict[str, str] = {}
    known = {**rows, **src.get("proxies", {})}
    for name, row in known.items():
        speed[name] = _row_speed(row, ref, workloads)
        how[name] = f"measured: {src['id']}, row '{row['row']}'"
    cat = catalog()
    for name, d in data["derived"].items():
        base = d["from"]
        if d.get("same"):
            speed[name] = speed[base]
        else:
            peak = d.get("proxy_fp16_tflops") or cat[base].peak_tflops("fp16-mixed")
            bw = d.get("proxy_mem_bw_gbs") or cat[base].mem_bw_gbs
            spec = cat[name]
            speed[name] = speed[base] * math.sqrt(spec.peak_tflops("fp16-mixed") / peak * spec.mem_bw_gbs / bw)
        how[name] = f"derived from {base}: {d['note']}"
    effs = []
    for name, row in src["scaling_8_in_node"].items():
        one = rows[name]
        effs.append(
            math.exp(sum(math.log((row[w] / row["gpus"]) / (one[w] / one["gpus"])) for w in workloads) / len(workloads))
        )
    eff8 = sum(effs) / len(effs)
    a = data["assumptions"]
    return SpeedTable(
        reference=ref_name,
        speed={k: v for k, v in speed.items() if k in cat},
        how={k: v for k, v in how.items() if k in cat},
        per_doubling=eff8 ** (1.0 / 3.0),
        cross_node_loss=float(a["cross_node_loss"]),
        cross_partition_loss=float(a["cross_partition_loss"]),
        step_overhead_s=float(a["step_overhead_s"]),
    )


def marp_relative(gpu: str, precision: str, reference: str) -> float:
    """The speed MARP plans with (catalog peak x assumed utilisation), relative to the reference type."""
    cat = catalog()
    g, r = cat[gpu], cat[reference]
    return (g.peak_tflops(precision) * g.efficiency) / (r.peak_tflops(precision) * r.efficiency)


# Bytes per parameter of a full fine-tune's checkpoint: the 16-bit weights and the optimizer's fp32 master copy
# and two Adam moments (2 + 12; DeepSpeed's and FSDP's sharded checkpoints hold both). A LoRA or QLoRA checkpoint
# holds the adapters and their states only; the frozen base weights are read by every start (`startup_s`).
FULL_CHECKPOINT_BYTES_PER_PARAM = 14.0
ADAPTER_CHECKPOINT_SHARE = 0.01  # adapters' parameters as a share of the model's (rank 8-64 on the projections)


def true_checkpoint_bytes(params_b: float, method: str) -> float:
    """Bytes of a job's training checkpoint: what a move or a time-limit resume writes and reads."""
    if method == "full":
        return params_b * 1e9 * FULL_CHECKPOINT_BYTES_PER_PARAM
    return params_b * 1e9 * ADAPTER_CHECKPOINT_SHARE * FULL_CHECKPOINT_BYTES_PER_PARAM


@dataclass(frozen=True)
class JobTruth:
    mem_ratio: float
    time_ratio: float


class Truth:
    """Seeded draws: the same seed gives every policy the same true jobs."""

    def __init__(self, model: ErrorModel, seed: int):
        self.model = model
        self.seed = seed
        self._jobs: dict[int, JobTruth] = {}
        self._types: dict[str, float] = {}

    def job(self, job_id: int) -> JobTruth:
        if job_id not in self._jobs:
            rng = random.Random(f"{self.seed}/job/{job_id}")
            m = self.model
            mem = max(0.3, rng.gauss(m.mem_bias, m.mem_sd))
            t = m.time_bias * math.exp(rng.gauss(0.0, m.time_sd))
            self._jobs[job_id] = JobTruth(mem, t)
        return self._jobs[job_id]

    def type_factor(self, gpu_model: str) -> float:
        if gpu_model not in self._types:
            rng = random.Random(f"{self.seed}/type/{gpu_model}")
            self._types[gpu_model] = math.exp(rng.gauss(0.0, self.model.type_sd))
        return self._types[gpu_model]

    def step_time(
        self,
        job_id: int,
        predicted_s: float,
        gpu_models: list[str],
        precision: str = "bf16-mixed",
        gpus: int = 1,
        nodes: int = 1,
        partitions: int = 1,
    ) -> float:
        """The true step time of a plan predicted to take `predicted_s` per step on these GPUs."""
        r_job = self.job(job_id).time_ratio
        if self.model.truth == "marp":
            return predicted_s * r_job * max(self.type_factor(g) for g in gpu_models)
        t = speed_table()
        m = self.model
        factor = max(marp_relative(g, precision, t.reference) / t.relative(g, precision) for g in gpu_models)
        loss = (1.0 / t.per_doubling) ** math.log2(max(1, gpus))
        if nodes > 1:
            loss *= 1.0 + (t.cross_node_loss if m.cross_node_loss is None else m.cross_node_loss)
        if partitions > 1:
            loss *= 1.0 + (t.cross_partition_loss if m.cross_partition_loss is None else m.cross_partition_loss)
        overhead = t.step_overhead_s if m.step_overhead_s is None else m.step_overhead_s
        return predicted_s * factor * loss * r_job + overhead

    def restart_s(self, params_b: float, method: str) -> float:
        """Extra seconds of a start that resumes a checkpoint: `restart_s`, plus, with `checkpoint_gbs`, writing
        the checkpoint at the stop and reading it at the start (`true_checkpoint_bytes`)."""
        m = self.model
        if m.checkpoint_gbs is None:
            return m.restart_s
        return m.restart_s + 2.0 * true_checkpoint_bytes(params_b, method) / (m.checkpoint_gbs * 1e9)

    def peak_gib(self, job_id: int, predicted_gib: float) -> float:
        return predicted_gib * self.job(job_id).mem_ratio
