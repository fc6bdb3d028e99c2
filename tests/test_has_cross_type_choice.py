"""Pipelines across GPU types (one Slurm heterogeneous job) are chosen where HAS's model says they finish sooner
than every allocation of one type, and not elsewhere (issue 30); the simulator's `has` may choose them, which it
never could: its jobs' framework left them off, so `has` and `has-homogeneous` were the same decision."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.units import TFLOPS
from frenzy_slurm.has import Requirements
from frenzy_slurm.has.decide import forget_kept
from frenzy_slurm.has.model import Allocation, Decision
from frenzy_slurm.jobspec import load_job_spec, resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.marp.plan import Workload
from frenzy_slurm.marp.speed import flops_per_token
from frenzy_slurm.planning import decide_job
from frenzy_slurm.sim.jobs import Attempt
from frenzy_slurm.sim.policies import HasPolicy
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.sim.workload import WorkloadJob
from frenzy_slurm.slurm.view import ClusterView, Job, Node

ROOT = Path(__file__).resolve().parent.parent
POOLS = [("h100", "H100-SXM", 4, 8), ("a100", "A100-40GB", 4, 8)]


def _llama2_7b() -> tuple[Requirements, Workload, SearchSpace]:
    spec = load_job_spec(ROOT / "examples" / "llama2-7b.yaml")
    spec = spec.model_copy(update={"limits": spec.limits.model_copy(update={"gpu_types": None})})
    w = workload_from_spec(spec, resolve_model(spec, ROOT / "examples"))
    return Requirements.from_spec(spec), w, search_space_from_spec(spec)


def _h100s_busy(free_nodes: int, hours: float) -> ClusterView:
    """The H100 nodes but `free_nodes` held by running jobs for `hours`; the A100s all free."""
    v = synthetic(POOLS)
    nodes: list[Node] = []
    jobs: list[Job] = []
    h100 = [n for n in v.nodes if n.partitions == ["h100"]]
    for n in v.nodes:
        if n in h100[free_nodes:]:
            n = n.model_copy(update={"gpus_used": n.gpus_total, "state": "allocated"})
            jobs.append(
                Job(
                    job_id=len(jobs) + 1,
                    state="RUNNING",
                    partition="h100",
                    nodes=[n.name],
                    node_count=1,
                    gpu_type=n.gpu_type,
                    gpus_per_node=n.gpus_total,
                    start_time=int(v.taken_at - 60),
                    end_time=int(v.taken_at + hours * 3600),
                    time_limit_min=int(hours * 60) + 1,
                )
            )
        nodes.append(n)
    return v.model_copy(update={"nodes": nodes, "jobs": jobs})


def _decide(
    view: ClusterView, heterogeneous: bool = True, margin: float | None = None, share: float | None = None
) -> Decision:
    req, w, space = _llama2_7b()
    assert space.heterogeneous  # the built-in trainer lays out stages per GPU type
    if not heterogeneous:
        space = replace(space, heterogeneous=False)
    # the arrivals' price off (site arrival_room, tests/test_has_arrival_room.py): these tests are about the
    # pipeline's own model, and the views hold running jobs whose arrivals it would price
    site = synthetic_site(POOLS).model_copy(update={"arrival_room": 0.0})
    if margin is not None:
        site = site.model_copy(update={"pipeline_margin": margin})
    if share is not None:
        site = site.model_copy(update={"max_job_share": share})
    forget_kept()
    return decide_job(req, w, space, view, site, None, view.taken_at, alternatives=40)


def test_a_pipeline_over_the_free_fast_gpus_and_the_slower_type_is_chosen_where_it_finishes_first():
    # (the site's max_job_share off, as in the tests below about the pipeline's own model: the pipeline takes
    # more than half of the A100s; test_a_pipeline_takes_at_most_the_sites_share... holds it to the share).
    # Three H100 nodes free: 24 H100s and 16 A100s are predicted 33% sooner than the 16 H100s alone (past the site's
    # 30% margin; 24 H100s alone are no candidate: widths are powers of two or whole pools). With the element-wise
    # operations priced at each stage's memory bandwidth (marp/speed.py) fewer free H100s leave no pipeline 30%
    # sooner: see the margin test below.
    view = _h100s_busy(free_nodes=3, hours=24)
    d = _decide(view, share=1.0)
    assert d.chosen.kind == "heterogeneous"
    assert [c.gpu_model for c in d.chosen.components] == ["H100-SXM", "A100-40GB"]
    assert d.chosen.start == view.taken_at  # on GPUs free now
    homogeneous = _decide(view, heterogeneous=False, share=1.0).chosen
    # sooner than what HAS chooses without pipelines, by more than the tie tolerance (60 s, 1%)
    assert d.chosen.completion < homogeneous.completion - max(60.0, 0.01 * (homogeneous.completion - view.taken_at))
    # the faster type's stages hold more layers: each stage's share follows its speed
    split = d.chosen.plan.layer_split
    h100_stages = len(d.chosen.components[0].stages)
    assert split is not None and min(split[:h100_stages]) > max(split[h100_stages:])


def test_a_pipeline_predicted_sooner_by_less_than_the_sites_margin_is_not_chosen():
    # one H100 node free: a pipeline of 8 H100s and 32 A100s is predicted about 21% sooner than the 32 A100s alone,
    # one of 8 H100s and 24 A100s about 12%
    view = _h100s_busy(free_nodes=1, hours=24)
    alone = _decide(view, heterogeneous=False, share=1.0).chosen

    def gain(margin: float) -> float:
        d = _decide(view, margin=margin, share=1.0).chosen
        return (
            1.0 - (d.completion - view.taken_at) / (alone.completion - view.taken_at) if d.kind != alone.kind else 0.0
        )

    assert synthetic_site(POOLS).pipeline_margin == 0.3  # the default
    assert _decide(view, share=1.0).chosen.kind == "homogeneous"
    assert 0.2 < gain(0.2) < 0.3
    assert 0.0 < gain(0.0) < 0.2


def test_no_pipeline_where_the_fast_type_alone_is_free_and_finishes_sooner():
    d = _decide(_h100s_busy(free_nodes=4, hours=24))
    assert d.chosen.kind == "homogeneous"
    assert d.chosen.components[0].gpu_model == "H100-SXM"


def test_no_pipeline_where_the_fast_type_frees_up_soon_enough():
    # the busy H100s end in 10 minutes: waiting for them beats a pipeline with the slower type
    d = _decide(_h100s_busy(free_nodes=1, hours=10 / 60))
    assert d.chosen.kind == "homogeneous"


def test_the_simulated_jobs_may_run_pipelines_across_types_and_has_homogeneous_may_not():
    job = WorkloadJob(
        id=1,
        submit_s=0,
        model="llama-2-7b",
        method="full",
        precision="bf16-mixed",
        seq_len=2048,
        global_batch=64,
        steps=100,
    )
    a = Attempt(job, steps=100)
    assert a.space.heterogeneous
    assert HasPolicy(heterogeneous=True).name == "has" and HasPolicy(heterogeneous=False).name == "has-homogeneous"


def test_the_pipelines_model_flops_utilisation_is_not_above_one_type_alone():
    """FlashFlex (arXiv 2409.01143, abstract; benchmarks/data/hetero_published.json): pipelines over unequal GPUs
    reach at best about the model FLOPs utilisation of homogeneous GPUs of the same total peak, from 0.30% to
    11.61% below at the least. HAS's model must not predict a pipeline more efficient than its types alone, each
    weighted by the peak it brings (the A100's GEMMs reach more of their peak than the H100's, 0.618 against 0.453,
    docs/marp.md "Step time": a pipeline with A100s beats the H100s alone per peak FLOP)."""
    req, w, _ = _llama2_7b()
    work = flops_per_token(w, "none") * req.global_batch * w.seq_len * req.steps

    def mfu(chosen: Allocation) -> float:
        peak = sum(catalog()[c.gpu_model].peak_tflops(w.precision) * TFLOPS * c.gpus for c in chosen.components)
        return work / (chosen.run_time_s * peak)

    pipeline = _decide(_h100s_busy(free_nodes=3, hours=24), share=1.0).chosen
    h100 = _decide(_h100s_busy(free_nodes=4, hours=24), share=1.0).chosen
    a100 = _decide(_h100s_busy(free_nodes=0, hours=24), share=1.0).chosen
    assert pipeline.kind == "heterogeneous" and h100.kind == a100.kind == "homogeneous"
    assert [c.gpu_model for c in a100.components] == ["A100-40GB"]
    alone = {"H100-SXM": mfu(h100), "A100-40GB": mfu(a100)}
    peaks = {c.gpu_model: catalog()[c.gpu_model].peak_tflops(w.precision) * c.gpus for c in pipeline.components}
    weighted = sum(alone[t] * p for t, p in peaks.items()) / sum(peaks.values())
    gap = 1.0 - mfu(pipeline) / weighted
    assert 0.0 <= gap <= 0.25, gap


def test_a_pipeline_is_chosen_where_no_single_type_holds_the_job():
    """Llama-2-7B over 2 A100-40GBs and 4 V100-32GBs: neither pool alone holds it (a pipeline's stages do), so
    there is no homogeneous completion to beat and the margin does not apply."""
    pools = [("a100", "A100-40GB", 1, 2), ("v100", "V100-32GB", 1, 4)]
    view = synthetic(pools)
    req, w, space = _llama2_7b()
    forget_kept()
    d = decide_job(req, w, space, view, synthetic_site(pools), None, view.taken_at)
    assert d.chosen.kind == "heterogeneous"
    assert not [a for a in d.alternatives if a.allocation and a.allocation.kind == "homogeneous"]


def test_a_pipeline_takes_at_most_the_sites_share_of_each_pool_where_one_within_it_holds_the_job():
    """With the default max_job_share (half a pool): one H100 node free and the A100s free. The pipeline of the
    test above takes more than half of the A100s, and the job fits within half of a pool, so that pipeline is
    refused as a homogeneous allocation over the share is; a pipeline within the share of both pools stays a
    candidate (the first pool's stages are tried within the share too). Before, a pair of pools with no candidate
    within the share kept its smallest, so a pipeline took whole pools for a job a share of one holds, and the
    users who do not plan with frenzy-slurm waited (docs/has.md, "Where has loses to sia")."""
    view = _h100s_busy(free_nodes=3, hours=24)
    d = _decide(view)
    share = synthetic_site(POOLS).max_job_share
    assert d.chosen.kind == "homogeneous"
    kept = [
        a.allocation
        for a in d.alternatives
        if a.allocation and a.allocation.kind == "heterogeneous" and "max_job_share" not in a.lost_because
    ]
    refused = [
        a.allocation
        for a in d.alternatives
        if a.allocation and a.allocation.kind == "heterogeneous" and "max_job_share" in a.lost_because
    ]
    assert refused, "the pipelines over the share are refused, with the share as the reason"
    for alloc in kept:
        for c in alloc.components:
            assert c.nodes * c.gpus_per_node <= share * 32, (c.partition, c.nodes, c.gpus_per_node)
    # with the share off, the same view takes the whole-pool pipeline
    assert _decide(view, share=1.0).chosen.kind == "heterogeneous"
