"""`frenzy-slurm calibrate`: fit per-site corrections from finished jobs and write them beside the site file.

    frenzy-slurm calibrate --site /etc/frenzy-slurm/site.yaml [JOB_DIR...] [--min-jobs 3] [--dry-run]

Reads plan.json + metrics.json of every job directory (default: all under $FRENZY_JOBS_DIR or
./frenzy-jobs), fits step-time corrections per GPU model and precision and memory factors per
framework mode, and writes `<site>.calibration.yaml`. Fits outside their bounds or on too few jobs
are printed and recorded as not applied. A directory counts only as Slurm ran its job (accounting, the
site epilog's record: calibration/verify.py), each user's jobs are one vote, and a correction the file
already holds moves by at most --max-change per run (calibration/fit.py); the output says what was
accepted, rejected and held, and why.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

import click

from frenzy_slurm.cli.common import echo, print_json, reports_errors, table
from frenzy_slurm.errors import InputError

if TYPE_CHECKING:  # the command imports these when it runs
    from frenzy_slurm.calibration import CalibrationFile
    from frenzy_slurm.calibration.run import CalibrationRun
    from frenzy_slurm.jobspec import JobSpec
    from frenzy_slurm.marp import GpuOption, MemoryEstimate, Workload
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.slurm import SlurmBackend

    Found = tuple[CalibrationFile, Path] | None  # site_calibration(): a calibration and its path

DEFAULT_VALID_DAYS = 90
# contrib/slurm/epilog's FRENZY_SPOOL default (calibration/run.py reads it; the help names it)
DEFAULT_EPILOG_DIR = Path("/var/spool/frenzy-slurm/gpu-peaks")


def accounting_backend() -> SlurmBackend:
    """The Slurm seam calibrate asks about jobs (accounting, GPU memory peaks): the CLI tools' sacct."""
    from frenzy_slurm.slurm import open_backend

    return open_backend("cli")


