"""Exact parameter counts on the meta device, and fake-tensor measurement of one training step.

Both import torch, so callers import this module lazily (fsbatch --dry-run never does unless a
model is given as a factory).
"""

from __future__ import annotations

import importlib
from typing import Any

from frenzy_slurm.errors import InputError
from frenzy_slurm.spec.arch import Architecture


def _call_factory(factory: str, kwargs: dict[str, Any]):
    module_name, _, fn_name = factory.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"model.factory '{factory}': cannot import ({exc}). Is the module on PYTHONPATH?") from None
    return fn(**kwargs)


def count_factory_parameters(factory: str, kwargs: dict[str, Any] | None = None) -> int:
    """Build the module on the meta device (no memory, no weights) and count its parameters."""
    try:
        import torch
    except ImportError:
        raise InputError("model.factory needs torch to trace the model; install frenzy-slurm[train].") from None
    with torch.device("meta"):
        module = _call_factory(factory, kwargs or {})
    if not isinstance(module, torch.nn.Module):
        raise InputError(f"model.factory '{factory}' returned {type(module).__name__}, not a torch.nn.Module")
    seen: set[int] = set()
    total = 0
    for p in module.parameters():  # tied weights are counted once
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    return total


def fake_step_peak(arch: Architecture, seq_len: int, micro_batch: int, steps: int = 2) -> dict[str, int]:
    """Peak bytes of fp32 AdamW training steps of the built-in GPT, under FakeTensorMode (no real memory).

    Returns MemTracker's peak snapshot for the CPU device: per category and 'Total'.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from frenzy_slurm.models.gpt import GPT, lm_loss

    with FakeTensorMode():
        model = GPT(arch)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
        tokens = torch.randint(0, arch.vocab, (micro_batch, seq_len))
        tracker = MemTracker()
        tracker.track_external(model, opt, tokens)
        with tracker:
            for _ in range(steps):
                tracker.reset_mod_stats()
                loss = lm_loss(model(tokens), tokens)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss
        snap = tracker.get_tracker_snapshot("peak")
    dev = next(iter(snap))
    return {str(k): int(v) for k, v in snap[dev].items()}
