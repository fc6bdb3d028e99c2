"""`fsbatch`: plan and submit a training job without choosing GPUs.

    fsbatch examples/llama2-7b.yaml --dry-run

This release plans: it validates model.yaml and ranks GPU types and counts by MARP's memory and
step-time predictions. Submission to Slurm comes with the cluster view and HAS stages.
"""

from __future__ import annotations

from pathlib import Path

import click

from frenzy_slurm import __version__
from frenzy_slurm.cli.common import existing_file, print_json, reports_errors, table
from frenzy_slurm.cli.plan_view import candidate_json, candidate_rows, gpu_options, load
from frenzy_slurm.errors import FrenzyError, NoFitError
from frenzy_slurm.marp import search, search_space_from_spec, workload_from_spec


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("model_yaml", type=existing_file)
@click.option("--dry-run", is_flag=True, help="Plan and print the decision; submit nothing.")
@click.option("--explain", is_flag=True, help="Show the alternatives considered and why the chosen one won.")
@click.option("--gpu", "gpus", multiple=True, metavar="TYPE[:COUNT]", help="GPU types to plan for (default: every catalog GPU, 8 each).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.version_option(__version__, prog_name="fsbatch")
@reports_errors("fsbatch")
def main(model_yaml: Path, dry_run: bool, explain: bool, gpus: tuple[str, ...], as_json: bool) -> None:
    """Plan (and later submit) the training job described by MODEL_YAML."""
    spec, model = load(model_yaml)
    w = workload_from_spec(spec, model)
    limit = spec.limits.max_gpus
    options = gpu_options(gpus, limit or 8)
    if spec.limits.gpu_types:
        options = [o for o in options if o.name in spec.limits.gpu_types or o.spec.name in spec.limits.gpu_types]
    cands = search(w, options, spec.training.global_batch, spec.training.total_steps, limit, search_space_from_spec(spec))
    ranked = sorted((c for items in cands.values() for c in items), key=lambda c: c.run_time_s)
    if not ranked:
        raise NoFitError(f"{model_yaml}: {spec.name} fits on no allowed GPU type within the limits. "
                         "To fix: raise limits.max_gpus, allow more gpu_types, use LoRA/QLoRA or a shorter seq_len. "
                         "See `frenzy-slurm memory` for the per-GPU estimate.")
    best = ranked[0]
    if as_json:
        print_json({"job": spec.name, "chosen": {"gpu": best.gpu, "gpus": best.gpus, "plan": best.plan.short(),
                                                   "peak_gib": best.peak_gib, "run_time_s": best.run_time_s},
                    "candidates": candidate_json(cands)})
    else:
        click.echo(f"{spec.name}: {best.gpus} x {best.gpu}, plan {best.plan.short()}, "
                   f"{best.peak_gib:.1f} of {best.capacity_gib:.1f} GiB per GPU, predicted run time "
                   f"{best.run_time_s / 3600:.2f} h")
        if explain:
            header, rows = candidate_rows(cands, 3)
            click.echo(table(rows, header))
    if not dry_run:
        raise FrenzyError("submission to Slurm is not available in this release; rerun with --dry-run to plan only.")
