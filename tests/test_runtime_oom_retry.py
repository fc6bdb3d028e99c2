"""A run that runs out of memory: its fallback plans (has/fallback.py), how the failure is seen (jobdir/oom.py,
in_job's hook, the job's output), and the epilogue that submits the fallback once (runtime/oom_retry.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.core.units import GiB
from frenzy_slurm.has.fallback import ERROR_STEPS, failing_factor, pick
from frenzy_slurm.has.model import Fallback
from frenzy_slurm.jobdir import oom
from frenzy_slurm.jobdir.planfile import read_plan
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.marp.plan import checkpoint_route
from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
from frenzy_slurm.runtime import oom_hook
from frenzy_slurm.runtime.oom_retry import Evidence, choose, detect, retry
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import my_user_name, oom_note

from .helpers import LOCAL, ROOT, make_spec


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    for key in ("FRENZY_JOB_DIR_INODE", "FRENZY_PLAN_SHA256", "FRENZY_DS_CONFIG_SHA256"):
        monkeypatch.delenv(key, raising=False)
    slurm = FakeSlurm(synthetic(LOCAL), user=my_user_name())
    return slurm, SiteFile(synthetic_site(LOCAL)), tmp_path


def _submitted(slurm: FakeSlurm, site: SiteFile, tmp_path: Path, **slurm_options: object) -> tuple[int, Path]:
    spec = make_spec(name="big", training__steps=2000)
    job = JobFile(tmp_path / "big.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(
        slurm=SlurmOptions(**slurm_options), job_dir=tmp_path / "jobs" / "big", now=slurm.now, env_check="off"
    )
    req = plan_job(job, site, slurm, opts)
    return submit(req, slurm).job_id, req.job_dir


def _record(job_dir: Path, job_id: int, peak_gib: float | None, rank: int = 0) -> None:
    data = {"rank": rank, "job_id": str(job_id), "kind": "cuda", "message": "x", "peak_gib": peak_gib, "at": 1.0}
    (job_dir / f"oom-{rank}.json").write_text(json.dumps(data))


def test_each_fallback_fits_an_error_that_breaks_the_chosen_plan(world):
    slurm, site, tmp = world
    _, job_dir = _submitted(slurm, site, tmp)
    decision = read_plan(job_dir / "plan.json").decision
    chosen, fallbacks = decision.chosen, decision.oom_fallbacks
    first = failing_factor(chosen)
    assert first is not None and fallbacks
    for f in fallbacks:
        assert f.memory_factor >= first * ERROR_STEPS[0] - 1e-3
        # the chosen plan fails at this error; the fallback holds it on every component
        assert any(c.peak_gib * f.memory_factor > c.capacity_gib for c in chosen.components)
        assert all(c.peak_gib * f.memory_factor <= c.capacity_gib * 1.0001 for c in f.allocation.components)
        assert (f.allocation.label(), f.allocation.plan) != (chosen.label(), chosen.plan)
        if f.resumes:  # loads the chosen plan's checkpoint (as it is, or converted by the built-in trainer)
            assert checkpoint_route(chosen.plan, f.allocation.plan) != "none"
        usable = {c.partition: c.capacity_gib for c in chosen.components}
        for c in f.allocation.components:  # plan.json keeps the site's usable memory, not the scaled one
            if c.partition in usable:
                assert c.capacity_gib == pytest.approx(usable[c.partition], rel=1e-3)
    from frenzy_slurm.cli.fsbatch import explain_rows

    marks = [r[0] for r in explain_rows(decision)[1]]
    assert marks.count("!") == len(fallbacks)  # --explain lists them


def test_no_fallbacks_are_planned_when_the_user_turns_retries_off(world):
    slurm, site, tmp = world
    _, job_dir = _submitted(slurm, site, tmp, oom_retry=False)
    pf = read_plan(job_dir / "plan.json")
    assert pf.decision.oom_fallbacks == [] and pf.slurm is not None and pf.slurm.oom_retry is False
    assert "frenzy_slurm.runtime.oom_retry" not in (job_dir / "job.sbatch").read_text()


def test_the_fallback_picked_can_continue_the_run_and_covers_the_measured_error(world):
    slurm, site, tmp = world
    _, job_dir = _submitted(slurm, site, tmp)
    alloc = read_plan(job_dir / "plan.json").decision.chosen
    small = Fallback(memory_factor=1.2, resumes=False, allocation=alloc)
    more = Fallback(memory_factor=1.5, resumes=True, allocation=alloc)
    most = Fallback(memory_factor=2.0, resumes=True, allocation=alloc)
    assert pick([small, more, most], has_checkpoint=False, error=None) is small
    assert pick([small, more, most], has_checkpoint=True, error=None) is more
    assert pick([small, more, most], has_checkpoint=False, error=1.7) is most
    assert pick([small, more, most], has_checkpoint=True, error=3.0) is most  # none covers it: the most headroom
    assert pick([small], has_checkpoint=True, error=None) is None


def test_out_of_memory_is_seen_in_records_torch_messages_and_slurms_oom_kill(world):
    slurm, site, tmp = world
    job_id, job_dir = _submitted(slurm, site, tmp)
    pf = read_plan(job_dir / "plan.json")
    planned = max(c.peak_gib for c in pf.decision.chosen.components)
    assert detect(job_dir, pf, job_id, 0.0, "step 3 loss 2.1\nTraceback: RuntimeError: NCCL error") is None
    torch_line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total"
    seen_text = Evidence("cuda", "torch's out-of-memory message in the job's output")
    assert detect(job_dir, pf, job_id, 0.0, torch_line) == seen_text
    host = "slurmstepd: error: Detected 1 oom_kill event in StepId=7.0. Some of the step tasks have been OOM Killed."
    assert detect(job_dir, pf, job_id, 0.0, host).kind == "host"  # type: ignore[union-attr]
    assert detect(job_dir, pf, job_id, 0.0, "Detected 2 oom-kill event(s) in step 7.0").kind == "host"  # type: ignore[union-attr]
    _record(job_dir, job_id + 1, 100.0)  # another job's (an earlier run in this directory): not this one's
    assert detect(job_dir, pf, job_id, 0.0, "") is None
    _record(job_dir, job_id, planned * 1.3, rank=1)
    _record(job_dir, job_id, planned * 1.1, rank=2)
    seen = detect(job_dir, pf, job_id, 0.0, "")
    assert seen is not None and seen.kind == "cuda" and seen.error == pytest.approx(1.3)
    assert detect(job_dir, pf, job_id, 5.0, "") is None  # records from before this run started


def test_the_epilogue_submits_the_fallback_once_after_this_job(world):
    slurm, site, tmp = world
    job_id, job_dir = _submitted(slurm, site, tmp)
    pf = read_plan(job_dir / "plan.json")
    _record(job_dir, job_id, None)
    line = retry(job_dir, job_id, backend=slurm)
    assert line is not None and "submitted again once as job" in line
    record = json.loads((job_dir / "oom.json").read_text())
    new = record["retry_job"]
    successor = read_plan(Path(record["retry_dir"]) / "plan.json")
    expected = pick(pf.decision.oom_fallbacks, has_checkpoint=False, error=None)
    assert expected is not None and successor.decision.chosen == expected.allocation
    assert successor.moved_from is not None and successor.moved_from.job_id == job_id
    assert successor.moved_from.reason == "out of memory" and successor.moved_from.plan == pf.decision.chosen.plan
    assert slurm.fake_jobs[new].after == [job_id]
    assert Path(record["retry_dir"]).name == "big.2"
    # never twice: a second epilogue (a requeued run of the job) submits nothing
    again = retry(job_dir, job_id, backend=slurm)
    assert again is not None and "already handled" in again
    assert sorted(slurm.fake_jobs) == [job_id, new]
    # the successor is not retried itself
    _record(Path(record["retry_dir"]), new, None)
    last = retry(Path(record["retry_dir"]), new, backend=slurm)
    assert last is not None and f"already the retry of job {job_id}" in last
    assert sorted(slurm.fake_jobs) == [job_id, new]
    assert oom_note(record) is not None and f"submitted again as job {new}" in (oom_note(record) or "")


def test_the_user_can_turn_the_retry_off(world):
    slurm, site, tmp = world
    job_id, job_dir = _submitted(slurm, site, tmp, oom_retry=False)
    pf = read_plan(job_dir / "plan.json")
    why = choose(pf, False, Evidence("cuda", "x"))
    assert isinstance(why, str) and "oom_retry is off" in why
    _record(job_dir, job_id, None)
    assert "oom_retry is off" in (retry(job_dir, job_id, backend=slurm) or "")
    assert sorted(slurm.fake_jobs) == [job_id]


def test_the_test_hook_raises_torchs_error_only_above_its_size_and_from_its_step(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    oom_hook.test_capacity_exceeded(0, 1.0)  # not set: nothing
    monkeypatch.setenv(oom_hook.TEST_CAPACITY_ENV, "0.5")
    monkeypatch.setenv(oom_hook.TEST_FROM_STEP_ENV, "3")
    oom_hook.test_capacity_exceeded(2, 1.0)  # before its step
    oom_hook.test_capacity_exceeded(3, 0.4)  # the plan fits
    with pytest.raises(torch.OutOfMemoryError) as caught:
        oom_hook.test_capacity_exceeded(3, 1.0)
    assert oom.is_cuda_oom(caught.value) and not oom.is_cuda_oom(RuntimeError("CUDA error"))
    assert oom.requested_bytes(str(caught.value)) == pytest.approx(0.5 * GiB)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    path = oom.record(tmp_path, caught.value, planned_gib=1.0)
    rec = json.loads(path.read_text())
    assert path.name == "oom-3.json" and rec["job_id"] == "42" and rec["peak_gib"] == pytest.approx(1.0)
    assert oom.read_records(tmp_path) == [rec]


def test_a_script_that_imports_in_job_records_an_uncaught_out_of_memory_error(tmp_path):
    pytest.importorskip("torch")
    script = (
        "from frenzy_slurm import in_job\nimport torch\n"
        "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 1.00 GiB. x')\n"
    )
    env = dict(os.environ, FRENZY_JOB_DIR=str(tmp_path), RANK="1", SLURM_JOB_ID="7", PYTHONPATH=str(ROOT))
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 1 and "torch.OutOfMemoryError" in res.stderr  # the traceback still printed
    rec = json.loads((tmp_path / "oom-1.json").read_text())
    assert rec["job_id"] == "7" and "Tried to allocate 1.00 GiB" in rec["message"]
