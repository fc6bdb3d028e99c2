"""What keeps `fsqueue` and `fsbatch --dry-run` quick (benchmarks/fsbatch_latency.py measures them): the plain
listing imports no planning stage and reads nothing of a job directory but plan.json's run time; the shipped
data files are read by libyaml into the same data; no pyslurm is found without scanning every distribution; the
job's packages are looked up in-process as the child probe would; Slurm's version is asked once per sinfo binary,
so a listing is one Slurm query; the benchmark reports its ratios."""

from __future__ import annotations

import getpass
import json
import subprocess
import sys

import pytest
import yaml

from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import frenzy_jobs

from .helpers import LOCAL, ROOT, make_spec, planned

PLANNING = (
    "frenzy_slurm.jobspec",
    "frenzy_slurm.marp",
    "frenzy_slurm.has",
    "frenzy_slurm.render",
    "frenzy_slurm.planning",
)


@pytest.fixture
def queued(tmp_path, monkeypatch):
    """A submitted job in a saved snapshot's queue, its directory with a plan and a large metrics.json."""
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    view = synthetic(LOCAL)
    req = planned(make_spec(), view, tmp_path / "jobs" / "j")
    slurm = FakeSlurm(view, user=getpass.getuser())
    done = submit(req, slurm)
    (done.job_dir / "metrics.json").write_text(json.dumps({"step": 3, "loss": [[i, 1.0] for i in range(10_000)]}))
    snap = tmp_path / "snap.json"
    snap.write_text(slurm.load().model_dump_json())
    return req, done, snap, slurm


