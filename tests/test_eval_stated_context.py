"""A measurement that states the CUDA context its nvidia-smi reading includes: the reader writes what that stack's
user writes (entry.env CUDA_MODULE_LOADING), and the product's context for it is the pool's eager or lazy one."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval import reading
from frenzy_slurm.marp.overheads import EAGER_LOADING_CONTEXT_GIB, LAZY_LOADING_CONTEXT_GIB

from .test_eval_stated_defaults import _row


@pytest.mark.parametrize(
    ("text", "gib"),
    [
        ("NVML used memory; includes ~1343 MiB CUDA context + caching-allocator reserve", 1343 / 1024),
        ("nvidia-smi reading, CUDA context: 1.3 GB", 1.3),
        ("includes 1,100 MB of CUDA context", 1100 / 1024),
        ("the CUDA context is 420 MiB", 420 / 1024),
        ("nvml_used (nvidia-smi-like, incl. CUDA context)", None),  # a context named, no size: nothing read
        ("peak reserved 12 GiB", None),
    ],
)
def test_stated_context_sizes_are_read(text, gib):
    got = reading.stated_context_gib(text)
    assert got == (pytest.approx(gib) if gib is not None else None)


def _nvml_row(notes: str):
    return _row(metric_type="nvml_used (nvidia-smi-like, incl. CUDA context)", notes=notes)


def test_a_stated_eager_sized_context_is_planned_with_eager_module_loading():
    from frenzy_slurm.eval.dataset import interpret_row

    eager = interpret_row(_nvml_row("includes ~1343 MiB CUDA context + caching-allocator reserve"))
    assert eager.spec.entry.env == {"CUDA_MODULE_LOADING": "EAGER"}
    assert eager.overheads.context_gib == EAGER_LOADING_CONTEXT_GIB
    lazy = interpret_row(_nvml_row("includes ~400 MiB CUDA context"))
    assert lazy.spec.entry.env == {"CUDA_MODULE_LOADING": "LAZY"}
    assert lazy.overheads.context_gib == LAZY_LOADING_CONTEXT_GIB
    unstated = interpret_row(_nvml_row(""))
    assert unstated.spec.entry.env == {}
    assert unstated.overheads.context_gib == LAZY_LOADING_CONTEXT_GIB  # a current torch loads lazily
