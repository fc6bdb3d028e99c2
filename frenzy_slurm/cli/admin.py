"""`frenzy-slurm`: admin and expert tools (memory estimates, presets; site config, simulation, calibration).

    frenzy-slurm memory examples/llama2-7b.yaml --gpu A100-80GB:16
    frenzy-slurm memory examples/llama2-7b.yaml --plan dp=8,zero=1,mb=2 --json
"""

from __future__ import annotations

from pathlib import Path

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import existing_file, print_json, reports_errors, table
from frenzy_slurm.cli.plan_view import candidate_json, candidate_rows, gpu_options, load, memory_json, memory_rows
from frenzy_slurm.errors import InputError, NoFitError
from frenzy_slurm.marp import estimate_memory, parse_plan, search, search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.memory import GiB


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="frenzy-slurm")
def main() -> None:
    """frenzy-slurm admin and expert tools: memory estimates and model presets."""


@main.command()
@click.argument("model_yaml", type=existing_file)
@click.option("--gpu", "gpus", multiple=True, metavar="TYPE[:COUNT]",
              help="GPU type from the catalog (repeatable), optionally with how many exist. Default: every catalog GPU.")
@click.option("--plan", "plan_text", metavar="dp=..,tp=..,pp=..,zero=..,mb=..", help="Estimate one plan instead of searching.")
@click.option("--metric", type=click.Choice(["allocated", "reserved", "device"]), default="device", show_default=True,
              help="What to estimate: torch max_memory_allocated, the allocator's reserved peak, or nvidia-smi used.")
@click.option("--max-gpus", type=click.IntRange(min=1), default=64, show_default=True, help="Largest GPU count searched.")
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True, help="Candidates shown per GPU type.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors("frenzy-slurm memory")
def memory(model_yaml: Path, gpus: tuple[str, ...], plan_text: str | None, metric: str, max_gpus: int, top: int,
           as_json: bool) -> None:
    """Per-GPU peak training memory of MODEL_YAML: one plan's breakdown, or the candidates per GPU type."""
    spec, model = load(model_yaml)
    w = workload_from_spec(spec, model)
    if plan_text:
        plan = parse_plan(plan_text)
        gb = spec.training.global_batch
        if gb % (plan.dp * plan.micro_batch):
            raise InputError(
                f"--plan: global_batch({gb}) is not a multiple of dp({plan.dp}) * mb({plan.micro_batch}); "
                "change dp or mb so that they divide it")
        if plan.grad_accum == 1:
            from dataclasses import replace

            plan = replace(plan, grad_accum=gb // (plan.dp * plan.micro_batch))
        if plan.tp > 1 and (w.arch.heads % plan.tp or w.arch.kv % plan.tp):
            raise InputError(f"--plan: tp({plan.tp}) must divide heads({w.arch.heads}) and kv_heads({w.arch.kv})")
        if plan.pp > w.arch.layers:
            raise InputError(f"--plan: pp({plan.pp}) > layers({w.arch.layers})")
        est = estimate_memory(w, plan, metric)  # type: ignore[arg-type]
        if as_json:
            print_json(memory_json(est))
            return
        header, rows = memory_rows(est)
        click.echo(f"{spec.name}: {model.name}, plan {plan.short()}, {metric} memory per GPU (GiB)")
        click.echo(table(rows, header))
        for opt in gpu_options(gpus, max_gpus) if gpus else []:
            fits = "fits" if est.peak <= opt.usable_bytes else "does NOT fit"
            click.echo(f"{opt.name}: {est.peak_gib:.1f} GiB of {opt.usable_bytes / GiB:.1f} usable -> {fits}")
        return
    options = gpu_options(gpus, max_gpus)
    cands = search(w, options, spec.training.global_batch, spec.training.total_steps, max_gpus,
                   search_space_from_spec(spec))
    if as_json:
        print_json(candidate_json(cands))
    else:
        header, rows = candidate_rows(cands, top)
        click.echo(f"{spec.name}: {model.name}; fastest plans per GPU type (device memory incl. overhead)")
        click.echo(table(rows, header))
    if not any(cands.values()):
        raise NoFitError(
            f"{spec.name} fits on none of the GPU types within {max_gpus} GPUs. To fix: allow more GPUs (--max-gpus), "
            "ZeRO-3/offload, a shorter seq_len, or LoRA.")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def presets(as_json: bool) -> None:
    """List the built-in model presets and their parameter counts."""
    from frenzy_slurm.marp.params import count_params
    from frenzy_slurm.spec import presets as all_presets

    items = all_presets()
    if as_json:
        print_json({n: {"source": p.source, "params": count_params(p.arch).total(p.arch.layers), **p.arch.model_dump()}
                    for n, p in items.items()})
        return
    rows = [[n, f"{count_params(p.arch).total(p.arch.layers) / 1e9:.3f}B", str(p.arch.layers), str(p.arch.hidden),
             f"{p.arch.heads}/{p.arch.kv}", str(p.arch.vocab), p.source] for n, p in items.items()]
    click.echo(table(rows, ["preset", "params", "layers", "hidden", "heads/kv", "vocab", "source"]))


@main.command("spec-reference")
def spec_reference() -> None:
    """Print the model.yaml reference (Markdown) generated from the schema."""
    from frenzy_slurm.spec.reference import render

    click.echo(render(), nl=False)
