"""calibrate counts only measurements the job's owner could not have forged, and no user outvotes the others.

The attack these replay: a user runs throwaway jobs (`sbatch --wrap true`, real job ids Slurm's accounting
knows, run by that user in that directory) beside job directories with fsbatch's files and a forged
metrics.json. What the user cannot forge is the site epilog's record (contrib/slurm/epilog, run here as it
runs on a node, with a stand-in `scontrol` answering as slurmctld does): the digest of the script Slurm ran
and of metrics.json when the job ended.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from .test_audit2_files import _accounting, _calibrate, _finished, _me
from .test_calibrate_cli import _job_dir, offline  # noqa: F401 (fixture: snapshot and site file)
from .users import other_user  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parent.parent
EPILOG = ROOT / "contrib" / "slurm" / "epilog"

# `scontrol write batch_script JOB -` prints the script slurmctld stored; `scontrol show job` the job's WorkDir
FAKE_SCONTROL = """#!/bin/bash
case "$1 $2" in
  "write batch_script") cat "$FAKE_SCRIPT" ;;
  "show job") printf '   WorkDir=%s\\n' "$FAKE_WORKDIR" ;;
  *) exit 1 ;;
esac
"""


def run_epilog(tmp: Path, spool: Path, job_id: int, script: bytes, workdir: Path, user: str, uid: int, tag: str):
    """The site epilog after job `job_id`, as slurmd runs it (root, Slurm's variables, no GPUs here)."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    ran = tmp / f"ran-{job_id}.sh"
    ran.write_bytes(script)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FRENZY_SPOOL": str(spool),
        "NVIDIA_SMI": "/nonexistent/nvidia-smi",
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOB_COMMENT": tag,
        "SLURM_JOB_USER": user,
        "SLURM_JOB_UID": str(uid),
        "FAKE_SCRIPT": str(ran),
        "FAKE_WORKDIR": str(workdir),
    }
    res = subprocess.run(["bash", str(EPILOG)], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    (record,) = [json.loads(f.read_text()) for f in spool.glob(f"{job_id}-*.json")]
    return record


def _tag(d: Path) -> str:
    return "frenzy:" + json.loads((d / "plan.json").read_text())["submission"]


def _submitted(d: Path) -> bytes:
    """job.sbatch as fsbatch writes it: the directory's inode and plan.json's digest bound in."""
    from frenzy_slurm.submit.jobdir import bind_identity

    files = {n: (d / n).read_text() for n in ("job.sbatch", "plan.json", "ds_config.json")}
    script = bind_identity(files["job.sbatch"], os.stat(d).st_ino, files)
    (d / "job.sbatch").write_text(script)
    return script.encode()


def _give(d: Path, user) -> None:
    for p in [d, *d.iterdir()]:
        os.chown(p, user.uid, user.gid)


def test_epilog_records_the_digests_of_the_script_slurm_ran_and_of_metrics(tmp_path):
    d = tmp_path / "job"
    d.mkdir()
    (d / "metrics.json").write_text('{"step_times_s": [1.0]}')
    rec = run_epilog(tmp_path, tmp_path / "spool", 77, b"#!/bin/sh\ntrue\n", d, _me(), os.getuid(), "frenzy:ab")
    assert rec["script_sha256"] == hashlib.sha256(b"#!/bin/sh\ntrue\n").hexdigest()
    assert rec["metrics_sha256"] == hashlib.sha256(b'{"step_times_s": [1.0]}').hexdigest()
    assert rec["work_dir"] == str(d) and rec["user"] == _me() and rec["gpus"] == []
    # a link is not followed, and a file of another user than the job's is not read
    (d / "metrics.json").rename(d / "real.json")
    (d / "metrics.json").symlink_to(d / "real.json")
    assert run_epilog(tmp_path, tmp_path / "s2", 78, b"x", d, _me(), os.getuid(), "frenzy:ab")["metrics_sha256"] is None
    (d / "metrics.json").unlink()
    (d / "real.json").rename(d / "metrics.json")
    assert run_epilog(tmp_path, tmp_path / "s3", 79, b"x", d, "bob", 4242, "frenzy:ab")["metrics_sha256"] is None


def test_forged_metrics_beside_a_throwaway_job_are_rejected(tmp_path, offline, monkeypatch, other_user):
    """Three directories of another user, each naming a real `sbatch --wrap true` job of theirs that ran there
    (accounting agrees), with fsbatch's files and metrics at x0.70: the epilog saw another script run."""
    snap, site = offline
    spool = tmp_path / "spool"
    dirs, jobs = [], {}
    for i in range(3):
        d = _finished(_job_dir(tmp_path, snap, site, f"fab{i}", 0.2), 300 + i, peak_gib=0.0028)
        _submitted(d)
        _give(d, other_user)
        run_epilog(tmp_path, spool, 300 + i, b"#!/bin/sh\ntrue\n", d, other_user.name, other_user.uid, _tag(d))
        dirs.append(d)
        jobs[300 + i] = (other_user.name, d)
    code, out = _calibrate(monkeypatch, _accounting(snap, jobs), site, dirs, "--epilog-dir", str(spool))
    assert code == 0 and out["accepted"] == [] and out["calibration"]["memory"] == []
    assert [r["why"] for r in out["rejected"]] == [
        f"job {300 + i}: the batch script Slurm ran is not this directory's job.sbatch" for i in range(3)
    ]


def test_another_users_real_job_counts_only_as_the_epilog_found_it(tmp_path, offline, monkeypatch, other_user):
    snap, site = offline
    spool = tmp_path / "spool"
    dirs, jobs = [], {}
    for i, name in enumerate(("real", "later", "changed", "noepilog", "tag")):
        d = _finished(_job_dir(tmp_path, snap, site, name, 0.2), 400 + i)
        script = _submitted(d)
        _give(d, other_user)
        if name == "later":  # metrics.json written after the job ended
            (d / "metrics.json").rename(d / "kept.json")
        tag = "frenzy:0000" if name == "tag" else _tag(d)
        if name != "noepilog":
            run_epilog(tmp_path, spool, 400 + i, script, d, other_user.name, other_user.uid, tag)
        if name == "later":
            (d / "kept.json").rename(d / "metrics.json")
        if name == "changed":  # rewritten after the epilog's record
            (d / "metrics.json").write_text((d / "metrics.json").read_text().replace("0.005", "0.0028"))
        dirs.append(d)
        jobs[400 + i] = (other_user.name, d)
    code, out = _calibrate(monkeypatch, _accounting(snap, jobs), site, dirs, "--epilog-dir", str(spool))
    assert code == 0, out
    assert [a["job_id"] for a in out["accepted"]] == ["400"]
    assert "confirmed by the site epilog's record" in out["accepted"][0]["why"]
    why = {Path(r["job_dir"]).name: r["why"] for r in out["rejected"]}
    assert why["later"].endswith(
        "metrics.json was not there when the job ended (the site epilog found none): written afterwards"
    )
    assert why["changed"].endswith(
        "metrics.json is not the one the site epilog found when the job ended: changed afterwards"
    )
    assert why["noepilog"].startswith(f"belongs to {other_user.name}, and has no record of the site epilog for job 403")
    assert why["tag"].endswith(
        f"Slurm's job comment is not this plan's ({_tag(dirs[4])}): not the job fsbatch submitted for it"
    )


def test_an_epilog_directory_others_can_write_vouches_for_nothing(tmp_path, offline, monkeypatch, other_user):
    snap, site = offline
    spool = tmp_path / "spool"
    d = _finished(_job_dir(tmp_path, snap, site, "real", 0.2), 500)
    run_epilog(tmp_path, spool, 500, _submitted(d), d, other_user.name, other_user.uid, _tag(d))
    _give(d, other_user)
    spool.chmod(0o777)
    code, out = _calibrate(
        monkeypatch, _accounting(snap, {500: (other_user.name, d)}), site, [d], "--epilog-dir", str(spool)
    )
    assert code == 0 and out["accepted"] == [] and out["epilog_records"] == 0
    assert "is not a directory of root's that only root can write" in " ".join(out["skipped"])


def test_accounting_must_agree_with_the_plan_and_the_claimed_steps(tmp_path, offline, monkeypatch):
    snap, site = offline
    dirs = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 600 + i) for i in range(3)]
    backend = _accounting(snap, {600 + i: (_me(), d) for i, d in enumerate(dirs)})
    backend.fake_jobs[601].end = 3  # ran 2 s: metrics.json claims 8.8 s of steps
    comps = json.loads((dirs[2] / "plan.json").read_text())["decision"]["chosen"]["components"]
    backend.fake_jobs[602].nodes = [["n1", "n2", "n3"]]  # three nodes where the plan has one
    backend.fake_jobs[602].components = [type("C", (), {"gpus_per_node": comps[0]["gpus_per_node"]})()]
    code, out = _calibrate(monkeypatch, backend, site, dirs)
    assert code == 0 and [a["job_id"] for a in out["accepted"]] == ["600"]
    assert [r["why"] for r in out["rejected"]] == [
        "metrics.json claims 9 s of steps, but job 601 ran 2 s",
        f"job 602 was allocated 3 node(s), but plan.json plans {comps[0]['nodes']}",
    ]


