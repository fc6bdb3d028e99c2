"""The opt-in preemptible mode on a real Slurm cluster with QOS preemption.

The cluster (devcluster up --accounting --preemption: `PreemptType=preempt/qos`, `PreemptMode=REQUEUE`, a QOS
`preemptible` with GraceTime that the normal QOS preempts, as docs/admin.md sets it up) runs on Debian's
Slurm, 60 ports above the session's cluster (FRENZY_TEST_SLURM_PORT; slurmd from +160, slurmdbd +62).

What the simulator assumes of such a site is checked here, with the built-in trainer:
- `fsbatch --preemptible` submits in the site's preemptible QOS;
- a job of the normal QOS that needs its GPUs preempts it: SIGTERM, the trainer checkpoints and, seeing the
  job's PreemptTime, requeues it under the same job id (which keeps its place in the queue);
- once the GPUs are free again it resumes from that checkpoint and finishes every step.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.runtime.checkpoints import latest_step

from .helpers import ROOT, fsbatch_json, wait_done
from .slurm_fixture import DEVCLUSTER, TEST_PORT, _cannot_run_slurm, release_requeued, sh, wait_for

pytestmark = [pytest.mark.live, pytest.mark.slow]
pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def preempt_cluster(tmp_path_factory):
    """SLURM_CONF of a cluster with QOS preemption (the default layout); the environment points at it meanwhile."""
    reason = _cannot_run_slurm()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("preempt-devcluster")
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state), FRENZY_DEVCLUSTER_PORT=str(int(TEST_PORT) + 60))
    res = subprocess.run(
        [str(DEVCLUSTER), "up", "--accounting", "--preemption"], capture_output=True, text=True, env=env, timeout=900
    )
    old = os.environ.get("SLURM_CONF")
    try:
        assert res.returncode == 0, res.stderr
        os.environ["SLURM_CONF"] = res.stdout.strip().splitlines()[-1].split("=", 1)[1]
        yield Path(os.environ["SLURM_CONF"])
    finally:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=180)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def _site(tmp_path: Path) -> Path:
    data = yaml.safe_load(CPU_SITE.read_text())
    data["preemption"] = {"qos": "preemptible", "min_run_min": 0}  # the tiny job runs for a minute
    d = tmp_path / "site"
    d.mkdir(mode=0o700)
    p = d / "site.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_a_preemptible_job_is_preempted_requeued_and_resumes(preempt_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    spec = yaml.safe_load(TINY.read_text())
    spec["name"] = "preempted"
    spec["training"].update(steps=80, checkpoint_interval=5)
    path = tmp_path / "preempted.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = fsbatch_json(str(path), "--site", str(_site(tmp_path)), "--preemptible")
    job, job_dir = str(out["job_id"]), Path(out["job_dir"])
    assert "#SBATCH --qos=preemptible\n" in (job_dir / "job.sbatch").read_text()
    assert sh("squeue", "-h", "-j", job, "-o", "%q", check=False).strip() == "preemptible"
    wait_for(lambda: (latest_step(job_dir / "checkpoints") or 0) >= 10, timeout=240, interval=0.5, what="step 10")
    comp = out["decision"]["chosen"]["components"][0]
    nodes = sh("squeue", "-h", "-j", job, "-o", "%N").strip()
    # a job of the normal QOS that needs those very nodes whole: Slurm preempts the training job to start it
    blocker = sh(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", comp["partition"], "-w", nodes, "-N", str(comp["nodes"]),
        "--exclusive", "-t", "2", "--wrap", "sleep 20",
    ).strip()  # fmt: skip
    try:
        wait_for(lambda: sh("squeue", "-h", "-j", blocker, "-o", "%T", check=False).strip() == "RUNNING", timeout=180,
                 what="the normal job to preempt and start")  # fmt: skip
        assert sh("squeue", "-h", "-j", job, "-o", "%T", check=False).strip() in ("PENDING", "REQUEUED", "COMPLETING")
        # Slurm holds a requeued job for a while (BeginTime); it may start once the blocker has ended
        release_requeued(job)
        done = wait_done(int(job), timeout=420)
    finally:
        subprocess.run(["scancel", blocker], capture_output=True, timeout=30)
    assert done["state"] == "COMPLETED", (job_dir / f"slurm-{job}.out").read_text()[-3000:]
    states = sh("sacct", "-n", "-X", "-D", "-j", job, "-o", "State%20").split()
    # one job id: requeued by its own trainer at the preemption's SIGTERM (Slurm's requeue at the end of GraceTime
    # would say PREEMPTED; without the trainer's, a job that saved and exited would end COMPLETED, unfinished)
    assert states == ["REQUEUED", "COMPLETED"], states
    m = json.loads((job_dir / "metrics.json").read_text())
    assert m["restart"] >= 1 and m["resumed_from_step"] >= 10 and m["step"] == 80
    assert [s for s, _ in m["loss"]] == list(range(1, 81)), "the step counter continues across the preemption"


def test_the_watcher_moves_a_running_job_which_resumes_its_checkpoint_elsewhere(preempt_cluster, tmp_path, monkeypatch):
    """`frenzy-slurm watch`'s move on real Slurm: the successor is submitted with afterany on the job, the job's
    steps get SIGTERM and the trainer saves and exits (no requeue: nothing preempted it), then the successor
    starts on the other partition and resumes that checkpoint. HAS's choice to move is forced here (the tiny
    model's predicted steps are too short for a move to pay); has/moves.py's decision is tested in
    test_track_watch.py."""
    from dataclasses import replace

    from frenzy_slurm.planning import SiteFile
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.track import watch

    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    # the dev cluster's GPUs as GPUs: one holds the tiny model, so the job is one component (zero 0, no pipeline)
    data = yaml.safe_load((ROOT / "site_configs" / "devcluster.yaml").read_text())
    data["preemption"] = {"qos": "preemptible", "min_run_min": 0, "restart_s": 1}
    site_path = tmp_path / "site" / "site.yaml"
    site_path.parent.mkdir(mode=0o700)
    site_path.write_text(yaml.safe_dump(data))
    spec = yaml.safe_load(TINY.read_text())
    spec["name"] = "watched"
    spec["training"].update(steps=400, checkpoint_interval=5)
    spec["limits"] = {"gpu_types": ["t4"], "max_gpus": 1}
    path = tmp_path / "watched.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = fsbatch_json(str(path), "--site", str(site_path), "--preemptible")
    job, job_dir = int(out["job_id"]), Path(out["job_dir"])
    assert out["decision"]["chosen"]["components"][0]["partition"] == "t4"
    wait_for(lambda: (latest_step(job_dir / "checkpoints") or 0) >= 5, timeout=240, interval=0.5, what="step 5")
    real = watch.running_move

    def to_a100(requirements, *args, **kwargs):  # any allocation on the A100s, whatever it gains
        return real(replace(requirements, gpu_types=("a100",)), *args, **{**kwargs, "gain": -100.0})

    monkeypatch.setattr(watch, "running_move", to_a100)
    (move,) = watch.watch_once(SiteFile(load_site(site_path), site_path), open_backend("cli"))
    assert move.kind == "running" and move.new_job_id is not None, move
    new, new_dir = move.new_job_id, Path(move.new_job_dir or "")
    assert f"#SBATCH --dependency=afterany:{job}\n" in (new_dir / "job.sbatch").read_text()
    assert "#SBATCH --qos=preemptible\n" in (new_dir / "job.sbatch").read_text()  # it stays in the QOS it ran in
    first = wait_done(job, timeout=240)
    assert first["state"] == "COMPLETED"
    saved = latest_step(job_dir / "checkpoints")
    assert saved is not None and 5 <= saved < 400  # stopped early, at the SIGTERM, with a checkpoint
    done = wait_done(new, timeout=420)
    assert done["state"] == "COMPLETED", (new_dir / f"slurm-{new}.out").read_text()[-3000:]
    assert sh("sacct", "-n", "-X", "-j", str(new), "-o", "Partition%20").split() == ["a100"]
    m = json.loads((new_dir / "metrics.json").read_text())
    assert m["resumed_from_step"] == saved and m["step"] == 400
    assert [s for s, _ in m["loss"]] == list(range(saved + 1, 401))
    assert json.loads((job_dir / "moved.json").read_text())["moved_to_job"] == new
