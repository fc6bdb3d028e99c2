"""Trace-driven simulation of a Slurm cluster with mixed GPU types, to compare allocation policies.

    from frenzy_slurm.sim import load_cluster, sample_philly, simulate
    result = simulate(sample_philly(Path("philly.csv"), seed=1, jobs=40), load_cluster("A100-80GB:2x8,T4:4x4"), "has")

`slurm.SimSlurm` is a SlurmBackend over simulated time (priority FIFO + backfill, node-granular GRES,
hetjobs, time limits, `--test-only`-style estimates); `workload` builds and reads workloads; `truth`
keeps true step times and memory apart from MARP's predictions; `policies` and `ilp` are what is
compared; `runner` is the event loop; `metrics` the report; `replay` checks the simulator against a
real Slurm cluster; `synthetic` builds static views for tests and the HAS benchmark. docs/simulation.md describes
the model and its limits.
"""

from frenzy_slurm.sim.clusters import SimCluster, load_cluster, parse_compact
from frenzy_slurm.sim.runner import RunResult, simulate
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.truth import ErrorModel
from frenzy_slurm.sim.workload import WorkloadFile, WorkloadJob, load_workload, sample_philly, save_workload

__all__ = [
    "ErrorModel",
    "RunResult",
    "SimCluster",
    "SimSlurm",
    "WorkloadFile",
    "WorkloadJob",
    "load_cluster",
    "load_workload",
    "parse_compact",
    "sample_philly",
    "save_workload",
    "simulate",
]
