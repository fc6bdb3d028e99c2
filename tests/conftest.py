"""Shared test helpers: run the console scripts as a user would."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from .slurm_fixture import clean_queue, slurm_cluster  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DEV_DATA = ROOT.parent / "shared" / "data" / "memory_measurements_dev.csv"


def pytest_collection_modifyitems(items):
    """A test that uses the real local cluster is `live`, whoever wrote it: `-m "not live"` runs anywhere."""
    for item in items:
        if {"slurm_cluster", "clean_queue"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.live)


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m frenzy_slurm.cli <prog> ...` in a fresh interpreter (exit codes and stderr as users see them)."""
    prog, *rest = args
    module = {"fsbatch": "fsbatch", "fsqueue": "fsqueue", "fsinfo": "fsinfo", "frenzy-slurm": "admin"}[prog]
    code = f"import sys; from frenzy_slurm.cli.{module} import main; sys.argv[0] = {prog!r}; main()"
    return subprocess.run([sys.executable, "-c", code, *rest], capture_output=True, text=True, cwd=cwd or ROOT, timeout=300)


@pytest.fixture
def write_yaml(tmp_path: Path):
    def _write(text: str, name: str = "model.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return _write
