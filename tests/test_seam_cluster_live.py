"""The orchestrator view against the real local Slurm cluster (contrib/devcluster)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.slurm import ComponentRequest, open_backend
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.slurm.pyslurm_backend import try_import
from frenzy_slurm.slurm.static import StaticBackend

from .helpers import ROOT, run_cli
from .slurm_fixture import sh, wait_for

SITE = ROOT / "site_configs" / "devcluster.yaml"
BIN = Path(sys.executable).parent  # the environment's console scripts


def pool(view, partition):
    return next(p for p in view.pools() if p.partition == partition)


def backends(tmp_path):
    """Every backend this machine can run, for the same contract."""
    out = {"cli": SlurmCliBackend(), "cli-text": SlurmCliBackend(force_text=True)}
    snap = tmp_path / "snap.json"
    snap.write_text(run_cli("fsinfo", "--json").stdout)
    out["static"] = StaticBackend(snap)
    if try_import() is not None:
        out["pyslurm"] = open_backend("pyslurm")
    return out


def test_layout_and_gpu_types(clean_queue):
    view = SlurmCliBackend().load()
    assert view.cluster == "frenzydev" and view.slurm_version.startswith("22.05")
    assert {(p.partition, p.gpu_type, p.gpus_total, p.gpus_free) for p in view.pools()} == {
        ("a100", "a100", 8, 8),
        ("v100", "v100", 16, 16),
        ("t4", "t4", 16, 16),
    }


def test_free_gpus_follow_a_job(clean_queue):
    jid = sh(
        "sbatch", "--parsable", "-o", "/dev/null", "-p", "a100", "--gres=gpu:a100:3", "-t", "5", "--wrap", "sleep 60"
    )
    b = SlurmCliBackend()
    # the view reads jobs and nodes with separate commands: a job starting between them is seen pending with its
    # GPUs already taken (CI saw it once), so wait for a read that has both
    view = wait_for(
        lambda: (
            (v := b.load())
            and pool(v, "a100").gpus_free == 5
            and any(str(j.job_id) == jid and j.phase == "running" for j in v.jobs)
            and v
        ),
        what="3 GPUs taken by the running job",
    )
    job = next(j for j in view.jobs if str(j.job_id) == jid)
    assert (job.phase, job.gpu_type, job.gpus_per_node, len(job.nodes)) == ("running", "a100", 3, 1)
    assert view.node(job.nodes[0]).gpus_used == 3
    sh("scancel", jid)
    wait_for(lambda: pool(b.load(), "a100").gpus_free == 8, what="GPUs returned")


def test_drained_node_leaves_free_capacity(clean_queue):
    sh("scontrol", "update", "NodeName=t4-4", "State=DRAIN", "Reason=frenzy-test")
    view = SlurmCliBackend().load()
    t4 = pool(view, "t4")
    assert (t4.gpus_free, t4.nodes_up, t4.nodes_down) == (12, 3, 1)
    assert view.node("t4-4").reason == "frenzy-test"


def test_backends_agree(clean_queue, tmp_path):
    sh("sbatch", "--parsable", "-o", "/dev/null", "-p", "v100", "--gres=gpu:v100:5", "-t", "5", "--wrap", "sleep 60")
    script = tmp_path / "het.sh"
    script.write_text(
        "#!/bin/sh\n#SBATCH -p a100 --gres=gpu:a100:2 -t 5\n"
        "#SBATCH hetjob\n#SBATCH -p t4 -N 2 --gres=gpu:t4:3\nsleep 60\n"
    )
    sh("sbatch", "--parsable", "-o", "/dev/null", str(script))
    wait_for(lambda: len([j for j in SlurmCliBackend().load().jobs if j.phase == "running"]) == 3, what="3 running")

    def state(v, features: bool = True) -> dict:
        exclude: dict = {"taken_at": True, "backend": True, "slurm_version": True, "cluster": True}
        if not features:  # the text format reads no node features (None: not known); the JSON answers [] here
            exclude["nodes"] = {"__all__": {"features"}}
        return v.model_dump(exclude=exclude)

    def disagreement(views) -> str | None:
        ref = state(views["cli"])
        for name, v in views.items():
            if name == "pyslurm":  # pyslurm has no per-job expected times for finished jobs; compare capacity
                if list(v.pools()) != list(views["cli"].pools()):
                    return (
                        f"pyslurm's pools differ from the CLI JSON view: {list(v.pools())} != "
                        f"{list(views['cli'].pools())}"
                    )
            elif name == "cli-text":
                if state(v, features=False) != state(views["cli"], features=False):
                    return (
                        f"{name} view differs from the CLI JSON view: {state(v, False)} != {state(views['cli'], False)}"
                    )
                if any(n.features is not None for n in v.nodes):
                    return f"{name} read node features, which its format does not hold"
            elif state(v) != ref:
                return f"{name} view differs from the CLI JSON view: {state(v)} != {ref}"
        return None

    # the backends read the cluster one after the other, and the cluster may change in between (a CI run saw
    # a node flagged NOT_RESPONDING for a moment in one read): a parsing difference shows in every attempt
    for _ in range(3):
        views = {name: b.load() for name, b in backends(tmp_path).items()}
        why = disagreement(views)
        if why is None:
            break
        time.sleep(2)
    assert why is None, why
    het = sorted(
        (j for j in views["cli"].jobs if j.het_job_id and j.phase == "running"), key=lambda j: j.het_job_offset
    )
    assert [j.display_id for j in het] == [f"{het[0].het_job_id}+0", f"{het[0].het_job_id}+1"]
    assert [(j.partition, j.gpus) for j in het] == [("a100", 2), ("t4", 6)]


def test_expected_start_now_and_later(clean_queue, tmp_path):
    b = SlurmCliBackend()
    now = time.time()
    est = b.expected_start([ComponentRequest("a100", "a100", 1, 4, 10)])
    assert est.start - now < 120 and len(est.nodes) == 1
    sh(
        "sbatch",
        "--parsable",
        "-o",
        "/dev/null",
        "-p",
        "a100",
        "-N",
        "2",
        "--gres=gpu:a100:4",
        "-t",
        "7",
        "--wrap",
        "sleep 300",
    )
    wait_for(lambda: pool(b.load(), "a100").gpus_free == 0, what="a100 full")
    later = b.expected_start([ComponentRequest("a100", "a100", 1, 4, 10), ComponentRequest("t4", "t4", 2, 4, 10)])
    assert 5 * 60 < later.start - now < 9 * 60, "starts when the 7-minute job ends"
    assert sorted(later.nodes)[0].startswith("a100") and sum(n.startswith("t4") for n in later.nodes) == 2
    snap = tmp_path / "snap.json"
    snap.write_text(run_cli("fsinfo", "--json").stdout)
    static = StaticBackend(snap).expected_start([ComponentRequest("a100", "a100", 1, 4, 10)])
    assert abs(static.start - later.start) < 90


def test_fsinfo_output(clean_queue):
    sh("sbatch", "--parsable", "-o", "/dev/null", "-p", "a100", "--gres=gpu:a100:4", "-t", "5", "--wrap", "sleep 60")
    sh(
        "sbatch",
        "--parsable",
        "-o",
        "/dev/null",
        "-p",
        "a100",
        "-N",
        "2",
        "--gres=gpu:a100:4",
        "-t",
        "5",
        "--wrap",
        "sleep 1",
    )
    wait_for(
        lambda: (
            (v := SlurmCliBackend().load())
            and pool(v, "a100").gpus_free == 4
            and [j.phase for j in v.jobs].count("running") == 1
        ),
        what="job running",
    )
    res = run_cli("fsinfo", "--site", str(SITE))
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if x.startswith("a100"))
    assert "A100-40GB" in line and "8/4/8" in line.replace(" ", "") and "312" in line
    data = json.loads(run_cli("fsinfo", "--json", "--site", str(SITE)).stdout)
    a100 = next(r for r in data["summary"] if r["partition"] == "a100")
    assert (a100["gpus_free"], a100["gpus_pending"], a100["gpu_memory_gib"]) == (4, 8, 40.0)


def test_site_validate_and_init(clean_queue, tmp_path):
    ok = run_cli("frenzy-slurm", "site", "validate", str(SITE))
    assert ok.returncode == 0 and "matches the cluster" in ok.stdout
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(
        SITE.read_text().replace("gres_type: a100", "gres_type: a100x").replace("gpus_per_node: 8", "gpus_per_node: 4")
    )
    bad = run_cli("frenzy-slurm", "site", "validate", str(wrong))
    assert bad.returncode == 1
    assert "no node of partition 'a100' has GRES gpu:a100x (found: gpu:a100)" in bad.stdout
    assert "gpus_per_node is 4, Slurm's nodes have 8" in bad.stdout
    assert "partition a100 has gpu:a100 GPUs that the site file does not describe" in bad.stdout
    out = tmp_path / "site.yaml"
    init = run_cli("frenzy-slurm", "site", "init", "-o", str(out))
    assert init.returncode == 0, init.stderr
    # GRES types a100 and v100 name no one model (40 or 80 GB, 16 or 32 GB): left out, the file does not load
    assert "gpu model unknown: Slurm calls it 'a100' (it may be A100-40GB or A100-80GB)" in out.read_text()
    assert run_cli("frenzy-slurm", "site", "validate", str(out)).returncode == 2
    data = yaml.safe_load(out.read_text())
    models = {"a100": ("A100-40GB", "nvlink3"), "v100": ("V100-32GB", "nvlink2")}
    for p in data["pools"]:
        if p["partition"] in models:
            p["gpu"], p["intra_node"] = models[p["partition"]]  # what the admin fills in
    out.write_text(yaml.safe_dump(data))
    guessed = run_cli("frenzy-slurm", "site", "validate", str(out))
    assert guessed.returncode == 1 and "pool t4/t4: gpu: T4 was guessed" in guessed.stdout, guessed.stdout
    for p in data["pools"]:
        p.pop("unconfirmed", None)  # the admin checked the t4 pool
    out.write_text(yaml.safe_dump(data))
    assert run_cli("frenzy-slurm", "site", "validate", str(out)).returncode == 0
    assert run_cli("frenzy-slurm", "site", "init", "-o", str(out)).returncode == 2  # no silent overwrite


def test_controller_down_is_reported(slurm_cluster, tmp_path):
    """A configuration whose controller port nobody listens on: a real connection failure."""
    conf = tmp_path / "slurm.conf"
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=16999", slurm_cluster.read_text()))
    env = dict(os.environ, SLURM_CONF=str(conf))
    res = subprocess.run([str(BIN / "fsinfo")], capture_output=True, text=True, env=env, timeout=120)
    assert res.returncode == 4
    assert "Slurm is unreachable" in res.stderr and "Traceback" not in res.stderr


def test_commands_missing(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))
    res = subprocess.run([str(BIN / "fsinfo")], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 4 and "'sinfo' was not found" in res.stderr


def test_unexpected_output(tmp_path, monkeypatch):
    """A Slurm that prints garbage: produced with stand-in tools on PATH (a real one never does this on demand)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, body in {
        "sinfo": "case \"$1\" in --version) echo 'slurm 22.05.8';; *) echo '{not json';; esac",
        "squeue": "echo '{\"jobs\": []}'",
        "scontrol": "echo 'PartitionName=p Nodes=n1'",
    }.items():
        f = bindir / tool
        f.write_text(f"#!/bin/sh\n{body}\n")
        f.chmod(0o755)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", SLURM_CONF=str(conf))
    res = subprocess.run([str(BIN / "fsinfo")], capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 6 and "could not read Slurm's answer" in res.stderr


def test_pyslurm_backend_or_reason():
    if try_import() is None:
        pytest.skip("pyslurm is not importable here or does not match this Slurm (PyPI has only 25.11; this is 22.05)")
    assert open_backend("auto").name == "pyslurm"


def test_static_snapshot_errors(tmp_path):
    bad = tmp_path / "snap.json"
    bad.write_text('{"backend": "cli", "nodes": [{"name": "x"}]}')
    res = run_cli("fsinfo", "--backend", "static", "--snapshot", str(bad))
    assert res.returncode == 2 and "nodes.0.state: required field is missing" in res.stderr
    res = run_cli("fsinfo", "--backend", "static")
    assert res.returncode == 2 and "needs --snapshot" in res.stderr


def test_job_state_query_filters_by_user_and_id(clean_queue):
    """One squeue per question; 22.05's `squeue --json` ignores --user/--jobs, so the backend filters too."""
    jid = int(
        sh("sbatch", "--parsable", "-o", "/dev/null", "-p", "t4", "--gres=gpu:t4:1", "-t", "2", "--wrap", "sleep 30")
    )
    b = SlurmCliBackend()
    assert [j.job_id for j in b.jobs(job_ids=[jid])] == [jid]
    assert b.jobs(job_ids=[jid + 1000]) == []
    assert jid in {j.job_id for j in b.jobs(user="root")}
    assert b.jobs(user="daemon") == []
    b.cancel(jid)
    wait_for(lambda: b.jobs(job_ids=[jid])[0].phase == "cancelled", what="cancelled")