def test_the_plain_listing_imports_no_planning_stage(queued, tmp_path):
    req, done, snap, _ = queued
    code = (
        "import sys; from frenzy_slurm.cli.fsqueue import main\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
        f"print(sorted(m for m in sys.modules if m.startswith({PLANNING!r}) or m in ('jinja2', 'torch')))"
    )
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    res = subprocess.run(
        [sys.executable, "-c", code, "--backend", "static", "--snapshot", str(snap)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    *table, imported = res.stdout.splitlines()
    assert imported == "[]"
    (row,) = [line.split() for line in table if line.split()[0] == str(done.job_id)]
    assert row[2] == "RUNNING" and row[-1] == str(done.job_dir)
    assert row[-2] != "-"  # REMAINING: plan.json's predicted run time, read without the plan's models


def test_the_listing_reads_only_the_plans_run_time(queued):
    req, done, _, slurm = queued
    (listed,) = frenzy_jobs(slurm.jobs(), files=False)
    assert listed.plan is None and listed.metrics is None and listed.finished is None and listed.started is None
    assert listed.planned_run_time_s == req.decision.chosen.run_time_s
    (detailed,) = frenzy_jobs(slurm.jobs())
    assert detailed.plan is not None and detailed.metrics["step"] == 3
    # the same REMAINING either way
    assert listed.predicted_remaining_s == pytest.approx(detailed.predicted_remaining_s, abs=1.0)


@pytest.mark.parametrize("name", ["presets.yaml", "gpus.yaml"])
def test_shipped_data_reads_the_same_with_libyaml(name):
    from frenzy_slurm.core.yamlfile import SHIPPED_DATA_LOADER

    text = (ROOT / "frenzy_slurm" / "data" / name).read_text()
    assert yaml.load(text, Loader=SHIPPED_DATA_LOADER) == yaml.load(text, Loader=yaml.SafeLoader)
    assert SHIPPED_DATA_LOADER is getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def test_no_pyslurm_is_found_without_scanning_metadata(monkeypatch):
    import importlib.util

    from frenzy_slurm.slurm import pyslurm_backend as pb

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyslurm" else real(name, *a))

    def scan(name: str) -> str:
        raise AssertionError("importlib.metadata scanned")

    monkeypatch.setattr("importlib.metadata.version", scan)
    assert pb.pyslurm_version() is None


def test_the_environment_check_asks_this_interpreter_as_the_probe_would(tmp_path):
    """Where the job's Python is fsbatch's own, its packages are looked up here, with the answer the child
    probe gives: a package in the working directory (sys.path[0] of `python -c`) is not the job's; an imported
    module or a dotted name is left to the child process (looking it up here could import torch)."""
    (tmp_path / "only_in_cwd_pkg").mkdir()
    (tmp_path / "only_in_cwd_pkg" / "__init__.py").write_text("")
    code = (
        "import json, sys; from frenzy_slurm.render.environment import probe, probe_here\n"
        "names = ('torch', 'deepspeed|nonexistent_pkg_xyz', 'nonexistent_pkg_xyz', 'only_in_cwd_pkg')\n"
        "here = probe_here(names)\n"
        "print(json.dumps([here, probe(sys.executable, names), 'torch' in sys.modules, probe_here(('torch.nn',)),"
        " probe_here(('json',))]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    here, child, imported, dotted, already = json.loads(res.stdout)
    assert here == child and here["only_in_cwd_pkg"] is False and here["nonexistent_pkg_xyz"] is False
    assert (imported, dotted, already) == (False, None, None)


def test_the_latency_benchmark_reports_ratios(tmp_path):
    """benchmarks/fsbatch_latency.py, as docs/has.md runs it (one repetition): the README's offline example
    beside `python -c pass`, as a ratio, and another checkout's (here this one) in the same turns."""
    out = tmp_path / "latency.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "fsbatch_latency.py"), "--readme-only", "--repeat", "1"]
    res = subprocess.run(
        [*argv, "--baseline", str(ROOT), "--json", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(out.read_text())
    assert set(got) == {"python -c pass", "README offline example", "README offline example @baseline"}
    ours = got["README offline example"]
    assert ours["ratio"] == pytest.approx(ours["median_s"] / got["python -c pass"]["median_s"]) and ours["ratio"] > 1


@pytest.fixture
def stand_in_slurm(tmp_path, monkeypatch):
    """Stand-in `sinfo` (counting its calls) and `squeue` (an empty JSON queue) first on PATH, a private cache."""
    bindir, calls = tmp_path / "bin", tmp_path / "calls"
    bindir.mkdir()
    tools = {"sinfo": f"echo sinfo >> {calls}; echo 'slurm 22.05.8'", "squeue": "echo '{\"jobs\": []}'"}
    for tool, body in tools.items():
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:/usr/bin:/bin")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return bindir, lambda: calls.read_text().split() if calls.exists() else []


def test_one_slurm_query_per_listing_the_version_kept_per_sinfo(stand_in_slurm):
    from frenzy_slurm.slurm.cli import SlurmCliBackend

    bindir, sinfo_calls = stand_in_slurm
    for _ in range(3):  # three commands, each a fresh backend: the version is asked once
        backend = SlurmCliBackend()
        assert backend.jobs(user="nobody") == [] and backend.features().json
    assert sinfo_calls() == ["sinfo"]
    (bindir / "sinfo").write_text((bindir / "sinfo").read_text() + "# upgraded\n")  # another binary
    SlurmCliBackend().jobs()
    assert sinfo_calls() == ["sinfo", "sinfo"]


def test_a_version_answer_someone_else_could_write_is_not_used(stand_in_slurm, tmp_path):
    from frenzy_slurm.slurm.cli import SlurmCliBackend

    _, sinfo_calls = stand_in_slurm
    SlurmCliBackend().jobs()
    (kept,) = (tmp_path / "cache" / "frenzy-slurm").glob("slurm-version-*.json")
    kept.write_text(json.dumps(json.loads(kept.read_text()) | {"answer": "slurm 20.02.1"}))
    kept.chmod(0o666)
    backend = SlurmCliBackend()
    backend.jobs()
    assert backend.version == "22.05.8" and sinfo_calls() == ["sinfo", "sinfo"]
