"""The candidate search's memo of memory terms (marp/memory_memo.py) changes no estimate: for each example job,
every plan the search may estimate (every group, micro-batch and GPU count up to 64) gives the same MemoryEstimate,
byte for byte, with one memo shared by all of them as without one."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.jobspec import load_job_spec, resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import plan_groups
from frenzy_slurm.marp.memory import Overheads, estimate_memory
from frenzy_slurm.marp.memory_job import job
from frenzy_slurm.marp.memory_memo import TermMemo

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _example(name: str):
    spec = load_job_spec(EXAMPLES / f"{name}.yaml")
    return spec, workload_from_spec(spec, resolve_model(spec, EXAMPLES))


@pytest.mark.parametrize("name", ["llama2-7b", "gpt2-medium", "llama3-8b-lora", "qwen2-1.5b-qlora", "tiny-cpu"])
def test_memo_changes_no_estimate(name):
    spec, w = _example(name)
    space = search_space_from_spec(spec)
    frag = Overheads(fragmentation=space.fragmentation)
    memo = TermMemo(w)
    plans = 0
    for world in (1, 2, 4, 8, 16, 32, 64):
        for g in plan_groups(w, world, spec.training.global_batch, space, 8):
            for mb in g.micro_batches:
                plan = g.plan(mb)
                for metric in ("reserved", "device"):
                    plain = estimate_memory(w, plan, metric, frag, peak_stages_only=True)
                    memoised = estimate_memory(w, plan, metric, frag, peak_stages_only=True, memo=memo)
                    assert memoised == plain, plan.short()  # dataclass equality: every stage's every float
                    assert memoised.peak == plain.peak
                plans += 1
    assert plans > 5  # (the tiny CPU job has 11)
    assert memo.hits > memo.misses  # the terms are shared: most lookups find their entry


def test_memo_refuses_another_workload():
    spec, w = _example("llama2-7b")
    _, other = _example("gpt2-medium")
    plan = next(plan_groups(w, 8, spec.training.global_batch, search_space_from_spec(spec), 8)).plan(1)
    with pytest.raises(ValueError, match="one workload"):
        job(other, plan, TermMemo(w))
