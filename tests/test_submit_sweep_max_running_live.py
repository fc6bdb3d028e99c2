"""On the real local cluster: `fsbatch --set ... --max-running 2` submits every job at once, and Slurm's afterany
chains start each job past the first two only once the one two before it has ended; at most two run at once
(tests/test_submit_sweep_max_running.py has the rules against the fake Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import run_cli, wait_done
from .slurm_fixture import sh
from .test_track_job_identity_live import sleeping_spec

pytestmark = pytest.mark.live


def test_sweep_runs_at_most_n_jobs_at_once(live_jobs_dir, tmp_path):
    res = run_cli(
        "fsbatch",
        str(sleeping_spec(tmp_path, "cap", 6)),
        "--set",
        "training.steps=2,3,4,5",
        "--max-running",
        "2",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    jobs = json.loads(res.stdout)
    ids = [j["job_id"] for j in jobs]
    assert [j["waits_for"] and j["waits_for"]["job_id"] for j in jobs] == [None, None, ids[0], ids[1]]
    for k in (2, 3):  # the dependency as Slurm holds it (ended jobs' dependencies are cleared, so ask early)
        dep = sh("squeue", "-h", "-j", str(ids[k]), "-o", "%E").strip()
        assert dep.startswith(f"afterany:{ids[k - 2]}") or dep in ("", "(null)"), dep
        record = json.loads((Path(jobs[k]["job_dir"]) / "submission.json").read_text())
        assert record["dependency"] == f"afterany:{ids[k - 2]}"
        assert f"--dependency=afterany:{ids[k - 2]}" in record["argv"]
    for j in ids:
        assert wait_done(j, timeout=300)["state"] == "COMPLETED"
    spans = []
    for j in jobs:
        d = Path(j["job_dir"])
        start = json.loads((d / "started.json").read_text())["started_at"]
        end = json.loads((d / "finished.json").read_text())["finished_at"]
        spans.append((start, end))
    for k in (2, 3):
        assert spans[k][0] >= spans[k - 2][1], spans
    # at most two at once: at every start, fewer than two others are running (whole seconds: an end and a start
    # in the same second count as not overlapping)
    for s, _ in spans:
        assert sum(1 for a, b in spans if a <= s < b) <= 2, spans
    assert spans[1][0] < spans[0][1]  # the first two ran side by side: the cap, not a queue of one
