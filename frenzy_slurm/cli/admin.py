"""`frenzy-slurm`: admin and expert tools (memory estimates, presets, the site file, prediction accuracy).

frenzy-slurm memory examples/llama2-7b.yaml --gpu A100-80GB:16
frenzy-slurm memory examples/llama2-7b.yaml --plan dp=8,zero=1,mb=2 --json
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import click
from pydantic import ValidationError

from frenzy_slurm.cli.common import (
    QuietPipeGroup,
    backend_options,
    cluster_options,
    print_json,
    reports_errors,
    table,
    unchecked_file,
)
from frenzy_slurm.cli.plan_view import (
    candidate_json,
    candidate_rows,
    capped_note,
    factory_note,
    gpu_options,
    load,
    memory_json,
    memory_rows,
)
from frenzy_slurm.core.errors import InputError, NoFitError
from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.core.units import GiB
from frenzy_slurm.core.version import __version__
from frenzy_slurm.jobdir.paths import jobs_dir
from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.marp import (
    estimate_memory,
    job_overheads,
    parse_plan,
    pinned_plan,
    search,
    search_space_from_spec,
    workload_from_spec,
)
from frenzy_slurm.marp.frameworks import PROFILES, profile_lines, profile_summary
from frenzy_slurm.marp.memory import MemoryEstimate
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Workload, plan_error

if TYPE_CHECKING:
    from frenzy_slurm.cli.calibrate import Found
    from frenzy_slurm.jobspec import JobSpec
    from frenzy_slurm.marp import GpuOption, ParallelPlan, Workload


@click.group(cls=QuietPipeGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="frenzy-slurm")
def main() -> None:
    """frenzy-slurm admin and expert tools: memory estimates, model presets, site files."""


@main.command()
@click.argument("model_yaml", type=unchecked_file)
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="TYPE[:COUNT]",
    help="GPU type from the catalog (repeatable), optionally with how many exist. Default: every catalog GPU. "
    "With --plan/--world: the estimate on the smallest type named, the variable-length cache within its memory.",
)
@click.option(
    "--plan",
    "plan_text",
    metavar="KEY=VALUE,...",
    help="Estimate one plan instead of searching. Keys: dp, tp, pp, cp (degrees), zero (0-3), mb (micro-batch), "
    "ga (gradient accumulation; default: global batch / (dp x mb)), ckpt (none|selective|full|op; default: "
    "model.yaml's activation_checkpointing where it names one), sp (sequence parallel: 1/0), offload "
    "(none|opt|opt+param); e.g. dp=8,zero=1,mb=2. With --world: only the keys given change the pinned plan.",
)
@click.option(
    "--world",
    type=click.IntRange(min=1, max=1 << 20),
    metavar="N",
    help="Estimate the one plan model.yaml pins (parallel:, training.micro_batch, activation_checkpointing) "
    "at N GPUs, as fsbatch's search builds it; refused when it pins several (then give the rest with --plan).",
)
@click.option(
    "--metric",
    type=click.Choice(["allocated", "reserved", "device"]),
    default="device",
    show_default=True,
    help="What to estimate: torch max_memory_allocated, the allocator's reserved peak, or nvidia-smi used.",
)
@click.option(
    "--max-gpus", type=click.IntRange(min=1), default=64, show_default=True, help="Largest GPU count searched."
)
@click.option("--top", type=click.IntRange(min=1), default=3, show_default=True, help="Candidates shown per GPU type.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option(
    "--trace-factory",
    is_flag=True,
    help="Import and call model.factory on this machine to count its parameters exactly. This RUNS ARBITRARY "
    "CODE (the module's and the function's) as you: only your own files, or the site's trusted_factories.",
)
@click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site file whose calibration (frenzy-slurm calibrate) to show beside the raw numbers (default: $FRENZY_SITE).",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="With --plan: also draw the breakdown per stage into FILE (.png, .svg or .pdf; needs matplotlib).",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    help="What the ranks compute on, as fsbatch predicts it from the site file's `device` (the default here "
    "too, else cuda): cpu for the local dev cluster's CPU processes.",
)
@reports_errors("frenzy-slurm memory")
def memory(
    model_yaml: Path,
    gpus: tuple[str, ...],
    plan_text: str | None,
    world: int | None,
    metric: Metric,  # click.Choice of its values
    max_gpus: int,
    top: int,
    as_json: bool,
    trace_factory: bool,
    site: Path | None,
    plot: Path | None,
    device: Literal["cuda", "cpu"] | None,
) -> None:
    """Per-GPU peak training memory of MODEL_YAML: one plan's breakdown, or the candidates per GPU type."""
    from frenzy_slurm.cli import calibrate as calib

    if plot and not (plan_text or world):
        raise InputError(
            "--plot draws one plan's breakdown: give the plan too, e.g. --plan dp=8,zero=1,mb=2 --plot mem.png "
            "(or --world N)"
        )
    spec, model = load(model_yaml, trace=trace_factory, site=site)
    if (note := factory_note(spec, model)) is not None and not as_json:
        click.echo(note, err=True)  # say whether user code ran on this machine (stderr: tables stay parseable)
    found = calib.site_calibration(site)
    w = workload_from_spec(spec, model, device=device or calib.site_device(site))
    profile = profile_summary(spec)
    if not as_json:
        click.echo("\n".join(profile_lines(spec)), err=True)  # which framework's defaults made this estimate
    if plan_text or world:
        plan = _checked(spec, w, one_plan(spec, w, plan_text, world))
        overheads = job_overheads(spec)
        raw = estimate_memory(w, plan, metric, overheads)
        named = gpu_options(gpus, max_gpus) if gpus else []
        # the breakdown on the smallest GPU named: what its allocator could reserve (MemoryEstimate.on_gpu)
        smallest = min(named, key=lambda o: o.spec.memory_gib, default=None)
        est = raw.on_gpu(smallest.spec.memory_gib * GiB, overheads) if smallest else raw
        calibrated = calib.memory_plan_calibration(found, spec, est)
        usable = min((o.usable_bytes for o in named), default=None)
        if plot:
            from frenzy_slurm.cli.memory_picture import plot_breakdown

            plot_breakdown(est, plot, f"{spec.name}: {model.name}, {plan.short()}", usable / GiB if usable else None)
        gpu = str(smallest.name) if smallest else None
        if as_json:
            extra = {"profile": profile} | ({"calibration": calibrated} if calibrated else {})
            print_json(memory_json(est, gpu) | extra)
            return
        click.echo(f"{spec.name}: {model.name}, plan {plan.short()}, {metric} memory per GPU (GiB)")
        _echo_breakdown(est, usable, plot, calib.memory_plan_line(calibrated) if calibrated else None)
        if (note := capped_note(est, gpu)) is not None:
            click.echo(note)
        for opt in named:
            on = raw.on_gpu(opt.spec.memory_gib * GiB, overheads)
            fits = "fits" if on.peak <= opt.usable_bytes else "does NOT fit"
            click.echo(f"{opt.name}: {on.peak_gib:.1f} GiB of {opt.usable_bytes / GiB:.1f} usable -> {fits}")
        return
    options = [replace(o, overheads=job_overheads(spec, o.overheads)) for o in gpu_options(gpus, max_gpus)]
    _show_candidates(spec, model.name, w, options, max_gpus, top, as_json, found, profile)


