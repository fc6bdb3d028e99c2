"""Fixtures and markers shared by the tests; helper functions live in helpers.py."""

from __future__ import annotations

from pathlib import Path

import pytest

# Each fixture is defined once, here: a test module that imports one defines a second fixture of the same name,
# and a session-scoped cluster would be started once per such module, on the same ports
from .slurm_fixture import clean_queue, live_slurm, slurm_cluster, slurm_cluster_2511  # noqa: F401  (fixtures)
from .users import other_user  # noqa: F401  (fixture)


def pytest_collection_modifyitems(items):
    """A test that uses the real local cluster is `live`, whoever wrote it: `-m "not live"` runs anywhere."""
    for item in items:
        if {"slurm_cluster", "clean_queue", "live_jobs_dir"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.live)


@pytest.fixture
def live_jobs_dir(tmp_path: Path, monkeypatch, clean_queue) -> Path:  # noqa: F811  (clean_queue is a fixture)
    """A private jobs directory, lock directory and queue cache for one live test, and the dev cluster's site file."""
    from .helpers import DEV_SITE

    d = tmp_path / "jobs"
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(d))
    monkeypatch.setenv("FRENZY_SITE", str(DEV_SITE))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return d


@pytest.fixture
def write_yaml(tmp_path: Path):
    def _write(text: str, name: str = "model.yaml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return _write
