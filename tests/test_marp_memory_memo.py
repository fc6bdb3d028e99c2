"""The candidate search's memo of memory terms (marp/memory_memo.py) changes no estimate: for each example job,
every plan the search may estimate (every group, micro-batch and GPU count up to 64) gives the same MemoryEstimate,
byte for byte, with one memo shared by all of them as without one; searches sharing one memo (has/kept.py) return
what each returns alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.has.kept import Kept
from frenzy_slurm.jobspec import load_job_spec, resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import GpuOption, plan_groups, search
from frenzy_slurm.marp.memory import Overheads, estimate_memory
from frenzy_slurm.marp.memory_job import job
from frenzy_slurm.marp.memory_memo import TermMemo
from tests.test_has_search_speed import _reference_search

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


def test_one_memo_over_several_searches_changes_no_candidate():
    """HAS's fallback plans search the same workload again over less usable memory, sharing one memo (has/kept.py):
    each search returns what the plain loop returns (every plan estimated without a memo), and the later ones find
    the estimates the first made."""
    spec, w = _example("llama2-7b")
    space = search_space_from_spec(spec)
    catalog_ = catalog()
    memo = TermMemo(w)
    for fraction in (0.95, 0.8, 0.6):
        opts = [GpuOption(n, catalog_[n], 64, usable_fraction=fraction) for n in ("A100-40GB", "H100-SXM", "T4")]
        alone = _reference_search(w, opts, spec.training.global_batch, 100, None, space)  # every plan, no memo
        misses = memo.misses
        shared = search(w, opts, spec.training.global_batch, 100, None, space, memo)
        assert shared == alone
        if fraction < 0.95:
            assert memo.misses - misses < memo.hits  # mostly found: the plans are those the first search estimated
    assert sum(len(c) for c in alone.values()) > 3


def test_kept_memo_is_one_per_workload_until_forgotten():
    spec, w = _example("llama2-7b")
    _, equal = _example("llama2-7b")  # another object, equal by value
    _, other = _example("gpt2-medium")
    kept = Kept()
    assert equal is not w and kept.memo(equal) is kept.memo(w)
    assert kept.memo(other) is not kept.memo(w)
    first = kept.memo(w)
    kept.forget(searches=False)
    assert kept.memo(w) is first  # the release index only
    kept.forget()
    assert kept.memo(w) is not first
