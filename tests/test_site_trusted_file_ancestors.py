"""Site, calibration and template files steer every job: another user who owns any directory above one could
rename the directory holding it and put their own in its place, so every directory above must be yours or root's
and writable by no one else (StrictModes; a sticky /tmp is fine), not only the file's own directory."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from frenzy_slurm import __version__
from frenzy_slurm.calibration import CalibrationFile, load_calibration, site_fingerprint, write_calibration
from frenzy_slurm.cli.admin import main
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.render import environment
from frenzy_slurm.site.config import load_site

from .users import other_user  # noqa: F401 (a fixture)

SITE_YAML = (
    "cluster: t\npools:\n  - {partition: gpu, gres_type: a100, gpu: A100-80GB, gpus_per_node: 4, intra_node: nvlink3}\n"
)


def _below_theirs(user, tmp_path: Path) -> tuple[Path, Path]:
    """(the other user's 0755 directory, a root-owned 0755 directory two levels below it)."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, user.uid, user.gid)
    mine = theirs / "a" / "b"
    mine.mkdir(parents=True, mode=0o755)
    return theirs, mine


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_site_file_below_another_users_directory_is_refused(tmp_path, other_user):  # noqa: F811
    theirs, mine = _below_theirs(other_user, tmp_path)
    site = mine / "site.yaml"
    site.write_text(SITE_YAML)
    with pytest.raises(InputError, match=rf"site file .* the directory {theirs} above it belongs to fsaudit"):
        load_site(site)
    res = CliRunner().invoke(main, ["site", "validate", str(site)])
    assert res.exit_code == 2 and f"{theirs} above it belongs to {other_user.name}" in res.output, res.output
    os.chown(theirs, 0, 0)
    assert load_site(site).pools[0].gpu == "A100-80GB"  # the same file where every directory is root's


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_calibration_file_below_another_users_directory_is_refused(tmp_path, other_user):  # noqa: F811
    theirs, mine = _below_theirs(other_user, tmp_path)
    site_path = tmp_path / "site.yaml"
    site_path.write_text(SITE_YAML)
    site = load_site(site_path)
    cal = CalibrationFile(
        site_file=str(site_path),
        site_fingerprint=site_fingerprint(site),
        created_at=time.time(),
        valid_until=time.time() + 86400,
        frenzy_version=__version__,
    )
    path = mine / "site.calibration.yaml"
    write_calibration(path, cal)
    with pytest.raises(InputError, match=rf"calibration file .* {theirs} above it belongs to fsaudit"):
        load_calibration(path, site)
    os.chown(theirs, 0, 0)
    assert load_calibration(path, site).site_fingerprint == site_fingerprint(site)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand a directory to another user")
def test_templates_directory_below_another_users_directory_is_refused(tmp_path, other_user):  # noqa: F811
    theirs, mine = _below_theirs(other_user, tmp_path)
    (mine / "_header.j2").write_text("#!/bin/bash\n")
    with pytest.raises(InputError, match=rf"templates directory .* {theirs} above it belongs to fsaudit"):
        environment(mine)
    os.chown(theirs, 0, 0)
    assert environment(mine).get_template("_header.j2").render() == "#!/bin/bash\n"


def test_a_writable_directory_further_up_is_refused_a_sticky_one_is_not(tmp_path):
    shared = tmp_path / "shared"
    (shared / "a").mkdir(parents=True)
    site = shared / "a" / "site.yaml"
    site.write_text(SITE_YAML)
    shared.chmod(0o777)
    with pytest.raises(InputError, match=rf"{shared} above it is writable by everyone .*chmod go-w {shared}"):
        load_site(site)
    shared.chmod(0o1777)  # /tmp's mode: no one renames another's entry there
    assert load_site(site).cluster == "t"
