"""On the real local Slurm cluster: concurrent `fsbatch --force` runs each get their own job and job
directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT, fsbatch_json, payload_spec_file


@pytest.fixture
def jobs_dir(live_jobs_dir):
    return live_jobs_dir


spec_file = payload_spec_file


def _fsbatch(*args: str) -> subprocess.Popen:
    code = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
    return subprocess.Popen(
        [sys.executable, "-c", code, *args, "--json"],
        cwd=ROOT,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_concurrent_force_runs_each_submit_their_own_job(jobs_dir, tmp_path):
    """Both used to plan into NAME.2; the second was then told its directory held a job and to use --force."""
    spec = spec_file(tmp_path, "forced")
    first = fsbatch_json(str(spec))
    procs = [_fsbatch(str(spec), "--force") for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    got = [json.loads(out) for out, _ in outs]
    assert sorted(g["job_dir"] for g in got) == [first["job_dir"] + ".2", first["job_dir"] + ".3"]
    assert len({first["job_id"], *(g["job_id"] for g in got)}) == 3
    for g in got:
        assert json.loads((Path(g["job_dir"]) / "submission.json").read_text())["job_id"] == g["job_id"]
