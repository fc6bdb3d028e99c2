"""HAS on synthetic views: objective, heterogeneity only when sooner, limits, layer split, no-fit message."""

from __future__ import annotations

import datetime as dt

import pytest

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.has.hetero import StageGroup, build, split_layers
from frenzy_slurm.has.pools import node_layout
from frenzy_slurm.jobspec import presets
from frenzy_slurm.marp import Workload
from frenzy_slurm.sim.synthetic import LARGE, synthetic, synthetic_site
from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL, fill, make_spec, plan


def test_node_layout():
    assert node_layout(8, 4) == (2, 4)
    assert node_layout(6, 4) == (2, 3)
    assert node_layout(3, 8) == (1, 3)
    assert node_layout(5, 4) == (5, 1)
    assert node_layout(7, 4) == (7, 1)


def test_layer_split_follows_speed():
    assert split_layers(24, [1.0, 1.0], 0.0) == [12, 12]
    s = split_layers(24, [3.0, 1.0], 0.0)
    assert s == [18, 6]
    s = split_layers(24, [1.0, 1.0], 2.0)  # the last stage also runs the output layer
    assert s[0] > s[1] and sum(s) == 24


def test_hetero_build_respects_memory():
    w = Workload.of(arch=presets()["llama-2-7b"].arch, seq_len=2048, precision="bf16-mixed")
    fast_small = StageGroup(
        "a", 1, rate=300e12, usable_bytes=20 * GiB, overhead_bytes=0.0, intra_gbs=300, inter_gbs=25, gpus_per_node=8
    )
    slow_big = StageGroup(
        "b", 3, rate=50e12, usable_bytes=76 * GiB, overhead_bytes=0.0, intra_gbs=300, inter_gbs=25, gpus_per_node=8
    )
    hp = build(w, [fast_small, slow_big], dp=1, micro_batch=1, global_batch=32, recompute="full")
    assert hp is not None
    caps = [20, 76, 76, 76]
    for stage, cap in zip(hp.memory.stages, caps, strict=True):
        assert stage.peak <= cap * GiB
    # by speed stage 0 would take most layers; its 20 GiB cap limits it
    assert hp.plan.layer_split[0] < 32 * 300 / (300 + 150)


def test_homogeneous_when_a_type_is_free():
    d = plan(make_spec(), synthetic(LOCAL))
    assert d.chosen.kind == "homogeneous" and d.chosen.start_source == "now"
    assert d.chosen.components[0].gpu_model == "A100-40GB"


