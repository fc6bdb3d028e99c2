"""Issue 19, files: what fsqueue and calibrate read from job directories, how every file is written, which
site, calibration and template files are trusted, and the queue cache (items 4, 5, 6, 7 and 14).

Tests with a second local user (`other_user`, an unprivileged `fsaudit`) need root and skip without it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.errors import InputError
from frenzy_slurm.slurm.view import Job

from .helpers import EXAMPLES, LOCAL, ROOT, make_spec, planned, run_cli
from .users import as_user, other_user  # noqa: F401 (fixture)

FSQUEUE = "import sys; from frenzy_slurm.cli.fsqueue import main; sys.argv[0] = 'fsqueue'; main()"


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def _snapshot(path: Path, jobs: list[Job]) -> Path:
    """A static-backend snapshot holding these queue jobs (fsqueue --backend static reads its jobs)."""
    from frenzy_slurm.sim.synthetic import synthetic

    view = synthetic(LOCAL)
    path.write_text(view.model_copy(update={"jobs": jobs}).model_dump_json())
    return path


def _fsqueue(tmp_path: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FRENZY_JOBS_DIR": str(tmp_path / "jobs")}
    return subprocess.run(
        [sys.executable, "-c", FSQUEUE, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout
    )


def _job(job_id: int, user: str, workdir: Path) -> Job:
    return Job(
        job_id=job_id,
        state="RUNNING",
        comment="frenzy:abc",
        user=user,
        workdir=str(workdir),
        name="x",
        partition="a100",
        gpus_per_node=1,
        node_count=1,
        start_time=int(time.time()) - 60,
    )


# ---------------------------------------------------------------- item 4: fsqueue reads job directories bounded


def test_fsqueue_all_does_not_open_another_users_job_directory(tmp_path, other_user):
    """The attacker's job directory holds a FIFO as checkpoints/latest and plan.json, and metrics.json is a link to
    /dev/zero: `fsqueue --all` by the victim (root here) returns at once and reads nothing of it."""
    trap = other_user.home / f"trap-{os.getpid()}"
    try:
        res = as_user(
            other_user,
            [
                "sh",
                "-c",
                f"mkdir -p {trap}/checkpoints && mkfifo {trap}/checkpoints/latest "
                f"{trap}/plan.json && ln -s /dev/zero {trap}/metrics.json && "
                f"chmod 755 {trap} {trap}/checkpoints",
            ],
        )
        assert res.returncode == 0, res.stderr
        snap = _snapshot(tmp_path / "snap.json", [_job(41, other_user.name, trap)])
        start = time.monotonic()
        try:
            out = _fsqueue(tmp_path, "--all", "--json", "--backend", "static", "--snapshot", str(snap), timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail("fsqueue --all hung on another user's FIFO")
        assert out.returncode == 0, out.stderr
        assert time.monotonic() - start < 30
        (job,) = json.loads(out.stdout)
        assert job["user"] == other_user.name and job["state"] == "RUNNING"
        assert job["plan"] is None and job["metrics"] is None and job["last_checkpoint_step"] is None
        assert any("reads only your own job directories" in n for n in job["notes"]), job["notes"]
        shown = _fsqueue(tmp_path, "41", "--backend", "static", "--snapshot", str(snap), timeout=30)
        assert shown.returncode == 0 and "reads only your own job directories" in shown.stdout, shown.stderr
    finally:
        shutil.rmtree(trap, ignore_errors=True)


def test_fsqueue_own_job_directory_fifo_and_device_are_refused_promptly(tmp_path):
    """Even in one's own job directory: a FIFO as checkpoints/latest or finished.json and /dev/zero as metrics.json
    are no records, read without blocking and without limit."""
    d = tmp_path / "jobs" / "mine"
    (d / "checkpoints").mkdir(parents=True, mode=0o700)
    os.mkfifo(d / "checkpoints" / "latest")
    os.mkfifo(d / "finished.json")
    (d / "metrics.json").symlink_to("/dev/zero")
    (d / "submission.json").write_text(json.dumps({"job_id": 42, "submission": "abc"}))  # fsbatch's record
    snap = _snapshot(tmp_path / "snap.json", [_job(42, _me(), d)])
    try:
        out = _fsqueue(tmp_path, "--json", "--backend", "static", "--snapshot", str(snap), timeout=30)
    except subprocess.TimeoutExpired:
        pytest.fail("fsqueue hung on a FIFO in the job directory")
    assert out.returncode == 0, out.stderr
    (job,) = json.loads(out.stdout)
    assert job["job_id"] == 42 and job["finished"] is None and job["metrics"] is None
    assert job["last_checkpoint_step"] is None


def test_checkpoint_tag_is_not_read_through_a_link(tmp_path):
    from frenzy_slurm.track import last_checkpoint

    (tmp_path / "elsewhere").write_text("step7")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "latest").symlink_to(tmp_path / "elsewhere")
    assert last_checkpoint(tmp_path / "ckpt") is None
    (tmp_path / "ckpt" / "latest").unlink()
    (tmp_path / "ckpt" / "latest").write_text("step7\n")
    assert last_checkpoint(tmp_path / "ckpt") == 7
    (tmp_path / "ckpt" / "latest").write_text("step7" + " " * 10_000)  # a tag is a few bytes
    assert last_checkpoint(tmp_path / "ckpt") is None


def test_job_directory_owned_by_someone_else_is_not_read_for_your_job(tmp_path, other_user):
    """A job of yours whose working directory belongs to another user (they control its files): not read, and
    not taken for a frenzy-slurm job (fsbatch's job directories are the user's own), whatever its record says."""
    from frenzy_slurm.track import frenzy_jobs

    d = tmp_path / "theirs"
    d.mkdir()
    (d / "metrics.json").write_text(json.dumps({"step": 99}))
    (d / "submission.json").write_text(json.dumps({"job_id": 43, "submission": "abc"}))
    for f in (d, d / "metrics.json", d / "submission.json"):
        os.chown(f, other_user.uid, other_user.gid)
    assert frenzy_jobs([_job(43, _me(), d)]) == []


def test_find_job_dir_ignores_a_malformed_submission(tmp_path):
    from frenzy_slurm.track import find_job_dir

    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "submission.json").write_text(json.dumps({"job_id": "x1"}))  # int() raised before
    assert find_job_dir(17, [tmp_path]) is None
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "submission.json").write_text(json.dumps({"job_id": "17"}))
    assert find_job_dir(17, [tmp_path]) == tmp_path / "b"


# ---------------------------------------------------------------- item 14: the queue cache


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake(user: str):
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.slurm.fake import FakeSlurm

    return FakeSlurm(synthetic(LOCAL), user=user)


def test_forged_cache_with_a_future_mtime_is_not_shown(cache_home):
    """A cache file (the old format, a bare job list) dated a year ahead showed its fake jobs forever."""
    from frenzy_slurm.track import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True, mode=0o700)
    fake = [Job(job_id=999, state="RUNNING", user=_me(), comment="frenzy:forged").model_dump(mode="json")]
    path.write_text(json.dumps(fake))
    path.chmod(0o600)
    future = time.time() + 365 * 86400
    os.utime(path, (future, future))
    assert [j.job_id for j in query_jobs_cached(backend, _me())] == []  # asked Slurm: an empty queue
    # the same forgery in the current format: its own timestamp is in the future
    path.write_text(json.dumps({"key": f"user={_me()}", "written_at": future, "jobs": fake}))
    path.chmod(0o600)
    os.utime(path, (future, future))
    assert [j.job_id for j in query_jobs_cached(backend, _me())] == []


def test_fresh_cache_is_reused_and_its_age_is_its_content(cache_home):
    from frenzy_slurm.track import _cache_path, query_jobs_cached

    backend = _fake(_me())
    assert query_jobs_cached(backend, _me()) == []
    path = _cache_path(backend, f"user={_me()}")
    data = json.loads(path.read_text())
    assert data["key"] == f"user={_me()}" and abs(data["written_at"] - time.time()) < 5
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    data["jobs"] = [Job(job_id=5, state="RUNNING", user=_me()).model_dump(mode="json")]
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    assert [j.job_id for j in query_jobs_cached(backend, _me())] == [5]  # within its age: reused
    data["written_at"] = time.time() - 60
    path.write_text(json.dumps(data))  # mtime now, content a minute old
    path.chmod(0o600)
    assert query_jobs_cached(backend, _me()) == []


def test_cache_in_a_directory_others_can_write_is_neither_read_nor_written(cache_home):
    from frenzy_slurm.track import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o777)
    planted = {
        "key": f"user={_me()}",
        "written_at": time.time(),
        "jobs": [Job(job_id=6, state="RUNNING", user=_me()).model_dump(mode="json")],
    }
    path.write_text(json.dumps(planted))
    path.chmod(0o600)
    assert query_jobs_cached(backend, _me()) == []
    assert json.loads(path.read_text()) == planted  # not rewritten there either


def test_cache_owned_by_another_user_is_not_read(cache_home, other_user):
    from frenzy_slurm.track import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_text(
        json.dumps(
            {
                "key": f"user={_me()}",
                "written_at": time.time(),
                "jobs": [Job(job_id=7, state="RUNNING", user=_me()).model_dump(mode="json")],
            }
        )
    )
    path.chmod(0o600)
    os.chown(path, other_user.uid, other_user.gid)
    assert query_jobs_cached(backend, _me()) == []


# ---------------------------------------------------------------- item 6: every write atomic, never through a link


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "bashrc"
    victim.write_text("# the victim's shell start-up\n")
    return victim


def test_write_calibration_never_writes_through_a_planted_link(tmp_path):
    from frenzy_slurm.calibration import CalibrationFile, write_calibration

    victim = _victim(tmp_path)
    target = tmp_path / "site.calibration.yaml"
    (tmp_path / f".{target.name}.tmp-{os.getpid()}").symlink_to(victim)  # the name the old code wrote to
    cal = CalibrationFile(site_file="site.yaml", site_fingerprint="x", created_at=0, valid_until=1, frenzy_version="0")
    write_calibration(target, cal)
    assert victim.read_text() == "# the victim's shell start-up\n"
    assert yaml.safe_load(target.read_text())["site_fingerprint"] == "x"
    assert oct(target.stat().st_mode & 0o777) == "0o644"  # every user's fsbatch reads it


def test_site_detect_never_writes_through_a_planted_link(tmp_path, monkeypatch):
    """In-process (the old temporary name held the pid): --backend static describes pools from GRES and writes."""
    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main
    from frenzy_slurm.sim.synthetic import synthetic

    victim = _victim(tmp_path)
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    out = tmp_path / "site.yaml"
    (tmp_path / f".site.yaml.tmp-{os.getpid()}").symlink_to(victim)
    (tmp_path / "site.yaml.detected").symlink_to(victim)
    res = CliRunner().invoke(main, ["site", "detect", "-o", str(out), "--backend", "static", "--snapshot", str(snap)])
    assert victim.read_text() == "# the victim's shell start-up\n", res.output
    assert res.exit_code == 0, res.output
    assert yaml.safe_load(out.read_text())["pools"] and not out.is_symlink()
    assert not (tmp_path / "site.yaml.detected").exists()  # renamed over the site file once it loaded


def test_save_workload_replaces_a_link_at_the_output(tmp_path):
    from frenzy_slurm.sim.workload import WorkloadFile, WorkloadJob, save_workload

    victim = _victim(tmp_path)
    wl = WorkloadFile(jobs=[WorkloadJob(id=0, submit_s=0, model="gpt2", seq_len=128, global_batch=8, steps=10)])
    for name in ("w.yaml", "w.csv"):
        (tmp_path / name).symlink_to(victim)
        save_workload(wl, tmp_path / name)
        assert victim.read_text() == "# the victim's shell start-up\n"
        assert not (tmp_path / name).is_symlink()


def test_sampler_lock_is_not_opened_through_a_link(tmp_path):
    from frenzy_slurm.runtime.nvml_sampler import merge_metrics

    victim = _victim(tmp_path)
    (tmp_path / ".metrics.lock").symlink_to(victim)
    with pytest.raises(OSError):
        merge_metrics(tmp_path)  # ELOOP: the lock is refused, never truncated
    assert victim.read_text() == "# the victim's shell start-up\n"


def test_no_write_text_left_in_the_package():
    """Every file frenzy-slurm writes goes through records.write_atomic (or an O_NOFOLLOW open)."""
    import re

    offenders = []
    for p in (ROOT / "frenzy_slurm").rglob("*.py"):
        for i, line in enumerate(p.read_text().splitlines(), 1):
            if re.search(
                r"\.write_text\(|\.write_bytes\(|(?<!fd)open\([^)]*[\"'][wa]b?\+?[\"']|\.savefig\((?!png|image)", line
            ):
                offenders.append(f"{p.relative_to(ROOT)}:{i}: {line.strip()}")
    assert offenders == []


# ---------------------------------------------------------------- item 7: trusted site, calibration, template files


def _site(tmp_path: Path) -> Path:
    from frenzy_slurm.sim.synthetic import synthetic_site

    d = tmp_path / "etc"
    d.mkdir(mode=0o755)
    site = d / "site.yaml"
    site.write_text(yaml.safe_dump(synthetic_site(LOCAL).model_dump(mode="json")))
    site.chmod(0o644)
    return site


def test_world_writable_site_file_is_refused_with_the_fix(tmp_path):
    from frenzy_slurm.site.config import load_site

    site = _site(tmp_path)
    load_site(site)
    site.chmod(0o666)
    with pytest.raises(InputError) as exc:
        load_site(site)
    assert f"site file {site} is writable by everyone (mode 666)" in exc.value.message
    assert f"chmod go-w {site}" in exc.value.message
    site.chmod(0o644)
    site.parent.chmod(0o777)
    with pytest.raises(InputError) as exc:
        load_site(site)
    assert f"the directory of site file {site}, {site.parent} is writable by everyone" in exc.value.message


def test_world_writable_site_file_is_exit_2_for_fsbatch(tmp_path):
    site = _site(tmp_path)
    site.chmod(0o646)
    res = run_cli(
        "fsbatch", str(EXAMPLES / "tiny-cpu.yaml"), "--dry-run", "--site", str(site), "--job-dir", str(tmp_path / "job")
    )
    assert res.returncode == 2 and "writable by everyone" in res.stderr and "Traceback" not in res.stderr


def test_site_file_owned_by_another_user_is_refused(tmp_path, other_user):
    from frenzy_slurm.site.config import load_site

    site = _site(tmp_path)
    os.chown(site, other_user.uid, other_user.gid)
    with pytest.raises(InputError, match=f"belongs to {other_user.name}, not to you or root"):
        load_site(site)
    os.chown(site, 0, 0)
    os.chown(site.parent, other_user.uid, other_user.gid)  # they could replace the file
    with pytest.raises(InputError, match=f"directory of site file .* belongs to {other_user.name}"):
        load_site(site)


def test_group_write_bit_only_of_a_user_private_group(tmp_path, other_user):
    import grp

    from frenzy_slurm.site.config import load_site

    site = _site(tmp_path)
    site.chmod(0o664)
    if grp.getgrgid(os.stat(site).st_gid).gr_mem:
        pytest.skip("root's group has members here")
    load_site(site)  # root:root 0664: the group is root's own
    os.chown(site, 0, other_user.gid)  # a group someone else is in
    with pytest.raises(InputError, match="writable by its group"):
        load_site(site)


def test_root_owned_site_file_is_trusted_by_other_users(tmp_path, other_user):
    """A root-owned 0644 site file in a root-owned directory is what a site installs: every user can use it."""
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="frenzy-site-", dir="/tmp"))  # pytest's own directories are 0700
    try:
        top.chmod(0o755)
        site = _site(top)
        code = (
            "import sys; from pathlib import Path; from frenzy_slurm.site.config import load_site; "
            "print(len(load_site(Path(sys.argv[1])).pools))"
        )
        res = as_user(other_user, [sys.executable, "-c", code, str(site)], cwd=Path("/"))
        assert res.returncode == 0 and res.stdout.strip() == str(len(LOCAL)), res.stderr
    finally:
        shutil.rmtree(top)


def test_calibration_file_owned_by_another_user_is_refused(tmp_path, other_user):
    from frenzy_slurm.calibration import CalibrationFile, load_calibration, site_fingerprint, write_calibration
    from frenzy_slurm.site.config import load_site

    site = _site(tmp_path)
    cfg = load_site(site)
    from frenzy_slurm import __version__

    cal_path = site.parent / "site.calibration.yaml"
    write_calibration(
        cal_path,
        CalibrationFile(
            site_file=str(site),
            site_fingerprint=site_fingerprint(cfg),
            created_at=time.time(),
            valid_until=time.time() + 86400,
            frenzy_version=__version__,
        ),
    )
    load_calibration(cal_path, cfg)
    os.chown(cal_path, other_user.uid, other_user.gid)
    with pytest.raises(InputError, match=f"calibration file {cal_path} belongs to {other_user.name}"):
        load_calibration(cal_path, cfg)


def _render_with(template_dir: Path):
    from frenzy_slurm.sim.synthetic import synthetic

    return planned(make_spec(), synthetic(LOCAL), Path("/home/u/frenzy-jobs/t-1"), templates=template_dir)


def test_world_writable_templates_directory_is_refused(tmp_path, monkeypatch):
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "_header.j2").write_text("#!/bin/bash\n# site header\n#SBATCH --job-name={{ name }}\n")
    assert _render_with(tdir).script.startswith("#!/bin/bash\n# site header\n")
    tdir.chmod(0o777)
    with pytest.raises(InputError, match=r"templates directory .* is writable by everyone .* a template is shell"):
        _render_with(tdir)
    tdir.chmod(0o755)
    (tdir / "_header.j2").chmod(0o666)  # the directory is fine, the template is not
    with pytest.raises(InputError, match=r"template .*_header.j2 is writable by everyone"):
        _render_with(tdir)
    monkeypatch.setenv("FRENZY_TEMPLATES", str(tdir))  # the same from the environment, through the CLI: exit 2
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from frenzy_slurm.cli.fsbatch import main; main()",
            str(EXAMPLES / "tiny-cpu.yaml"),
            "--dry-run",
            "--site",
            str(ROOT / "site_configs" / "devcluster-cpu.yaml"),
            "--backend",
            "static",
            "--snapshot",
            str(_cpu_snapshot(tmp_path)),
            "--job-dir",
            str(tmp_path / "job"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 2 and "_header.j2 is writable by everyone" in res.stderr, res.stderr


def _cpu_snapshot(tmp_path: Path) -> Path:
    from frenzy_slurm.sim.synthetic import synthetic

    site = yaml.safe_load((ROOT / "site_configs" / "devcluster-cpu.yaml").read_text())
    pools = [(p["partition"], p["gpu"], 2, p["gpus_per_node"]) for p in site["pools"]]
    snap = tmp_path / "cpu-snap.json"
    snap.write_text(
        synthetic(pools, gres_types={p["partition"]: p["gres_type"] for p in site["pools"]}).model_dump_json()
    )
    return snap


def test_template_owned_by_another_user_is_refused(tmp_path, other_user):
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "_header.j2").write_text("#!/bin/bash\n#SBATCH --job-name={{ name }}\n")
    os.chown(tdir / "_header.j2", other_user.uid, other_user.gid)
    with pytest.raises(InputError, match=f"template .*_header.j2 belongs to {other_user.name}"):
        _render_with(tdir)


# ---------------------------------------------------------------- item 5: calibrate trusts only jobs Slurm knows

from .test_calibrate_cli import _job_dir, offline  # noqa: E402,F401 (fixture: snapshot and site file)


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
