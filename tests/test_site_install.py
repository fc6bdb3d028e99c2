"""`frenzy-slurm site install`: one command puts the venv, modulefiles, the site file and the Slurm prolog/epilog in
place, root's; a second run changes nothing; unsafe targets are refused before anything is written.

The venv is an existing one (a `venv --without-pip` whose .pth file points at this checkout), so the test needs no
package index; the wheel path (venv created, wheel installed) is what docs/admin.md's walkthrough ran.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner

from frenzy_slurm import __version__
from frenzy_slurm.cli.admin import main

from .helpers import ROOT

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="site install writes root's files")
SITE_YAML = (
    "cluster: test\npools:\n"
    "  - {partition: gpu, untyped: true, gpu: A100-80GB, gpus_per_node: 4, intra_node: nvlink3}\n"
)


@pytest.fixture(scope="module")
def venv_prefix(tmp_path_factory) -> Path:
    """An existing venv that imports this checkout's frenzy_slurm (and the project venv's packages)."""
    prefix = tmp_path_factory.mktemp("opt") / "frenzy-slurm"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True, timeout=120)
    site_packages = next((prefix / "lib").glob("python3*/site-packages"))
    (site_packages / "frenzy-checkout.pth").write_text(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    return prefix


def _layout(tmp_path: Path, venv_prefix: Path) -> dict[str, Path]:
    site = tmp_path / "site.yaml"
    site.write_text(SITE_YAML)
    site.chmod(0o644)
    return {
        "prefix": venv_prefix,
        "etc": tmp_path / "etc" / "frenzy-slurm",
        "scripts": tmp_path / "etc" / "slurm",
        "modules": tmp_path / "modulefiles",
        "site": site,
    }


def _install(paths: dict[str, Path], *extra: str):
    args = [
        "site",
        "install",
        "--prefix",
        str(paths["prefix"]),
        "--etc",
        str(paths["etc"]),
        "--scripts-dir",
        str(paths["scripts"]),
        "--modulefiles",
        str(paths["modules"]),
        "--site-file",
        str(paths["site"]),
        *extra,
    ]
    return CliRunner().invoke(main, args)


def _files(paths: dict[str, Path]) -> dict[str, Path]:
    mod = paths["modules"] / "frenzy-slurm"
    return {
        "prolog": paths["scripts"] / "frenzy-prolog",
        "epilog": paths["scripts"] / "frenzy-epilog",
        "site": paths["etc"] / "site.yaml",
        "lua": mod / f"{__version__}.lua",
        "tcl": mod / __version__,
    }


@needs_root
def test_install_puts_everything_in_place_root_owned_and_is_idempotent(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    res = _install(paths)
    assert res.exit_code == 0, res.output
    files = _files(paths)
    for name, mode in (("prolog", 0o755), ("epilog", 0o755), ("site", 0o644), ("lua", 0o644), ("tcl", 0o644)):
        st = os.stat(files[name])
        assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (mode, 0, 0), name
    assert files["prolog"].read_bytes() == (ROOT / "contrib" / "slurm" / "prolog").read_bytes()
    assert files["epilog"].read_bytes() == (ROOT / "contrib" / "slurm" / "epilog").read_bytes()
    assert files["site"].read_text() == SITE_YAML
    for d in (paths["etc"], paths["scripts"], paths["modules"] / "frenzy-slurm"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o755
    assert f"unchanged     venv with frenzy-slurm {__version__}: {venv_prefix}" in res.output
    assert f"    Prolog={files['prolog']}\n    Epilog={files['epilog']}\n" in res.output
    assert f"module use {paths['modules']}" in res.output

    before = {n: os.stat(p).st_mtime_ns for n, p in files.items()}
    again = _install(paths)
    assert again.exit_code == 0, again.output
    steps = [line for line in again.output.splitlines() if line and not line.startswith((" ", "Add", "Next"))]
    assert steps and all(line.startswith("unchanged") for line in steps), again.output
    assert {n: os.stat(p).st_mtime_ns for n, p in files.items()} == before

    files["epilog"].chmod(0o777)  # a changed mode is put back
    third = _install(paths)
    assert f"updated       epilog: {files['epilog']}" in third.output
    assert stat.S_IMODE(os.stat(files["epilog"]).st_mode) == 0o755


@needs_root
def test_dry_run_changes_nothing(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    res = _install(paths, "--dry-run")
    assert res.exit_code == 0, res.output
    assert f"would create  epilog: {paths['scripts'] / 'frenzy-epilog'}" in res.output
    assert not paths["etc"].exists() and not paths["scripts"].exists() and not paths["modules"].exists()


@needs_root
@pytest.mark.parametrize("where", ["scripts", "etc_parent"])
def test_world_writable_target_is_refused_before_anything_is_written(tmp_path, venv_prefix, where):
    paths = _layout(tmp_path, venv_prefix)
    target = paths["scripts"] if where == "scripts" else paths["etc"].parent
    target.mkdir(parents=True)
    target.chmod(0o777)
    res = _install(paths)
    assert res.exit_code == 2, res.output
    assert f"{target} is writable by others (mode 0777)" in res.output and f"chmod go-w {target}" in res.output
    assert not (paths["modules"]).exists() and not (paths["scripts"] / "frenzy-prolog").exists()


@needs_root
def test_group_writable_and_symlinked_targets_are_refused(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    real = tmp_path / "real-slurm"
    real.mkdir()
    paths["scripts"].parent.mkdir(parents=True)
    paths["scripts"].symlink_to(real)
    res = _install(paths)
    assert res.exit_code == 2 and f"{paths['scripts']} is a symbolic link" in res.output, res.output
    assert not any(real.iterdir())
    paths["scripts"].unlink()
    paths["modules"].mkdir()
    paths["modules"].chmod(0o775)
    res = _install(paths)
    assert res.exit_code == 2 and "is writable by its group (mode 0775)" in res.output, res.output


@needs_root
def test_an_invalid_site_file_is_refused_naming_the_field(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    paths["site"].write_text(SITE_YAML.replace("A100-80GB", "a100-80gb"))
    res = _install(paths)
    assert res.exit_code == 2 and "did you mean A100-80GB" in res.output and str(paths["site"]) in res.output
    assert not paths["etc"].exists()


@needs_root
def test_slurm_conf_is_read_never_written(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nProlog=/etc/slurm/site-prolog   # the site's own\n")
    text = conf.read_text()
    res = _install(paths, "--slurm-conf", str(conf))
    assert res.exit_code == 0, res.output
    assert (
        f"has Prolog=/etc/slurm/site-prolog: call {paths['scripts'] / 'frenzy-prolog'} from that script" in res.output
    )
    assert f"    Epilog={paths['scripts'] / 'frenzy-epilog'}" in res.output
    assert "    Prolog=" not in res.output
    assert conf.read_text() == text


def test_unsafe_characters_and_non_root_are_refused(tmp_path, monkeypatch):
    res = CliRunner().invoke(main, ["site", "install", "--prefix", str(tmp_path / "a b"), "--dry-run"])
    assert res.exit_code == 2 and "--prefix" in res.output and "letters, digits" in res.output
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    res = CliRunner().invoke(main, ["site", "install", "--prefix", str(tmp_path / "p")])
    assert res.exit_code == 2 and "run it as root, or with --dry-run" in res.output


def test_a_prefix_without_frenzy_slurm_needs_a_wheel(tmp_path):
    res = CliRunner().invoke(main, ["site", "install", "--prefix", str(tmp_path / "new"), "--dry-run"])
    assert res.exit_code == 2 and "give --wheel FILE" in res.output
    bad = tmp_path / "frenzy_slurm.zip"
    bad.write_text("")
    res = CliRunner().invoke(
        main, ["site", "install", "--prefix", str(tmp_path / "new"), "--wheel", str(bad), "--dry-run"]
    )
    assert res.exit_code == 2 and "not a frenzy-slurm wheel" in res.output


@needs_root
def test_environment_modules_loads_the_tcl_modulefile(tmp_path, venv_prefix):
    modulecmd = shutil.which("modulecmd")
    if modulecmd is None:
        pytest.skip("Environment Modules is not installed (apt-get install environment-modules)")
    paths = _layout(tmp_path, venv_prefix)
    assert _install(paths).exit_code == 0
    # as a user's shell does: `module load` (modulecmd's bash code, evaluated), then the installed tools' site
    script = (
        'eval "$("$1" bash load frenzy-slurm/$2)" && echo "$PATH" && echo "$FRENZY_SITE" && '
        'python -P -c "from frenzy_slurm.site.tools import find_site; print(find_site(None))"'
    )
    out = subprocess.run(
        ["bash", "-c", script, "bash", modulecmd, __version__],
        capture_output=True,
        text=True,
        env=dict(os.environ, MODULEPATH=str(paths["modules"])),
        cwd="/",
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    path, site, found = out.stdout.splitlines()
    assert path.split(":")[0] == str(venv_prefix / "bin")  # `python` above is the installed venv's
    assert site == found == str(paths["etc"] / "site.yaml")


LUA_STUBS = """
env = {}
function whatis(s) end
function help(s) end
function prepend_path(k, v) env[k] = v .. ":" .. (env[k] or "") end
function setenv(k, v) env[k] = v end
dofile(arg[1])
print(env["PATH"]); print(env["FRENZY_SITE"])
"""


@needs_root
def test_the_lua_modulefile_sets_path_and_site(tmp_path, venv_prefix):
    paths = _layout(tmp_path, venv_prefix)
    assert _install(paths).exit_code == 0
    lua = shutil.which("lua5.4") or shutil.which("lua")
    lua_file = _files(paths)["lua"]
    if lua is None:  # no Lua: the file's Lmod calls, as written
        text = lua_file.read_text()
        assert f'prepend_path("PATH", "{venv_prefix}/bin")' in text
        assert f'setenv("FRENZY_SITE", "{paths["etc"] / "site.yaml"}")' in text
        return
    stubs = tmp_path / "stubs.lua"
    stubs.write_text(LUA_STUBS)
    out = subprocess.run([lua, str(stubs), str(lua_file)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{venv_prefix}/bin:", str(paths["etc"] / "site.yaml")]


def test_the_site_file_is_found_by_flag_then_env_then_the_installed_default(tmp_path, monkeypatch):
    from frenzy_slurm.site import install, tools

    assert tools.DEFAULT_SITE_PATHS == (install.InstallOptions(prefix=tmp_path).etc / "site.yaml",)
    installed = tmp_path / "etc" / "site.yaml"  # where `site install --etc` put it
    installed.parent.mkdir()
    installed.write_text(SITE_YAML)
    monkeypatch.setattr(tools, "DEFAULT_SITE_PATHS", (installed,))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    assert tools.find_site(None) == installed
    monkeypatch.setenv("FRENZY_SITE", str(tmp_path / "env.yaml"))
    assert tools.find_site(None) == tmp_path / "env.yaml"
    assert tools.find_site(tmp_path / "flag.yaml") == tmp_path / "flag.yaml"


def test_venv_and_pip_run_under_umask_022_whatever_the_admins(tmp_path):
    from frenzy_slurm.site.install import _run

    made = tmp_path / "made"
    old = os.umask(0o002)  # a group-writable default, as some sites set for admins
    try:
        _run([sys.executable, "-c", f"import os; os.mkdir({str(made)!r})"], "mkdir")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(made).st_mode) == 0o755
