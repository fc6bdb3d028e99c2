"""Exact parameter counts on the meta device, and fake-tensor measurement of one training step.

Both import torch, so callers import this module lazily (fsbatch --dry-run never does unless the
user asks to trace a model factory).

Trust model (docs/security.md): `model.factory` names code that runs on the login node. It is imported
and called only when the user opts in (`--trace-factory`), never from Python's standard library or
builtins (`os:system`, `subprocess:getoutput`), and with keyword arguments checked against the
function's signature before it is called.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from typing import Any

from frenzy_slurm.errors import InputError
from frenzy_slurm.jobspec.arch import Architecture


_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def refuse_stdlib(factory: str) -> None:
    """A factory is a model builder from the user's package, never a standard-library callable."""
    module_name = factory.partition(":")[0]
    if _top(module_name) in _STDLIB:
        raise InputError(f"model.factory '{factory}': '{_top(module_name)}' is part of Python's standard library, "
                         "which builds no models; name a function of your own package, e.g. mypkg.models:build.")


def load_factory(factory: str, kwargs: dict[str, Any]):
    """Import the factory (this runs the module's top-level code) and check kwargs against its signature."""
    refuse_stdlib(factory)
    module_name, _, fn_name = factory.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"model.factory '{factory}': cannot import ({exc}). Is the module on PYTHONPATH?") from None
    except Exception as exc:  # the module's own top-level code failed
        raise InputError(f"model.factory '{factory}': importing {module_name} raised {type(exc).__name__}: "
                         f"{exc}") from None
    origin = getattr(fn, "__module__", None) or ""
    if _top(origin) in _STDLIB or not callable(fn):  # e.g. `from os import system` re-exported by a package
        raise InputError(f"model.factory '{factory}' is {'not callable' if not callable(fn) else f'{origin}.{fn_name}'}"
                         "; name a function that builds and returns a torch.nn.Module.")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind(**kwargs)
        except TypeError as exc:
            raise InputError(f"model.factory_kwargs: {exc} for {factory}{sig}; use only its keyword "
                             "arguments.") from None
    return fn


def _call_factory(factory: str, kwargs: dict[str, Any]):
    fn = load_factory(factory, kwargs)
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise InputError(f"model.factory '{factory}' raised {type(exc).__name__}: {exc} (with model.factory_kwargs "
                         f"{kwargs}).") from None


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
