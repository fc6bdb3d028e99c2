"""contrib/devcluster itself: idempotent up, status, GPU devices in jobs, hetjobs, accounting, clean down."""

from __future__ import annotations

import os
import subprocess

import pytest

from .slurm_fixture import DEVCLUSTER, TEST_PORT, sh, wait_for


def test_up_is_idempotent_and_status(slurm_cluster):
    state = slurm_cluster.parent.parent
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(state))
    pids = (state / "run" / "slurmctld.pid").read_text()
    conf = slurm_cluster.read_text()
    env.pop("FRENZY_DEVCLUSTER_PORT", None)  # a plain second `up` (default port) must not reconfigure a running cluster
    res = subprocess.run([str(DEVCLUSTER), "up"], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == f"export SLURM_CONF={slurm_cluster}"
    assert (state / "run" / "slurmctld.pid").read_text() == pids, "a second up must not restart daemons"
    assert slurm_cluster.read_text() == conf, "a second up must keep the running cluster's configuration"
    assert f"SlurmctldPort={TEST_PORT}" in conf
    st = subprocess.run([str(DEVCLUSTER), "status"], capture_output=True, text=True, env=env, timeout=60)
    assert st.returncode == 0 and st.stdout.count("running pid") == 10  # munged, slurmctld, 8 slurmd


def test_jobs_see_node_names_and_gpus(clean_queue, tmp_path):
    out = tmp_path / "out.txt"
    jid = sh(
        "sbatch",
        "--parsable",
        "-p",
        "t4",
        "--gres=gpu:t4:2",
        "-t",
        "2",
        "-o",
        str(out),
        "--wrap",
        "echo host=$(hostname) gpus=$CUDA_VISIBLE_DEVICES",
    )
    wait_for(lambda: out.exists() and "host=" in out.read_text(), what=f"job {jid} output")
    text = out.read_text()
    assert "host=t4-" in text and "gpus=0,1" in text


def test_hetjob_runs_across_partitions(clean_queue, tmp_path):
    out = tmp_path / "het.txt"
    script = tmp_path / "het.sh"
    script.write_text(
        f"#!/bin/sh\n#SBATCH -p a100 --gres=gpu:a100:1 -t 2 -o {out}\n#SBATCH hetjob\n"
        "#SBATCH -p v100 --gres=gpu:v100:1\n"
        "echo size=$SLURM_HET_SIZE p0=$SLURM_JOB_PARTITION_HET_GROUP_0 p1=$SLURM_JOB_PARTITION_HET_GROUP_1\n"
    )
    sh("sbatch", "--parsable", str(script))  # the script names its own output file
    wait_for(lambda: out.exists() and "size=" in out.read_text(), timeout=60, what="hetjob output")
    assert "size=2 p0=a100 p1=v100" in out.read_text()


@pytest.mark.live
@pytest.mark.slow
def test_accounting_gives_sacct(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root")
    env = dict(os.environ, FRENZY_DEVCLUSTER_DIR=str(tmp_path / "acct"), FRENZY_DEVCLUSTER_PORT="19817")
    res = subprocess.run(
        [str(DEVCLUSTER), "up", "--accounting", "--layout", "t4:1x2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    try:
        assert res.returncode == 0, res.stderr
        senv = dict(env, SLURM_CONF=res.stdout.strip().split("=", 1)[1])
        jid = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-p",
                "t4",
                "--gres=gpu:t4:2",
                "-t",
                "1",
                "-o",
                str(tmp_path / "slurm-%j.out"),
                "--wrap",
                "true",
            ],
            capture_output=True,
            text=True,
            env=senv,
            check=True,
        ).stdout.strip()

        def accounted():
            r = subprocess.run(
                ["sacct", "-n", "-X", "-j", jid, "-o", "State,AllocTRES%80"], capture_output=True, text=True, env=senv
            )
            return "COMPLETED" in r.stdout and r.stdout

        assert "gres/gpu=2" in wait_for(accounted, timeout=60, what="sacct record")
    finally:
        subprocess.run([str(DEVCLUSTER), "down"], capture_output=True, env=env, timeout=120)
    leftovers = subprocess.run(["pgrep", "-f", str(tmp_path / "acct")], capture_output=True, text=True).stdout
    assert leftovers == "", "down must stop every daemon it started"