def _show_candidates(
    spec: JobSpec,
    model_name: str,
    w: Workload,
    options: list[GpuOption],
    max_gpus: int,
    top: int,
    as_json: bool,
    found: Found,
    profile: dict,
) -> None:
    """The fastest plans per GPU type (raw and calibrated where the site has a calibration); NoFitError where
    none fits."""
    from frenzy_slurm.cli import calibrate as calib

    cands = search(
        w, options, spec.training.global_batch, spec.training.total_steps, max_gpus, search_space_from_spec(spec)
    )
    if as_json:
        print_json(candidate_json(cands) | {"profile": profile})
    else:
        header, rows = candidate_rows(cands, top)
        click.echo(f"{spec.name}: {model_name}; fastest plans per GPU type (device memory incl. overhead)")
        click.echo(table(rows, header))
        both = calib.calibrated_search_rows(found, spec, w, options, max_gpus)
        if both and found is not None:  # rows come only with a calibration
            click.echo(f"raw and calibrated ({found[1]}):")
            click.echo(table(both[1], both[0]))
    if not any(cands.values()):
        raise NoFitError(
            f"{spec.name} fits on none of the GPU types within {max_gpus} GPUs. To fix: allow more GPUs (--max-gpus), "
            "ZeRO-3/offload, a shorter seq_len, or LoRA."
        )


