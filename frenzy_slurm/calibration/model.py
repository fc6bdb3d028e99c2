"""The calibration file: per-site corrections fitted from measured jobs, stored beside the site file.

`site.yaml` -> `site.calibration.yaml` (or `$FRENZY_CALIBRATION`). It records what it was fitted
against (a fingerprint of the site file's pools) and until when it is valid; loading a calibration
whose site file changed, that has expired, or that does not parse is an error, never silently skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.config import JsonDict

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import check_trusted
from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.core.version import __version__
from frenzy_slurm.core.yamlfile import load_model_file
from frenzy_slurm.site.config import SiteConfig

SITE_WIDE = "*"  # the `gpu` of a step-time correction fitted over every GPU type of the site


# Bounds on every number of the file (a calibration is read by every fsbatch): finite, and far beyond what a fit
# can produce (FitBounds caps applied factors at x4 and overheads at 30 s by default), so a value past them was
# written by hand or by something else than `frenzy-slurm calibrate`.
_MAX_FACTOR = 100.0
_MAX_S = 3600.0
_MAX_JOBS = 10**7
_MAX_RANKS = 10**9
_MAX_ERROR = 1e6  # a relative error
_MAX_EPOCH_S = 32_503_680_000.0  # the year 3000
FACTOR: JsonDict = {"unit": "(a factor)"}
SECONDS: JsonDict = {"unit": "s"}
EPOCH: JsonDict = {"unit": "s since 1970"}


class _M(BaseModel):
    # defer_build: the validators are built when a calibration file is first read; a site without one (and every
    # `fsbatch --dry-run` on it) never pays for them (behaviour is the same)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, defer_build=True)


class StepTimeCorrection(_M):
    """Step-time model corrections for one GPU model (or the whole site) and one precision.

    predicted step = compute / (peak x efficiency x efficiency_factor) + communication
                     + step_overhead_s + microbatch_overhead_s x (grad_accum + pp - 1)
    """

    gpu: str = Field(description="Catalog GPU model, or '*' for the site-wide fit used by GPU types without their own.")
    precision: str = Field(description="Training precision of the jobs fitted (fp32, bf16-mixed, ...).")
    efficiency_factor: float = Field(
        1.0,
        gt=0,
        le=_MAX_FACTOR,
        json_schema_extra=FACTOR,
        description="Achieved/assumed FLOP-rate ratio; 1 = catalog efficiency.",
    )
    step_overhead_s: float = Field(
        0.0,
        ge=0,
        le=_MAX_S,
        json_schema_extra=SECONDS,
        description="Fixed seconds per optimizer step (optimizer, collectives' latency, framework bookkeeping).",
    )
    microbatch_overhead_s: float = Field(
        0.0,
        ge=0,
        le=_MAX_S,
        json_schema_extra=SECONDS,
        description="Fixed seconds per micro-batch slot on the critical "
        "path (per-op dispatch, pipeline send/recv latency).",
    )
    jobs: int = Field(ge=1, le=_MAX_JOBS, description="Jobs the fit rests on.")
    raw_error: float = Field(
        ge=0,
        le=_MAX_ERROR,
        description="Median |predicted - measured| / measured of those jobs before calibration.",
    )
    calibrated_error: float = Field(ge=0, le=_MAX_ERROR, description="The same after calibration.")


class MemoryCorrection(_M):
    """A factor on MARP's predicted peak memory for one framework mode."""

    mode: str = Field(description="Framework mode: '<precision>/<method>' (e.g. bf16-mixed/full, fp32/lora).")
    factor: float = Field(
        gt=0,
        le=_MAX_FACTOR,
        json_schema_extra=FACTOR,
        description="Measured / predicted peak; predictions are multiplied by it.",
    )
    jobs: int = Field(ge=1, le=_MAX_JOBS, description="Jobs the factor rests on.")
    ranks: int = Field(ge=1, le=_MAX_RANKS, description="Rank measurements (one per GPU) the factor rests on.")


class FitBounds(_M):
    """The bounds a fit had to satisfy to be applied."""

    min_jobs: int = Field(3, ge=1, le=_MAX_JOBS, description="Fewest measured jobs a correction may rest on.")
    max_efficiency_factor: float = Field(
        4.0, ge=1, le=_MAX_FACTOR, json_schema_extra=FACTOR, description="Efficiency may move by at most this factor."
    )
    max_step_overhead_s: float = Field(
        30.0, gt=0, le=_MAX_S, json_schema_extra=SECONDS, description="Largest fixed per-step overhead accepted."
    )
    max_microbatch_overhead_s: float = Field(
        5.0, gt=0, le=_MAX_S, json_schema_extra=SECONDS, description="Largest per-micro-batch overhead accepted."
    )
    max_memory_factor: float = Field(
        1.5, ge=1, le=_MAX_FACTOR, json_schema_extra=FACTOR, description="Memory predictions may move by at most this."
    )
    max_change: float = Field(
        1.25,
        ge=1,
        le=_MAX_FACTOR,
        json_schema_extra=FACTOR,
        description="A correction the previous calibration applied moves by at most this factor either way per "
        "calibration (its efficiency, overheads and memory factor): thin or hostile evidence cannot swing it.",
    )


