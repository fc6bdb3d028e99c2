"""On the real local cluster: sbatch's own timeout against a paused slurmctld, and a SIGTERM while sbatch runs,
each leave the job recorded by its tag. The unit tests of the same rules are in
test_submit_sbatch_interrupted.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
from pathlib import Path

import pytest

from frenzy_slurm.site.config import load_site
from frenzy_slurm.slurm import cli as slurm_cli
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.submission import submit

from .helpers import DEV_SITE, make_spec, payload_spec_file, planned, run_cli
from .slurm_fixture import sh

SITE = DEV_SITE


@pytest.fixture
def env(live_jobs_dir):
    return live_jobs_dir.parent


spec_file = payload_spec_file


def _slurmctld_pid() -> int:
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    pidfile = re.search(r"^SlurmctldPidFile=(\S+)", conf, re.M).group(1)
    return int(Path(pidfile).read_text().split()[0])


def test_sbatch_own_timeout_with_slurmctld_paused_records_the_job(env, monkeypatch):
    """slurmctld stops answering as sbatch sends the job; sbatch gives up by itself after MessageTimeout (10 s)
    with "Socket timed out" (exit 1), before our own timeout: that used to be reported as "unreachable" (exit 4)
    while the job was created."""
    script = env / "train.py"
    script.write_text("print('trained')\n")
    spec = make_spec(
        training={"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32"},
        entry={"trainer": "script", "script": str(script)},
    )
    backend = SlurmCliBackend()
    req = planned(spec, backend.load(), env / "jobs" / "paused", site=load_site(SITE), spec_path=env / "model.yaml")
    pid = _slurmctld_pid()
    real_run = slurm_cli.run
    ended: list[str] = []

    def paused_sbatch(argv, *args, **kw):
        if argv[0] != "sbatch":
            return real_run(argv, *args, **kw)
        os.kill(pid, signal.SIGSTOP)
        threading.Timer(14.0, os.kill, (pid, signal.SIGCONT)).start()  # back after sbatch has given up
        try:
            return real_run(argv, *args, **kw)  # our 60 s timeout: sbatch's own 10 s ends it first
        except Exception as exc:
            ended.append(type(exc).__name__ + ": " + getattr(exc, "message", str(exc)))
            raise

    monkeypatch.setattr(slurm_cli, "run", paused_sbatch)
    try:
        done = submit(req, backend, timeout_waits=(8.0, 5.0, 10.0))
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ended and ended[0].startswith("SlurmUnavailable") and "SlurmTimeout" not in ended[0], ended
    record = json.loads((req.job_dir / "submission.json").read_text())
    assert record["job_id"] == done.job_id and "found in the queue by its tag" in record["recovered"]
    assert f"{done.job_id} frenzy:{req.submission}" in sh(
        "squeue", "-h", "--states=all", "-j", str(done.job_id), "-o", "%i %k"
    )


def test_sigterm_during_sbatch_records_the_job_first(env, monkeypatch):
    """A SIGTERM that reaches fsbatch while sbatch runs used to end it at once: a job, and no record or word."""
    real = shutil.which("sbatch")
    bindir = env / "bin"
    bindir.mkdir()
    (bindir / "sbatch").write_text(f'#!/bin/sh\nkill -TERM $PPID\nsleep 1\nexec {real} "$@"\n')
    (bindir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    res = run_cli("fsbatch", str(spec_file(env, "term")))
    assert res.returncode == 128 + signal.SIGTERM, (res.returncode, res.stderr)
    assert "SIGTERM received: finishing the submission first" in res.stderr
    m = re.search(r"stopped by SIGTERM after job (\d+) was submitted and recorded in (\S+)", res.stderr)
    assert m, res.stderr
    job_id, record = int(m.group(1)), Path(m.group(2).rstrip(";"))
    assert json.loads(record.read_text())["job_id"] == job_id
    assert sh("squeue", "-h", "-j", str(job_id), "-o", "%k").startswith("frenzy:")