def _checked(spec: JobSpec, w: Workload, plan: ParallelPlan) -> ParallelPlan:
    """The plan with its gradient accumulation from the global batch; InputError where it cannot run this model."""
    gb = spec.training.global_batch
    if gb % (plan.dp * plan.micro_batch):
        raise InputError(
            f"--plan: global_batch({gb}) is not a multiple of dp({plan.dp}) * mb({plan.micro_batch}); "
            "change dp or mb so that they divide it"
        )
    if plan.grad_accum == 1:
        plan = plan.with_(grad_accum=gb // (plan.dp * plan.micro_batch))
    if plan.tp > 1 and (w.arch.heads % plan.tp or w.arch.kv % plan.tp):
        raise InputError(f"--plan: tp({plan.tp}) must divide heads({w.arch.heads}) and kv_heads({w.arch.kv})")
    if plan.pp > w.arch.layers:
        raise InputError(f"--plan: pp({plan.pp}) > layers({w.arch.layers})")
    return plan


def _echo_breakdown(est: MemoryEstimate, usable: float | None, plot: Path | None, calibrated: str | None) -> None:
    header, rows = memory_rows(est)
    click.echo(table(rows, header))
    from frenzy_slurm.cli.memory_picture import terminal_bars

    click.echo(terminal_bars(est, usable_gib=usable / GiB if usable else None))
    if plot:
        click.echo(f"breakdown drawn in {plot}")
    if calibrated:
        click.echo(calibrated)


def one_plan(spec: JobSpec, w: Workload, plan_text: str | None, world: int | None) -> ParallelPlan:
    """The plan `memory --plan/--world` estimates. --world: the plan model.yaml pins at that many GPUs, with the keys
    --plan gives changed. --plan alone: its keys, and model.yaml's activation checkpointing where --plan names
    none (a setting the user wrote is never dropped)."""
    given = parse_plan(plan_text) if plan_text else None
    if world is None:
        assert given is not None
        t = spec.training
        if "recompute" in given.model_fields_set or t.activation_checkpointing == "auto":
            return given
        layers = -(-w.arch.layers // given.pp)
        every = layers // t.checkpoint_every if t.checkpoint_every and t.activation_checkpointing == "full" else None
        try:
            return given.with_(recompute=t.activation_checkpointing, recompute_layers=every)
        except ValidationError as exc:
            raise InputError(f"--plan {plan_text} with model.yaml's checkpointing: {plan_error(exc)}") from None
    base = pinned_plan(spec, w, world)
    if given is None:
        return base
    changed = {k: getattr(given, k) for k in given.model_fields_set}
    if changed.keys() & {"dp", "micro_batch"} and "grad_accum" not in changed:
        changed["grad_accum"] = 1  # recomputed from the global batch below
    try:
        plan = base.with_(**changed)
    except ValidationError as exc:
        raise InputError(f"--plan {plan_text} with --world {world}: {plan_error(exc)}") from None
    if plan.world != world:
        raise InputError(
            f"--plan {plan_text} with --world {world}: the plan's degrees (dp x tp x pp x cp) make {plan.world} "
            f"GPUs, not {world}; change the degrees or --world"
        )
    return plan


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def presets(as_json: bool) -> None:
    """List the built-in model presets and their parameter counts."""
    from frenzy_slurm.jobspec import presets as all_presets
    from frenzy_slurm.marp.params import count_params

    items = all_presets()
    if as_json:
        print_json(
            {
                n: {"source": p.source, "params": count_params(p.arch).total(p.arch.layers), **p.arch.model_dump()}
                for n, p in items.items()
            }
        )
        return
    rows = [
        [
            n,
            f"{count_params(p.arch).total(p.arch.layers) / 1e9:.3f}B",
            str(p.arch.layers),
            str(p.arch.hidden),
            f"{p.arch.heads}/{p.arch.kv}",
            str(p.arch.vocab),
            p.source,
        ]
        for n, p in items.items()
    ]
    click.echo(table(rows, ["preset", "params", "layers", "hidden", "heads/kv", "vocab", "source"]))


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def frameworks(as_json: bool) -> None:
    """The framework profiles (entry.framework): the releases each describes, its memory defaults and the
    plans it can run."""
    from dataclasses import asdict

    if as_json:
        print_json({name: asdict(p) for name, p in PROFILES.items()})
        return
    rows = [
        [
            p.name,
            p.describes,
            p.model_code,
            "fused" if p.fused_optimizer else "foreach",
            "yes" if p.holds_logits else "no",
            f"{p.loss_chunk_tokens}-token" if p.loss_chunk_tokens else str(p.loss_chunks),
            f"tp {p.can.tp}, pp {p.can.pp}, cp {p.can.cp}, zero {','.join(map(str, p.can.zero_stages))}",
        ]
        for p in PROFILES.values()
    ]
    click.echo(
        table(rows, ["framework", "describes", "model code", "optimizer", "holds logits", "loss chunks", "plans"])
    )
    click.echo("plans: auto = searched, asked = only when model.yaml pins it, no = never")


@main.command("spec-reference")
def spec_reference() -> None:
    """Print the model.yaml reference (Markdown) generated from the schema."""
    from frenzy_slurm.jobspec.reference import render

    click.echo(render(), nl=False)


@main.group()
def site() -> None:
    """Write and check the site file that describes each partition's GPUs."""


@site.command("init")
@backend_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write here instead of stdout.")
@click.option("--force", is_flag=True, help="Overwrite an existing output file.")
@reports_errors("frenzy-slurm site init")
def site_init(backend: str, snapshot: Path | None, output: Path | None, force: bool) -> None:
    """Propose a site file from the live cluster's partitions and GRES types."""
    from frenzy_slurm.site.tools import propose_site
    from frenzy_slurm.slurm import open_backend

    text, flagged = propose_site(open_backend(backend, snapshot).load())
    if output is None:
        click.echo(text, nl=False)
    else:
        if output.exists() and not force:
            raise InputError(f"{output} exists; use --force to overwrite it.")

        write_atomic(output, text, mode=0o644)  # never leave a half-written site file; admins share it
        click.echo(f"wrote {output}", err=True)
    for line in flagged:
        click.echo(f"frenzy-slurm site init: check: {line}", err=True)


@site.command("install")
@click.option("--prefix", required=True, type=click.Path(path_type=Path), help="The shared venv (created if missing).")
@click.option("--wheel", type=click.Path(path_type=Path), help="frenzy_slurm-*.whl to install into it.")
@click.option("--extras", default="", help="Extras with the wheel, comma-separated (train,nvml for jobs' Python).")
@click.option("--etc", default="/etc/frenzy-slurm", show_default=True, type=click.Path(path_type=Path),
              help="Where site.yaml lives.")  # fmt: skip
@click.option("--site-file", type=unchecked_file, help="Install this site file as ETC/site.yaml (checked first).")
@click.option("--scripts-dir", default="/etc/slurm", show_default=True, type=click.Path(path_type=Path),
              help="Where frenzy-prolog and frenzy-epilog go (root's, 0755).")  # fmt: skip
@click.option("--modulefiles", type=click.Path(path_type=Path), help="Modulefile tree (default PREFIX/modulefiles).")
@click.option("--slurm-conf", type=unchecked_file, help="Read (never edit) it: are Prolog=/Epilog= set already?")
@click.option("--force", is_flag=True, help="Replace an ETC/site.yaml that differs from --site-file.")
@click.option("--dry-run", is_flag=True, help="Say what would change; change nothing.")
@reports_errors("frenzy-slurm site install")
def site_install(
    prefix: Path,
    wheel: Path | None,
    extras: str,
    etc: Path,
    site_file: Path | None,
    scripts_dir: Path,
    modulefiles: Path | None,
    slurm_conf: Path | None,
    force: bool,
    dry_run: bool,
) -> None:
    """Install for the site in one step: the venv, modulefiles, ETC, the Slurm prolog and epilog (docs/admin.md).

    Idempotent: a second run says `unchanged` for each part. slurm.conf is not edited; the lines to add are
    printed."""
    from frenzy_slurm.site.install import InstallOptions, install

    result = install(
        InstallOptions(
            prefix=prefix,
            etc=etc,
            scripts_dir=scripts_dir,
            modulefiles=modulefiles,
            wheel=wheel,
            extras=tuple(e.strip() for e in extras.split(",") if e.strip()),
            site_file=site_file,
            slurm_conf=slurm_conf,
            force=force,
            dry_run=dry_run,
        )
    )
    for step in result.steps:
        click.echo(step.line())
    if result.slurm_conf_lines:
        click.echo("\nAdd to slurm.conf on every node (then `scontrol reconfigure`); this command does not edit it:")
        for line in result.slurm_conf_lines:
            click.echo(f"    {line}")
    if result.next_steps:
        click.echo("\nNext:")
        for line in result.next_steps:
            click.echo(f"    {line}")


@site.command("validate")
@cluster_options
@click.argument("site_file", type=click.Path(dir_okay=False, path_type=Path), required=False)
@reports_errors("frenzy-slurm site validate")
def site_validate(backend: str, snapshot: Path | None, site: Path | None, site_file: Path | None) -> None:
    """Check SITE_FILE (or --site) against the live cluster; exit 1 if they disagree."""
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.site.tools import find_site, validate_site
    from frenzy_slurm.slurm import open_backend

    path = site_file or find_site(site)
    if path is None:
        raise InputError("no site file given: pass SITE_FILE or --site, or set FRENZY_SITE")
    site_cfg = load_site(path)
    problems = validate_site(site_cfg, open_backend(backend, snapshot).load())
    from frenzy_slurm.cli.calibrate import calibration_status

    problems += calibration_status(site_cfg, path)  # a stale calibration beside it would stop every fsbatch
    for p in problems:
        click.echo(f"{path}: {p}")
    if problems:
        raise SystemExit(1)
    click.echo(f"{path}: matches the cluster")


@site.command("catalog")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def site_catalog(as_json: bool) -> None:
    """List the built-in GPU catalog (names usable as `gpu:` in site files)."""
    from frenzy_slurm.core.gpus import catalog

    if as_json:
        print_json({n: s.model_dump() for n, s in catalog().items()})
        return
    rows = [
        [
            n,
            f"{s.memory_gib:.1f}",
            f"{s.bf16:g}",
            f"{s.fp16:g}",
            f"{s.fp32:g}",
            f"{s.mem_bw_gbs:g}",
            f"{s.efficiency:g}",
        ]
        for n, s in catalog().items()
    ]
    click.echo(table(rows, ["gpu", "mem GiB", "bf16 TF", "fp16 TF", "fp32 TF", "mem GB/s", "efficiency"]))


@main.command()
@click.argument("job_dirs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@backend_options
@reports_errors("frenzy-slurm accuracy")
def accuracy(job_dirs: tuple[Path, ...], as_json: bool, backend: str, snapshot: Path | None) -> None:
    """MARP's memory predictions against what finished jobs measured (metrics.json).

    JOB_DIRS default to every job directory under $FRENZY_JOBS_DIR (or ./frenzy-jobs). Job states come
    from one accounting query for all of them (where the site keeps accounting).
    """
    from frenzy_slurm.slurm import SlurmUnavailable, open_backend
    from frenzy_slurm.track.jobs import from_job_dirs

    dirs = list(job_dirs)
    if not dirs:
        root = jobs_dir()
        dirs = sorted(p.parent for p in root.glob("*/metrics.json"))
    rows: list[dict[str, Any]] = []
    accs: list[float] = []
    measured = [d for d in dirs if (d / "metrics.json").exists()]
    for d in dirs:
        if d not in measured:
            rows.append({"job_dir": str(d), "note": "no metrics.json (not finished, or not the built-in trainer)"})
    try:
        cluster = open_backend(backend, snapshot) if measured else None
    except SlurmUnavailable:
        cluster = None  # the job directories alone still answer
    for t in from_job_dirs(measured, cluster):
        where = t.job_dir
        for r in (t.metrics or {}).get("ranks", []):
            pred, meas = (
                r.get("predicted_allocated_gib", r.get("predicted_gib")),
                r.get("peak_gib"),
            )  # trainer; NVML sampler
            acc = 1 - abs(pred - meas) / meas if pred and meas else None
            if acc is not None:
                accs.append(acc)
            rows.append(
                {
                    "job_dir": str(where),
                    "job_id": t.job_id,
                    "rank": r.get("rank"),
                    "gpu": r.get("gpu_model"),
                    "device": r.get("device"),
                    "predicted_gib": pred,
                    "measured_gib": meas,
                    "accuracy": acc,
                }
            )
    summary = {
        "ranks": len(accs),
        "mean_accuracy": sum(accs) / len(accs) if accs else None,
        "within_10pct": sum(a >= 0.9 for a in accs) / len(accs) if accs else None,
    }
    if as_json:
        print_json({"rows": rows, "summary": summary})
        return
    out = [
        [
            Path(r["job_dir"]).name,
            str(r.get("job_id", "-")),
            str(r.get("rank", "-")),
            str(r.get("gpu") or "-"),
            str(r.get("device") or "-"),
            f"{r['predicted_gib']:.4g}" if r.get("predicted_gib") else "-",
            f"{r['measured_gib']:.4g}" if r.get("measured_gib") else "-",
            f"{r['accuracy']:.1%}" if r.get("accuracy") is not None else r.get("note", "-"),
        ]
        for r in rows
    ]
    click.echo(table(out, ["job", "id", "rank", "gpu", "device", "pred GiB", "meas GiB", "accuracy"]))
    if accs:
        click.echo(
            f"{len(accs)} ranks: mean accuracy {summary['mean_accuracy']:.1%}, {summary['within_10pct']:.0%} within 10%"
        )


def _register_calibration_commands() -> None:
    """`frenzy-slurm calibrate` and `frenzy-slurm site detect` live in their own modules."""
    from frenzy_slurm.cli.calibrate import calibrate
    from frenzy_slurm.cli.site_detect import site_detect

    main.add_command(calibrate)
    site.add_command(site_detect)


_register_calibration_commands()


def _register_simulate_command() -> None:
    """`frenzy-slurm simulate` lives in its own module (frenzy_slurm/cli/simulate.py)."""
    from frenzy_slurm.cli.simulate import simulate

    main.add_command(simulate)


_register_simulate_command()


def _register_watch_command() -> None:
    """`frenzy-slurm watch` lives in its own module (frenzy_slurm/cli/watch.py)."""
    from frenzy_slurm.cli.watch import watch

    main.add_command(watch)


_register_watch_command()


def _register_salloc_command() -> None:
    """`frenzy-slurm salloc` lives in its own module (frenzy_slurm/cli/salloc.py)."""
    from frenzy_slurm.cli.salloc import salloc

    main.add_command(salloc)


_register_salloc_command()