class CalibrationFile(_M):
    """What `frenzy-slurm calibrate` writes; MARP and HAS read it at every fsbatch."""

    version: Literal[1] = Field(1, description="File format version.")
    site_file: str = Field(description="The site file this was fitted against (informational).")
    site_fingerprint: str = Field(description="Hash of that site file's pools; a changed site file makes this stale.")
    created_at: float = Field(ge=0, le=_MAX_EPOCH_S, json_schema_extra=EPOCH, description="When it was fitted.")
    valid_until: float = Field(
        ge=0,
        le=_MAX_EPOCH_S,
        json_schema_extra=EPOCH,
        description="After this (epoch seconds) the file is stale: refit or remove it.",
    )
    frenzy_version: str = Field(description="frenzy-slurm version that fitted it.")
    limits: FitBounds = Field(default_factory=FitBounds, description="Bounds the fit was held to.")
    step_time: list[StepTimeCorrection] = Field(default_factory=list, description="Applied step-time corrections.")
    memory: list[MemoryCorrection] = Field(default_factory=list, description="Applied memory corrections.")
    jobs: list[str] = Field(default_factory=list, description="Job directories the fit used.")
    not_applied: list[str] = Field(
        default_factory=list,
        description="Fits refused (too few jobs, out of bounds), and why; kept for the admin, never applied.",
    )
    notes: list[str] = Field(
        default_factory=list, description="Terms the jobs could not tell apart, kept at their prior values."
    )

    def step_correction(self, gpu: str, precision: str) -> StepTimeCorrection | None:
        """This GPU model's own correction, else the site-wide one for the precision, else None."""
        own = next((c for c in self.step_time if c.gpu == gpu and c.precision == precision), None)
        return own or next((c for c in self.step_time if c.gpu == SITE_WIDE and c.precision == precision), None)

    def memory_factor(self, mode: str) -> MemoryCorrection | None:
        return next((m for m in self.memory if m.mode == mode), None)


def site_fingerprint(site: SiteConfig) -> str:
    """Hash of what the admin wrote in the site file (pools and defaults), not its comments or its name.

    Only values set in the file count (exclude_unset): a new frenzy-slurm version adding a field with a
    default must not make every site's calibration stale.
    """
    data = json.dumps(site.model_dump(mode="json", exclude={"cluster"}, exclude_unset=True), sort_keys=True)
    return hashlib.sha256(data.encode()).hexdigest()[:16]


def calibration_path(site_path: Path) -> Path:
    """$FRENZY_CALIBRATION, else `<site stem>.calibration.yaml` beside the site file."""
    env = os.environ.get("FRENZY_CALIBRATION")
    if env:
        return Path(env)
    return site_path.with_name(site_path.stem + ".calibration.yaml")


def load_calibration(path: Path, site: SiteConfig, now: float | None = None) -> CalibrationFile:
    """Read and check a calibration file; stale or malformed is an InputError that says how to fix it."""
    if os.path.lexists(path):
        check_trusted(path, "calibration file", "its factors change every job's memory and step-time predictions")
    cal = load_model_file(path, CalibrationFile)
    fix = f"To fix: rerun `frenzy-slurm calibrate` (it rewrites {path}), or delete {path} to plan without calibration."
    if cal.site_fingerprint != site_fingerprint(site):
        raise InputError(
            f"{path}: stale calibration: it was fitted against a different version of the site file "
            f"({cal.site_file}, pools changed since). {fix}"
        )

    if cal.frenzy_version != __version__:
        # corrections are relative to the step-time and memory models of the version that fitted them
        raise InputError(
            f"{path}: stale calibration: fitted by frenzy-slurm {cal.frenzy_version}, this is "
            f"{__version__}, whose predictions it was not fitted to. {fix}"
        )
    now = time.time() if now is None else now
    if now > cal.valid_until:
        days = (now - cal.valid_until) / 86400
        raise InputError(
            f"{path}: stale calibration: valid_until passed {days:.0f} days ago "
            f"({time.strftime('%Y-%m-%d', time.gmtime(cal.valid_until))}). {fix}"
        )
    gpus = {p.gpu for p in site.pools} | {SITE_WIDE}
    for i, c in enumerate(cal.step_time):
        if c.gpu not in gpus:
            raise InputError(
                f"{path}: step_time.{i}.gpu: '{c.gpu}' is no GPU of the site file "
                f"({', '.join(sorted(gpus - {SITE_WIDE}))}). {fix}"
            )
    return cal


def write_calibration(path: Path, cal: CalibrationFile) -> None:
    """Atomically, with a header saying where it came from."""
    import yaml

    head = (
        f"# Written by `frenzy-slurm calibrate` (frenzy-slurm {cal.frenzy_version}) from {len(cal.jobs)} job(s).\n"
        "# MARP and HAS apply it at every fsbatch; `fsbatch --explain` shows raw and calibrated numbers.\n"
        "# Rerun the command to refresh it; delete the file to plan without calibration.\n"
    )
    body = yaml.safe_dump(cal.model_dump(mode="json"), sort_keys=False, width=110)
    # every user's fsbatch reads it: world-readable, written by the one private atomic writer (a link planted
    # at the name, or at a temporary name, is replaced, never followed)
    write_atomic(path, head + body, mode=0o644)
