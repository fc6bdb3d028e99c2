"""On a real Slurm cluster with accounting and enforced limits: untyped GRES (`Gres=gpu:4`) is seen and
planned on through the site file, and HAS keeps within the QOS's GPU limits (MaxTRESPerJob, MaxTRESPerUser).

The cluster is started once per Slurm version for this module (devcluster up --accounting --enforce-limits,
layout t4:1x2,gpu:2x4:untyped), 50 ports above the session's cluster of that version (FRENZY_TEST_SLURM_PORT,
FRENZY_TEST_SLURM_PORT_2511; slurmd from +150, slurmdbd +52), so both can run at once.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from frenzy_slurm.has.qos import QOS_START_SOURCE
from frenzy_slurm.site.config import Pool, SiteConfig
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.slurm.view import PoolKey

from .helpers import make_spec
from .slurm_fixture import (
    BUILT_VERSION,
    DEVCLUSTER,
    LIVE_VERSIONS,
    TEST_PORT,
    TEST_PORT_BUILT,
    _built_slurm_reason,
    _cannot_run_slurm,
    wait_for,
)

pytestmark = pytest.mark.live

LAYOUT = "t4:1x2,gpu:2x4:untyped"


@pytest.fixture(scope="module", params=LIVE_VERSIONS)
def qos_cluster(request, tmp_path_factory):
    """SLURM_CONF of a cluster with slurmdbd, AccountingStorageEnforce=limits and an untyped partition `gpu`, for
    each live Slurm version in turn (the environment's SLURM_CONF and PATH point at it meanwhile)."""
    version = request.param
    reason = _cannot_run_slurm() or (_built_slurm_reason() if version == BUILT_VERSION else None)
    if reason:
        pytest.skip(reason)
    state = tmp_path_factory.mktemp(f"qos-devcluster-{version}")
    port = int(TEST_PORT_BUILT if version == BUILT_VERSION else TEST_PORT) + 50
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state), FRENZY_DEVCLUSTER_PORT=str(port))
    argv = [str(DEVCLUSTER), "up", "--accounting", "--enforce-limits", "--layout", LAYOUT]
    if version == BUILT_VERSION:
        argv += ["--slurm", version]
    res = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=2400)
    old = {k: os.environ.get(k) for k in ("SLURM_CONF", "PATH")}
    try:
        assert res.returncode == 0, res.stderr
        exports = dict(line.removeprefix("export ").split("=", 1) for line in res.stdout.splitlines() if "=" in line)
        os.environ["SLURM_CONF"] = exports["SLURM_CONF"]
        if "PATH" in exports:
            os.environ["PATH"] = exports["PATH"].replace("$PATH", old["PATH"] or "/usr/bin:/bin")
        for cmd in (
            ["add", "qos", "gpu2", "set", "MaxTRESPerJob=gres/gpu=2"],
            ["add", "qos", "user3", "set", "MaxTRESPerUser=gres/gpu=3"],
            ["modify", "user", "root", "set", "qos+=gpu2,user3"],
        ):
            subprocess.run(["sacctmgr", "-i", *cmd], capture_output=True, text=True, check=True, timeout=60)
        yield version
    finally:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=180)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


SITE = SiteConfig(
    cluster="frenzydev",
    pools=[
        Pool(partition="t4", gres_type="t4", gpu="T4", gpus_per_node=2, intra_node="pcie3"),
        Pool(partition="gpu", untyped=True, gpu="A100-40GB", gpus_per_node=4, intra_node="nvlink3"),
    ],
)


def _plan(tmp_path: Path, qos: str | None, name: str, site: SiteConfig = SITE, **spec_over):
    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job

    spec = make_spec(name=name, **spec_over)
    job = JobFile(tmp_path / "model.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(qos=qos), job_dir=tmp_path / "jobs" / name)
    return plan_job(job, SiteFile(site), SlurmCliBackend(), opts)


def _squeue(job: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T %r %q %b"], capture_output=True, text=True, timeout=30
    ).stdout.strip()


def _sbatch(*args: str) -> str:
    return subprocess.run(
        ["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_untyped_gres_is_a_pool_of_the_live_view(qos_cluster):
    pools = {p.key: p for p in SlurmCliBackend().load().pools()}
    assert pools[PoolKey("gpu", None)].gpus_total == 8 and pools[PoolKey("t4", "t4")].gpus_total == 2


def test_without_a_mapping_fsbatch_names_the_untyped_gpus(qos_cluster, tmp_path):
    t4_only = SITE.model_copy(update={"pools": SITE.pools[:1]})
    req = _plan(tmp_path, None, "unmapped", t4_only)
    assert any("gpu/untyped: partition gpu has 8 GPUs whose GRES has no type" in n for n in req.notes)


def test_plan_keeps_within_max_tres_per_job_and_slurm_runs_it(qos_cluster, tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    free = _plan(tmp_path, None, "free").plan.decision.chosen
    assert free.gpus > 2 and free.components[0].partition == "gpu"  # the control: the default QOS has no limit
    req = _plan(tmp_path, "gpu2", "capped")
    chosen = req.plan.decision.chosen
    assert chosen.gpus <= 2
    assert "#SBATCH --qos=gpu2" in req.script
    if chosen.components[0].gpu_type is None:
        assert f"#SBATCH --gres=gpu:{chosen.components[0].gpus_per_node}\n" in req.script
    # Slurm agrees: the planned job's GRES under QOS gpu2 is not held back, a wider one is (QOSMaxGRESPerJob)
    gres = f"gpu:{chosen.components[0].gpus_per_node}"
    ok = _sbatch("-q", "gpu2", "-p", chosen.components[0].partition, f"--gres={gres}", "-t", "1", "--wrap", "sleep 5")
    wide = _sbatch("-q", "gpu2", "-p", "gpu", "--gres=gpu:4", "-t", "1", "--wrap", "true")
    try:
        assert wait_for(lambda: "QOSMaxGRESPerJob" in _squeue(wide), timeout=30, what="the wide job's reason")
        assert wait_for(lambda: _squeue(ok).split()[:1] in (["RUNNING"], ["COMPLETING"], []), timeout=30, what="start")
    finally:
        subprocess.run(["scancel", ok, wide], capture_output=True, timeout=30)


def test_running_gpus_count_against_max_tres_per_user(qos_cluster, tmp_path):
    held = _sbatch("-q", "user3", "-p", "gpu", "--gres=gpu:2", "-t", "3", "--wrap", "sleep 170")
    try:
        wait_for(lambda: _squeue(held).startswith("RUNNING"), timeout=60, what="the holding job to run")
        # 2 held + at least 2 planned > 3: the plan waits for the holding job's time limit, though GPUs are free
        req = _plan(tmp_path, "user3", "peruser", limits={"min_gpus": 2})
        chosen = req.plan.decision.chosen
        assert 2 <= chosen.gpus <= 3
        assert chosen.start_source == QOS_START_SOURCE
        assert chosen.start >= time.time() + 60
        assert any("QOS user3" in n and "your running jobs hold 2" in n for n in req.notes)
        free = _plan(tmp_path, None, "peruser-normal", limits={"min_gpus": 2}).plan.decision.chosen
        assert free.start_source == "now"  # the control: under the default QOS it starts now
    finally:
        subprocess.run(["scancel", held], capture_output=True, timeout=30)
