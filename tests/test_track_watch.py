"""`frenzy-slurm watch` (frenzy_slurm/track/watch.py) and its decisions (frenzy_slurm/has/moves.py), on the fake Slurm.

The cluster is tests/helpers.py's LOCAL shape: A100s (fast), V100s, T4s. Another user's long job holds every A100,
so a long preemptible job first goes elsewhere; when the A100s free up, the watcher moves it there."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_slurm.has.moves import growth_site, resumable, with_own_gpus_free, without_job
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.jobdir.planfile import read_plan
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.plan import ParallelPlan, checkpoint_route
from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.site.config import Preemption
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.run import SlurmCommandError
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import frenzy_jobs, my_user_name
from frenzy_slurm.track.watch import MOVED, watch_once

from .helpers import LOCAL, make_spec

HOUR = 3600.0
LONG = {"model": {"preset": "gpt2-medium"}, "training__steps": 100_000}  # many hours on any pool


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    view = synthetic(LOCAL)
    slurm = FakeSlurm(view, user=my_user_name())
    site = SiteFile(
        synthetic_site(LOCAL).model_copy(
            update={"preemption": Preemption(qos="preemptible", min_run_min=60, restart_s=300)}
        )
    )
    return slurm, site, tmp_path


def _hold_pool(slurm: FakeSlurm, partition: str, gpu_type: str, nodes: int, per_node: int, hours: float) -> int:
    """Another user's job on a whole pool for `hours`."""
    minutes = int(hours * 60)  # its time limit: what Slurm's start estimates go by
    req = ComponentRequest(
        partition=partition, gpu_type=gpu_type, nodes=nodes, gpus_per_node=per_node, time_min=minutes
    )
    jid = slurm.submit(BatchJob(script=Path("x"), workdir=Path("/tmp"), components=[req], name="other")).job_id
    slurm.set_run_time(jid, hours * HOUR)
    return jid


def _submit(slurm: FakeSlurm, site: SiteFile, tmp_path: Path, name: str, preemptible: bool = True) -> int:
    spec = make_spec(name=name, **LONG)
    job = JobFile(tmp_path / f"{name}.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(
        slurm=SlurmOptions(preemptible=preemptible), job_dir=tmp_path / "jobs" / name, now=slurm.now, env_check="off"
    )
    return submit(plan_job(job, site, slurm, opts), slurm).job_id


def _pool(slurm: FakeSlurm, job_id: int) -> str:
    return slurm.fake_jobs[job_id].components[0].partition


def test_a_running_preemptible_job_moves_to_the_pool_that_freed_up(world):
    slurm, site, tmp = world
    other = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    jid = _submit(slurm, site, tmp, "long")
    assert slurm.fake_jobs[jid].state == "RUNNING" and _pool(slurm, jid) != "a100"
    slurm.advance(HOUR)
    assert watch_once(site, slurm, now=slurm.now) == []  # nothing better yet: the A100s are held
    slurm.cancel(other)
    (dry,) = watch_once(site, slurm, dry_run=True, now=slurm.now)
    assert dry.new_job_id is None and slurm.signals == [] and not (tmp / "jobs" / "long" / MOVED).exists()
    (move,) = watch_once(site, slurm, now=slurm.now)
    assert (
        move.kind == "running" and "a100" in move.to_allocation and move.predicted_end_moved < dry.predicted_end_staying
    )
    new = move.new_job_id
    assert new is not None and _pool(slurm, new) == "a100"
    # the old job's steps got SIGTERM (the runtime saves a checkpoint and exits); the new one waits for it to end
    assert slurm.signals == [(jid, "TERM")] and slurm.fake_jobs[jid].state == "RUNNING"
    new_dir = Path(move.new_job_dir or "")
    assert new_dir.parent == tmp / "jobs" and new_dir != tmp / "jobs" / "long"
    assert f"#SBATCH --dependency=afterany:{jid}\n" in (new_dir / "job.sbatch").read_text()
    moved_from = read_plan(new_dir / "plan.json").moved_from
    assert moved_from is not None and moved_from.job_id == jid and moved_from.job_dir == str(tmp / "jobs" / "long")
    record = json.loads((tmp / "jobs" / "long" / MOVED).read_text())
    assert record["moved_to_job"] == new and record["while"] == "RUNNING"
    (old,) = [t for t in frenzy_jobs(slurm.load().jobs) if t.job_id == jid]
    assert any(f"moved by frenzy-slurm watch to job {new}" in n for n in old.notes)  # what fsqueue JOBID says
    # moved once: the next pass leaves the old job alone, and the new one has not run long enough to move
    assert watch_once(site, slurm, now=slurm.now) == []


