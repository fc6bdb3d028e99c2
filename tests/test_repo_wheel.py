"""The wheel a `pip install frenzy-slurm` would get: built, installed in a fresh venv, used outside the checkout.

    .venv/bin/python -m pytest tests/test_repo_wheel.py      # about a minute on 2 cores; needs the `build` package

What it owns: that `python -m build --wheel` packs the templates (frenzy_slurm/templates is a symlink to
../templates: the wheel must hold the .j2 files, not a link) and the data tables, that the core dependencies
the wheel declares are enough for `fsbatch --dry-run` without torch, and that the installed commands work from
a directory that is not the checkout (nothing found through the working directory or an editable install).

No cluster snapshot ships with the repository, so the test writes one the way tests/test_cli.py's
`offline_cluster` does: `frenzy_slurm.sim.synthetic` builds the `fsinfo --json` view of the local dev
cluster's shape (tests/helpers.py LOCAL), planned against the shipped site_configs/devcluster.yaml.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import venv
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

import pytest

from .helpers import EXAMPLES, LOCAL, ROOT

pytestmark = pytest.mark.slow

# What the wheel is built from: everything pyproject.toml packs, nothing else (a stale build/ or an
# egg-info in the checkout must not leak into the test's wheel).
# frenzy_slurm/site/slurm links to contrib/slurm (the prolog and epilog `site install` copies).
SOURCES = ["pyproject.toml", "README.md", "frenzy_slurm", "templates", "contrib/slurm"]
BUILD_TIMEOUT_S = 120
INSTALL_TIMEOUT_S = 240
RUN_TIMEOUT_S = 60


def _run(argv: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run one command, failing the test with its output (not a bare CalledProcessError) when it fails."""
    res = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kw)
    assert res.returncode == 0, f"{' '.join(argv)} exited {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res


def _clean_env(bin_dir: Path) -> dict[str, str]:
    """The environment of a user who installed the wheel: its venv first on PATH, no checkout on any path."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FRENZY_", "PYTHON", "VIRTUAL_ENV", "SLURM_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    return env


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`python -m build --wheel` of a clean copy of the sources (symlinks kept as links, as in git)."""
    pytest.importorskip("build", reason="the `build` package (dev extra) is not installed")
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    assert (src / "frenzy_slurm" / "templates").is_symlink(), "the copy keeps the templates link, as git has it"
    dist = tmp_path_factory.mktemp("dist")
    # --no-isolation: the dev venv's setuptools (it must satisfy build-system.requires: build checks) rather than
    # a download per run; the build itself is what a user's `python -m build --wheel` runs.
    _run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist), str(src)],
        BUILD_TIMEOUT_S,
        cwd=src,
    )
    wheels = list(dist.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_wheel_holds_the_templates_and_data_files_themselves(wheel):
    import frenzy_slurm

    assert wheel.name == f"frenzy_slurm-{frenzy_slurm.__version__}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        for pattern, folder in [("*.j2", ROOT / "templates"), ("*.yaml", ROOT / "frenzy_slurm" / "data")]:
            files = sorted(folder.glob(pattern))
            assert files, f"nothing matches {pattern} in {folder}"
            sub = "templates" if folder.name == "templates" else "data"
            for f in files:
                info = zf.getinfo(f"frenzy_slurm/{sub}/{f.name}")  # KeyError: missing from the wheel
                assert not stat.S_ISLNK(info.external_attr >> 16), f"{info.filename} is a link in the wheel"
                assert zf.read(info) == f.read_bytes(), f"{info.filename} differs from {f}"
        for name in ("prolog", "epilog"):  # through the frenzy_slurm/site/slurm link, as the templates
            info = zf.getinfo(f"frenzy_slurm/site/slurm/{name}")
            assert zf.read(info) == (ROOT / "contrib" / "slurm" / name).read_bytes()
        meta = Parser().parsestr(zf.read(f"frenzy_slurm-{frenzy_slurm.__version__}.dist-info/METADATA").decode())
    assert meta["License-Expression"] == "Apache-2.0"
    assert any(c.startswith("Programming Language :: Python :: 3.11") for c in meta.get_all("Classifier", []))


def _core_requirements(wheel: Path) -> list[str]:
    """The wheel's Requires-Dist without an `extra ==` marker: what `pip install frenzy-slurm` pulls in."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(name).decode())
    reqs = [r for r in meta.get_all("Requires-Dist", []) if "extra ==" not in r]
    assert reqs and not any(r.lower().startswith(("torch", "deepspeed")) for r in reqs), reqs
    return reqs


def test_installed_wheel_plans_a_job_outside_the_checkout(wheel, tmp_path):
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    py = str(bin_dir / "python")
    env = _clean_env(bin_dir)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    assert ROOT not in outside.parents
    # the wheel without dependencies, then the core ones it declares (pip resolves them from its index); no torch
    _run([py, "-m", "pip", "install", "--no-deps", "--no-input", str(wheel)], INSTALL_TIMEOUT_S, env=env, cwd=outside)
    _run(
        [py, "-m", "pip", "install", "--no-input", *_core_requirements(wheel)], INSTALL_TIMEOUT_S, env=env, cwd=outside
    )

    where = _run(
        [
            py,
            "-c",
            "import importlib.util as u, frenzy_slurm; print(frenzy_slurm.__file__); "
            "print(u.find_spec('torch') is None)",
        ],
        RUN_TIMEOUT_S,
        env=env,
        cwd=outside,
    )
    package_file, no_torch = where.stdout.split()
    assert Path(package_file).is_relative_to(env_dir), f"frenzy_slurm imported from {package_file}, not the venv"
    assert no_torch == "True", "torch came in with the core dependencies"

    from frenzy_slurm.sim.synthetic import synthetic

    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL, gres_types={p: p for p, *_ in LOCAL}).model_dump_json())  # the site's GRES
    job_dir = outside / "jobs" / "j"
    res = _run(
        [
            str(bin_dir / "fsbatch"),
            str(EXAMPLES / "llama2-7b.yaml"),
            "--dry-run",
            "--backend",
            "static",
            "--snapshot",
            str(snap),
            "--site",
            str(ROOT / "site_configs" / "devcluster.yaml"),
            "--job-dir",
            str(job_dir),
        ],
        RUN_TIMEOUT_S,
        env=env,
        cwd=outside,
    )
    out = res.stdout
    partitions = re.findall(r"^#SBATCH --partition=(\S+)$", out, re.M)
    gres = re.findall(r"^#SBATCH --gres=gpu:(\w+):(\d+)$", out, re.M)
    assert partitions and set(partitions) <= {p for p, *_ in LOCAL}, out
    assert gres and all(int(n) >= 1 for _, n in gres), out
    # the decision line names the same GPU count and partition, e.g. "homogeneous 16xT4(t4)"
    decided = re.search(r"(\d+)x[\w-]+\((\w+)\)", out.splitlines()[0])
    assert decided and int(decided.group(1)) >= 1 and decided.group(2) in partitions, out.splitlines()[0]
    assert f"srun --kill-on-bad-exit=1 --label {bin_dir}/python" in out, "the job runs the venv's interpreter"
    assert not job_dir.exists(), "--dry-run writes nothing"