# ---------------------------------------------------------------- one user, one vote; bounded per calibration


def _obs(tmp_path: Path, user: str, i: int, ratio: float = 1.0, step: float | None = None):
    from frenzy_slurm.calibration.observe import Observation

    return Observation(
        job_dir=tmp_path / f"{user}{i}",
        job_id=str(i),
        kind="homogeneous",
        gpus=("A100-40GB",),
        precision="bf16-mixed",
        mode="bf16-mixed/full",
        slots=1,
        compute_s=None if step is None else 0.001,
        other_s=None if step is None else 0.0,
        measured_step_s=step,
        memory=[(10.0, 10.0 * ratio)],
        user=user,
    )


def _previous(factor: float = 1.0, overhead: float = 0.0):
    from frenzy_slurm.calibration import CalibrationFile, MemoryCorrection, StepTimeCorrection

    return CalibrationFile(
        site_file="s",
        site_fingerprint="f",
        created_at=0,
        valid_until=1,
        frenzy_version="0",
        memory=[MemoryCorrection(mode="bf16-mixed/full", factor=factor, jobs=3, ranks=3)],
        step_time=[
            StepTimeCorrection(
                gpu="A100-40GB",
                precision="bf16-mixed",
                step_overhead_s=overhead,
                jobs=3,
                raw_error=1,
                calibrated_error=0,
            )
        ],
    )