def test_a_move_on_slow_storage_also_pays_for_writing_and_reading_the_checkpoint(world):
    from dataclasses import replace

    from frenzy_slurm.has.moves import move_cost_s, restore_s
    from frenzy_slurm.marp import workload_from_spec
    from frenzy_slurm.marp.memory_states import checkpoint_bytes

    slurm, site, tmp = world
    other = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    jid = _submit(slurm, site, tmp, "long")
    slurm.advance(HOUR)
    slurm.cancel(other)
    (fast,) = watch_once(site, slurm, dry_run=True, now=slurm.now)  # restart_s alone: 300 s
    gain = fast.predicted_end_staying - fast.predicted_end_moved
    spec = read_plan(tmp / "jobs" / "long" / "plan.json").spec
    size = checkpoint_bytes(workload_from_spec(spec, resolve_model(spec, tmp)))
    assert size == pytest.approx(355e6 * 14, rel=0.05)  # gpt2-medium: 16-bit weights, fp32 master, two moments

    def priced(gbs: float) -> SiteFile:
        p = site.config.preemption.model_copy(update={"checkpoint_gbs": gbs})
        return SiteFile(site.config.model_copy(update={"preemption": p}))

    # storage that writes and reads the checkpoint in 1,000 s: the move is made, and its end is that much later
    quick = 2 * size / 1000.0 / 1e9
    (slower,) = watch_once(priced(quick), slurm, dry_run=True, now=slurm.now)
    assert slower.predicted_end_moved == pytest.approx(fast.predicted_end_moved + 1000.0, abs=1.0)
    w = workload_from_spec(spec, resolve_model(spec, tmp))
    assert move_cost_s(priced(quick).config.preemption, w) == pytest.approx(1300.0)
    assert move_cost_s(None, w) == 300.0  # a site without a preemption block: the default restart_s
    # the successor reads the checkpoint before its first step (500 s here): its --time allows for that
    assert restore_s(priced(quick).config.preemption, w) == pytest.approx(500.0) and restore_s(None, w) == 0.0
    req = Requirements(name="x", global_batch=8, steps=10)
    assert req.time_min(3600.0) == 85  # 3600 x 1.25 + 600 s slack
    assert replace(req, resume_s=500.0).time_min(3600.0) == 94  # and the read, without the margin
    # storage that takes longer than the gain: staying finishes sooner, nothing moves
    assert gain > 3600.0 and watch_once(priced(2 * size / (2 * gain) / 1e9), slurm, dry_run=True, now=slurm.now) == []
    assert slurm.signals == [] and slurm.fake_jobs[jid].state == "RUNNING"


def test_a_pending_job_is_resubmitted_where_it_starts_now_and_the_old_one_cancelled(world):
    slurm, site, tmp = world
    a100 = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    for partition, nodes, per_node in (("v100", 2, 8), ("t4", 4, 4)):
        _hold_pool(slurm, partition, {"v100": "v100_32gb"}.get(partition, partition), nodes, per_node, 3)
    jid = _submit(slurm, site, tmp, "waiting")
    assert slurm.fake_jobs[jid].state == "PENDING"
    slurm.cancel(a100)
    (move,) = watch_once(site, slurm, now=slurm.now)
    assert move.kind == "pending" and move.new_job_id is not None
    assert slurm.fake_jobs[jid].state == "CANCELLED" and slurm.fake_jobs[move.new_job_id].state == "RUNNING"
    assert _pool(slurm, move.new_job_id) == "a100"
    # it never ran: the new job starts afresh, with the user's options (no dependency on the old job)
    new_dir = Path(move.new_job_dir or "")
    assert read_plan(new_dir / "plan.json").moved_from is None
    assert "--dependency" not in (new_dir / "job.sbatch").read_text()


def test_jobs_not_marked_preemptible_are_never_touched(world):
    slurm, site, tmp = world
    a100 = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    for partition, nodes, per_node in (("v100", 2, 8), ("t4", 4, 4)):
        _hold_pool(slurm, partition, {"v100": "v100_32gb"}.get(partition, partition), nodes, per_node, 3)
    plain = _submit(slurm, site, tmp, "plain", preemptible=False)
    slurm.cancel(a100)
    assert watch_once(site, slurm, now=slurm.now) == []  # not marked preemptible: not the watcher's to move
    assert slurm.fake_jobs[plain].state in ("PENDING", "RUNNING")
    assert not (tmp / "jobs" / "plain" / MOVED).exists()


