"""`devcluster up` refuses ports another program holds, naming the port and FRENZY_DEVCLUSTER_PORT.

Otherwise its readiness check (sinfo with the new slurm.conf) could talk to another cluster listening there, whose
nodes have the same names, and report that cluster as started. The refusal comes before anything is installed or
started, so the non-live tests need root (devcluster's own rule) but no Slurm.
"""

from __future__ import annotations

import os
import random
import socket
import subprocess

import pytest

from .slurm_fixture import DEVCLUSTER, TEST_PORT, sh

NODES = 8  # the default layout's: a100 2, v100 2, t4 4; slurmd ports N+100..N+107


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def _free_base() -> int:
    """A slurmctld port N whose cluster's ports (N, N+2, N+100..) are all free, far from the test clusters'."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(40000, 50000)
        if all(_free(p) for p in (base, base + 2, *range(base + 100, base + 100 + NODES))):
            return base
    pytest.skip("no free range of ports found")


def _listen(port: int) -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    s.listen()
    return s


def _up(state, port: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state), FRENZY_DEVCLUSTER_PORT=str(port))
    env.pop("FRENZY_DEVCLUSTER_LAYOUT", None)
    return subprocess.run([str(DEVCLUSTER), "up"], capture_output=True, text=True, env=env, timeout=120)


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="devcluster runs as root only")


@needs_root
@pytest.mark.parametrize(("offset", "daemon"), [(0, "slurmctld"), (103, "slurmd v100-2")])
def test_up_refuses_a_port_another_program_listens_on(tmp_path, offset, daemon):
    base = _free_base()
    with _listen(base + offset):
        res = _up(tmp_path / "state", base)
    assert res.returncode == 1
    assert f"port {base + offset} ({daemon}) already in use" in res.stderr
    assert "FRENZY_DEVCLUSTER_PORT=N" in res.stderr and f"now N={base}" in res.stderr
    assert res.stdout == ""  # no SLURM_CONF to export
    assert not (tmp_path / "state" / "run").exists(), "nothing may start"


def test_a_second_cluster_on_a_running_clusters_port_is_refused(slurm_cluster, tmp_path):
    """The case that reported success before: another state directory, the live test cluster's port."""
    res = _up(tmp_path / "other", int(TEST_PORT))
    assert res.returncode == 1
    assert f"ports {TEST_PORT} (slurmctld), {int(TEST_PORT) + 100} (slurmd a100-1)," in res.stderr
    assert "already in use" in res.stderr and "FRENZY_DEVCLUSTER_PORT" in res.stderr
    assert res.stdout == ""
    assert not (tmp_path / "other" / "run").exists()
    assert "idle" in sh("sinfo", "-h", "-o", "%T")  # the running cluster is untouched
