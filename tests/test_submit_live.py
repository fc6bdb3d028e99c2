"""On the real local cluster: slurmctld is paused while sbatch runs, sbatch times out, the
job appears once slurmctld resumes; fsbatch's submission finds it by its tag and records it (it used to
report "Slurm unreachable" and write no submission.json)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
from pathlib import Path

from frenzy_slurm.site.config import load_site
from frenzy_slurm.slurm import cli as slurm_cli
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.submission import submit

from .helpers import ROOT, make_spec, planned
from .slurm_fixture import sh

SITE = ROOT / "site_configs" / "devcluster.yaml"


def _slurmctld_pid() -> int:
    conf = Path(os.environ["SLURM_CONF"]).read_text()
    pidfile = re.search(r"^SlurmctldPidFile=(\S+)", conf, re.M).group(1)
    return int(Path(pidfile).read_text().split()[0])


def test_sbatch_timeout_while_slurmctld_is_paused(clean_queue, tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    spec = make_spec(
        training={"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32"},
        entry={"trainer": "script", "script": str(script)},
    )
    backend = SlurmCliBackend()
    req = planned(
        spec, backend.load(), tmp_path / "jobs" / "paused", site=load_site(SITE), spec_path=tmp_path / "model.yaml"
    )
    pid = _slurmctld_pid()
    real_run = slurm_cli.run

    def paused_sbatch(argv, timeout=30.0, **kw):
        if argv[0] != "sbatch":
            return real_run(argv, timeout=timeout, **kw)
        os.kill(pid, signal.SIGSTOP)  # slurmctld stops answering just as sbatch sends the job
        threading.Timer(6.0, os.kill, (pid, signal.SIGCONT)).start()
        return real_run(argv, timeout=3.0, **kw)  # sbatch gives up long before slurmctld is back

    monkeypatch.setattr(slurm_cli, "run", paused_sbatch)
    try:
        done = submit(req, backend, timeout_waits=(4.0, 5.0, 10.0))
    finally:
        os.kill(pid, signal.SIGCONT)
    record = json.loads((req.job_dir / "submission.json").read_text())
    assert record["job_id"] == done.job_id and "timed out" in record["recovered"]
    shown = sh("squeue", "-h", "--states=all", "-j", str(done.job_id), "-o", "%i %k")
    assert f"{done.job_id} frenzy:{req.submission}" in shown


def test_concurrent_submissions_from_five_directories_give_one_job(clean_queue, tmp_path):
    """The audit's case: one model.yaml submitted at once from five job directories gave five jobs."""
    import subprocess
    import sys

    import yaml

    script = tmp_path / "train.py"
    # the job runs until the test ends (clean_queue cancels it): one that has ended by the time a slower fsbatch
    # checks is submitted again, as a rerun (exit 0, by design), which a loaded machine made happen in CI
    script.write_text("import time\ntime.sleep(600)\n")
    spec = tmp_path / "model.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "name": "five",
                "model": {"preset": "gpt2"},
                "training": {"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32"},
                "entry": {"trainer": "script", "script": str(script)},
            }
        )
    )
    env = {**os.environ, "FRENZY_SITE": str(SITE), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    code = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
    procs = []
    for i in range(5):
        d = tmp_path / f"dir{i}"
        d.mkdir(mode=0o700)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code, str(spec), "--job-dir", str(d / "job"), "--json"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=d,
            )
        )
    results = [(p.wait(timeout=300), p.stdout.read(), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _, _ in results)
    assert codes == [0, 7, 7, 7, 7], results
    ok = next(json.loads(out) for rc, out, _ in results if rc == 0)
    job_id, tag = ok["job_id"], f"frenzy:{ok['submission']}"
    tagged = [line for line in sh("squeue", "-h", "--states=all", "-o", "%i %k").splitlines() if line.endswith(tag)]
    assert len(tagged) == 1 and tagged[0].startswith(str(job_id))