@click.command()
@click.argument("job_dirs", nargs=-1, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--site",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Site file (default: $FRENZY_SITE, /etc/frenzy-slurm/site.yaml).",
)
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Calibration file (default: $FRENZY_CALIBRATION, else <site>.calibration.yaml beside the site file).",
)
@click.option(
    "--min-jobs", type=click.IntRange(min=1), default=3, show_default=True, help="Fewest jobs a correction may rest on."
)
@click.option(
    "--max-efficiency-factor",
    type=click.FloatRange(min=1),
    default=4.0,
    show_default=True,
    help="Largest move of a GPU's FLOP-rate efficiency, either way.",
)
@click.option(
    "--max-memory-factor",
    type=click.FloatRange(min=1),
    default=1.5,
    show_default=True,
    help="Largest move of memory predictions, either way.",
)
@click.option(
    "--max-change",
    type=click.FloatRange(min=1),
    default=1.25,
    show_default=True,
    help="Largest move per calibration, either way, of a correction the calibration file already holds.",
)
@click.option(
    "--valid-days",
    type=click.IntRange(min=1),
    default=DEFAULT_VALID_DAYS,
    show_default=True,
    help="After this many days the file is stale and fsbatch refuses it until it is refitted.",
)
@click.option(
    "--epilog-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The site epilog's records (contrib/slurm/epilog): what vouches for other users' jobs, and GPU peaks "
    f"for jobs without metrics.json (default: {DEFAULT_EPILOG_DIR} where it exists).",
)
@click.option(
    "--sacct/--no-sacct",
    "use_sacct",
    default=True,
    show_default=True,
    help="Also ask Slurm's accounting for the jobs' GPU memory peaks (gres/gpumem, Slurm 23.02+).",
)
@click.option(
    "--since",
    "since_days",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Only jobs measured in the last DAYS days (e.g. after a driver or framework upgrade).",
)
@click.option("--dry-run", is_flag=True, help="Fit and print; do not write the file.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@reports_errors("frenzy-slurm calibrate")
def calibrate(
    job_dirs: tuple[Path, ...],
    site: Path | None,
    output: Path | None,
    min_jobs: int,
    max_efficiency_factor: float,
    max_memory_factor: float,
    max_change: float,
    valid_days: int,
    epilog_dir: Path | None,
    use_sacct: bool,
    since_days: float | None,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Fit per-site corrections of MARP/HAS predictions from what finished jobs measured.

    JOB_DIRS are job directories, or directories holding them (a user's frenzy-jobs, or several users'
    with a shell glob); default: every job directory under $FRENZY_JOBS_DIR (or ./frenzy-jobs).
    """
    from frenzy_slurm.calibration import FitBounds, calibration_path
    from frenzy_slurm.calibration import run as calibration
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.site.tools import find_site

    site_path = find_site(site)
    if site_path is None:
        raise InputError("no site file: pass --site FILE or set FRENZY_SITE; the calibration is written beside it.")
    site_cfg = load_site(site_path)
    dirs = calibration.job_dirs(job_dirs, since_days)
    try:
        import scipy  # noqa: F401
    except ImportError:
        raise InputError("fitting needs numpy and scipy: pip install 'frenzy-slurm[calibrate]'.") from None
    bounds = FitBounds(
        min_jobs=min_jobs,
        max_efficiency_factor=max_efficiency_factor,
        max_memory_factor=max_memory_factor,
        max_change=max_change,
    )
    run = calibration.calibrate(
        site_path,
        site_cfg,
        dirs,
        bounds,
        output or calibration_path(site_path),
        accounting_backend(),
        epilog_dir,
        use_sacct,
        valid_days,
        dry_run,
    )
    if as_json:
        print_json(_as_json(run))
    else:
        _print_run(run, site_path, max_change, dry_run)


def _as_json(run: CalibrationRun) -> dict:
    return {
        "path": str(run.path),
        "written": run.written,
        "calibration": run.calibration.model_dump(mode="json"),
        "skipped": run.skipped,
        "accounting": run.verdict.accounting,
        "epilog_records": run.epilog_records,
        "previous": str(run.path) if run.previous is not None else None,
        "accepted": [{"job_dir": str(d), "job_id": j, "why": why} for d, j, why in run.verdict.accepted],
        "rejected": [{"job_dir": str(d), "why": why} for d, why in run.verdict.rejected],
    }


def _print_run(run: CalibrationRun, site_path: Path, max_change: float, dry_run: bool) -> None:
    users = len({o.user for o in run.observations})
    click.echo(
        f"{len(run.observations)} measured job(s) of {users} user(s) from {len(run.dirs)} director(ies); "
        f"site file {site_path}"
    )
    if run.previous is not None:
        click.echo(f"previous calibration {run.path}: each correction moves by at most x{max_change:g}")
    for d, _, why in run.verdict.accepted:
        echo(f"accepted: {d}: {why}")
    for d, why in run.verdict.rejected:
        echo(f"rejected: {d}: {why}")
    _print_corrections(run.calibration)
    for finding in run.refused:
        echo(f"not applied: {finding.text}")
    for finding in run.notes:
        echo(f"note: {finding.text}")
    for line in run.skipped:
        echo(f"skipped: {line}", err=True)
    if run.empty:
        click.echo(
            f"no correction met its bounds and minimum job count; nothing is applied and {run.path} is not "
            "written" + (" (the calibration already there stays as it is)." if run.path.exists() else ".")
        )
        return
    click.echo(("would write " if dry_run else "wrote ") + str(run.path))


def _print_corrections(cal: CalibrationFile) -> None:
    """The step-time and memory corrections fitted, as tables."""
    if cal.step_time:
        rows = [
            [
                c.gpu if c.gpu != "*" else "site-wide",
                c.precision,
                f"x{c.efficiency_factor:.3g}",
                f"{c.step_overhead_s:.4g}",
                f"{c.microbatch_overhead_s:.4g}",
                str(c.jobs),
                f"{c.raw_error:.1%}",
                f"{c.calibrated_error:.1%}",
            ]
            for c in cal.step_time
        ]
        click.echo(
            table(
                rows,
                ["gpu", "precision", "efficiency", "s/step", "s/micro-batch", "jobs", "error before", "error after"],
            )
        )
    if cal.memory:
        click.echo(
            table(
                [[m.mode, f"x{m.factor:.3f}", str(m.jobs), str(m.ranks)] for m in cal.memory],
                ["memory mode", "factor", "jobs", "ranks"],
            )
        )


def site_calibration(site: Path | None) -> Found:
    """(calibration, path) beside the site file given or found ($FRENZY_SITE), or None; stale is an error."""
    from frenzy_slurm.calibration import find_calibration
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.site.tools import find_site

    path = find_site(site)
    if path is None or not path.exists():
        return None
    return find_calibration(load_site(path), path)


def site_device(site: Path | None) -> Literal["cuda", "cpu"]:
    """The `device` of the site file given or found ($FRENZY_SITE), as fsbatch predicts with it; cuda without one."""
    from frenzy_slurm.site.config import load_site
    from frenzy_slurm.site.tools import find_site

    path = find_site(site)
    return load_site(path).device if path is not None and path.exists() else "cuda"


def memory_plan_calibration(found: Found, spec: JobSpec, est: MemoryEstimate) -> dict | None:
    """`frenzy-slurm memory --plan`: the breakdown's peak raw and with the site's memory factor."""
    if found is None:
        return None
    cal, path = found
    mode = f"{spec.training.precision}/{spec.training.method}"
    corr = cal.memory_factor(mode)
    factor = corr.factor if corr else 1.0
    return {
        "path": str(path),
        "mode": mode,
        "factor": factor,
        "jobs": corr.jobs if corr else 0,
        "raw_peak_gib": est.peak_gib,
        "calibrated_peak_gib": est.peak_gib * factor,
    }


def memory_plan_line(info: dict) -> str:
    if info["jobs"] == 0:
        return (
            f"calibration {info['path']}: no memory correction for {info['mode']}; "
            f"peak {info['raw_peak_gib']:.4g} GiB (raw)"
        )
    return (
        f"calibration {info['path']}: memory {info['mode']} x{info['factor']:.3f} ({info['jobs']} jobs): peak raw "
        f"{info['raw_peak_gib']:.4g} GiB -> calibrated {info['calibrated_peak_gib']:.4g} GiB"
    )


def calibrated_search_rows(
    found: Found, spec: JobSpec, w: Workload, options: list[GpuOption], max_gpus: int
) -> tuple[list[str], list[list[str]]] | None:
    """`frenzy-slurm memory` candidates: per GPU type, the fastest plan's step time raw and calibrated."""
    from dataclasses import replace

    from frenzy_slurm.marp import search, search_space_from_spec

    if found is None:
        return None
    cal, _ = found
    t = spec.training
    mem = cal.memory_factor(f"{t.precision}/{t.method}")
    calibrated = []
    for opt in options:
        corr = cal.step_correction(opt.spec.name, t.precision)
        spec_gpu = opt.spec
        if corr is not None:
            spec_gpu = spec_gpu.model_copy(
                update={
                    "efficiency": min(1.0, spec_gpu.efficiency * corr.efficiency_factor),
                    "step_overhead_s": corr.step_overhead_s,
                    "microbatch_overhead_s": corr.microbatch_overhead_s,
                }
            )
        calibrated.append(
            replace(
                opt, spec=spec_gpu, usable_fraction=opt.usable_fraction / mem.factor if mem else opt.usable_fraction
            )
        )
    space = search_space_from_spec(spec)
    raw = search(w, options, t.global_batch, t.total_steps, max_gpus, space)
    cal_c = search(w, calibrated, t.global_batch, t.total_steps, max_gpus, space)
    rows = []
    for name in raw:
        r = raw[name][0] if raw[name] else None
        c = cal_c[name][0] if cal_c.get(name) else None
        rows.append(
            [
                str(name),
                r.plan.short() if r else "-",
                f"{r.step_time_s:.4g}" if r else "-",
                c.plan.short() if c else "-",
                f"{c.step_time_s:.4g}" if c else "-",
            ]
        )
    return ["gpu", "fastest plan (raw)", "raw step s", "fastest plan (calibrated)", "calibrated step s"], rows


def calibration_status(site_cfg: SiteConfig, site_path: Path) -> list[str]:
    """`site validate`: the calibration beside the site file, if any, as fsbatch would load it (problems only)."""
    from frenzy_slurm.calibration import calibration_path, load_calibration

    path = calibration_path(site_path)
    if not path.exists():
        return []
    try:
        load_calibration(path, site_cfg)
    except InputError as exc:
        return [f"calibration: {exc.message}"]
    return []
