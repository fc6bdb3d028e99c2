"""The pyslurm backend's reading and its guarded import, without pyslurm: the same meaning whether it is installed.

The stand-in objects carry the attribute names and values pyslurm 25.11.2 returned against a real Slurm 25.11.7
(shared/docs/pyslurm-25.11.md; the live tests in test_seam_slurm_versions_live.py compare the real thing with the
CLI backend). The import guard is exercised for real: a child interpreter imports pyslurm against an unusable
slurm.conf, and whatever happens there (ImportError without pyslurm, `fatal:` and exit 1 with it), this
process goes on and gets a reason.
"""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest

from frenzy_slurm.slurm import pyslurm_backend as pb
from frenzy_slurm.slurm.run import Result


class Coll(dict):
    """pyslurm's collections are dict-like (not dict subclasses, but .values() is what the backend uses)."""


def node(name, state, gres, allocated=None, reason=None, partitions=None):
    return SimpleNamespace(
        name=name,
        state=state,
        configured_gres=gres,
        allocated_gres=allocated or {},
        reason=reason,
        partitions=partitions or [name.split("-")[0]],
        total_cpus=16,
        allocated_cpus=1 if allocated else 0,
        real_memory=64000,
        allocated_memory=500 if allocated else 0,
    )


def job(id, name, state, nodes, gres_per_node=None, gpus=None, reason="None", het=None, offset=None, partition="t4"):
    return SimpleNamespace(
        id=id,
        name=name,
        state=state,
        state_reason=reason,
        partition=partition,
        allocated_nodes=nodes,
        num_nodes=1,
        gres_per_node=gres_per_node or {},
        gpus=gpus or {},
        heterogeneous_id=het,
        heterogeneous_offset=offset,
        user_name="root",
        start_time=1,
        end_time=2,
        time_limit=30,
        comment="",
        working_directory="/tmp",
    )


def fake_pyslurm(accounting_tres):
    gpu = SimpleNamespace  # pyslurm's GPU objects have .count and .type
    nodes = Coll(
        {
            "t4-1": node("t4-1", "MIXED", {"gpu:t4": 4}, {"gpu": 2, "gpu:t4": 2}),
            "t4-2": node("t4-2", "MIXED+PLANNED", {"gpu:t4": 4}, {"gpu": 1, "gpu:t4": 1}),
            "t4-4": node("t4-4", "IDLE+DRAIN", {"gpu:t4": 4}, reason="maintenance"),
        }
    )
    jobs = Coll(
        {
            1: job(1, "gpus", "RUNNING", "t4-1", gpus={"gpu": gpu(count=2), "gpu:t4": gpu(count=2, type="t4")}),
            2: job(2, "gres", "RUNNING", "t4-2", gres_per_node={"gres/gpu:t4": 1}),
            3: job(3, "waits", "PENDING", None, gres_per_node={"gres/gpu:t4": 4}, reason="Resources"),
            4: job(4, "new", "SOMETHING_NEW", None),
        }
    )
    parts = Coll(
        {
            "t4": SimpleNamespace(
                name="t4",
                state="UP",
                nodes="t4-[1-2,4]",
                is_default=True,
                default_time=10,
                max_time="UNLIMITED",
                max_nodes="UNLIMITED",
            )
        }
    )
    config = SimpleNamespace(version="25.11.7", cluster_name="frenzydev", accounting_storage_tres=accounting_tres)
    return SimpleNamespace(
        __version__="25.11.2",
        Nodes=SimpleNamespace(load=lambda: nodes),
        Jobs=SimpleNamespace(load=lambda: jobs),
        Partitions=SimpleNamespace(load=lambda: parts),
        slurmctld=SimpleNamespace(Config=SimpleNamespace(load=lambda: config)),
    )


