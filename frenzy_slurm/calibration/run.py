"""One calibration run, as `frenzy-slurm calibrate` asks for it: the job directories found, verified and
observed, the corrections fitted and bounded, the calibration file made (and written unless a dry run).

The CLI parses the flags and prints a `CalibrationRun`; everything it reports is decided here.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm import __version__
from frenzy_slurm.errors import InputError

if TYPE_CHECKING:
    from frenzy_slurm.calibration.fit import Finding
    from frenzy_slurm.calibration.model import CalibrationFile, FitBounds
    from frenzy_slurm.calibration.observe import Observation
    from frenzy_slurm.calibration.verify import Verdict
    from frenzy_slurm.site.config import SiteConfig
    from frenzy_slurm.slurm import SlurmBackend

DEFAULT_EPILOG_DIR = Path("/var/spool/frenzy-slurm/gpu-peaks")  # contrib/slurm/epilog's FRENZY_SPOOL default


@dataclass(frozen=True)
class CalibrationRun:
    """What one calibration found, fitted and made (written, unless `dry_run` or nothing was fitted)."""

    path: Path  # the calibration file
    calibration: CalibrationFile
    previous: CalibrationFile | None  # the calibration it replaces, whose corrections bound the new ones
    dirs: list[Path]  # the job directories considered
    verdict: Verdict  # which of them are evidence, and why
    observations: list[Observation]
    findings: list[Finding]
    skipped: list[str]  # directories (and epilog records) left out, and why
    epilog_records: int
    written: bool

    @property
    def empty(self) -> bool:
        """No correction met its bounds and minimum job count."""
        return not self.calibration.step_time and not self.calibration.memory

    @property
    def refused(self) -> list[Finding]:
        return [f for f in self.findings if f.refused]

    @property
    def notes(self) -> list[Finding]:
        return [f for f in self.findings if not f.refused]


def job_dirs(given: tuple[Path, ...], since_days: float | None) -> list[Path]:
    """The job directories to calibrate from: those given (a jobs root stands for the job directories in it),
    else every one under $FRENZY_JOBS_DIR (or ./frenzy-jobs); with `since_days`, only those whose metrics.json
    is that recent. InputError when none is left."""
    from frenzy_slurm.calibration.observe import job_dirs_under

    dirs = []
    for d in given:
        dirs += [d] if (d / "plan.json").exists() or not d.is_dir() else (job_dirs_under(d) or [d])
    if not given:
        root = Path(os.environ.get("FRENZY_JOBS_DIR", "frenzy-jobs"))
        dirs = job_dirs_under(root)
        if not dirs:
            raise InputError(f"no job directories under {root}: pass JOB_DIR arguments or set FRENZY_JOBS_DIR.")
    if since_days is not None:
        cutoff = time.time() - since_days * 86400
        dirs = [
            d for d in dirs if os.path.lexists(d / "metrics.json") and os.lstat(d / "metrics.json").st_mtime >= cutoff
        ]
        if not dirs:
            raise InputError(f"no job measured in the last {since_days:g} days among the directories given.")
    return dirs


def _sacct_peaks(backend: SlurmBackend, job_ids: list[str | None]) -> dict[int, float] | None:
    """Slurm's per-job GPU memory peaks for the accepted jobs: one sacct query, None without Slurm."""
    from frenzy_slurm.slurm import SlurmUnavailable

    ids = [int(j) for j in job_ids if j and j.isdigit()]
    if not ids:
        return None
    try:
        return backend.gpu_memory_peaks(ids)
    except SlurmUnavailable:
        return None


def _epilog(epilog_dir: Path | None) -> tuple[dict[str, list[dict]], list[str]]:
    """The site epilog's records (`epilog_dir`, else the default spool where it exists), and why none."""
    from frenzy_slurm.calibration.verify import trusted_epilog_records

    if epilog_dir is None and not DEFAULT_EPILOG_DIR.is_dir():
        return {}, []
    records, problem = trusted_epilog_records(epilog_dir or DEFAULT_EPILOG_DIR)
    return records, [problem] if problem else []


def previous_calibration(path: Path) -> CalibrationFile | None:
    """The calibration a new one replaces (its corrections move by at most --max-change), if one parses there.
    A stale one counts too: staleness says when to refit, not that the values were wrong."""
    from frenzy_slurm.calibration.model import CalibrationFile
    from frenzy_slurm.inputfile import check_trusted
    from frenzy_slurm.yamlfile import load_model_file

    if not os.path.lexists(path):
        return None
    try:
        check_trusted(path, "calibration file", "its factors bound the next calibration")
        return load_model_file(path, CalibrationFile)
    except InputError:
        return None  # unreadable or not trusted: nothing to hold the fit to (the output says it is replaced)


def calibrate(
    site_path: Path,
    site_cfg: SiteConfig,
    dirs: list[Path],
    bounds: FitBounds,
    path: Path,
    backend: SlurmBackend,
    epilog_dir: Path | None = None,
    use_sacct: bool = True,
    valid_days: int = 90,
    dry_run: bool = False,
) -> CalibrationRun:
    """Verify `dirs` (of the site `site_cfg` read from `site_path`) against Slurm (`backend`'s accounting) and
    the site epilog's records, observe the accepted ones, fit within `bounds` (each correction the calibration at
    `path` holds moving by at most bounds.max_change) and write the calibration file to `path` unless `dry_run`
    or nothing was fitted."""
    from frenzy_slurm.calibration.fit import fit
    from frenzy_slurm.calibration.model import CalibrationFile, site_fingerprint, write_calibration
    from frenzy_slurm.calibration.observe import observe
    from frenzy_slurm.calibration.verify import verify_jobs

    epilog, skipped = _epilog(epilog_dir)
    # a directory is evidence only if Slurm ran its plan (accounting, the site epilog's record) as it says
    verdict = verify_jobs(dirs, backend, epilog)
    observations = []
    sacct = _sacct_peaks(backend, [j for _, j, _ in verdict.accepted]) if use_sacct else None
    for d in verdict.dirs:
        got = observe(d, site_cfg, epilog, sacct)
        if isinstance(got, str):
            skipped.append(f"{d}: {got}")
        else:
            observations.append(replace(got, user=verdict.owners.get(d, "")))
            if got.note:
                skipped.append(f"{d}: {got.note}")
    previous = previous_calibration(path)
    steps, memory, findings = fit(observations, bounds, previous)
    now = time.time()
    cal = CalibrationFile(
        site_file=str(site_path),
        site_fingerprint=site_fingerprint(site_cfg),
        created_at=now,
        valid_until=now + valid_days * 86400,
        frenzy_version=__version__,
        limits=bounds,
        step_time=steps,
        memory=memory,
        jobs=[str(o.job_dir) for o in observations],
        not_applied=[f.text for f in findings if f.refused],
        notes=[f.text for f in findings if not f.refused],
    )
    written = not dry_run and bool(steps or memory)
    if written:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_calibration(path, cal)
    return CalibrationRun(
        path, cal, previous, dirs, verdict, observations, findings, skipped, len(epilog), written=written
    )