def test_a_pending_job_that_started_meanwhile_is_left(world, monkeypatch):
    slurm, site, tmp = world
    a100 = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    for partition, nodes, per_node in (("v100", 2, 8), ("t4", 4, 4)):
        _hold_pool(slurm, partition, {"v100": "v100_32gb"}.get(partition, partition), nodes, per_node, 3)
    jid = _submit(slurm, site, tmp, "waiting")
    slurm.cancel(a100)
    submitted = len(slurm.fake_jobs)

    def started(job_id):  # it started between the pass's view and the hold: scontrol hold refuses
        raise SlurmCommandError(["scontrol", "hold", str(job_id)], 1, "Job is no longer pending execution")

    monkeypatch.setattr(slurm, "hold", started)
    (move,) = watch_once(site, slurm, now=slurm.now)
    assert move.new_job_id is None and "started meanwhile" in move.note
    assert len(slurm.fake_jobs) == submitted and slurm.fake_jobs[jid].state == "PENDING"
    assert not (tmp / "jobs" / "waiting" / MOVED).exists()


def test_a_failed_submission_releases_the_held_job(world, monkeypatch):
    slurm, site, tmp = world
    a100 = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 500)
    for partition, nodes, per_node in (("v100", 2, 8), ("t4", 4, 4)):
        _hold_pool(slurm, partition, {"v100": "v100_32gb"}.get(partition, partition), nodes, per_node, 3)
    jid = _submit(slurm, site, tmp, "waiting")
    slurm.cancel(a100)
    from frenzy_slurm.slurm.run import SlurmUnavailable

    def refuse(job):
        raise SlurmUnavailable("sbatch did not answer")

    monkeypatch.setattr(slurm, "submit", refuse)
    (move,) = watch_once(site, slurm, now=slurm.now)
    assert move.new_job_id is None and "not moved" in move.note
    assert slurm.fake_jobs[jid].state == "PENDING" and not slurm.fake_jobs[jid].held  # released: it waits as before
    assert not (tmp / "jobs" / "waiting" / MOVED).exists()


def _plan(**kw) -> ParallelPlan:
    return ParallelPlan(**kw)


def test_only_plans_that_can_load_the_checkpoint_are_searched():
    space, req = SearchSpace(), Requirements(name="j", global_batch=64, steps=10)
    # ZeRO 1-3 with the built-in trainer's conversion: any width and depth, the same tensor parallelism
    found = resumable(space, req, _plan(dp=4, zero=1), universal=True)
    assert found is not None and found[0].zero_stages == (1, 2) and found[0].tp_degrees == (1,)
    assert found[1] == req and found[0].pp_degrees == space.pp_degrees
    found = resumable(space, req, _plan(dp=4, zero=3), universal=True)  # ZeRO 3's universal files are its own
    assert found is not None and found[0].zero_stages == (3,) and found[1] == req
    # ZeRO 0: any data-parallel width, no pipeline; a ZeRO-0 pipeline cannot be reshaped at all
    found = resumable(space, req, _plan(dp=4, zero=0), universal=True)
    assert found is not None and found[0].pp_degrees == (1,) and found[0].zero_stages == (0,) and found[1] == req
    assert resumable(space, req, _plan(dp=2, pp=2, zero=0), universal=True) is None
    # a framework's own checkpoints: the same layout, only the GPU type may change
    found = resumable(space, req, _plan(dp=4, zero=2), universal=False)
    assert found is not None and found[0].zero_stages == (2,) and (found[1].min_gpus, found[1].max_gpus) == (4, 4)
    assert resumable(space, req, _plan(dp=2, pp=2, zero=1), universal=False) is None


def test_every_plan_the_watcher_may_choose_loads_the_checkpoint_as_the_runtime_does():
    """has/moves.py `resumable` (which plans are searched) agrees with marp.plan `checkpoint_route` (how the
    runtime loads): over a grid of layouts, every plan allowed loads, as it is where there is no conversion."""
    grid = [
        _plan(dp=dp, pp=pp, zero=zero, tp=tp)
        for dp in (1, 2, 4)
        for pp in (1, 2)
        for zero in (0, 1, 2, 3)
        for tp in (1, 2)
        if not (pp > 1 and zero > 1)
    ]
    space, req = SearchSpace(), Requirements(name="j", global_batch=64, steps=10)
    allowed_somewhere = 0
    for universal in (True, False):
        for old in grid:
            found = resumable(space, req, old, universal)
            for new in grid:
                ok = found is not None and (
                    new.tp in found[0].tp_degrees
                    and new.zero in found[0].zero_stages
                    and new.pp in found[0].pp_degrees
                    and (found[1].min_gpus or 0) <= new.world <= (found[1].max_gpus or 10**6)
                )
                if ok:
                    allowed_somewhere += old != new
                    assert checkpoint_route(old, new) in (("as-is", "universal") if universal else ("as-is",)), (
                        old.short(),
                        new.short(),
                    )
    assert allowed_somewhere > 50  # the grid exercises moves, not only staying put