@pytest.mark.parametrize("accounting", [True, False])
def test_view_from_pyslurm(accounting):
    tres = ["cpu", "mem", "energy", "node", "billing", "fs/disk", "vmem", "pages", "gres/gpu", "gres/gpu:t4"]
    view = pb.PyslurmBackend(fake_pyslurm(tres if accounting else ["cpu", "mem"])).load()
    assert view.cluster == "frenzydev" and view.slurm_version == "25.11.7" and view.backend == "pyslurm"
    nodes = {n.name: n for n in view.nodes}
    assert (nodes["t4-4"].state, nodes["t4-4"].flags, nodes["t4-4"].reason) == ("drained", ["DRAIN"], "maintenance")
    assert not nodes["t4-4"].available
    assert (nodes["t4-2"].state, nodes["t4-2"].flags) == ("mixed", [])  # PLANNED dropped, as the CLI backend does
    # with GPU TRES accounted, allocated_gres counts 2 (not 2 + 2 for the typed entry); without it, running jobs
    # are the source, and the --gpus job is found through its TRES dict
    assert (nodes["t4-1"].gpus_used, nodes["t4-2"].gpus_used, nodes["t4-4"].gpus_used) == (2, 1, 0)
    jobs = {j.job_id: j for j in view.jobs}
    assert (jobs[1].gpu_type, jobs[1].gpus_per_node) == ("t4", 2)
    assert jobs[1].reason is None and jobs[3].reason == "Resources"  # pyslurm says 'None'
    assert jobs[4].phase == "unknown"
    assert view.partitions[0].nodes == ["t4-1", "t4-2", "t4-4"]


def test_untyped_gres_keeps_its_gpus():
    mod = fake_pyslurm(["gres/gpu"])
    nodes = Coll({"gpu-1": node("gpu-1", "MIXED", {"gpu": 4}, {"gpu": 1}, partitions=["gpu"])})
    mod.Nodes = SimpleNamespace(load=lambda: nodes)
    view = pb.PyslurmBackend(mod).load()
    (n,) = view.nodes
    assert (n.gpu_type, n.gpus_total, n.gpus_used) == (None, 4, 1)
    assert [(p.key, p.gpus_total) for p in view.pools()] == [(("gpu", None), 4)]


def test_gpu_counts():
    assert pb._gpu_count({"gpu": 2, "gpu:a100": 2}) == 2
    assert pb._gpu_count({"gres/gpu:a100": 3}) == 3 and pb._gpu_count({}) == 0
    assert pb._gpu_type({"gpu": 2, "gpu:a100": 2}) == "a100" and pb._gpu_type({"gpu": 1}) is None


def test_import_probe_survives_an_unusable_configuration(tmp_path, monkeypatch):
    """pyslurm's import ends the process on such a file (`fatal: Unable to process configuration file`);
    in the child it may, and the verdict is cached so the child runs once."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    problem = pb.probe_import(conf, "25.11.2")
    assert problem and problem.startswith("importing pyslurm fails here")

    def no_child(*args, **kwargs):
        raise AssertionError("the cached verdict must be used")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert pb.probe_import(conf, "25.11.2") == problem
    conf.write_text("ClusterName=y\n")  # another configuration (size or mtime differs): probed again
    with pytest.raises(AssertionError, match="cached verdict"):
        pb.probe_import(conf, "25.11.2")


def test_problem_order_without_importing(tmp_path, monkeypatch):
    """Cheap checks first: metadata, slurm.conf, version match, `scontrol ping`; the import comes last."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    answers = {
        "sinfo": Result(["sinfo"], "slurm 25.11.7\n", "", 0),
        "scontrol": Result(["scontrol"], "Slurmctld(primary) at vm is DOWN\n", "", 1),
    }
    calls = []

    def fake_run(argv, timeout=30.0, check=True, input_text=None, env=None):
        calls.append(argv[0])
        return answers[argv[0]]

    monkeypatch.setattr(pb, "run", fake_run)
    monkeypatch.setattr(pb, "probe_import", lambda conf, version: pytest.fail("must not import"))
    monkeypatch.setattr(pb, "pyslurm_version", lambda: None)
    assert "not installed" in pb.pyslurm_problem() and calls == []
    monkeypatch.setattr(pb, "pyslurm_version", lambda: "25.11.2")
    assert "slurmctld does not answer" in pb.pyslurm_problem() and calls == ["sinfo", "scontrol"]
    answers["sinfo"] = Result(["sinfo"], "slurm-wlm 22.05.8\n", "", 0)
    assert "does not match the running Slurm 22.05.8" in pb.pyslurm_problem()
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "missing.conf"))
    assert "no slurm.conf" in pb.pyslurm_problem()
    assert pb.try_import() is None


def test_track_cache_is_keyed_by_backend(tmp_path, monkeypatch):
    """A --backend cli query right after a pyslurm one must ask Slurm again, not reuse the pyslurm answer."""
    from frenzy_slurm.track import jobs as track

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cli_like, pyslurm_like = SimpleNamespace(name="cli"), SimpleNamespace(name="pyslurm")
    assert track._cache_path(cli_like, "user=root") != track._cache_path(pyslurm_like, "user=root")
    assert track._cache_path(cli_like, "user=root") == track._cache_path(SimpleNamespace(name="cli"), "user=root")
