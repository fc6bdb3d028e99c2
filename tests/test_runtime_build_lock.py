"""A job that waits on a killed extension build's lock says so (frenzy_slurm/runtime/build_lock.py)."""

from __future__ import annotations

import io
import os
import threading
import time
from pathlib import Path

from frenzy_slurm.runtime.build_lock import extensions_root, lock_note, old_locks, watch_start


def _lock(root: Path, rel: str, age_s: float) -> Path:
    path = root / rel / "lock"
    path.parent.mkdir(parents=True)
    path.touch()
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def test_extensions_root_follows_torch():
    assert extensions_root({"TORCH_EXTENSIONS_DIR": "/x/ext", "HOME": "/h"}) == Path("/x/ext")
    assert extensions_root({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == Path("/c/torch_extensions")
    assert extensions_root({"HOME": "/h"}) == Path("/h/.cache/torch_extensions")


def test_old_locks_both_layouts_oldest_first(tmp_path):
    a = _lock(tmp_path, "deepspeed_shm_comm", 900)  # $TORCH_EXTENSIONS_DIR/NAME
    b = _lock(tmp_path, "py311_cpu/cpu_adam", 4000)  # the default root's pyXY_cpu/NAME
    _lock(tmp_path, "py311_cpu/fused_adam", 30)  # a build under way now
    found = old_locks(tmp_path, 300)
    assert [p for p, _ in found] == [b, a]
    assert 3990 < found[0][1] < 4100
    assert old_locks(tmp_path / "none", 0) == []


def test_note_names_file_age_and_fix(tmp_path):
    path = tmp_path / "deepspeed_shm_comm" / "lock"
    text = lock_note(path, 1800)
    assert str(path) in text and "30 min" in text and "deepspeed_shm_comm" in text and f"rm '{path}'" in text


class _Now(threading.Timer):
    """A timer that fires at once, synchronously, so the test does not sleep."""

    def start(self) -> None:
        self.function()


def test_watch_start_notes_only_when_asked(tmp_path):
    _lock(tmp_path, "deepspeed_shm_comm", 600)
    out = io.StringIO()
    with watch_start(True, after_s=300, root=tmp_path, out=out, timer=_Now):
        pass
    assert out.getvalue().count("frenzy-slurm: start-up waits on") == 1
    quiet = io.StringIO()
    with watch_start(False, after_s=300, root=tmp_path, out=quiet, timer=_Now):
        pass
    with watch_start(True, after_s=3600, root=tmp_path, out=quiet, timer=_Now):  # the lock is younger than that
        pass
    assert quiet.getvalue() == ""


def test_watch_start_cancelled_when_start_ends(tmp_path):
    _lock(tmp_path, "deepspeed_shm_comm", 600)
    out = io.StringIO()
    with watch_start(True, after_s=0.2, root=tmp_path, out=out):
        pass  # DeepSpeed started at once: the timer is cancelled before it fires
    time.sleep(0.4)
    assert out.getvalue() == ""


def test_real_baton_waits_and_is_named(tmp_path):
    """torch's own FileBaton waits on the file a killed build left; the note fires while it waits and names it."""
    from torch.utils.file_baton import FileBaton

    lock = _lock(tmp_path, "deepspeed_shm_comm", 5)
    baton = FileBaton(str(lock), wait_seconds=0.01)
    assert not baton.try_acquire()
    out = io.StringIO()
    waited = threading.Thread(target=baton.wait)
    with watch_start(True, after_s=0.3, root=tmp_path, out=out):
        waited.start()
        waited.join(1.0)
        assert waited.is_alive()  # still waiting: nothing in torch ends it
    assert str(lock) in out.getvalue()
    lock.unlink()  # what the note tells the user to do
    waited.join(1.0)
    assert not waited.is_alive()
