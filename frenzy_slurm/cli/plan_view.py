"""Turning MARP results into tables and JSON for the commands (no Slurm, no torch)."""

from __future__ import annotations

from collections.abc import Hashable
from pathlib import Path
from typing import Any

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import GpuSpec, catalog, match_gpu
from frenzy_slurm.core.units import GiB, fmt_gib
from frenzy_slurm.jobspec import JobSpec, ResolvedModel, load_job_spec, resolve_model
from frenzy_slurm.marp import Candidate, GpuOption, MemoryEstimate, with_exact_params
from frenzy_slurm.marp.memory import COMPONENTS
from frenzy_slurm.slurm.timefmt import format_slurm_time


def load(path: Path, trace: bool = False, site: Path | None = None) -> tuple[JobSpec, ResolvedModel]:
    """model.yaml and its model. `trace` is the user's --trace-factory: consent to import and call
    model.factory on this machine (docs/security.md); without it no user code runs. With it, the factory
    must be the user's own code or listed in the site file's (`site`, or $FRENZY_SITE) trusted_factories."""
    spec = load_job_spec(path)
    model = resolve_model(spec, path.parent)
    if not trace or spec.model.factory is None:
        return spec, model
    from frenzy_slurm.site.tools import maybe_load_site

    site_cfg = maybe_load_site(site)
    return spec, with_exact_params(spec, model, tuple(site_cfg.trusted_factories) if site_cfg else ())


def factory_note(spec: JobSpec, model: ResolvedModel) -> str | None:
    """Whether user code from model.factory ran on this machine (for --explain and --json); None without one."""
    if spec.model.factory is None:
        return None
    if model.exact_params is not None:
        return (
            f"user code ran: model.factory {spec.model.factory} was imported and called on this machine "
            f"(--trace-factory); it has {model.exact_params:,} parameters"
        )
    return (
        f"model.factory {spec.model.factory} was not run: parameters come from factory_arch "
        "(--trace-factory imports and calls it here for an exact count)"
    )


def gpu_options(specs: tuple[str, ...], default_count: int) -> list[GpuOption]:
    """`--gpu A100-80GB:16` (count optional) -> options; none given: every catalog GPU."""
    if not specs:
        return [GpuOption(name, spec, default_count) for name, spec in catalog().items()]
    out = []
    for item in specs:
        name, _, count = item.partition(":")
        spec: GpuSpec | None = match_gpu(name)
        if spec is None:
            raise InputError(f"--gpu {item}: unknown GPU '{name}'. Known: {', '.join(catalog())}")
        if count and not count.isdigit():
            raise InputError(f"--gpu {item}: the count after ':' must be a whole number, e.g. --gpu A100-80GB:16")
        out.append(GpuOption(name, spec, int(count) if count else default_count))
    return out


def memory_rows(est: MemoryEstimate) -> tuple[list[str], list[list[str]]]:
    header = ["stage", "layers", "params(M)", *COMPONENTS, "peak", "at"]
    rows = []
    for s in est.stages:
        g = s.gib()
        rows.append(
            [
                str(s.stage),
                str(s.layers),
                f"{s.params / 1e6:.1f}",
                *(f"{g[c]:.2f}" for c in COMPONENTS),
                f"{g['peak']:.2f}",
                s.phase,
            ]
        )
    return header, rows


def memory_json(est: MemoryEstimate, gpu: str | None = None) -> dict[str, Any]:
    """One plan's estimate; `gpu`: the GPU it was fitted to (`MemoryEstimate.on_gpu`), named in `capped`."""
    out = {
        "plan": est.plan.short(),
        "metric": est.metric,
        "peak_gib": est.peak_gib,
        "needed_gib": est.needed / GiB,
        "stages": [
            {
                "stage": s.stage,
                "layers": s.layers,
                "params": s.params,
                "phase": s.phase,
                **s.gib(),
                "cached": s.cached / GiB,
                "released": s.released / GiB,
            }
            for s in est.stages
        ],
    }
    if est.released > 0:
        out["capped"] = {"gpu": gpu, "released_gib": est.released / GiB, "note": capped_note(est, gpu)}
    return out


def capped_note(est: MemoryEstimate, gpu: str | None) -> str | None:
    """The line saying that the variable-length cache was cut to what the GPU holds; None where nothing was."""
    if est.released <= 0:
        return None
    return (
        f"capped: {est.released / GiB:.2f} GiB of the variable-length cache left out on {gpu or 'this GPU'}: the "
        "caching allocator frees its cache and retries before it reports out of memory, so the reading stays "
        "within the GPU's memory less the CUDA context, NCCL and cuBLAS (needed unchanged)"
    )


def candidate_rows(cands: dict[Hashable, list[Candidate]], top: int) -> tuple[list[str], list[list[str]]]:
    header = ["gpu", "gpus", "plan", "peak", "usable", "step s", "run time"]
    rows = []
    for gpu, items in cands.items():
        if not items:
            rows.append([str(gpu), "-", "does not fit", "-", "-", "-", "-"])
            continue
        for c in items[:top]:
            rows.append(
                [
                    str(gpu),
                    str(c.gpus),
                    c.plan.short(),
                    fmt_gib(c.peak_gib),
                    fmt_gib(c.capacity_gib),
                    f"{c.step_time_s:.2f}",
                    hms(c.run_time_s),
                ]
            )
    return header, rows


def candidate_json(cands: dict[Hashable, list[Candidate]]) -> dict[str, list[dict[str, Any]]]:
    return {
        str(gpu): [
            {
                "gpus": c.gpus,
                "plan": c.plan.short(),
                "peak_gib": c.peak_gib,
                "usable_gib": c.capacity_gib,
                "step_time_s": c.step_time_s,
                "run_time_s": c.run_time_s,
            }
            | ({"capped": {"released_gib": c.memory.released / GiB}} if c.memory.released > 0 else {})
            for c in items
        ]
        for gpu, items in cands.items()
    }


hms = format_slurm_time  # the tables print durations as Slurm does: [D-]HH:MM:SS
