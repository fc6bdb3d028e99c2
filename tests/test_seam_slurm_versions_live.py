"""fsinfo, fsbatch and fsqueue on each live Slurm version (Debian's 22.05 and 25.11 built from source), with
every backend that version offers (cli everywhere, pyslurm on 25.11), and the backends' views compared.

The 25.11 cluster comes from tests/slurm_fixture.py (`devcluster up --slurm 25.11`, accounting on); pyslurm
is built and installed by `./frenzy-dev test` (`devcluster build --slurm 25.11 --pyslurm`).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.slurm import pyslurm_backend

from .helpers import EXAMPLES, ROOT, run_cli
from .slurm_fixture import occupy_gpus, sh, wait_for

pytestmark = pytest.mark.live

SITE = ROOT / "site_configs" / "devcluster.yaml"
CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TOTALS = {"a100": 8, "v100": 16, "t4": 16}


def backends(live) -> list[str]:
    """cli everywhere; pyslurm where it exists for the version (25.11) and is installed."""
    if live.version == "25.11" and pyslurm_backend.pyslurm_version() is not None:
        return ["cli", "pyslurm"]
    return ["cli"]


def fsinfo(backend: str) -> dict:
    res = run_cli("fsinfo", "--json", "--backend", backend, "--site", str(SITE))
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    d = tmp_path / "jobs"
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(d))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    return d


def test_pyslurm_is_there_on_2511(live_slurm):
    if live_slurm.version != "25.11":
        assert backends(live_slurm) == ["cli"]
        return
    if pyslurm_backend.pyslurm_version() is None:
        message = (
            "pyslurm is not installed in this environment: `contrib/devcluster/devcluster build --slurm 25.11 "
            "--pyslurm` (./frenzy-dev test runs it)"
        )
        if os.environ.get("FRENZY_REQUIRE_PYSLURM") == "1":
            pytest.fail(message)
        pytest.skip(message)
    assert pyslurm_backend.pyslurm_problem() is None


def test_fsinfo_every_backend(live_slurm):
    for backend in backends(live_slurm):
        view = fsinfo(backend)
        assert view["backend"] == backend and view["cluster"] == "frenzydev"
        assert view["slurm_version"].startswith(live_slurm.version + ".")
        per_partition: dict[str, int] = {}
        for n in view["nodes"]:
            per_partition[n["partitions"][0]] = per_partition.get(n["partitions"][0], 0) + n["gpus_total"]
            assert n["gpus_used"] == 0 and n["state"] == "idle", n
        assert per_partition == TOTALS
        table = run_cli("fsinfo", "--backend", backend, "--site", str(SITE))
        assert table.returncode == 0 and "A100-40GB" in table.stdout and "16/16/0" in table.stdout


def test_auto_picks_pyslurm_only_where_it_matches(live_slurm):
    auto = fsinfo("auto")["backend"]
    assert auto == ("pyslurm" if "pyslurm" in backends(live_slurm) else "cli")
    if live_slurm.version == "22.05":  # pyslurm (installed or not) cannot serve 22.05: a clear refusal, exit 4
        res = run_cli("fsinfo", "--backend", "pyslurm")
        assert res.returncode == 4 and "Traceback" not in res.stderr
        assert "does not match the running Slurm 22.05" in res.stderr or "not installed" in res.stderr


def test_views_agree_with_gres_gpus_and_het_jobs(live_slurm, tmp_path):
    """Jobs that ask with --gres, with --gpus (invisible in pyslurm's gres_per_node), a hetjob, a drained node."""
    out = tmp_path / "slurm-%j.out"
    sh("sbatch", "-o", str(out), "-p", "a100", "-w", "a100-1", "--gres=gpu:a100:3", "-t", "30", "--wrap", "sleep 600")
    sh("sbatch", "-o", str(out), "-p", "t4", "-w", "t4-1", "-N", "1", "--gpus=t4:2", "-t", "30", "--wrap", "sleep 600")
    het = tmp_path / "het.sh"
    het.write_text(
        f"#!/bin/sh\n#SBATCH -t 30 -o {out} -p a100 -w a100-2 --gres=gpu:a100:1\n#SBATCH hetjob\n"
        "#SBATCH -p v100 -w v100-1 --gpus=v100:2 -N 1\nsleep 600\n"
    )
    sh("sbatch", str(het))
    sh("scontrol", "update", "NodeName=t4-4", "State=DRAIN", "Reason=maintenance")
    wait_for(lambda: len(sh("squeue", "-h", "-t", "R", "-o", "%i").split()) == 4, what="4 running job components")
    expected = {"a100-1": 3, "a100-2": 1, "t4-1": 2, "v100-1": 2}
    views = {b: fsinfo(b) for b in backends(live_slurm)}
    for backend, view in views.items():
        nodes = {n["name"]: n for n in view["nodes"]}
        assert {name: n["gpus_used"] for name, n in nodes.items() if n["gpus_used"]} == expected, backend
        assert (nodes["t4-4"]["state"], nodes["t4-4"]["flags"], nodes["t4-4"]["reason"]) == (
            "drained",
            ["DRAIN"],
            "maintenance",
        ), backend
        jobs = {j["job_id"]: j for j in view["jobs"] if j["state"] == "RUNNING"}
        assert sorted((j["partition"], j["gpu_type"], j["gpus_per_node"]) for j in jobs.values()) == [
            ("a100", "a100", 1),
            ("a100", "a100", 3),
            ("t4", "t4", 2),
            ("v100", "v100", 2),
        ], backend
    if len(views) == 2:
        keep = (
            "name",
            "partitions",
            "state",
            "flags",
            "reason",
            "gpu_type",
            "gpus_total",
            "gpus_used",
            "cpus",
            "cpus_alloc",
            "memory_mb",
            "memory_alloc_mb",
        )
        cli_nodes, py_nodes = ([{k: n[k] for k in keep} for n in v["nodes"]] for v in views.values())
        assert cli_nodes == py_nodes
        jkeep = (
            "job_id",
            "het_job_id",
            "het_job_offset",
            "state",
            "reason",
            "partition",
            "nodes",
            "gpu_type",
            "gpus_per_node",
            "time_limit_min",
        )
        cli_jobs, py_jobs = (
            {j["job_id"]: {k: j[k] for k in jkeep} for j in v["jobs"] if j["state"] == "RUNNING"}
            for v in views.values()
        )
        assert cli_jobs == py_jobs
        assert views["cli"]["summary"] == views["pyslurm"]["summary"]


def test_fsbatch_dry_run_every_backend(live_slurm, jobs_dir):
    # a100 full: its candidates start later, so `sbatch --test-only` estimates (each version's wording) are read
    occupy_gpus({"v100-1": 8, "v100-2": 8, "t4-1": 4, "t4-2": 4, "t4-3": 4, "t4-4": 4})
    chosen = {}
    for backend in backends(live_slurm):
        res = run_cli(
            "fsbatch",
            str(EXAMPLES / "llama2-7b.yaml"),
            "--site",
            str(SITE),
            "--dry-run",
            "--json",
            "--backend",
            backend,
        )
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        assert out.get("job_id") is None
        c = out["decision"]["chosen"]
        chosen[backend] = [(x["partition"], x["nodes"], x["gpus_per_node"]) for x in c["components"]]
    assert len(set(map(tuple, chosen.values()))) == 1, chosen


def _fsqueue(job_id: int, backend: str) -> dict | None:
    res = run_cli("fsqueue", str(job_id), "--json", "--backend", backend)
    return json.loads(res.stdout) if res.returncode == 0 else None


@pytest.mark.slow
def test_hetjob_training_every_backend(live_slurm, jobs_dir, tmp_path):
    """The tiny example as a 2-stage pipeline across v100 and t4 (a100 busy), submitted and followed by each backend."""
    occupy_gpus({"v100-2": 1, "t4-4": 1})
    for backend in backends(live_slurm):
        spec = yaml.safe_load((EXAMPLES / "tiny-cpu.yaml").read_text())
        spec["name"] = f"tiny-{backend}"  # another submission per backend (the same plan would be refused as a repeat)
        model = tmp_path / f"tiny-{backend}.yaml"
        model.write_text(yaml.safe_dump(spec))
        res = run_cli("fsbatch", str(model), "--site", str(CPU_SITE), "--backend", backend, "--json")
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        chosen = out["decision"]["chosen"]
        assert chosen["kind"] == "heterogeneous" and {c["partition"] for c in chosen["components"]} == {"v100", "t4"}
        job = out["job_id"]
        listed = run_cli("fsqueue", "--json", "--backend", backend)
        assert listed.returncode == 0 and job in [j["job_id"] for j in json.loads(listed.stdout)], listed.stdout

        def done():  # polled by wait_for right here, in this iteration
            d = _fsqueue(job, backend)  # noqa: B023
            return d if d and d["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL") else None

        final = wait_for(done, timeout=400, interval=2.0, what=f"job {job} ({backend}) to finish")
        log = Path(out["job_dir"]) / f"slurm-{job}.out"
        assert final["state"] == "COMPLETED", log.read_text()[-3000:] if log.exists() else final
        metrics = json.loads((Path(out["job_dir"]) / "metrics.json").read_text())
        assert metrics["step"] == metrics["total_steps"] == 6
        other = [b for b in backends(live_slurm) if b != backend]
        for b in other:  # the other backend follows the same job to the same end
            assert _fsqueue(job, b)["state"] == "COMPLETED"


def test_controller_down_fails_fast_with_every_backend(live_slurm, tmp_path):
    """A slurm.conf whose controller port nobody listens on. pyslurm's import would stall (or end the process);
    the pyslurm backend asks `scontrol ping` first and refuses in well under a second of Slurm time."""
    import re
    import time

    conf = tmp_path / "slurm.conf"
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=16999", live_slurm.conf.read_text()))
    for extra in ("gres.conf", "cgroup.conf"):
        if (live_slurm.conf.parent / extra).exists():
            (tmp_path / extra).write_text((live_slurm.conf.parent / extra).read_text())
    env = dict(os.environ, SLURM_CONF=str(conf))
    for backend in backends(live_slurm):
        t0 = time.monotonic()
        res = subprocess.run(
            [str(Path(os.sys.executable).parent / "fsinfo"), "--backend", backend],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        took = time.monotonic() - t0
        assert res.returncode == 4 and "Traceback" not in res.stderr, res.stderr
        if backend == "pyslurm":
            assert "slurmctld does not answer" in res.stderr and took < 8, (took, res.stderr)
