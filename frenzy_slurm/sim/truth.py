"""Ground truth, kept apart from prediction: each job's true step time and true peak memory.

Policies plan with MARP's predictions; the simulator runs jobs with the truth, drawn (seeded) around
the prediction:

- memory: true peak = predicted peak x r_mem, one r_mem per job (MARP's error is systematic for a
  given model and setup, not per plan); r_mem ~ Normal(mem_bias, mem_sd). The default is MARP's
  measured signed error on the dev set (docs/accuracy.md; see docs/simulation.md for the command).
  A plan whose true peak exceeds the GPU's physical memory fails with OOM after the start-up time;
- step time: true = predicted x r_job x r_type, r_job ~ time_bias x LogNormal(0, time_sd) per job and one
  r_type ~ LogNormal(0, type_sd) per GPU type and seed (the catalog's assumed utilisation is off for
  a whole GPU type at once). A heterogeneous pipeline runs at its slowest type's factor. There are no
  measured step times in the dev set, so these two are assumptions; docs/simulation.md shows how the
  comparison moves with them.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

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

    @classmethod
    def exact(cls) -> ErrorModel:
        """Predictions are the truth (for tests and for isolating the scheduler)."""
        return cls(mem_bias=1.0, mem_sd=0.0, time_sd=0.0, type_sd=0.0)


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

    def step_time(self, job_id: int, predicted_s: float, gpu_models: list[str]) -> float:
        return predicted_s * self.job(job_id).time_ratio * max(self.type_factor(g) for g in gpu_models)

    def peak_gib(self, job_id: int, predicted_gib: float) -> float:
        return predicted_gib * self.job(job_id).mem_ratio
