"""`frenzy-slurm site install` runs as root: every directory above what it writes or installs from must be root's
and writable by no one else (StrictModes), the --wheel root's and writable by no one else, and files are written
relative to the directory descriptor that was checked.

The attack these protect against: a prefix under a directory another user owns (mode 0755, so only its owner
writes it) was accepted; that user renamed the installed scripts directory and put their own prolog in its place,
which slurmd ran as root.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from frenzy_slurm.cli.admin import main
from frenzy_slurm.site import install

from .users import as_user, other_user  # noqa: F401 (a fixture)

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="site install writes root's files")
SITE_YAML = (
    "cluster: test\npools:\n"
    "  - {partition: gpu, untyped: true, gpu: A100-80GB, gpus_per_node: 4, intra_node: nvlink3}\n"
)
WHEEL = "frenzy_slurm-9.9.9-py3-none-any.whl"


@pytest.fixture
def reachable() -> Iterator[Path]:
    """A root-owned 0755 directory in /tmp, which the other user can reach (pytest's tmp_path is root's 0700)."""
    path = Path(tempfile.mkdtemp(prefix="frenzy-test-install-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _owned_by(user, path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, user.uid, user.gid)
    path.chmod(0o755)  # only its owner can write it: the old check (last component only) let it pass
    return path


def _args(tmp: Path, **over: Path) -> list[str]:
    site = tmp / "site.yaml"
    if not site.exists():
        site.write_text(SITE_YAML)
    paths = {
        "--prefix": tmp / "opt" / "frenzy-slurm",
        "--etc": tmp / "etc" / "frenzy-slurm",
        "--scripts-dir": tmp / "etc" / "slurm",
        "--modulefiles": tmp / "modulefiles",
        "--site-file": site,
        **{f"--{k.replace('_', '-')}": v for k, v in over.items()},
    }
    return ["site", "install", *[x for k, v in paths.items() for x in (k, str(v))]]


@needs_root
@pytest.mark.parametrize("flag", ["scripts_dir", "etc", "modulefiles", "prefix"])
def test_a_target_below_another_users_directory_is_refused(tmp_path, other_user, flag):  # noqa: F811
    theirs = _owned_by(other_user, tmp_path / "shared")
    root_dir = theirs / "inner"  # root's own directory, 0755: only the one above is the other user's
    root_dir.mkdir(mode=0o755)
    target = root_dir / "target"
    res = CliRunner().invoke(main, [*_args(tmp_path, **{flag: target}), "--wheel", str(tmp_path / WHEEL)])
    assert res.exit_code == 2, res.output
    assert f"{theirs} belongs to {other_user.name}" in res.output and f"chown root: {theirs}" in res.output
    assert not target.exists() and not (tmp_path / "etc").exists() and not (tmp_path / "modulefiles").exists()


@needs_root
def test_the_attack_the_check_prevents(reachable, other_user):  # noqa: F811
    """What the owner of a directory above the scripts does to a root-owned 0755 directory below it: rename it
    and put their own in its place. It works (so the directory above must be root's), and install refuses it."""
    tmp_path = reachable
    theirs = _owned_by(other_user, tmp_path / "shared")
    scripts = theirs / "slurm"
    scripts.mkdir(mode=0o755)
    (scripts / "frenzy-prolog").write_text("#!/bin/sh\nexit 0\n")
    res = as_user(
        other_user, ["sh", "-c", 'mv "$0/slurm" "$0/old" && mkdir "$0/slurm" && echo evil > "$0/slurm/frenzy-prolog"',
                     str(theirs)],
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert (scripts / "frenzy-prolog").read_text() == "evil\n"
    out = CliRunner().invoke(main, [*_args(tmp_path, scripts_dir=scripts), "--dry-run"])
    assert out.exit_code == 2 and f"{theirs} belongs to {other_user.name}" in out.output, out.output


@needs_root
def test_a_site_file_below_another_users_directory_is_refused(tmp_path, other_user):  # noqa: F811
    inner = _owned_by(other_user, tmp_path / "theirs") / "mine"
    inner.mkdir(mode=0o755)
    site = inner / "site.yaml"
    site.write_text(SITE_YAML)
    res = CliRunner().invoke(main, [*_args(tmp_path, site_file=site), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert f"the directory {tmp_path / 'theirs'} above it belongs to {other_user.name}" in res.output


def _wheel(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    wheel = directory / WHEEL
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: never installed, the checks come first
    wheel.chmod(0o644)
    return wheel


@needs_root
def test_a_wheel_of_another_user_or_writable_by_others_is_refused(tmp_path, other_user):  # noqa: F811
    new_prefix = tmp_path / "new" / "frenzy-slurm"
    wheel = _wheel(tmp_path / "dist")
    ok = CliRunner().invoke(main, [*_args(tmp_path, prefix=new_prefix), "--wheel", str(wheel), "--dry-run"])
    assert ok.exit_code == 0 and f"would install {wheel}" in ok.output, ok.output
    cases = {
        "belongs to fsaudit, not root": lambda: os.chown(wheel, other_user.uid, other_user.gid),
        "is writable by others (mode 0666)": lambda: wheel.chmod(0o666),
        "is writable by its group (mode 0664)": lambda: wheel.chmod(0o664),
    }
    for needle, spoil in cases.items():
        wheel.unlink()
        _wheel(tmp_path / "dist")
        spoil()
        res = CliRunner().invoke(main, [*_args(tmp_path, prefix=new_prefix), "--wheel", str(wheel), "--dry-run"])
        assert res.exit_code == 2 and f"--wheel {wheel} {needle}" in res.output, (needle, res.output)
    theirs = _wheel(_owned_by(other_user, tmp_path / "their-dist") / "sub")
    res = CliRunner().invoke(main, [*_args(tmp_path, prefix=new_prefix), "--wheel", str(theirs), "--dry-run"])
    assert res.exit_code == 2 and f"{tmp_path / 'their-dist'} above it belongs to" in res.output, res.output
    link = tmp_path / "dist" / "link" / WHEEL
    link.parent.mkdir()
    link.symlink_to(_wheel(tmp_path / "dist2"))
    res = CliRunner().invoke(main, [*_args(tmp_path, prefix=new_prefix), "--wheel", str(link), "--dry-run"])
    assert res.exit_code == 2 and "symbolic link" in res.output, res.output


@needs_root
def test_an_existing_venv_with_an_entry_of_another_user_is_refused_before_its_python_runs(tmp_path, other_user):  # noqa: F811
    prefix = tmp_path / "opt" / "frenzy-slurm"
    (prefix / "bin").mkdir(parents=True)
    marker = tmp_path / "ran"
    python = prefix / "bin" / "python"
    python.write_text(f"#!/bin/sh\ntouch {marker}\n")
    python.chmod(0o755)
    os.chown(prefix / "bin", other_user.uid, other_user.gid)
    res = CliRunner().invoke(main, [*_args(tmp_path), "--dry-run"])
    assert res.exit_code == 2 and f"{prefix / 'bin'} belongs to {other_user.name}" in res.output, res.output
    assert not marker.exists()


@needs_root
def test_files_are_written_into_the_directory_that_was_checked(tmp_path):
    """A directory renamed away after its check, and another put in its place, does not receive the file: the
    write goes through the descriptor opened (and checked) first."""
    scripts = tmp_path / "slurm"
    scripts.mkdir(mode=0o755)
    steps: list[install.Step] = []
    fd = install.open_dir(scripts, "--scripts-dir")
    assert fd is not None
    try:
        os.rename(scripts, tmp_path / "moved")
        scripts.mkdir(mode=0o755)
        install._ensure_file(fd, scripts / "frenzy-prolog", b"root's\n", 0o755, False, steps, "prolog")
    finally:
        os.close(fd)
    assert (tmp_path / "moved" / "frenzy-prolog").read_bytes() == b"root's\n"
    assert not (scripts / "frenzy-prolog").exists()
    shutil.rmtree(scripts)
