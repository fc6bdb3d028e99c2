"""The real local Slurm cluster, started once per test session by contrib/devcluster/devcluster."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DEVCLUSTER = ROOT / "contrib" / "devcluster" / "devcluster"
# not the default (16817, slurmd 16917+), so a developer's own dev cluster keeps running; several test sessions
# at once (developers working side by side) each set their own FRENZY_TEST_SLURM_PORT
TEST_PORT = os.environ.get("FRENZY_TEST_SLURM_PORT", "18817")
# The second live version: Slurm 25.11 built from ../shared/vendor/slurm (cached outside the repository by
# contrib/devcluster/build-slurm; `./frenzy-dev test` builds it and pyslurm first), beside the 22.05 cluster on
# its own ports: 300 above TEST_PORT (slurmctld, +2 slurmdbd, +100.. slurmd), clear of 22.05's slurmd ports
BUILT_VERSION = "25.11"
TEST_PORT_BUILT = os.environ.get("FRENZY_TEST_SLURM_PORT_2511", str(int(TEST_PORT) + 300))
LIVE_VERSIONS = ["22.05", BUILT_VERSION]


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


@dataclass(frozen=True)
class LiveSlurm:
    """One running test cluster: its version, slurm.conf and the PATH that puts its commands first."""

    version: str
    conf: Path
    path: str


def _built_slurm_reason() -> str | None:
    """Why the 25.11 cluster cannot be built here (None if it can, or is in the cache)."""
    vendor = Path(os.environ.get("FRENZY_SLURM_VENDOR", ROOT.parent / "shared" / "vendor" / "slurm"))
    if not list(vendor.glob(f"slurm-{BUILT_VERSION}.*.tar.xz")):
        return f"no Slurm {BUILT_VERSION} source in {vendor} (set FRENZY_SLURM_VENDOR)"
    return None


@pytest.fixture(scope="session")
def slurm_cluster_2511(tmp_path_factory) -> LiveSlurm:
    """A Slurm 25.11 cluster with accounting (slurmdbd), started once per session; the environment is untouched
    (the `live_slurm` fixture points SLURM_CONF and PATH at it per test)."""
    reason = _cannot_run_slurm() or _built_slurm_reason()
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp(f"devcluster-{BUILT_VERSION}")
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state), FRENZY_DEVCLUSTER_PORT=TEST_PORT_BUILT)
    # builds Slurm into the cache if it is not there yet (about 4-8 minutes), else starts in seconds
    res = subprocess.run(
        [str(DEVCLUSTER), "up", "--slurm", BUILT_VERSION], capture_output=True, text=True, env=env, timeout=2400
    )
    if res.returncode != 0:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=120)
        pytest.fail(f"devcluster up --slurm {BUILT_VERSION} failed:\n{res.stderr}")
    exports = dict(line.removeprefix("export ").split("=", 1) for line in res.stdout.splitlines() if "=" in line)
    path = exports["PATH"].replace("$PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    try:
        yield LiveSlurm(BUILT_VERSION, Path(exports["SLURM_CONF"]), path)
    finally:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=120)


@pytest.fixture(params=LIVE_VERSIONS)
def live_slurm(request, monkeypatch) -> LiveSlurm:
    """Each live Slurm version in turn, with SLURM_CONF and PATH pointing at it and an empty queue."""
    if request.param == BUILT_VERSION:
        live = request.getfixturevalue("slurm_cluster_2511")
    else:
        live = LiveSlurm("22.05", request.getfixturevalue("slurm_cluster"), os.environ.get("PATH", ""))
    monkeypatch.setenv("SLURM_CONF", str(live.conf))
    monkeypatch.setenv("PATH", live.path)
    _empty_queue()
    yield live
    _empty_queue()


def _empty_queue() -> None:
    subprocess.run(["scancel", "--quiet", "-u", "root"], capture_output=True, timeout=60)
    wait_for(lambda: not sh("squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"), what="an empty queue")
    nodes = sh("sinfo", "-h", "-N", "-o", "%N").split()
    subprocess.run(
        ["scontrol", "update", f"NodeName={','.join(sorted(set(nodes)))}", "State=RESUME"],
        capture_output=True,
        timeout=60,
    )


def sh(*argv: str, check: bool = True) -> str:
    # errors=replace: another test's job name may be any bytes (Slurm prints them raw), and stays listed MinJobAge
    res = subprocess.run(list(argv), capture_output=True, text=True, errors="replace", timeout=60)
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


def release_requeued(job: int | str) -> None:
    """Wait until a requeued job is PENDING again, then lift the hold Slurm puts on it so that it starts now.

    Slurm holds a requeued job (BeginTime) for the credential lifetime + 1 s because slurmd will not launch a
    batch job whose credential is not newer, in whole seconds, than the kill that requeued it. `StartTime=now`
    can fall in the same second as that kill when the run ended at once. slurmd then logs "Job N already killed,
    do not launch batch job" and slurmctld logs "Killing non-startable batch JobId=N: Job credential revoked".
    The job ends FAILED and its script never runs. `now+1` is a second after the kill: the job was PENDING,
    so the kill had already happened.
    """
    wait_for(lambda: "PENDING" in sh("squeue", "-h", "-j", str(job), "-o", "%T", check=False), what="requeued")
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now+1"], check=True, timeout=60)


@pytest.fixture
def clean_queue(slurm_cluster):
    """Cancel every job and resume every node before and after the test."""

    def clean():
        subprocess.run(["scancel", "--quiet", "-u", "root"], capture_output=True)
        wait_for(lambda: not sh("squeue", "-h", "-t", "PD,R,CG,S", "-o", "%i"), what="an empty queue")
        nodes = sh("sinfo", "-h", "-N", "-o", "%N").split()
        subprocess.run(["scontrol", "update", f"NodeName={','.join(nodes)}", "State=RESUME"], capture_output=True)
        # every slurmd answering (sinfo marks a node that does not with '*', e.g. after slurmctld restarted)
        wait_for(
            lambda: not any(s.endswith("*") for s in sh("sinfo", "-h", "-N", "-o", "%t").split()),
            timeout=60,
            what="every node responding",
        )

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
            sh(
                "sbatch",
                "-p",
                node.partitions[0],
                "-w",
                node.name,
                f"--gres=gpu:{node.gpu_type}:{count}",
                "-t",
                "30",
                "-o",
                "/dev/null",
                "--wrap",
                "sleep 600",
            )
            held += 1
    wait_for(lambda: len(sh("squeue", "-h", "-t", "R", "-o", "%i").split()) == held, what="GPU holders running")
