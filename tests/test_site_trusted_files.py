"""Site, calibration and template files steer every job: each is used only when it is yours or root's and
no one else can write it or its directory (a group write bit only of a user-private group); a root-owned site
file is every user's. A refusal names the file and the fix, exit 2 from fsbatch.

Tests with a second local user (`other_user`, an unprivileged `fsaudit`) need root and skip without it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.core.errors import InputError

from .helpers import EXAMPLES, LOCAL, ROOT, make_spec, planned, run_cli
from .users import as_user, other_user  # noqa: F401 (fixture)

# ---------------------------------------------------------------- trusted site, calibration, template files


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
