"""The faster MARP candidate search and HAS decision decide exactly what the plain loop decides.

`_reference_search` (and `_reference_plans`) is `marp.candidates.search` as it was before the search skipped estimates
(commit ca31e50): every plan estimated, in order, each group ending at the first plan that fits
nowhere. The optimised search must return equal candidates (same plans, memory, step times, in the
same order) and `decide()` equal decisions on synthetic clusters, busy and idle, for several jobs.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Hashable

import pytest

from frenzy_slurm.has import Requirements, decide
from frenzy_slurm.has.pools import usable_pools
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import Candidate, GpuOption, SearchSpace, _counts, search
from frenzy_slurm.marp.memory import MemoryEstimate, Overheads, estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.speed import plan_costs
from frenzy_slurm.sim.synthetic import LARGE, synthetic, synthetic_site
from frenzy_slurm.units import GiB
from tests.helpers import LOCAL, fill, make_spec

decide_module = importlib.import_module("frenzy_slurm.has.decide")  # the module (the package exports the function)
MEDIUM = [("a100", "A100-80GB", 16, 8), ("v100", "V100-32GB", 32, 8), ("t4", "T4", 32, 4)]  # the simulator's 512


def _reference_plans(w: Workload, world: int, global_batch: int, space: SearchSpace, gpus_per_node: int):
    a = w.arch
    for tp in space.tp_degrees:
        if tp > world or tp > gpus_per_node or a.heads % tp or a.kv % tp or world % tp:
            continue
        for pp in space.pp_degrees:
            if pp > a.layers or world % (tp * pp):
                continue
            dp = world // (tp * pp)
            if dp > global_batch or global_batch % dp:
                continue
            for zero in space.zero_stages:
                if (zero > 0 and dp == 1) or (zero >= 2 and pp > 1):
                    continue
                if dp > 1 and zero < (1 if pp > 1 else 2) and (1 if pp > 1 else 2) in space.zero_stages:
                    continue
                for rc in space.recompute:
                    if rc == "selective" and w.activations.attention != "eager":
                        continue
                    mbs = (
                        [space.micro_batch]
                        if space.micro_batch
                        else [
                            m
                            for m in (1 << i for i in range(8))
                            if m <= space.max_micro_batch and (global_batch // dp) % m == 0
                        ]
                    )
                    group = []
                    for mb in mbs:
                        if (global_batch // dp) % mb:
                            continue
                        ga = global_batch // (dp * mb)
                        group.append(
                            ParallelPlan(
                                dp=dp,
                                tp=tp,
                                pp=pp,
                                zero=zero,
                                micro_batch=mb,
                                grad_accum=ga,
                                recompute=rc,
                                sequence_parallel=tp > 1,
                            )
                        )
                    if group:
                        yield group


def _reference_search(
    w: Workload,
    options: list[GpuOption],
    global_batch: int,
    steps: int,
    max_gpus: int | None = None,
    space: SearchSpace | None = None,
) -> dict[Hashable, list[Candidate]]:
    space = space or SearchSpace()
    limit = max_gpus or max((o.max_gpus for o in options), default=0)
    largest = max((o.usable_bytes - o.overhead_bytes(1) for o in options), default=0.0)
    frag = Overheads(fragmentation=space.fragmentation)
    memo: dict[ParallelPlan, MemoryEstimate] = {}
    out: dict[Hashable, list[Candidate]] = {o.name: [] for o in options}
    counts = {o.name: set(_counts(o, limit)) for o in options}
    worlds = sorted(set().union(*counts.values())) if counts else []
    for world in worlds:
        users = [o for o in options if world in counts[o.name]]
        gpn = max(o.gpus_per_node for o in users)
        best: dict[str, Candidate] = {}
        for group in _reference_plans(w, world, global_batch, space, gpn):
            for plan in group:
                est = memo.get(plan) or estimate_memory(w, plan, "reserved", frag, peak_stages_only=True)
                memo[plan] = est
                if est.peak > largest:
                    break
                costs = plan_costs(w, plan, global_batch)
                for o in users:
                    extra = o.overhead_bytes(world)
                    if est.peak + extra > o.usable_bytes or plan.tp > o.gpus_per_node:
                        continue
                    t = costs.seconds_on(o.spec, o.links)
                    cur = best.get(o.name)
                    if cur is None or t < cur.step_time_s:
                        best[o.name] = Candidate(o.name, world, plan, est, o.usable_bytes / GiB, t, steps, extra / GiB)
        for name, cand in best.items():
            out[name].append(cand)
    for name in out:
        out[name].sort(key=lambda c: c.step_time_s)
    return out


SPECS = {
    "gpt2-medium": dict(),
    "gpt2-medium-seq4k-mb2": dict(training__seq_len=4096, training__micro_batch=2),
    "gpt2-medium-full-ckpt": dict(training__activation_checkpointing="full", training__global_batch=256),
    "gpt2-medium-script-tp": dict(entry={"trainer": "script", "script": "train.py"}),
    "llama2-7b": dict(model={"preset": "llama-2-7b"}, training__global_batch=128),
    "llama3-8b-lora": dict(
        model={"preset": "llama-3-8b"},
        training__method="lora",
        training__global_batch=32,
        entry={"trainer": "script", "script": "train.py"},
    ),
    "llama2-13b-qlora": dict(
        model={"preset": "llama-2-13b"},
        training__method="qlora",
        training__global_batch=16,
        entry={"trainer": "script", "script": "train.py"},
    ),
    "llama2-70b": dict(model={"preset": "llama-2-70b"}, training__global_batch=512, training__seq_len=2048),
    "tinyllama-fp32": dict(model={"preset": "tinyllama-1.1b"}, training__precision="fp32", training__global_batch=96),
}


def _job(name: str):
    spec = make_spec(**SPECS[name])
    model = resolve_model(spec, ".")
    return spec, workload_from_spec(spec, model), search_space_from_spec(spec)


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("pools", [LOCAL, MEDIUM, LARGE], ids=["local", "512", "2048"])
def test_search_equals_the_plain_loop(name, pools):
    spec, w, space = _job(name)
    view = synthetic(pools, busy=0.3, seed=2)
    opts = [p.option for p in usable_pools(Requirements.from_spec(spec), view, synthetic_site(pools))[0]]
    for max_gpus in (None, 16):
        got = search(w, opts, spec.training.global_batch, 100, max_gpus, space)
        want = _reference_search(w, opts, spec.training.global_batch, 100, max_gpus, space)
        assert got == want
    assert any(got.values()) or name == "llama2-70b"


@pytest.mark.parametrize("name", ["gpt2-medium", "llama2-7b", "llama3-8b-lora", "llama2-13b-qlora", "tinyllama-fp32"])
@pytest.mark.parametrize(
    "pools,busy",
    [(LOCAL, 0.0), (LOCAL, 0.7), (MEDIUM, 0.5), (LARGE, 0.0), (LARGE, 0.7)],
    ids=["local-idle", "local-busy", "512-half", "2048-idle", "2048-busy"],
)
def test_decision_equals_the_plain_loop(name, pools, busy, monkeypatch):
    spec, w, space = _job(name)
    site = synthetic_site(pools)
    view = synthetic(pools, busy=busy, seed=3)
    if pools is LOCAL and busy:
        view = fill(view, "a100", minutes=30)  # the fastest type must wait: starts from the view
    req = Requirements.from_spec(spec)

    def run():
        d = decide(req, w, view, site, space, backend=None, now=view.taken_at)
        return d.model_dump(exclude={"decision_ms"})

    got = run()
    monkeypatch.setattr(decide_module, "search", _reference_search)
    want = run()
    assert got == want
    assert got["chosen"]["components"]


@pytest.mark.parametrize("huge_mb", [1, 2, 4, 8])
def test_search_ends_groups_where_the_plain_loop_does(huge_mb, monkeypatch):
    """With a memory model that is not monotone in micro-batch (one micro-batch of the slower groups fits
    nowhere, the next ones do), plans after it in its group stay out, as in the plain loop."""
    from frenzy_slurm.marp import candidates

    real = candidates.estimate_memory

    def odd(w, plan, *args, **kwargs):
        est = real(w, plan, *args, **kwargs)
        if plan.micro_batch == huge_mb and (plan.zero == 3 or plan.recompute == "full" or plan.pp > 1):
            big = dataclasses.replace(est.stages[0], overhead=1e15)
            est = MemoryEstimate(plan=est.plan, metric=est.metric, stages=(big,))
        return est

    monkeypatch.setattr(candidates, "estimate_memory", odd)
    monkeypatch.setitem(globals(), "estimate_memory", odd)
    for name in ("gpt2-medium", "llama2-7b", "gpt2-medium-script-tp"):
        spec, w, space = _job(name)
        view = synthetic(MEDIUM, busy=0.3, seed=2)
        opts = [p.option for p in usable_pools(Requirements.from_spec(spec), view, synthetic_site(MEDIUM))[0]]
        got = search(w, opts, spec.training.global_batch, 100, None, space)
        assert got == _reference_search(w, opts, spec.training.global_batch, 100, None, space)


@pytest.mark.parametrize("policy", ["has", "has-homogeneous", "ilp"])
def test_simulation_is_the_same_with_the_plain_search(policy, monkeypatch):
    """A whole simulated run (30 jobs, prediction errors, OOMs and resubmissions, a pending queue) places
    every job the same way with the faster search as with the plain one. (When GPUs free up has one engine,
    `slurm.releases.GpuTimeline`, checked against its definition in tests/test_release_engine.py.)"""
    from pathlib import Path

    from frenzy_slurm.sim import ErrorModel, ilp, load_workload, parse_compact, policies, simulate

    wl = load_workload(Path(__file__).parent / "data" / "sim" / "philly-seed2-30.yaml")
    cluster = parse_compact("A100-80GB:1x8,V100-32GB:2x8,T4:2x4")

    def run():
        r = simulate(wl, cluster, policy, seed=2, errors=ErrorModel())
        return [dataclasses.asdict(rec) for rec in r.records], r.timeline

    got = run()
    for module in (decide_module, policies, ilp):
        monkeypatch.setattr(module, "search", _reference_search)
    want = run()
    assert got == want
    assert all(rec["state"] == "done" for rec in got[0])
