"""`frenzy-slurm simulate`: replay a workload through the simulated Slurm under several policies.

    frenzy-slurm simulate philly:1:60 --cluster A100-80GB:2x8,V100-32GB:4x8,T4:4x4 --policy has,ilp,user-fixed
    frenzy-slurm simulate my-workload.yaml --cluster cluster.yaml --policy all --json out.json --plot plots/

WORKLOAD is a workload file (YAML or CSV, see docs/simulation.md) or `philly:SEED[:JOBS]` to sample one
from the Philly trace (`--trace`, `$FRENZY_PHILLY_TRACE`, or the development checkout's
../shared/data/traces/philly.csv). Needs the `sim` extra for `ilp` (scipy) and `--plot` (matplotlib).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from frenzy_slurm.cli.common import reports_errors
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.records import write_atomic

if TYPE_CHECKING:
    from frenzy_slurm.sim.workload import WorkloadFile

DEV_TRACE = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces" / "philly.csv"


def trace_path(given: Path | None) -> Path:
    if given is not None:
        return given
    env = os.environ.get("FRENZY_PHILLY_TRACE")
    return Path(env) if env else DEV_TRACE


def resolve_workload(arg: str, trace: Path | None) -> tuple[WorkloadFile, int]:
    """A workload file, or `philly:SEED[:JOBS]` sampled from the trace."""
    from frenzy_slurm.sim.workload import load_workload, sample_philly

    if arg.startswith("philly:"):
        parts = arg.split(":")[1:]
        try:
            seed = int(parts[0])
            jobs = int(parts[1]) if len(parts) > 1 else 40
        except (ValueError, IndexError):
            raise InputError(f"WORKLOAD {arg}: write philly:SEED or philly:SEED:JOBS (e.g. philly:1:60)") from None
        if jobs < 1 or len(parts) > 2:
            raise InputError(f"WORKLOAD {arg}: write philly:SEED or philly:SEED:JOBS with JOBS >= 1")
        return sample_philly(trace_path(trace), seed, jobs), seed
    path = Path(arg)
    if not path.is_file():
        raise InputError(f"WORKLOAD {arg}: no such file; give a workload file (.yaml/.csv) or philly:SEED[:JOBS]")
    return load_workload(path), 0


def earlier_workload(arg: str, trace: Path | None, wl: WorkloadFile, seed: int) -> WorkloadFile:
    """The jobs of the period before WORKLOAD's (`wl`, sampled with `seed`), for a site calibrated in production
    (`--calibrate-every`): the trace's jobs drawn with the seed `WARMUP_SEED_OFFSET` on for `philly:SEED[:JOBS]`; a
    workload file's own jobs (its users ran the same jobs before), which the earlier period runs with other true
    draws."""
    from frenzy_slurm.sim.runner import WARMUP_SEED_OFFSET
    from frenzy_slurm.sim.workload import sample_philly

    if arg.startswith("philly:"):
        return sample_philly(trace_path(trace), seed + WARMUP_SEED_OFFSET, len(wl.jobs))
    return wl


def _seeds(text: str | None, default: int) -> list[int]:
    if text is None:
        return [default]
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise InputError(f"--seed {text}: give integers, e.g. 1 or 1,2,3") from None


@click.command("simulate")
@click.argument("workload")
@click.option(
    "--cluster",
    "cluster_arg",
    required=True,
    metavar="FILE|GPU:NODESxGPUS,...",
    help="Cluster YAML file, or the compact form A100-80GB:2x8,V100-32GB:4x8,T4:4x4.",
)
@click.option(
    "--policy",
    "policies",
    default="has,user-fixed",
    show_default=True,
    metavar="NAME[,NAME...]",
    help="has, has-homogeneous, has-replan, has-preempt, slurm-multi, sia, ilp, fastest-fit, "
    "user-fixed:fastest|largest|usual|biggest, "
    "user-fixed (all its variants) or all.",
)
@click.option(
    "--seed", "seed_text", metavar="N[,N...]", help="Seed(s) of the ground truth (default: the philly seed, else 0)."
)
@click.option(
    "--load",
    type=click.FloatRange(min=0.0, min_open=True),
    default=0.8,
    show_default=True,
    help="Offered load: arrivals rescaled so the work is this share of the cluster's capacity.",
)
@click.option("--as-is", "as_is", is_flag=True, help="Keep the workload's arrival times (ignore --load).")
@click.option(
    "--estimates",
    type=click.Choice(["test-only", "backfill"]),
    default="test-only",
    show_default=True,
    help="How the simulated Slurm answers start estimates: like sbatch --test-only (running jobs "
    "only) or like squeue --start (after the queue's backfill reservations).",
)
@click.option(
    "--backfill",
    type=click.Choice(["slurm", "easy"]),
    default="slurm",
    show_default=True,
    help="slurm: every pending job tested gets a reservation (sched/backfill); easy: only the first.",
)
@click.option(
    "--bf-interval",
    type=click.FloatRange(min=0.0),
    default=0.0,
    show_default=True,
    help="Seconds between Slurm's backfill passes (its bf_interval, 30 by default on real sites); "
    "0: every job end schedules at once.",
)
@click.option(
    "--max-gpus",
    type=click.IntRange(min=1),
    default=None,
    help="limits.max_gpus in every job's model.yaml (every policy honours it).",
)
@click.option(
    "--max-job-share",
    type=click.FloatRange(min=0.0, max=1.0, min_open=True),
    default=None,
    help="The site file's max_job_share: the most of one pool HAS gives one job (default 0.5).",
)
@click.option(
    "--calibrate-every",
    type=click.FloatRange(min=0.1, max=24 * 365),
    default=None,
    help="Hours between the site's calibrations (frenzy-slurm calibrate on the jobs finished so far, as a cron job "
    "would run it), after an earlier period that calibrated the same way (philly:SEED: the trace's jobs of seed "
    "SEED+1000; a workload file: its own jobs); the policies that plan with MARP see the calibrated site. "
    "Default: never.",
)
@click.option("--exact", is_flag=True, help="No prediction error: the truth is MARP's prediction.")
@click.option(
    "--truth",
    type=click.Choice(["published", "marp"]),
    default="published",
    show_default=True,
    help="Step-time truth: published per-type speeds and scaling, or MARP's model with noise.",
)
@click.option(
    "--plain-share",
    type=click.FloatRange(min=0.0, max=1.0),
    default=0.0,
    show_default=True,
    help="Share of jobs from users who do not use frenzy-slurm (they submit as slurm-multi under every policy).",
)
@click.option(
    "--restart-s",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Extra seconds a start that resumes a checkpoint pays (sia's moves, time-limit resumes); default 0.",
)
@click.option(
    "--checkpoint-gbs",
    type=click.FloatRange(min=0.001, max=1e4),
    default=None,
    help="GB/s a job's checkpoint is written at its stop and read at its resumed start: such a start also pays "
    "twice its checkpoint's size over this (14 bytes per parameter of a full fine-tune). Default: no size term.",
)
@click.option(
    "--startup-s",
    type=click.FloatRange(min=0.0),
    default=None,
    help="Seconds from a job's start to its first step, paid again at every restart (sia's moves, OOMs); default 120.",
)
@click.option(
    "--ilp-round",
    type=click.FloatRange(min=1.0),
    default=60.0,
    show_default=True,
    help="Seconds between the ilp policy's rounds.",
)
@click.option(
    "--trace",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Philly trace CSV for philly:SEED workloads.",
)
@click.option(
    "--save-workload",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the workload (as replayed, before load scaling) to this .yaml or .csv file.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help='Write {"runs": [...], "summary": [...]} here (\'-\' for stdout).',
)
@click.option(
    "--plot",
    "plot_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write JCT CDF and utilisation plots (PNG) to this directory.",
)
@reports_errors("frenzy-slurm simulate")
def simulate(
    workload: str,
    cluster_arg: str,
    policies: str,
    seed_text: str | None,
    load: float,
    as_is: bool,
    estimates: str,
    backfill: str,
    bf_interval: float,
    max_gpus: int | None,
    max_job_share: float | None,
    calibrate_every: float | None,
    exact: bool,
    truth: str,
    plain_share: float,
    restart_s: float | None,
    checkpoint_gbs: float | None,
    startup_s: float | None,
    ilp_round: float,
    trace: Path | None,
    save_workload: Path | None,
    json_path: Path | None,
    plot_dir: Path | None,
) -> None:
    """Replay WORKLOAD on a simulated Slurm cluster under each policy; print JCT, utilisation, overhead."""
    from frenzy_slurm.sim.clusters import load_cluster
    from frenzy_slurm.sim.metrics import aggregate, markdown, plot, summarize
    from frenzy_slurm.sim.runner import WARMUP_SEED_OFFSET, Runner, warmed_calibration
    from frenzy_slurm.sim.truth import ErrorModel
    from frenzy_slurm.sim.workload import save_workload as write_workload

    names = _policies(policies)
    cluster = load_cluster(cluster_arg)
    wl, wl_seed = resolve_workload(workload, trace)
    if save_workload is not None:
        write_workload(wl, save_workload)
    seeds = _seeds(seed_text, wl_seed)
    errors = ErrorModel.exact() if exact else ErrorModel(truth=truth)  # type: ignore[arg-type]  # click.Choice
    if startup_s is not None:
        errors = errors.model_copy(update={"startup_s": startup_s})
    if restart_s is not None:
        errors = errors.model_copy(update={"restart_s": restart_s})
    if checkpoint_gbs is not None:
        errors = errors.model_copy(update={"checkpoint_gbs": checkpoint_gbs})
    results, rows = [], []
    runs = [(s, n) for s in seeds for n in names]
    bar = _progress(len(runs) * len(wl.jobs))
    same: dict[str, Any] = {"errors": errors, "load": None if as_is else load, "estimates": estimates}
    same |= {"reserve": 1 if backfill == "easy" else None, "ilp_round_s": ilp_round, "sched_interval_s": bf_interval}
    same |= {"max_gpus": max_gpus, "max_job_share": max_job_share, "plain_share": plain_share}
    earlier = earlier_workload(workload, trace, wl, wl_seed) if calibrate_every is not None else None
    for seed, name in runs:
        warm = None
        if earlier is not None and calibrate_every is not None:  # a site in production: an earlier period calibrated it
            warm = warmed_calibration(earlier, cluster, name, seed + WARMUP_SEED_OFFSET, calibrate_every * 3600, **same)
        runner = Runner(wl, cluster, name, seed, progress=bar.update if bar else None, calibration=warm, **same)
        r = runner.run()
        results.append(r)
        rows.append(summarize(r))
    if bar:
        bar.close()
    summary = aggregate(rows)
    click.echo(
        f"workload: {wl.source or workload} ({len(wl.jobs)} jobs); cluster: {cluster.describe()} "
        f"({cluster.gpus} GPUs); load {'as-is' if as_is else load}; seeds {','.join(map(str, seeds))}"
    )
    click.echo(markdown(summary if len(seeds) > 1 else rows))
    if json_path is not None:
        _write_json(json_path, {"runs": rows, "summary": summary})
    if plot_dir is not None:
        for p in plot(results, plot_dir):
            click.echo(f"wrote {p}")


def _policies(text: str) -> list[str]:
    """--policy's names, each known and with what it needs installed (ilp and sia solve with scipy)."""
    from frenzy_slurm.sim.policies import expand_policies

    try:
        names = expand_policies(text)
    except ValueError as exc:
        raise InputError(f"--policy: {exc}") from None
    for needs_scipy in ("ilp", "sia"):
        if needs_scipy in names:
            try:
                import scipy.optimize  # noqa: F401
            except ImportError:
                raise InputError(f"--policy {needs_scipy} needs scipy: pip install 'frenzy-slurm[sim]'") from None
    return names


def _write_json(json_path: Path, data: dict) -> None:
    """--json's results: to stdout for `-`, else to the file (never through a planted link)."""
    text = json.dumps(data, indent=2, default=str)
    if str(json_path) == "-":
        click.echo(text)
    else:
        write_atomic(json_path, text + "\n", mode=0o644)


def _progress(total: int) -> Any:  # a tqdm bar (tqdm is untyped and optional) or None
    """A tqdm bar on stderr when it is a terminal and tqdm is installed; None otherwise."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit="job", desc="simulating", file=sys.stderr, leave=False)
