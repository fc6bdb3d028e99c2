"""fsqueue's queue cache: reused within its age, which is its content (not its mtime), never read from a
directory others can write or from a file another user owns."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import pytest

from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL
from .users import other_user  # noqa: F401 (fixture)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


# ---------------------------------------------------------------- the queue cache


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
    from frenzy_slurm.track.jobs import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True, mode=0o700)
    fake = [asdict(Job(job_id=999, state="RUNNING", user=_me(), comment="frenzy:forged"))]
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
    from frenzy_slurm.track.jobs import _cache_path, query_jobs_cached

    backend = _fake(_me())
    assert query_jobs_cached(backend, _me()) == []
    path = _cache_path(backend, f"user={_me()}")
    data = json.loads(path.read_text())
    assert data["key"] == f"user={_me()}" and abs(data["written_at"] - time.time()) < 5
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    data["jobs"] = [asdict(Job(job_id=5, state="RUNNING", user=_me()))]
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    assert [j.job_id for j in query_jobs_cached(backend, _me())] == [5]  # within its age: reused
    data["written_at"] = time.time() - 60
    path.write_text(json.dumps(data))  # mtime now, content a minute old
    path.chmod(0o600)
    assert query_jobs_cached(backend, _me()) == []


def test_cache_in_a_directory_others_can_write_is_neither_read_nor_written(cache_home):
    from frenzy_slurm.track.jobs import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True)
    path.parent.chmod(0o777)
    planted = {
        "key": f"user={_me()}",
        "written_at": time.time(),
        "jobs": [asdict(Job(job_id=6, state="RUNNING", user=_me()))],
    }
    path.write_text(json.dumps(planted))
    path.chmod(0o600)
    assert query_jobs_cached(backend, _me()) == []
    assert json.loads(path.read_text()) == planted  # not rewritten there either


def test_cache_owned_by_another_user_is_not_read(cache_home, other_user):
    from frenzy_slurm.track.jobs import _cache_path, query_jobs_cached

    backend = _fake(_me())
    path = _cache_path(backend, f"user={_me()}")
    path.parent.mkdir(parents=True, mode=0o700)
    path.write_text(
        json.dumps(
            {
                "key": f"user={_me()}",
                "written_at": time.time(),
                "jobs": [asdict(Job(job_id=7, state="RUNNING", user=_me()))],
            }
        )
    )
    path.chmod(0o600)
    os.chown(path, other_user.uid, other_user.gid)
    assert query_jobs_cached(backend, _me()) == []