def test_one_users_many_jobs_are_one_vote_and_the_victim_is_not_the_outlier(tmp_path):
    from frenzy_slurm.calibration import FitBounds
    from frenzy_slurm.calibration.fit import fit_memory

    victim = [_obs(tmp_path, "victim", 0, 1.0)]
    honest = [_obs(tmp_path, "bob", i, r) for i, r in enumerate((1.02, 1.01))]
    mallory = [_obs(tmp_path, "mallory", i, 0.70) for i in range(9)]
    (corr,), notes = fit_memory(victim + honest + mallory, FitBounds(min_jobs=3))
    assert corr.factor == pytest.approx((1.0 + 1.015) / 2) and corr.jobs == 3
    assert any("memory bf16-mixed/full: mallory measured/predicted x0.7 over 9 jobs" in n.text for n in notes), notes


def test_one_users_many_jobs_cannot_move_a_factor_beyond_the_bound(tmp_path):
    from frenzy_slurm.calibration import FitBounds
    from frenzy_slurm.calibration.fit import fit

    jobs = [_obs(tmp_path, "mallory", i, 0.70, step=0.8) for i in range(20)]
    steps, memory, notes = fit(jobs, FitBounds(min_jobs=3, max_change=1.25), _previous(1.0, 2.8))
    assert memory[0].factor == pytest.approx(0.8)  # not x0.70
    own = next(c for c in steps if c.gpu == "A100-40GB")
    assert own.step_overhead_s == pytest.approx(2.8 / 1.25)  # not 0.8 s
    assert any("s/step fitted 0.799, previous calibration 2.8: moved to 2.24" in n.text for n in notes), notes
    assert any("factor fitted x0.7, previous calibration x1: moved to x0.8" in n.text for n in notes), notes
    # the first calibration has nothing to move from: only the fit's own bounds hold it
    _, first, _ = fit(jobs, FitBounds(min_jobs=3))
    assert first[0].factor == pytest.approx(0.70)


def test_calibrate_holds_the_memory_factor_of_the_calibration_it_replaces(tmp_path, offline, monkeypatch):
    from frenzy_slurm.calibration import write_calibration

    snap, site = offline
    dirs = [_finished(_job_dir(tmp_path, snap, site, f"run{i}", 0.2), 700 + i, peak_gib=0.0028) for i in range(3)]
    prev = _previous(1.0).model_copy(
        update={"memory": [_previous(1.0).memory[0].model_copy(update={"mode": "fp32/full"})]}
    )
    write_calibration(site.parent / "site.calibration.yaml", prev)
    backend = _accounting(snap, {700 + i: (_me(), d) for i, d in enumerate(dirs)})
    code, out = _calibrate(monkeypatch, backend, site, dirs)
    assert code == 0, out
    assert out["previous"] == str(site.parent / "site.calibration.yaml")
    (memory,) = out["calibration"]["memory"]
    assert memory["factor"] == pytest.approx(0.8)  # measured x0.70, held to x1.25 of the previous x1
    assert any("moved to x0.8, at most x1.25 per calibration" in n for n in out["calibration"]["notes"])
