"""GPU-type prices: HAS weighs the delay an allocation causes the jobs queued for and arriving at its GPUs."""

from __future__ import annotations

import pytest

from frenzy_slurm.has import pricing
from frenzy_slurm.sim.clusters import generated_shape, parse_compact
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.view import Job, PoolKey

from .helpers import LOCAL, fill, load_benchmark, make_spec, plan

TRAINING = {"seq_len": 1024, "global_batch": 64, "steps": 20000, "precision": "fp16-mixed"}


def _queued(partition: str, gpu_type: str | None, n: int, first_id: int = 7000) -> list[Job]:
    return [
        Job(
            job_id=first_id + i,
            state="PENDING",
            partition=partition,
            node_count=1,
            gpu_type=gpu_type,
            gpus_per_node=4,
            time_limit_min=60,
        )
        for i in range(n)
    ]


def _busy_a100_view():
    """One a100 node (4 GPUs) busy for 10 min, three jobs queued for the a100s; the v100s all free. (20 min before
    the matmul efficiencies were read from published runs, docs/marp.md "Step time": the A100s, now 1.37x faster
    than assumed, then end with the V100s that start at once, and the price has nothing to decide.)"""
    view = fill(synthetic(LOCAL), "a100", {"a100-1": 4}, minutes=10)
    return view.model_copy(update={"jobs": [*view.jobs, *_queued("a100", "a100_40gb", 3)]})


def test_a_long_job_leaves_a_contended_type_when_another_serves_it_nearly_as_well():
    spec = make_spec(limits__gpu_types=["a100", "v100"], training=TRAINING)
    view = _busy_a100_view()
    unpriced = plan(spec, view, site=synthetic_site(LOCAL).model_copy(update={"price_weight": 0.0}))
    assert unpriced.chosen.label() == "4xA100-40GB(a100)"  # earliest completion alone: 10 min sooner
    d = plan(spec, view)  # the site's default price_weight
    assert d.chosen.label() == "8xV100-32GB(v100)" and d.chosen.start == view.taken_at
    a100 = next(a for a in d.alternatives if a.description == "4xA100-40GB(a100)")
    assert a100.allocation.completion < d.chosen.completion - 5 * 60
    assert "delays the jobs queued for and arriving at its GPUs" in a100.lost_because
    # with nothing queued or running the a100s cost no one anything: the fastest type again
    assert plan(spec, synthetic(LOCAL)).chosen.components[0].partition == "a100"


def test_demand_per_pool_from_the_view():
    view = fill(synthetic(LOCAL), "a100", {"a100-1": 4}, minutes=20)  # a100-2 busy: started 1 min ago, 21 min limit
    jobs = [*view.jobs, *_queued("a100", "a100_40gb", 2), *_queued("v100,t4", None, 1, first_id=8000)]
    d = pricing.demand(view.model_copy(update={"jobs": jobs}))
    a100, v100, t4 = d[PoolKey("a100", "a100_40gb")], d[PoolKey("v100", "v100_32gb")], d[PoolKey("t4", "t4")]
    assert a100.gpus == 8 and a100.waiting == 2.0
    assert a100.arrivals_per_s == pytest.approx(1 / (21 * 60))  # Little's law: one running job, 21 min limit
    assert a100.busy == 1.0  # 4 running + 8 asked for by the queue, of 8
    assert v100.waiting == 0.5 and t4.waiting == 0.5  # a job queued on two partitions counts half on each
    assert v100.arrivals_per_s == 0.0
    # G*T/C of the pool's work moves back, for each waiting job and half of it for each expected arrival
    push = 4 * 3600 / 8
    assert pricing.delay_s(a100, 4, 600) == pytest.approx(4 * 600 / 8 * (2 + 0.5 * 600 / (21 * 60)))
    # at most as many arrivals as jobs run there now (one): a long job is not charged for a pool's every turnover
    assert pricing.delay_s(a100, 4, 3600) == pytest.approx(push * (2 + 0.5 * 1))
    assert pricing.delay_s(None, 4, 3600) == 0.0


def test_the_price_weight_is_a_site_setting():
    from pydantic import ValidationError

    from frenzy_slurm.site.config import SiteConfig

    site = synthetic_site(LOCAL)
    assert site.price_weight == 2.0
    with pytest.raises(ValidationError, match="price_weight"):
        SiteConfig.model_validate({**site.model_dump(), "price_weight": -1})


