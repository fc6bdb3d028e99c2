"""The real local Slurm cluster, started once per test session by contrib/devcluster/devcluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVCLUSTER = ROOT / "contrib" / "devcluster" / "devcluster"
# not the default (16817, slurmd 16917+), so a developer's own dev cluster keeps running; several test sessions
# at once (developers working side by side) each set their own FRENZY_TEST_SLURM_PORT
TEST_PORT = os.environ.get("FRENZY_TEST_SLURM_PORT", "18817")


def _cannot_run_slurm() -> str | None:
    if os.geteuid() != 0:
        return "the local Slurm cluster needs root (slurmd, mknod)"
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        return "neither Slurm nor apt-get is available to install it"
    return None


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """Yields the SLURM_CONF path; the environment of the test session points at it."""
    reason = _cannot_run_slurm()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp("devcluster")
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state), FRENZY_DEVCLUSTER_PORT=TEST_PORT)
    res = subprocess.run([str(DEVCLUSTER), "up"], capture_output=True, text=True, env=env, timeout=900)
    if res.returncode != 0:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=120)
        pytest.fail(f"devcluster up failed:\n{res.stderr}")
    conf = res.stdout.strip().split("=", 1)[1]
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = conf
    try:
        yield Path(conf)
    finally:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=120)
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


def sh(*argv: str, check: bool = True) -> str:
    res = subprocess.run(list(argv), capture_output=True, text=True, timeout=60)
    if check and res.returncode != 0:
        raise AssertionError(f"{' '.join(argv)}: {res.stderr}")
    return res.stdout.strip()


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2, what: str = "condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture
def clean_queue(slurm_cluster):
    """Cancel every job and resume every node before and after the test."""

    def clean():
        subprocess.run(["scancel", "--quiet", "-u", "root"], capture_output=True)
        wait_for(lambda: not sh("squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"), what="an empty queue")
        nodes = sh("sinfo", "-h", "-N", "-o", "%N").split()
        subprocess.run(["scontrol", "update", f"NodeName={','.join(nodes)}", "State=RESUME"], capture_output=True)

    clean()
    yield slurm_cluster
    clean()


def occupy_gpus(leave_free: dict[str, int]) -> None:
    """Hold every GPU of the cluster with sleeping jobs, except `leave_free[node]` GPUs on those nodes."""
    from frenzy_slurm.slurm import open_backend

    held = 0
    for node in open_backend("cli").load().nodes:
        count = node.gpus_total - leave_free.get(node.name, 0)
        if count > 0:
            sh("sbatch", "-p", node.partitions[0], "-w", node.name, f"--gres=gpu:{node.gpu_type}:{count}", "-t", "30",
               "-o", "/dev/null", "--wrap", "sleep 600")
            held += 1
    wait_for(lambda: len(sh("squeue", "-h", "-t", "R", "-o", "%i").split()) == held, what="GPU holders running")
