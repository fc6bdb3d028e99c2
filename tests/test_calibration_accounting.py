"""calibrate counts a job directory only for a job Slurm's accounting knows, run by the directory's owner
in that directory, from files its owner alone could write; without accounting, only your own job directories.
Memory outliers are left out by their median and MAD.

Tests with a second local user (`other_user`, an unprivileged `fsaudit`) need root and skip without it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .test_calibration_cli import _job_dir, offline  # noqa: F401 (fixture: snapshot and site file)
from .users import other_user  # noqa: F401 (fixture)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _finished(d: Path, job_id: int, peak_gib: float = 0.005) -> Path:
    """A finished job directory: submission.json naming `job_id`, metrics.json with this peak (predicted 0.004)."""
    (d / "submission.json").write_text(json.dumps({"job_id": str(job_id)}))
    metrics = json.loads((d / "metrics.json").read_text())
    for r in metrics["ranks"]:
        r["peak_gib"] = peak_gib
    metrics["job_id"] = str(job_id)
    (d / "metrics.json").write_text(json.dumps(metrics))
    return d


def _accounting(snap: Path, jobs: dict[int, tuple[str, Path | None]], enabled: bool = True):
    """A fake Slurm whose accounting knows these finished jobs: id -> (user, working directory)."""
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.slurm.fake import FakeJob, FakeSlurm

    slurm = FakeSlurm(open_backend("static", snap).load(), user=_me(), accounting=enabled)
    for jid, (user, workdir) in jobs.items():
        slurm.fake_jobs[jid] = FakeJob(
            job_id=jid,
            components=[],
            name="x",
            comment="frenzy:x",
            user=user,
            workdir=str(workdir) if workdir else None,
            submitted=0,
            run_s=1,
            state="COMPLETED",
            start=1,
            end=1000,  # long enough for the steps metrics.json claims
        )
    return slurm


def _calibrate(monkeypatch, backend, site: Path, dirs: list[Path], *extra: str) -> tuple[int, dict]:
    from click.testing import CliRunner

    import frenzy_slurm.cli.calibrate as cal_cli
    from frenzy_slurm.cli.admin import main

    monkeypatch.setattr(cal_cli, "accounting_backend", lambda: backend)
    res = CliRunner().invoke(main, ["calibrate", "--site", str(site), "--json", *extra, *map(str, dirs)])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.output
    return res.exit_code, json.loads(res.stdout) if res.exit_code == 0 else {"output": res.output}


def test_fabricated_job_directories_do_not_set_the_memory_factor(tmp_path, offline, monkeypatch):
    """Three directories naming jobs that never existed, measured at x0.70: accounting knows none of them."""
    snap, site = offline
    fake = [_finished(_job_dir(tmp_path, snap, site, f"fab{i}", 0.2), 90000 + i, peak_gib=0.0028) for i in range(3)]
    code, out = _calibrate(monkeypatch, _accounting(snap, {}), site, fake)
    assert code == 0 and out["written"] is False and out["calibration"]["memory"] == []
    assert out["accounting"] is True and out["accepted"] == []
    assert [r["why"] for r in out["rejected"]] == [
        f"job {90000 + i} is unknown to Slurm's accounting (it never ran here)" for i in range(3)
    ]
    assert not (site.parent / "site.calibration.yaml").exists()


def test_only_jobs_accounting_knows_for_the_same_user_and_directory_count(tmp_path, offline, monkeypatch):
    snap, site = offline
    real = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 100 + i) for i in range(3)]
    fabricated = _finished(_job_dir(tmp_path, snap, site, "fab", 0.2), 555, peak_gib=0.0028)  # never ran
    foreign = _finished(_job_dir(tmp_path, snap, site, "alice", 0.2), 200, peak_gib=0.0028)  # alice's job
    moved = _finished(_job_dir(tmp_path, snap, site, "moved", 0.2), 201, peak_gib=0.0028)  # ran elsewhere
    twice = _job_dir(tmp_path, snap, site, "twice", 0.2)
    _finished(twice, 100, peak_gib=0.0028)  # a copy standing for run0's job again
    backend = _accounting(
        snap,
        {
            100: (_me(), real[0]),
            101: (_me(), real[1]),
            102: (_me(), None),
            200: ("alice", foreign),
            201: (_me(), tmp_path / "elsewhere"),
        },
    )
    code, out = _calibrate(monkeypatch, backend, site, [*real, fabricated, foreign, moved, twice])
    assert code == 0, out
    assert [a["job_id"] for a in out["accepted"]] == ["100", "101", "102"]
    why = {Path(r["job_dir"]).name: r["why"] for r in out["rejected"]}
    assert why == {
        "fab": "job 555 is unknown to Slurm's accounting (it never ran here)",
        "alice": f"job 200 was run by alice, but the directory belongs to {_me()}",
        "moved": f"job 201 ran in {tmp_path / 'elsewhere'}, not in this directory",
        "twice": f"job 100 is already counted from {real[0]}",
    }
    (memory,) = out["calibration"]["memory"]
    assert memory["factor"] == pytest.approx(1.25) and memory["jobs"] == 3
    assert out["calibration"]["jobs"] == [str(d) for d in real]


def test_calibrate_text_report_says_what_was_accepted_and_why(tmp_path, offline, monkeypatch):
    from click.testing import CliRunner

    import frenzy_slurm.cli.calibrate as cal_cli
    from frenzy_slurm.cli.admin import main

    snap, site = offline
    real = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 100 + i) for i in range(3)]
    fab = _finished(_job_dir(tmp_path, snap, site, "fab", 0.2), 555)
    monkeypatch.setattr(
        cal_cli, "accounting_backend", lambda: _accounting(snap, {100 + i: (_me(), real[i]) for i in range(3)})
    )
    res = CliRunner().invoke(main, ["calibrate", "--site", str(site), "--dry-run", *map(str, [*real, fab])])
    assert res.exit_code == 0, res.output
    assert f"accepted: {real[0]}: job 100 of {_me()}, COMPLETED in Slurm's accounting" in res.stdout
    assert f"rejected: {fab}: job 555 is unknown to Slurm's accounting" in res.stdout


def test_without_accounting_only_your_own_job_directories_count(tmp_path, offline, monkeypatch, other_user):
    snap, site = offline
    mine = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 100 + i) for i in range(3)]
    theirs = [_finished(_job_dir(tmp_path, snap, site, f"fab{i}", 0.2), 90000 + i, peak_gib=0.0028) for i in range(3)]
    for d in theirs:
        for p in [d, *d.iterdir()]:
            os.chown(p, other_user.uid, other_user.gid)
    code, out = _calibrate(monkeypatch, _accounting(snap, {}, enabled=False), site, [*mine, *theirs])
    assert code == 0 and out["accounting"] is False
    assert [a["job_dir"] for a in out["accepted"]] == [str(d) for d in mine]
    assert all("not checked against Slurm" in a["why"] for a in out["accepted"])
    assert all(f"belongs to {other_user.name}" in r["why"] for r in out["rejected"]) and len(out["rejected"]) == 3
    assert out["calibration"]["memory"][0]["factor"] == pytest.approx(1.25)


def test_job_files_of_someone_else_in_a_job_directory_are_refused(tmp_path, offline, monkeypatch, other_user):
    """A job directory (of a real job) whose metrics.json another user planted, or that others can write."""
    snap, site = offline
    dirs = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 100 + i) for i in range(3)]
    os.chown(dirs[0] / "metrics.json", other_user.uid, other_user.gid)
    dirs[1].chmod(0o777)
    (dirs[2] / "metrics.json").rename(dirs[2] / "real-metrics.json")
    (dirs[2] / "metrics.json").symlink_to(dirs[2] / "real-metrics.json")
    backend = _accounting(snap, {100 + i: (_me(), d) for i, d in enumerate(dirs)})
    code, out = _calibrate(monkeypatch, backend, site, dirs)
    assert code == 0 and out["accepted"] == []
    assert [r["why"] for r in out["rejected"]] == [
        f"metrics.json belongs to {other_user.name}, not to the directory's owner {_me()}",
        "is writable by others (mode 777): anyone could have written its records",
        "metrics.json is not a regular file (a link, FIFO or device)",
    ]


def test_memory_outliers_are_left_out_by_median_and_mad(tmp_path):
    from frenzy_slurm.calibration import FitBounds
    from frenzy_slurm.calibration.fit import fit_memory, reject_outliers
    from frenzy_slurm.calibration.observe import Observation

    def obs(name: str, ratio: float) -> Observation:
        return Observation(
            job_dir=tmp_path / name,
            job_id=None,
            kind="homogeneous",
            gpus=("A100-40GB",),
            precision="bf16-mixed",
            mode="bf16-mixed/full",
            slots=1,
            compute_s=None,
            other_s=None,
            measured_step_s=None,
            memory=[(10.0, 10.0 * ratio)],
        )

    honest = [obs(f"run{i}", r) for i, r in enumerate((1.0, 1.01, 0.99, 1.02))]
    planted = [obs(f"fab{i}", 0.70) for i in range(2)]
    (corr,), notes = fit_memory(honest + planted, FitBounds(min_jobs=3))
    assert corr.factor == pytest.approx(1.005) and corr.jobs == 4
    assert sum("(median/MAD test); left out" in n.text for n in notes) == 2
    assert reject_outliers([1.0, 1.0, 1.0, 1.01]) == ([0, 1, 2, 3], [])  # honest noise under 2% stays
    assert reject_outliers([1.0, 0.7]) == ([0, 1], [])  # two values: nothing to compare with