def test_generated_shapes_are_seeded_and_within_bounds():
    for seed in range(1, 40):
        text = generated_shape(seed, 32, 512)
        assert text == generated_shape(seed, 32, 512)
        cluster = parse_compact(text)
        assert 32 <= cluster.gpus <= 512 and 3 <= len(cluster.partitions) <= 5
        assert len({p.gpu for p in cluster.partitions}) == len(cluster.partitions)
    assert len({generated_shape(s) for s in range(1, 40)}) == 39


def _jct_benchmark():
    return load_benchmark("jct")


def test_the_judging_set_is_apart_from_the_tuning_set():
    jct = _jct_benchmark()
    judge, tune = jct.CASES["judge"], jct.CASES["tune"]
    judge_shapes, tune_shapes = judge["shapes"].split(","), tune["shapes"].split(",")
    assert not set(judge_shapes) & set(tune_shapes)
    assert not {jct.GENERATED[s][0] for s in judge_shapes} & {jct.GENERATED[s][0] for s in jct.TUNING_SHAPES}
    judge_seeds = {int(s) for s in judge["seeds"].split(",")}
    assert len(judge_seeds) >= 10
    assert not judge_seeds & {int(s) for s in tune["seeds"].split(",")} and not judge_seeds & set(jct.TUNING["seeds"])
    sizes = [parse_compact(jct.SHAPES[s]).gpus for s in judge_shapes]
    assert min(sizes) >= 32 and max(sizes) <= 512 and len(set(sizes)) == len(sizes)
    for s in judge_shapes:
        (load,) = jct.shape_load(s, "auto")
        assert 0.8 <= load <= 1.2


def test_the_small_gpu_tuning_shapes_are_tuning_and_small():
    """The `small` case (docs/has.md, "Small, slow GPUs") is tuning: its shapes are tuning shapes drawn from shape
    seeds and run with job seeds the judging set does not use, of 16-32 GB types only, 32-96 GPUs."""
    jct = _jct_benchmark()
    small, judge = jct.CASES["small"], jct.CASES["judge"]
    shapes = small["shapes"].split(",")
    assert set(shapes) <= set(jct.TUNING_SHAPES)
    assert not {jct.GENERATED[s][0] for s in shapes} & {jct.GENERATED[s][0] for s in judge["shapes"].split(",")}
    assert not {int(s) for s in small["seeds"].split(",")} & {int(s) for s in judge["seeds"].split(",")}
    for s in shapes:
        cluster = parse_compact(jct.SHAPES[s])
        assert 32 <= cluster.gpus <= 96
        assert {p.split(":")[0] for p in jct.SHAPES[s].split(",")} <= {"V100-16GB", "V100-32GB", "A10G", "T4", "L4"}


def test_the_one_node_tuning_shapes_are_tuning_and_one_node_per_type():
    """The `onenode` case (docs/has.md, "One-node pools") is tuning: shapes of one node per type, 3-5 types and
    24-48 GPUs, drawn from shape seeds and run with job seeds the judging set does not use."""
    jct = _jct_benchmark()
    case, judge = jct.CASES["onenode"], jct.CASES["judge"]
    shapes = case["shapes"].split(",")
    assert set(shapes) <= set(jct.TUNING_SHAPES)
    assert not {jct.GENERATED[s][0] for s in shapes} & {jct.GENERATED[s][0] for s in judge["shapes"].split(",")}
    assert not {int(s) for s in case["seeds"].split(",")} & {int(s) for s in judge["seeds"].split(",")}
    for s in shapes:
        cluster = parse_compact(jct.SHAPES[s])
        assert 24 <= cluster.gpus <= 48 and 3 <= len(cluster.partitions) <= 5
        assert all(p.nodes == 1 for p in cluster.partitions)


def test_one_node_shapes_are_seeded_and_within_bounds():
    for seed in range(3101, 3121):
        text = generated_shape(seed, 24, 48, one_node=True)
        assert text == generated_shape(seed, 24, 48, one_node=True)
        cluster = parse_compact(text)
        assert 24 <= cluster.gpus <= 48 and all(p.nodes == 1 for p in cluster.partitions)
    assert generated_shape(3101, 24, 48, one_node=True) == "T4:1x4,H100-PCIe:1x8,L40S:1x4,V100-16GB:1x8,A40:1x8"
    # the default draw is unchanged by the option
    assert generated_shape(3101, 24, 48) != generated_shape(3101, 24, 48, one_node=True)
