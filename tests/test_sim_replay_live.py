"""The simulator against real Slurm: HAS's placements for 30 Philly jobs, replayed in about 90 s on the local
cluster through the real backend's submit (payloads sleep for the true run time), against the simulator's
starts and ends for the same jobs. Goal: median start difference under 5% of the replay's makespan.

    FRENZY_TEST_SLURM_PORT=... python -m pytest tests/test_sim_replay_live.py -q -s   # prints the comparison
"""

from __future__ import annotations

import json
from pathlib import Path

from frenzy_slurm.sim import ErrorModel, SimCluster, load_workload, simulate
from frenzy_slurm.sim.replay import compare, live_replay, replay_jobs, simulate_replay
from frenzy_slurm.site.config import load_site
from frenzy_slurm.slurm import open_backend

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = Path(__file__).parent / "data" / "sim" / "philly-seed2-30.yaml"


def test_replay_on_real_slurm_matches_the_simulator(clean_queue, tmp_path):
    backend = open_backend("cli")
    cluster = SimCluster.from_view(backend.load(), load_site(ROOT / "site_configs" / "devcluster.yaml"))
    assert cluster.gpus == 40
    result = simulate(load_workload(WORKLOAD), cluster, "has", seed=2, errors=ErrorModel.exact())
    jobs = replay_jobs(result, makespan_s=90.0)
    assert len(jobs) == 30
    sim = simulate_replay(jobs, cluster, sched_interval_s=1.0)  # contrib/devcluster: SchedulerParameters=bf_interval=1
    live = live_replay(jobs, backend, tmp_path / "replay", timeout_s=240.0)
    report = compare(sim, live)
    print(json.dumps({k: v for k, v in report.items() if k != "per_job"}, indent=2))
    (tmp_path / "replay.json").write_text(json.dumps(report, indent=2))
    assert report["jobs"] == 30
    for row in report["per_job"]:  # both ran every job for its run time (Slurm's times are whole seconds)
        assert row["live_end"] - row["live_start"] >= row["sim_end"] - row["sim_start"] - 1.5
    assert report["start_diff_median_pct_of_makespan"] < 5.0
