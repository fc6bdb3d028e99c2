"""On a real cluster with accounting (Slurm 25.11 with slurmdbd; the 22.05 test cluster keeps
none): `frenzy-slurm calibrate` accepts a job directory only if sacct knows its job, run by the directory's
owner, in that directory."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .helpers import run_cli
from .slurm_fixture import sh, wait_for
from .test_calibration_accounting import _finished, _me
from .test_calibration_cli import _job_dir, offline  # noqa: F401 (fixture: snapshot and site file)
from .users import other_user  # noqa: F401 (fixture)

pytestmark = pytest.mark.live  # slurm_cluster_2511 is not among the fixtures conftest marks live by name


@pytest.fixture
def accounting_cluster(slurm_cluster_2511, monkeypatch):
    """The 25.11 cluster (slurmdbd) for this test: SLURM_CONF and PATH point at it."""
    monkeypatch.setenv("SLURM_CONF", str(slurm_cluster_2511.conf))
    monkeypatch.setenv("PATH", slurm_cluster_2511.path)
    return slurm_cluster_2511


def _run_true(workdir) -> int:
    """A real job that runs `true` in `workdir`; its id."""
    out = sh(
        "sbatch",
        "--parsable",
        "-p",
        sh("sinfo", "-h", "-o", "%R").split()[0],
        "-N1",
        "-t",
        "1",
        f"--chdir={workdir}",
        "-o",
        "/dev/null",
        "--wrap",
        "true",
    )
    return int(out.split(";")[0])


def _steps_within(d, seconds: float) -> None:
    """metrics.json's step times scaled to add up to `seconds` (calibrate compares them with sacct's run time)."""
    metrics = json.loads((d / "metrics.json").read_text())
    total = sum(metrics["step_times_s"])
    metrics["step_times_s"] = [t * seconds / total for t in metrics["step_times_s"]]
    metrics["step_time_s"] *= seconds / total
    (d / "metrics.json").write_text(json.dumps(metrics))


def _accounted(ids: list[int]) -> bool:
    rows = sh("sacct", "-n", "-X", "-P", "-j", ",".join(map(str, ids)), "-o", "JobIDRaw,State").splitlines()
    states = dict(r.split("|")[:2] for r in rows if "|" in r)
    return all(states.get(str(i), "").startswith("COMPLETED") for i in ids)


def test_calibrate_checks_job_directories_against_slurms_accounting(tmp_path, offline, accounting_cluster, other_user):
    snap, site = offline
    real = [_job_dir(tmp_path, snap, site, f"run{i}", 0.2) for i in range(3)]
    foreign = _job_dir(tmp_path, snap, site, "foreign", 0.2)  # a real job of root's, in a directory of fsaudit's
    ids = [_run_true(d) for d in real]
    foreign_id = _run_true(foreign)
    wait_for(lambda: _accounted([*ids, foreign_id]), timeout=120, what="the jobs in sacct as COMPLETED")
    for d, jid in zip(real, ids, strict=True):
        _finished(d, jid)
        _steps_within(d, 0.1)  # `true` ran for a moment: metrics claiming seconds of steps would be refused
    _finished(foreign, foreign_id, peak_gib=0.0028)
    for p in [foreign, *foreign.iterdir()]:
        os.chown(p, other_user.uid, other_user.gid)
    never = max(ids) + 100_000
    fabricated = [
        _finished(_job_dir(tmp_path, snap, site, f"fab{i}", 0.2), never + i, peak_gib=0.0028) for i in range(3)
    ]
    res = run_cli(
        "frenzy-slurm",
        "calibrate",
        "--site",
        str(site),
        "--json",
        "--dry-run",
        *map(str, [*real, foreign, *fabricated]),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["accounting"] is True
    assert [(a["job_id"], a["why"]) for a in out["accepted"]] == [
        (str(j), f"job {j} of {_me()}, COMPLETED in Slurm's accounting") for j in ids
    ]
    assert [r["why"] for r in out["rejected"]] == [
        f"job {foreign_id} was run by {_me()}, but the directory belongs to {other_user.name}",
        *(f"job {never + i} is unknown to Slurm's accounting (it never ran here)" for i in range(3)),
    ]
    (memory,) = out["calibration"]["memory"]
    assert memory["factor"] == pytest.approx(1.25) and memory["jobs"] == 3


def test_sacct_reports_user_and_work_dir(tmp_path, accounting_cluster):
    """The seam's accounting record carries who ran the job and where (sacct User, WorkDir)."""
    from frenzy_slurm.slurm import open_backend

    jid = _run_true(tmp_path)
    wait_for(lambda: _accounted([jid]), timeout=120, what="the job in sacct as COMPLETED")
    rec = open_backend("cli").accounting([jid])[jid]
    assert (rec.user, rec.work_dir, rec.state) == (_me(), str(tmp_path), "COMPLETED")
    assert subprocess.run(["sacct", "--version"], capture_output=True, text=True).stdout.startswith("slurm 25.11")
