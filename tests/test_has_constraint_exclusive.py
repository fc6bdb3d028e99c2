"""HAS honours -C/--constraint and --exclusive in the plan, not only in job.sbatch: it plans only on nodes
with the features (a matching OR per node, and says so), under --exclusive counts a node any job uses as busy
until it empties and takes whole nodes, and asks `sbatch --test-only` with both.

The nodes a job may use are has/nodes.py's; the constraint grammar's tests are in test_seam_constraints.py."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.has.nodes import nodes_for
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.backend import ComponentRequest, StartEstimate
from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL, fill, make_spec, plan


def _featured(view, features: dict[str, list[str]]):
    nodes = [n.model_copy(update={"features": features.get(n.name, [])}) for n in view.nodes]
    return view.model_copy(update={"nodes": nodes})


def _req(**kw) -> Requirements:
    return Requirements(name="t", global_batch=64, steps=100, **kw)


def test_the_constraint_leaves_out_nodes_without_the_features():
    view = _featured(synthetic(LOCAL), {"v100-1": ["ib"], "t4-1": ["ib"], "t4-2": ["ib"]})
    narrowed, notes = nodes_for(_req(constraint="ib"), view)
    assert sorted(n.name for n in narrowed.nodes) == ["t4-1", "t4-2", "v100-1"]
    assert {p.name: p.nodes for p in narrowed.partitions}["v100"] == ["v100-1"]
    assert notes == ["a100/a100_40gb: no node has the features -C ib asks for (its nodes have: none)"]
    # nothing asked: the view itself
    assert nodes_for(_req(), view)[0] is view


def test_has_plans_only_on_nodes_with_the_features():
    view = _featured(synthetic(LOCAL), {n: ["fast"] for n in ("t4-1", "t4-2", "t4-3", "t4-4")})
    free = plan(make_spec(model={"preset": "gpt2"}), view)
    assert free.chosen.components[0].partition != "t4"  # without -C the faster GPUs win
    on_t4 = plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "fast"}), view)
    assert {c.partition for c in on_t4.chosen.components} == {"t4"}
    with pytest.raises(NoFitError, match="no node has the features -C slow"):
        plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "slow"}), view)


def test_matching_or_is_planned_per_node_and_said():
    view = _featured(synthetic(LOCAL), {"v100-1": ["r1"], "v100-2": ["r2"]})
    _, notes = nodes_for(_req(constraint="[r1|r2]"), view)
    assert any("r1 or r2" in n and "left to Slurm" in n for n in notes)


def test_exclusive_counts_a_node_any_job_uses_as_busy_until_it_empties():
    view = synthetic(LOCAL)
    now = view.taken_at
    # v100-1: 2 of 8 GPUs used by a job ending in 30 min and a CPU-only job ending in 90 min; v100-2 idle
    nodes = [
        n.model_copy(update={"gpus_used": 2, "cpus_alloc": 3, "state": "mixed"}) if n.name == "v100-1" else n
        for n in view.nodes
    ]
    jobs = [
        Job(job_id=7, state="RUNNING", partition="v100", nodes=["v100-1"], node_count=1, gpu_type="v100_32gb",
            gpus_per_node=2, end_time=int(now + 1800)),
        Job(job_id=8, state="RUNNING", partition="v100", nodes=["v100-1"], node_count=1, end_time=int(now + 5400)),
    ]  # fmt: skip
    view = view.model_copy(update={"nodes": nodes, "jobs": jobs})
    whole, _ = nodes_for(_req(exclusive=True), view)
    v1 = next(n for n in whole.nodes if n.name == "v100-1")
    assert v1.gpus_free == 0
    (hold,) = [j for j in whole.jobs if "v100-1" in j.nodes]
    assert (hold.gpus_per_node, hold.end_time, hold.job_id) == (8, int(now + 5400), 8)
    # shared, the node has 6 GPUs free now; exclusive, a one-node job waits for the CPU-only job to end
    from frenzy_slurm.slurm.releases import ReleaseIndex

    start = ReleaseIndex(whole, now).start("v100", "v100_32gb", 2, 8, 600.0)
    assert start == pytest.approx(now + 5400)  # two whole nodes: v100-1 frees at the last job's end
    assert ReleaseIndex(view, now).start("v100", "v100_32gb", 1, 6, 600.0) == pytest.approx(now)


def test_exclusive_plans_take_whole_nodes():
    spec = make_spec(model={"preset": "gpt2"}, slurm={"exclusive": True})
    view = fill(synthetic(LOCAL), "a100", keep_free={"a100-1": 2})  # a100-1: 2 GPUs free beside another job
    d = plan(spec, view)
    for alloc in [d.chosen] + [a.allocation for a in d.alternatives if a.allocation is not None]:
        for c in alloc.components:
            if c.partition == "a100":
                assert alloc.start > view.taken_at  # the shared node is not free for an exclusive job
    # one candidate per pool and node count: a narrower plan on the same nodes is not offered as cheaper
    seen = [
        (tuple(c.partition for c in a.allocation.components), tuple(c.nodes for c in a.allocation.components))
        for a in d.alternatives
        if a.allocation is not None and not a.lost_because.startswith(("more than", "exceeds"))
    ]
    chosen = (tuple(c.partition for c in d.chosen.components), tuple(c.nodes for c in d.chosen.components))
    assert chosen not in seen


class _Recorder:
    """A backend whose only use is to record what HAS asks `sbatch --test-only`."""

    def __init__(self):
        self.asked: list[list[ComponentRequest]] = []

    def expected_start(self, components):
        self.asked.append(components)
        return StartEstimate(start=2e9, nodes=[], source="test-only")


def test_test_only_is_asked_with_the_constraint_and_exclusive():
    with_ib = {n: ["ib"] for n in ("a100-1", "a100-2", "v100-1", "v100-2", "t4-1")}
    view = fill(_featured(synthetic(LOCAL), with_ib), "a100")
    for part in ("v100", "t4"):
        view = fill(view, part)
    rec = _Recorder()
    plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "ib", "exclusive": True}), view, backend=rec)
    assert rec.asked and all(c.constraint == "ib" and c.exclusive for comps in rec.asked for c in comps)
