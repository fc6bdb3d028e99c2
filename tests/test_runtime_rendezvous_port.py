"""The rendezvous port is a free one: job.sbatch asks `runtime.dist free-port` on the first node (no port
derived from the job id), which skips a port in use and stays below the ephemeral range."""

from __future__ import annotations

import os
from pathlib import Path

from .trust_world import request, world  # noqa: F401  (world is a fixture)

ROOT = Path(__file__).resolve().parent.parent

# --- the rendezvous port ---------------------------------------------------------------------------------


def test_script_picks_a_free_port_on_the_first_node(world, tmp_path):
    script = request(world, tmp_path / "jobs" / "a").script
    assert "20000 +" not in script and "SLURM_JOB_ID} % 20000" not in script
    assert "-P -m frenzy_slurm.runtime.dist free-port) ||" in script and "\nexport MASTER_PORT\n" in script


def test_free_port_skips_a_port_in_use_and_stays_below_the_ephemeral_range():
    import random
    import socket

    from frenzy_slurm.runtime import dist

    low, _ = dist.ephemeral_range()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0 if low <= dist.PORT_FLOOR + 1 else random.randint(dist.PORT_FLOOR, low - 1)))
        busy.listen()
        taken = busy.getsockname()[1]

        class Picks(random.Random):
            seq = [taken, taken]

            def randint(self, a, b):
                return self.seq.pop(0) if self.seq else super().randint(a, b)

        port = dist.free_port(rng=Picks(7))
        assert port != taken
        assert dist.PORT_FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))  # it is free


def test_free_port_command_prints_one_port(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime.dist", "free-port"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0 and 1024 < int(res.stdout) < 65536, res.stderr