def test_a_job_s_own_gpus_count_free_and_growth_waits_for_an_empty_queue(world):
    slurm, site, _ = world
    jid = _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 5)
    view = slurm.load()
    free = with_own_gpus_free(view, jid)
    assert sum(n.gpus_used for n in view.nodes) == 8 and sum(n.gpus_used for n in free.nodes) == 0
    assert all(j.job_id != jid for j in without_job(view, jid).jobs)
    cfg = site.config.model_copy(
        update={"preemption": Preemption(qos="preemptible", move_share=1.0), "max_job_share": 0.5}
    )
    assert growth_site(cfg, free, in_preemptible_qos=True).max_job_share == 1.0
    assert growth_site(cfg, free, in_preemptible_qos=False).max_job_share == 0.5
    _hold_pool(slurm, "a100", "a100_40gb", 2, 4, 5)  # waits behind the first: growth would delay it
    assert growth_site(cfg, with_own_gpus_free(slurm.load(), jid), in_preemptible_qos=True).max_job_share == 0.5


def _site_file(tmp_path: Path, preemption: dict | None) -> Path:
    import yaml

    data = synthetic_site(LOCAL).model_dump(mode="json", exclude_none=True)
    if preemption is not None:
        data["preemption"] = preemption
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_command_checks_its_site_and_flags_and_prints_one_object_per_pass(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main

    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    snapshot = tmp_path / "view.json"
    snapshot.write_text(synthetic(LOCAL).model_dump_json())
    cluster = ["--backend", "static", "--snapshot", str(snapshot)]
    runner = CliRunner()
    res = runner.invoke(main, ["watch", "--site", str(_site_file(tmp_path, None)), *cluster, "--once"])
    assert res.exit_code == 2 and "has no preemption: block" in res.output
    site = str(_site_file(tmp_path, {"qos": "preemptible"}))
    res = runner.invoke(main, ["watch", "--site", site, *cluster, "--interval", "5"])
    assert res.exit_code == 2 and "--interval" in res.output  # at least 10 s: slurmctld is shared
    res = runner.invoke(main, ["watch", "--site", site, *cluster, "--once", "--dry-run", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["moves"] == [] and out["dry_run"] is True


def test_a_pass_reads_the_cluster_again_after_each_move(world):
    """Two running jobs that would both finish sooner on the 4 A100s just freed: the first moves there, and the
    second is decided on the cluster with the first's successor on them. On the view the pass began with, both
    were moved onto the same 4 A100s."""
    slurm, site, tmp = world
    other = _hold_pool(slurm, "a100", "a100_40gb", 1, 4, 500)
    _hold_pool(slurm, "a100", "a100_40gb", 1, 4, 500)  # the other A100 node stays held
    first, second = _submit(slurm, site, tmp, "first"), _submit(slurm, site, tmp, "second")
    assert all(slurm.fake_jobs[j].state == "RUNNING" and _pool(slurm, j) != "a100" for j in (first, second))
    slurm.advance(HOUR)
    slurm.cancel(other)
    dry = watch_once(site, slurm, dry_run=True, now=slurm.now)
    assert [(a.job_id, a.to_allocation) for a in dry] == [(first, "4xA100-40GB(a100)"), (second, "4xA100-40GB(a100)")]
    moves = watch_once(site, slurm, now=slurm.now)
    # the second sees the first's successor on those A100s: it queues for 2 of them after it, which the
    # predictions still say beats staying (on one view it too took the 4 held by then, and waited for nothing)
    assert [(m.job_id, m.to_allocation) for m in moves] == [(first, "4xA100-40GB(a100)"), (second, "2xA100-40GB(a100)")]
    assert moves[1].predicted_end_moved > moves[0].predicted_end_moved
    assert [slurm.fake_jobs[m.new_job_id or 0].state for m in moves] == ["RUNNING", "PENDING"]
