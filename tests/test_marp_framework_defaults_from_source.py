"""Framework defaults that change with the framework's or torch's release (marp/framework_facts.py), as the
profiles take them from model.yaml's entry.framework_version and entry.torch_version."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import estimate_memory, workload_from_spec
from frenzy_slurm.marp.frameworks import profile_summary
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import make_spec


def _spec(framework: str, version: str | None = None, torch: str | None = None, **over: object):
    entry: dict[str, object] = {"trainer": "script", "script": "train.py", "framework": framework}
    if version is not None:
        entry["framework_version"] = version
    if torch is not None:
        entry["torch_version"] = torch
    return make_spec(entry=entry, **over)


@pytest.mark.parametrize(
    ("version", "torch", "fused"),
    [
        ("4.45", "2.9", False),  # training_args.py: default_optim = "adamw_torch", the fused default commented out
        ("4.53", "2.9", False),
        ("4.54", "2.7", False),  # from 4.54: adamw_torch_fused only with torch >= 2.8
        ("4.54", "2.8", True),
        ("4.57.1", "2.8.1", True),
        ("5.17", "2.6", False),
        (None, None, True),  # the newest described transformers with a current torch
    ],
)
def test_the_trainers_default_optimizer_follows_transformers_and_torch(version, torch, fused):
    spec = _spec("hf-trainer", version, torch)
    w = workload_from_spec(spec, resolve_model(spec, "."))
    assert w.states.fused_optimizer is fused
    taken = profile_summary(spec)["defaults_taken"]
    assert isinstance(taken, dict) and taken["training.optimizer_impl"] == ("fused" if fused else "foreach")


def test_a_foreach_default_costs_a_state_sized_temporary_at_the_step():
    old, new = _spec("hf-trainer", "4.53", "2.9"), _spec("hf-trainer", "4.54", "2.9")
    plan = ParallelPlan()
    peaks = [
        estimate_memory(workload_from_spec(s, resolve_model(s, ".")), plan, "allocated").stages[0].peak
        for s in (old, new)
    ]
    assert peaks[0] > peaks[1]


def _torchtitan_peaks(pp: int, reshard: bool | None) -> list[float]:
    over = {"parallel": {"reshard_after_forward": reshard}} if reshard is not None else {}
    spec = _spec("torchtitan", **over)
    w = workload_from_spec(spec, resolve_model(spec, "."))
    est = estimate_memory(w, ParallelPlan(dp=2, pp=pp, zero=3, micro_batch=1, grad_accum=32), "allocated")
    return [s.peak / GiB for s in est.stages]


def test_torchtitan_keeps_pipeline_stages_gathered_with_unsharded_fp32_gradients():
    """torchtitan 0.3's default reshard policy is `not pp_enabled`, and torch's PipelineStage turns gradient sync
    off until the last micro-batch: with pp > 1 a stage holds its weights gathered and its whole gradient in fp32."""
    default = _torchtitan_peaks(pp=2, reshard=None)
    always = _torchtitan_peaks(pp=2, reshard=True)  # parallel.reshard_after_forward: true (torchtitan "always")
    spec = _spec("torchtitan")
    w = workload_from_spec(spec, resolve_model(spec, "."))
    assert w.comm.fsdp_pp_unsharded
    from frenzy_slurm.marp.params import count_params

    blocks = count_params(w.arch).per_layer * w.arch.layers / 2 / GiB  # one stage's blocks (G elements)
    for d, a in zip(default, always, strict=True):
        assert d - a > 3.0 * blocks  # the stage's fp32 gradient (4 B/param) beyond what resharding keeps
    # without pipeline stages the policy reshards as before
    assert _torchtitan_peaks(pp=1, reshard=None) == _torchtitan_peaks(pp=1, reshard=True)


def test_torchtitan_shards_over_the_context_parallel_ranks_at_dp_1():
    """torchtitan 0.3's FSDP mesh is dp_shard x cp and FSDP is always applied: two cp ranks at dp 1 hold half the
    states each, and the search offers no replicated (ZeRO 0) plan there."""
    from frenzy_slurm.marp import search_space_from_spec
    from frenzy_slurm.marp.candidates import plan_groups

    spec = _spec("torchtitan", parallel={"cp": 2, "tp": 1, "pp": 1})
    w = workload_from_spec(spec, resolve_model(spec, "."))
    groups = list(plan_groups(w, 2, 64, search_space_from_spec(spec), 8))
    assert {(g.dp, g.zero) for g in groups} == {(1, 3)}
    plan = groups[0].plan(groups[0].micro_batches[0])
    sharded = estimate_memory(w, plan, "allocated").stages[0]
    replicated = estimate_memory(w, plan.model_copy(update={"zero": 0}), "allocated").stages[0]
    assert sharded.peak < replicated.peak
    # a framework whose sharding is not over the cp ranks (Megatron's) keeps dp 1 unsharded
    mega = _spec("megatron", parallel={"cp": 2, "tp": 1, "pp": 1})
    wm = workload_from_spec(mega, resolve_model(mega, "."))
    assert {(g.dp, g.zero) for g in plan_groups(wm, 2, 64, search_space_from_spec(mega), 8)} == {(1, 0)}
