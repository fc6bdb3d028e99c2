"""A job's pre-planned shapes (frenzy_slurm/render/shapes.py): which of HAS's allocations are kept, and which one
the runtime runs, from what Slurm says the job got."""

from __future__ import annotations

import json

import pytest

from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
from frenzy_slurm.render.ds_config import ds_config
from frenzy_slurm.render.shapes import MAX_SHAPES, pick, shape, shape_allocations
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.fake import FakeSlurm

from .helpers import make_spec

# two partitions of the same A100s (a site's short and long queue) and one of T4s
POOLS = [("short", "A100-40GB", 2, 4), ("long", "A100-40GB", 2, 4), ("t4", "T4", 4, 4)]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("shapes")
    view = synthetic(POOLS)
    slurm = FakeSlurm(view)
    # as a job marked slurm.replan is planned: one partition's GPUs (no pipeline across the two A100 partitions)
    spec = make_spec(name="s", model={"preset": "gpt2-medium"}, training__steps=2000, parallel__heterogeneous=False)
    job = JobFile(tmp / "s.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(), job_dir=tmp / "jobs" / "s", now=slurm.now, env_check="off")
    return spec, plan_job(job, SiteFile(synthetic_site(POOLS)), slurm, opts).plan.decision


def test_the_chosen_allocation_comes_first_then_others_of_its_gpu_type(planned):
    _, decision = planned
    allocs = shape_allocations(decision)
    assert 2 <= len(allocs) <= MAX_SHAPES
    assert allocs[0] == decision.chosen
    chosen = decision.chosen.components[0]
    keys = [(a.components[0].partition, a.components[0].nodes, a.components[0].gpus_per_node) for a in allocs]
    assert len(set(keys)) == len(keys)
    for a in allocs:
        assert a.components[0].gpu_type == chosen.gpu_type
        assert a.time_min <= decision.chosen.time_min


def test_the_runtime_runs_the_shape_slurm_gave_the_job(planned):
    spec, decision = planned
    shapes = [shape(a, ds_config(spec, a.plan)) for a in shape_allocations(decision)]
    for s in shapes:
        env = {"SLURM_JOB_PARTITION": s.partition, "SLURM_JOB_NUM_NODES": str(s.nodes)}
        env["SLURM_GPUS_ON_NODE"] = str(s.gpus_per_node)
        got = pick(shapes, env)
        assert got is s
        assert got.ds_config["train_batch_size"] == spec.training.global_batch
        assert got.allocation.plan.world == s.nodes * s.gpus_per_node


def test_a_shape_that_was_not_planned_is_refused_with_what_was(planned):
    spec, decision = planned
    shapes = [shape(a, ds_config(spec, a.plan)) for a in shape_allocations(decision)]
    env = {"SLURM_JOB_PARTITION": "t4", "SLURM_JOB_NUM_NODES": "3", "SLURM_GPUS_ON_NODE": "1"}
    with pytest.raises(FrenzyError, match=r"partition t4 with 3 node\(s\) x 1 GPU\(s\).*planned: "):
        pick(shapes, env)
    with pytest.raises(FrenzyError, match="SLURM_GPUS_ON_NODE"):
        pick(shapes, {"SLURM_JOB_PARTITION": "t4", "SLURM_JOB_NUM_NODES": "1"})


def _request(tmp, replan: bool, share: float | None = None, **spec_over):
    slurm = FakeSlurm(synthetic(POOLS))
    spec = make_spec(name="r", model={"preset": "gpt2-medium"}, training__steps=2000, **spec_over)
    job = JobFile(tmp / "r.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(replan=replan), job_dir=tmp / "jobs" / "r", now=slurm.now, env_check="off")
    site = synthetic_site(POOLS)
    if share is not None:
        site = site.model_copy(update={"max_job_share": share})
    return plan_job(job, SiteFile(site), slurm, opts)


def test_slurm_replan_records_the_shapes_and_launches_the_shape_slurm_gave(tmp_path):
    from frenzy_slurm.jobdir.planfile import plan_from
    from frenzy_slurm.render.shapes import SRUN_AS_GIVEN, runs_as

    req = _request(tmp_path, replan=True)
    pf = plan_from(json.loads(req.files["plan.json"]), tmp_path / "plan.json")
    assert [s.allocation for s in pf.shapes] == shape_allocations(req.plan.decision)
    assert len(pf.shapes) >= 2
    assert f"srun {SRUN_AS_GIVEN}--kill-on-bad-exit=1" in req.files["job.sbatch"]
    other = pf.shapes[1]
    env = {"SLURM_JOB_PARTITION": other.partition, "SLURM_JOB_NUM_NODES": str(other.nodes)}
    ran, config = runs_as(pf, env | {"SLURM_GPUS_ON_NODE": str(other.gpus_per_node)})
    assert ran.decision.chosen == other.allocation and config == other.ds_config
    plain = _request(tmp_path / "plain", replan=False).plan
    assert runs_as(plain, env) == (plain, None)  # without shapes: plan.json as written


def test_without_slurm_replan_nothing_changes(tmp_path):
    req = _request(tmp_path, replan=False)
    assert req.plan.shapes == []
    assert "SLURM_GPUS_ON_NODE" not in req.files["job.sbatch"]


def test_slurm_replan_is_refused_for_a_script_job(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(InputError, match="slurm.replan: only jobs of the built-in trainer"):
        _request(tmp_path, replan=True, entry={"trainer": "script", "script": str(script)})


def test_a_job_marked_replan_is_planned_on_one_partition_and_not_with_a_pipeline_asked_for(tmp_path):
    """Without slurm.replan (and a site letting one job take whole pools: a pipeline is held to max_job_share of
    each pool, as any allocation) HAS lays this job over both A100 partitions (a pipeline finishing sooner); with
    it, on one partition, so that its shapes exist; asking for both is refused by name."""
    assert _request(tmp_path / "a", replan=False, share=1.0).plan.decision.chosen.kind == "heterogeneous"
    assert _request(tmp_path / "b", replan=True, share=1.0).plan.decision.chosen.kind == "homogeneous"
    with pytest.raises(InputError, match="slurm.replan .* parallel.heterogeneous"):
        _request(tmp_path / "c", replan=True, parallel__heterogeneous=True)
