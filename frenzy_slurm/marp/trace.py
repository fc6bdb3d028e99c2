"""Exact parameter counts on the meta device, and fake-tensor measurement of one training step.

Both import torch, so callers import this module lazily (fsbatch --dry-run never does unless the
user asks to trace a model factory).

Trust model (docs/security.md): `model.factory` names code that runs on the login node. It is imported
and called only when the user opts in (`--trace-factory`), never from Python's standard library or
builtins (`os:system`, `subprocess:getoutput`), and with keyword arguments checked against the
function's signature before it is called. It must also be the user's own code: every file the import
runs and the file defining the function are the user's, writable by nobody else, and outside Python's
installed packages (so `torch.hub:load` or setuptools' `spawn`, which run whatever they are given, are
refused), unless the site file lists the factory under `trusted_factories`.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os
import site
import stat
import sys
import sysconfig
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.arch import Architecture

_STDLIB = frozenset(sys.stdlib_module_names) | frozenset(sys.builtin_module_names)


def _top(module: str) -> str:
    return module.split(".", 1)[0]


def refuse_stdlib(factory: str) -> None:
    """A factory is a model builder from the user's package, never a standard-library callable."""
    module_name = factory.partition(":")[0]
    if _top(module_name) in _STDLIB:
        raise InputError(
            f"model.factory '{factory}': '{_top(module_name)}' is part of Python's standard library, "
            "which builds no models; name a function of your own package, e.g. mypkg.models:build."
        )


def allow_listed(factory: str, allowed: Iterable[str]) -> bool:
    """The site's `trusted_factories`: `pkg.mod:fn` exactly, or `pkg` / `pkg.mod` for every factory in it."""
    module_name = factory.partition(":")[0]
    for entry in allowed:
        if ":" in entry:
            if entry == factory:
                return True
        elif module_name == entry or module_name.startswith(entry + "."):
            return True
    return False


def _installed_dirs() -> list[Path]:
    """Where Python keeps installed software: the standard library and every site-packages directory."""
    paths = {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages())
    return [Path(p).resolve() for p in paths if p]


def _module_files(module_name: str) -> list[Path] | str:
    """The files importing `module_name` runs (each package's __init__ on the way, then the module), found as
    the import system would find them but without running any of them; or why there is no such file."""
    files: list[Path] = []
    search: list[str] | None = None
    parts = module_name.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            spec = next(
                (
                    found
                    for finder in sys.meta_path
                    if hasattr(finder, "find_spec")
                    if (found := finder.find_spec(name, search)) is not None
                ),
                None,
            )
        if spec is None:
            return f"no module {name} on the Python path"
        if spec.origin in (None, "namespace") and spec.submodule_search_locations is not None:
            pass  # a namespace package: no file of its own runs
        elif not spec.origin or not os.path.isfile(spec.origin):
            return f"{name} is {spec.origin or 'not a file'} (built into Python), not a file of yours"
        else:
            files.append(Path(spec.origin))
        search = list(spec.submodule_search_locations or [])
    return files


def _group_private(gid: int, uid: int) -> bool:
    """A user-private group (Debian's umask 002): its only member is the user, so its write bit lets no one in."""
    import grp
    import pwd

    try:
        group, user = grp.getgrgid(gid), pwd.getpwuid(uid)
    except KeyError:
        return False
    return group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def _not_yours(path: Path) -> str | None:
    """Why `path` (a module file) is not the user's own code: installed software, someone else's file, or a
    file or directory that others can write (a planted or edited module would run as the user)."""
    real = path.resolve()
    for installed in _installed_dirs():
        if real.is_relative_to(installed):
            return f"{real} is installed software (under {installed}), not a file of yours"
    uid = os.geteuid()
    for target in (real, real.parent):
        try:
            st = os.stat(target)
        except OSError as exc:
            return f"{target} cannot be checked ({exc.strerror})"
        if st.st_uid != uid:
            return f"{target} belongs to uid {st.st_uid}, not to you"
        if st.st_mode & stat.S_IWOTH or (st.st_mode & stat.S_IWGRP and not _group_private(st.st_gid, uid)):
            return f"{target} is writable by other users"
    return None


def _refuse_unless_yours(factory: str, module_name: str, files: list[Path] | str) -> None:
    problem = files if isinstance(files, str) else next((p for f in files if (p := _not_yours(f))), None)
    if problem:
        raise InputError(
            f"model.factory '{factory}': {problem}. --trace-factory imports and calls only your own model code (a "
            f"file you own, writable by no one else, outside Python's installed packages), since importing and "
            f"calling {module_name} runs it as you. To fix: put the model builder in a module of your own (e.g. "
            "beside model.yaml, on PYTHONPATH), drop --trace-factory (factory_arch gives the numbers), or ask the "
            "site's admins to list it under trusted_factories in the site file."
        )


def load_factory(factory: str, kwargs: dict[str, Any], allowed: Iterable[str] = ()) -> Callable[..., Any]:
    """Import the factory (this runs the module's top-level code) and check kwargs against its signature.

    Before anything is imported, every file the import would run must be the user's own (see _not_yours),
    unless the site's `trusted_factories` lists the factory; after it, so must the file defining the function
    (a module of yours re-exporting `torch.hub.load` is refused too).
    """
    refuse_stdlib(factory)
    module_name, _, fn_name = factory.partition(":")
    trusted = allow_listed(factory, allowed)
    if not trusted:
        _refuse_unless_yours(factory, module_name, _module_files(module_name))
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise InputError(f"model.factory '{factory}': cannot import ({exc}). Is the module on PYTHONPATH?") from None
    except Exception as exc:  # the module's own top-level code failed
        raise InputError(
            f"model.factory '{factory}': importing {module_name} raised {type(exc).__name__}: {exc}"
        ) from None
    origin = getattr(fn, "__module__", None) or ""
    if _top(origin) in _STDLIB or not callable(fn):  # e.g. `from os import system` re-exported by a package
        raise InputError(
            f"model.factory '{factory}' is {'not callable' if not callable(fn) else f'{origin}.{fn_name}'}"
            "; name a function that builds and returns a torch.nn.Module."
        )
    if not trusted and origin and origin != module_name:  # re-exported from another module: that one runs
        defined = getattr(sys.modules.get(origin), "__file__", None)
        _refuse_unless_yours(factory, origin, [Path(defined)] if defined else f"{origin} has no source file")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None
    if sig is not None:
        try:
            sig.bind(**kwargs)
        except TypeError as exc:
            raise InputError(
                f"model.factory_kwargs: {exc} for {factory}{sig}; use only its keyword arguments."
            ) from None
    return fn


def _call_factory(factory: str, kwargs: dict[str, Any], allowed: Iterable[str] = ()) -> Any:  # the user's module
    fn = load_factory(factory, kwargs, allowed)
    try:
        return fn(**kwargs)
    except Exception as exc:
        raise InputError(
            f"model.factory '{factory}' raised {type(exc).__name__}: {exc} (with model.factory_kwargs {kwargs})."
        ) from None


def count_factory_parameters(factory: str, kwargs: dict[str, Any] | None = None, allowed: Iterable[str] = ()) -> int:
    """Build the module on the meta device (no memory, no weights) and count its parameters. `allowed` is the
    site file's `trusted_factories`."""
    try:
        import torch
    except ImportError:
        raise InputError("model.factory needs torch to trace the model; install frenzy-slurm[train].") from None
    with torch.device("meta"):
        module = _call_factory(factory, kwargs or {}, allowed)
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

    # imports torch at its top
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
