"""The in-memory FakeSlurm behind the Slurm seam, and HAS's `--test-only` refinement through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import BatchJob, ComponentRequest, SlurmBackend, SlurmCommandError, SlurmUnavailable
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.run import SlurmTimeout

from .helpers import LOCAL, make_spec, plan

T0 = 1.8e9


def fake(**kw) -> FakeSlurm:
    return FakeSlurm(synthetic(LOCAL, now=T0), **kw)


def batch(*comps: tuple[str, int, int, int], comment: str = "frenzy:abc") -> BatchJob:
    """comps: (partition, nodes, GPUs per node, minutes)."""
    return BatchJob(
        script=Path("/jobs/x/job.sbatch"),
        workdir=Path("/jobs/x"),
        name="x",
        comment=comment,
        components=[ComponentRequest(p, None, n, g, t) for p, n, g, t in comps],
    )


def interface_methods() -> list[str]:
    return [n for n, v in vars(SlurmBackend).items() if callable(v) and not n.startswith("_")]


def test_implements_the_interface():
    """Every method of the SlurmBackend Protocol exists on the fake (and on every real backend)."""
    from frenzy_slurm.slurm.cli import SlurmCliBackend
    from frenzy_slurm.slurm.pyslurm_backend import PyslurmBackend
    from frenzy_slurm.slurm.static import StaticBackend

    names = interface_methods()
    assert {"load", "expected_start", "submit", "jobs", "cancel", "requeue", "accounting"} <= set(names)
    for cls in (FakeSlurm, SlurmCliBackend, PyslurmBackend, StaticBackend):
        missing = [n for n in names if not callable(getattr(cls, n, None))]
        assert not missing, f"{cls.__name__} lacks {missing}"


def test_fifo_start_end_and_accounting():
    s = fake()
    a = s.submit(batch(("a100", 2, 4, 10))).job_id  # the whole a100 partition
    b = s.submit(batch(("a100", 1, 2, 10))).job_id  # must wait for a
    s.set_run_time(a, 300)
    assert [j.state for j in s.jobs([a, b])] == ["RUNNING", "PENDING"]
    assert s.load().node("a100-1").gpus_used == 4
    s.advance(299)
    assert s.jobs([b])[0].state == "PENDING"
    s.advance(1)
    assert [j.state for j in s.jobs([a, b])] == ["COMPLETED", "RUNNING"]
    assert s.jobs([b])[0].start_time == int(T0 + 300)
    rec = s.accounting([a])[a]
    assert (rec.state, rec.elapsed_s) == ("COMPLETED", 300)
    assert fake(accounting=False).accounting([a]) is None


def test_hetjob_components_start_together_and_cancel_together():
    s = fake()
    s.submit(batch(("v100", 2, 8, 30)))  # v100 full
    het = s.submit(batch(("a100", 1, 4, 10), ("v100", 1, 2, 10))).job_id
    rows = s.jobs([het])
    assert [(r.job_id, r.het_job_id, r.het_job_offset, r.state) for r in rows] == [
        (het, het, 0, "PENDING"),
        (het + 1, het, 1, "PENDING"),
    ]  # a100 is free, but not v100: neither starts
    s.advance(30 * 60)
    assert {r.state for r in s.jobs([het])} == {"RUNNING"}
    s.cancel(het)
    assert {r.state for r in s.jobs([het])} == {"CANCELLED"}


def test_expected_start_as_test_only_answers():
    s = fake()
    s.submit(batch(("t4", 4, 4, 20)))  # t4 full for 20 minutes (its limit)
    est = s.expected_start([ComponentRequest("t4", None, 2, 4, 10)])
    assert est.start == pytest.approx(T0 + 20 * 60) and len(est.nodes) == 2 and est.source == "fake"
    assert s.expected_start([ComponentRequest("a100", None, 1, 4, 10)]).start == pytest.approx(T0)
    with pytest.raises(SlurmCommandError, match="node configuration is not available"):
        s.expected_start([ComponentRequest("t4", None, 5, 4, 10)])  # more nodes than the partition has


def test_refusals_outages_and_timeouts():
    s = fake()
    with pytest.raises(SlurmCommandError, match="invalid partition"):
        s.submit(batch(("nope", 1, 1, 1)))
    s.down = True
    with pytest.raises(SlurmUnavailable):
        s.jobs()
    s.down, s.submit_times_out = False, True
    with pytest.raises(SlurmTimeout):
        s.submit(batch(("t4", 1, 1, 1), comment="frenzy:late"))
    assert [j.comment for j in s.jobs(user="user")] == ["frenzy:late"]  # the job exists all the same


def test_has_refines_waiting_candidates_with_test_only():
    """When nothing is free, HAS asks the backend's --test-only for the leading candidates' start."""
    s = fake()
    for part, nodes, gpus in (("a100", 2, 4), ("v100", 2, 8), ("t4", 4, 4)):
        jid = s.submit(batch((part, nodes, gpus, 45))).job_id
        s.set_run_time(jid, 45 * 60)
    view = s.load()
    d = plan(make_spec(), view, backend=s)
    assert "expected_start" in s.calls
    assert d.chosen.start_source == "fake"
    assert d.chosen.start == pytest.approx(T0 + 45 * 60)  # the holders' limit, as Slurm would estimate it
    # without a backend HAS uses the view's end times only
    assert plan(make_spec(), view).chosen.start_source == "view"
