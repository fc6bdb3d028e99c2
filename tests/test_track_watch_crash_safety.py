"""`frenzy-slurm watch` stopped at every step of a move, then run again: one live copy, nothing held for ever.

Each test makes one step of a move fail on the fake Slurm (tests/test_track_watch.py's cluster: a pending job that
the A100s, freed, finish sooner): the watcher killed (an exception no handler catches, as SIGKILL leaves
things), a lost reply, a full disk. The pass stops there; the next pass must leave exactly one live copy of
the run, no job held, moved.json naming the live successor where there is one, and no open intent.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

import frenzy_slurm.core.records as records
import frenzy_slurm.track.watch as watch_stage
import frenzy_slurm.track.watch_journal as journal
from frenzy_slurm.slurm.run import SlurmUnavailable
from frenzy_slurm.track.watch import MOVED, watch_once

from .test_track_watch import HOUR, _hold_pool, _submit, world  # noqa: F401 (fixture)


class Killed(BaseException):
    """The watcher killed at this point: no handler of the pass runs (as with SIGKILL)."""


def _waiting(slurm, site, tmp) -> int:
    """A pending preemptible job that a move to the A100s (freed now) finishes sooner."""
    a100 = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    for partition, nodes, per_node in (("v100", 2, 8), ("t4", 4, 4)):
        _hold_pool(slurm, partition, {"v100": "v100_32gb"}.get(partition, partition), nodes, per_node, 3)
    jid = _submit(slurm, site, tmp, "waiting")
    slurm.cancel(a100)
    assert slurm.fake_jobs[jid].state == "PENDING"
    return jid


def _running(slurm, site, tmp) -> int:
    """A running preemptible job off the A100s, which have just freed up."""
    other = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    jid = _submit(slurm, site, tmp, "long")
    slurm.advance(HOUR)
    slurm.cancel(other)
    assert slurm.fake_jobs[jid].state == "RUNNING"
    return jid


def _copies(slurm, tmp: Path, name: str) -> list[int]:
    """The jobs of this run: the old one and every job submitted from one of its sibling directories."""
    jobs = tmp / "jobs"
    return [
        j.job_id
        for j in slurm.fake_jobs.values()
        if j.workdir and Path(j.workdir).parent == jobs and Path(j.workdir).name.split(".")[0] == name
    ]


def _assert_settled(slurm, tmp: Path, name: str, old: int) -> int:
    """One live copy, nothing held, moved.json naming it where the run moved, no open intent: the live copy."""
    live = [i for i in _copies(slurm, tmp, name) if slurm.fake_jobs[i].state in ("PENDING", "RUNNING")]
    assert len(live) == 1, {i: slurm.fake_jobs[i].state for i in _copies(slurm, tmp, name)}
    assert not any(j.held for j in slurm.fake_jobs.values() if j.state == "PENDING")
    assert list((tmp / "locks" / "watch").glob("*.json")) == []
    moved = tmp / "jobs" / name / MOVED
    if live[0] != old:
        assert json.loads(moved.read_text())["moved_to_job"] == live[0]
    else:
        assert not moved.exists()
    return live[0]


def test_killed_before_the_hold_the_next_pass_moves_it_once(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    with monkeypatch.context() as m:
        m.setattr(slurm, "hold", lambda job_id: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
    assert len(list((tmp / "locks" / "watch").glob("*.json"))) == 1  # the intent, written before acting
    watch_once(site, slurm, now=slurm.now)
    assert _assert_settled(slurm, tmp, "waiting", old) != old


def test_a_lost_hold_reply_does_not_hold_the_job_for_ever(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    hold = slurm.hold

    def held_but_no_reply(job_id):
        hold(job_id)
        raise SlurmUnavailable("'scontrol hold' did not answer within 60s")

    with monkeypatch.context() as m:
        m.setattr(slurm, "hold", held_but_no_reply)
        with pytest.raises(SlurmUnavailable):
            watch_once(site, slurm, now=slurm.now)
    assert slurm.fake_jobs[old].held
    _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)  # the A100s are taken again: no move is worth it now
    assert watch_once(site, slurm, now=slurm.now) == []
    assert _assert_settled(slurm, tmp, "waiting", old) == old  # released: it waits where it was


def test_killed_after_the_hold_before_sbatch_the_job_is_released(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    with monkeypatch.context() as m:
        m.setattr(watch_stage, "submit", lambda req, backend: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
        assert slurm.fake_jobs[old].held
        # a pass that cannot submit either: it releases the job, which waits as before (nothing new is submitted)
        m.setattr(watch_stage, "submit", lambda req, backend: (_ for _ in ()).throw(SlurmUnavailable("down")))
        (again,) = watch_once(site, slurm, now=slurm.now)
        assert again.new_job_id is None and "not moved" in again.note
    assert _assert_settled(slurm, tmp, "waiting", old) == old
    assert not slurm.fake_jobs[old].held and slurm.fake_jobs[old].state == "PENDING"


def test_killed_after_sbatch_the_next_pass_finds_the_successor_and_moves_nothing_twice(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    sbatch = slurm.submit

    def submitted_then_killed(job):
        sbatch(job)
        raise Killed()

    with monkeypatch.context() as m:
        m.setattr(slurm, "submit", submitted_then_killed)
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
    assert len(_copies(slurm, tmp, "waiting")) == 2
    finished: list[str] = []
    assert watch_once(site, slurm, now=slurm.now, finished=finished) == []  # finished the open move: no new one
    new = _assert_settled(slurm, tmp, "waiting", old)
    assert len(_copies(slurm, tmp, "waiting")) == 2 and slurm.fake_jobs[old].state == "CANCELLED"
    assert slurm.fake_jobs[new].workdir == str(tmp / "jobs" / "waiting.2")
    assert finished == [f"job {old}: finished its move to job {new}"]


def test_a_full_disk_after_sbatch_keeps_the_old_job_held_until_the_move_is_recorded(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    sbatch, write = slurm.submit, records.write_atomic
    full = []

    def submitted_then_full(job):
        answer = sbatch(job)
        full.append(True)
        return answer

    def no_space(path, text, mode=0o600):
        if full:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        write(path, text, mode)

    with monkeypatch.context() as m:
        m.setattr(slurm, "submit", submitted_then_full)
        m.setattr(records, "write_atomic", no_space)
        (move,) = watch_once(site, slurm, now=slurm.now)
    assert move.new_job_id is None and "the next pass finishes the move" in move.note
    # never released while its unrecorded successor is queued: held, so only one of them can start
    assert slurm.fake_jobs[old].held and slurm.fake_jobs[old].state == "PENDING"
    watch_once(site, slurm, now=slurm.now)
    _assert_settled(slurm, tmp, "waiting", old)
    assert slurm.fake_jobs[old].state == "CANCELLED"


def test_killed_before_the_old_job_is_cancelled_the_next_pass_cancels_it(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    with monkeypatch.context() as m:
        m.setattr(slurm, "cancel", lambda job_id, signal=None: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
    assert (tmp / "jobs" / "waiting" / MOVED).exists() and slurm.fake_jobs[old].held
    watch_once(site, slurm, now=slurm.now)
    _assert_settled(slurm, tmp, "waiting", old)


def test_killed_before_the_intent_is_removed_the_next_pass_only_tidies(world, monkeypatch):
    slurm, site, tmp = world
    old = _waiting(slurm, site, tmp)
    with monkeypatch.context() as m:
        m.setattr(journal, "drop", lambda intent: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
    submitted = len(slurm.fake_jobs)
    assert watch_once(site, slurm, now=slurm.now) == []
    _assert_settled(slurm, tmp, "waiting", old)
    assert len(slurm.fake_jobs) == submitted


@pytest.mark.parametrize("where", ["after sbatch", "after the signal"])
def test_a_running_job_gets_one_successor_and_one_signal(world, monkeypatch, where):
    slurm, site, tmp = world
    old = _running(slurm, site, tmp)
    sbatch = slurm.submit

    def submitted_then_killed(job):
        sbatch(job)
        raise Killed()

    with monkeypatch.context() as m:
        if where == "after sbatch":
            m.setattr(slurm, "submit", submitted_then_killed)
        else:
            m.setattr(journal, "drop", lambda intent: (_ for _ in ()).throw(Killed()))
        with pytest.raises(Killed):
            watch_once(site, slurm, now=slurm.now)
    assert watch_once(site, slurm, now=slurm.now) == []
    (new,) = [i for i in _copies(slurm, tmp, "long") if i != old]
    assert slurm.signals == [(old, "TERM")]  # once: a second SIGTERM could cut its checkpoint short
    assert json.loads((tmp / "jobs" / "long" / MOVED).read_text())["moved_to_job"] == new
    # it waits for the old job to save and end (the fake Slurm does not model dependencies; sbatch does)
    assert (
        f"#SBATCH --dependency=afterany:{old}\n"
        in (Path(slurm.fake_jobs[new].workdir or "") / "job.sbatch").read_text()
    )
    assert list((tmp / "locks" / "watch").glob("*.json")) == []