def test_heterogeneous_only_when_sooner():
    spec = make_spec(
        model={"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
        training={"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
    )
    view = fill(synthetic(LOCAL), "a100")
    view = fill(view, "v100", {"v100-2": 2})
    view = fill(view, "t4", {"t4-4": 2})
    d = plan(spec, view)
    assert d.chosen.kind == "heterogeneous", d.chosen.label()
    assert [c.partition for c in d.chosen.components] == ["v100", "t4"]
    assert [c.gpus for c in d.chosen.components] == [2, 2]
    assert sum(d.chosen.plan.layer_split) == 16 and d.chosen.plan.pp == 4
    assert all(c.peak_gib <= c.capacity_gib for c in d.chosen.components)
    # the same job when the GPUs free up soon: waiting for one type finishes first
    soon = fill(fill(fill(synthetic(LOCAL), "a100", minutes=1), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    spec_long = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": 2000})})
    d2 = plan(spec_long, soon)
    assert d2.chosen.kind == "homogeneous", d2.chosen.label()
    assert d2.chosen.start_source == "view" and d2.chosen.start == pytest.approx(soon.taken_at + 60)


def test_waits_when_nothing_is_free():
    view = fill(fill(fill(synthetic(LOCAL), "a100", minutes=30), "v100", minutes=60), "t4", minutes=90)
    d = plan(make_spec(), view)
    assert d.chosen.start_source == "view"
    assert d.chosen.start == pytest.approx(view.taken_at + 30 * 60)


def test_limits():
    view = synthetic(LOCAL)
    d = plan(make_spec(limits__max_gpus=2), view)
    assert d.chosen.gpus <= 2
    d = plan(make_spec(limits__gpu_types=["t4"]), view)
    assert {c.gpu_type for c in d.chosen.components} == {"t4"}
    assert any("not in limits.gpu_types" in a.lost_because for a in d.alternatives)
    with pytest.raises(NoFitError, match="fits nowhere"):
        plan(
            make_spec(limits__time_limit="00:01:00", training={"seq_len": 1024, "global_batch": 64, "steps": 100000}),
            view,
        )
    past = dt.datetime.fromtimestamp(view.taken_at - 10, tz=dt.UTC)
    with pytest.raises(NoFitError):
        plan(make_spec(limits__deadline=past.isoformat()), view)


def test_partition_max_time():
    view = synthetic(LOCAL)
    parts = [p.model_copy(update={"max_time_min": 5}) if p.name == "a100" else p for p in view.partitions]
    view = view.model_copy(update={"partitions": parts})
    spec = make_spec(training={"seq_len": 1024, "global_batch": 64, "steps": 3000})
    d = plan(spec, view)
    assert "a100" not in {c.partition for c in d.chosen.components}


def test_no_fit_names_the_smallest_allocation():
    spec = make_spec(
        model={"preset": "llama-2-13b"},
        limits__max_gpus=4,
        training={"seq_len": 2048, "global_batch": 64, "steps": 10, "precision": "fp32"},
    )
    with pytest.raises(NoFitError) as err:
        plan(spec, synthetic(LOCAL))
    msg = err.value.message
    assert "smallest allocation that would fit" in msg and "To fix" in msg
    smallest = int(msg.split("would fit: ")[1].split(" x ")[0])
    assert smallest > 4


def test_large_cluster_decision():
    """2,048 GPUs in 8 types, half busy (benchmarks/has_decision.py times this shape)."""
    view = synthetic(LARGE, busy=0.5, seed=3)
    d = plan(make_spec(), view, synthetic_site(LARGE))
    comp = d.chosen.components[0]
    assert d.chosen.start_source == "now" and comp.peak_gib <= comp.capacity_gib
    free = sum(n.gpus_free for n in view.nodes if comp.partition in n.partitions)
    assert d.chosen.gpus <= free


def test_has_owns_the_time_limit():
    """HAS returns the --time it chose; a requested --time above a partition's MaxTime rules that partition out."""
    view = synthetic(LOCAL)
    d = plan(make_spec(), view)
    assert d.chosen.time_min == int(-(-(d.chosen.run_time_s * 1.25 + 600) // 60))
    assert plan(make_spec(), view, time="2:00:00").chosen.time_min == 120
    parts = [p.model_copy(update={"max_time_min": 60}) for p in view.partitions]
    capped = view.model_copy(update={"partitions": parts})
    assert plan(make_spec(), capped, time="59").chosen.time_min == 59
    with pytest.raises(NoFitError, match="MaxTime 60 min"):
        plan(make_spec(), capped, time="2:00:00")  # fsbatch -t above every partition's MaxTime


def test_pools_are_keyed_by_partition_and_gres_type():
    """Two partitions with the same GPU model are two pools, each with its own prediction."""
    from frenzy_slurm.sim.synthetic import synthetic_site
    from frenzy_slurm.slurm import PoolKey

    shape = [("a100", "A100-40GB", 2, 4), ("a100b", "A100-40GB", 1, 4)]
    view = fill(synthetic(shape), "a100")
    d = plan(make_spec(), view, synthetic_site(shape))
    comp = d.chosen.components[0]
    assert (comp.partition, comp.gpu_type) == ("a100b", "a100_40gb")
    assert PoolKey("a100b", "a100_40gb") == ("a100b", "a100_40gb") and str(PoolKey("p", "g")) == "p/g"


def _alloc(gpus: int, run_s: float, start: float = 0.0):
    from frenzy_slurm.has.model import Allocation, Component
    from frenzy_slurm.marp.plan import ParallelPlan

    comp = Component(
        partition="p",
        gpu_type="g",
        gpu_model="A100-40GB",
        nodes=1,
        gpus_per_node=gpus,
        stages=[0],
        peak_gib=1.0,
        capacity_gib=40.0,
    )
    return Allocation(
        kind="homogeneous",
        components=[comp],
        plan=ParallelPlan(dp=gpus),
        step_time_s=1.0,
        run_time_s=run_s,
        time_min=60,
        start=start,
        start_source="now",
    )


def test_wider_only_while_each_gpu_is_worth_it():
    """Each widening must turn every extra GPU into at least half a GPU of speed-up (waiting included)."""
    from frenzy_slurm.has.decide import _Cand, _widest_worth_it

    def pick(*allocs):
        ordered = sorted((_Cand(a) for a in allocs), key=lambda c: c.alloc.completion)
        return _widest_worth_it(ordered, now=0.0, tol=60.0).alloc.gpus

    # 1 -> 2 GPUs: 1.9x (efficiency 0.9); 2 -> 8: only 1.5x for 4x the GPUs (efficiency 0.17)
    assert pick(_alloc(1, 10_000), _alloc(2, 5_300), _alloc(8, 3_500)) == 2
    # scaling well all the way: the widest
    assert pick(_alloc(1, 10_000), _alloc(2, 5_200), _alloc(8, 1_400)) == 8
    # the narrow allocation must wait 5 h, the wide one starts now: waiting counts
    assert pick(_alloc(1, 3_600, start=18_000), _alloc(8, 2_000)) == 8


def test_pending_jobs_are_ahead_in_the_queue():
    """A pending job ahead takes the GPUs as they free up; only a job short enough backfills before it."""
    from frenzy_slurm.slurm.releases import ReleaseIndex

    view = fill(synthetic(LOCAL), "a100", minutes=30)  # both a100 nodes busy for 30 min
    t0 = view.taken_at
    waiting = Job(
        job_id=5000,
        state="PENDING",
        partition="a100",
        node_count=2,
        gpu_type="a100_40gb",
        gpus_per_node=4,
        time_limit_min=120,
    )
    queued = view.model_copy(update={"jobs": [*view.jobs, waiting]})
    assert ReleaseIndex(view, t0).start("a100", None, 1, 4, 3600) == pytest.approx(t0 + 1800)
    # the pending job holds both nodes from +30 min to +150 min: a new job starts after it
    assert ReleaseIndex(queued, t0).start("a100", None, 1, 4, 3600) == pytest.approx(t0 + 1800 + 7200)
    assert ReleaseIndex(queued, t0, queue=False).start("a100", None, 1, 4, 3600) == pytest.approx(t0 + 1800)
    # on an idle partition a short job backfills in front of a pending job's later reservation
    idle_wait = Job(
        job_id=5001, state="PENDING", partition="t4", node_count=4, gpu_type="t4", gpus_per_node=4, time_limit_min=60
    )
    busy_t4 = fill(synthetic(LOCAL), "t4", {"t4-4": 4}, minutes=20)  # three t4 nodes busy for 20 min, one free
    idx = ReleaseIndex(busy_t4.model_copy(update={"jobs": [*busy_t4.jobs, idle_wait]}), t0)
    assert idx.start("t4", None, 1, 4, 600) == pytest.approx(t0)  # 10 min fits before the reservation at +20
    assert idx.start("t4", None, 1, 4, 3600) == pytest.approx(t0 + 1200 + 3600)  # 1 h does not: after it


def test_has_sees_the_queue():
    view = fill(fill(fill(synthetic(LOCAL), "a100", minutes=30), "v100", minutes=60), "t4", minutes=90)
    ahead = [
        Job(
            job_id=6000 + i,
            state="PENDING",
            partition="a100",
            node_count=2,
            gpu_type="a100_40gb",
            gpus_per_node=4,
            time_limit_min=240,
        )
        for i in range(2)
    ]
    d = plan(make_spec(), view.model_copy(update={"jobs": [*view.jobs, *ahead]}))
    # without the queue HAS would wait 30 min for the a100s (test_waits_when_nothing_is_free); two 4-hour jobs
    # are ahead there, so another pool wins
    assert d.chosen.components[0].partition != "a100"


def test_one_job_leaves_room_in_a_pool():
    """A job that scales well gets at most the site's max_job_share of a pool, unless it needs (or asks for) more."""
    from frenzy_slurm.sim.synthetic import synthetic_site

    view = synthetic(LOCAL)  # a100: 2 nodes x 4 GPUs
    training = {"seq_len": 1024, "global_batch": 64, "steps": 20000, "precision": "bf16-mixed"}
    spec = make_spec(limits__gpu_types=["a100"], training=training)
    d = plan(spec, view)
    assert d.chosen.label() == "4xA100-40GB(a100)"
    wide = next(a for a in d.alternatives if a.description == "8xA100-40GB(a100)")
    assert wide.allocation.completion < d.chosen.completion and "at most 50% of a pool" in wide.lost_because
    assert "takes 8 of the 8 GPUs of a100" in wide.lost_because
    whole = synthetic_site(LOCAL).model_copy(update={"max_job_share": 1.0})
    assert plan(spec, view, site=whole).chosen.gpus == 8
    # asking for the whole pool, or needing it to fit, is honoured
    assert plan(make_spec(limits__gpu_types=["a100"], limits__min_gpus=8, training=training), view).chosen.gpus == 8
    big = make_spec(
        model={"preset": "llama-2-7b"},
        limits__gpu_types=["a100"],
        training={"seq_len": 2048, "global_batch": 64, "steps": 10, "precision": "bf16-mixed"},
    )
    assert plan(big, view).chosen.gpus == 8
