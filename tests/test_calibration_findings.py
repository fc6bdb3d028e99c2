"""A calibration's findings carry their status: refused (not applied) or a note, whatever their text says."""

from pathlib import Path

import pytest

pytest.importorskip("scipy", reason="fitting needs the calibrate extra")

from frenzy_slurm.calibration import FitBounds  # noqa: E402
from frenzy_slurm.calibration.fit import fit_memory  # noqa: E402
from frenzy_slurm.calibration.observe import Observation  # noqa: E402


def _obs(job_dir: Path, ratio: float) -> Observation:
    return Observation(
        job_dir=job_dir,
        job_id=None,
        kind="homogeneous",
        gpus=("A100-40GB",),
        precision="bf16-mixed",
        mode="bf16-mixed/full",
        slots=1,
        compute_s=None,
        other_s=None,
        measured_step_s=None,
        memory=[(10.0, 10.0 * ratio)],
        user=job_dir.name,
    )


def test_a_note_naming_a_directory_called_not_applied_stays_a_note(tmp_path):
    """The outlier note names the job directory; one called "not applied" used to file the note among the
    corrections not applied (the CLI sorted findings by that substring)."""
    honest = [_obs(tmp_path / f"run{i}", r) for i, r in enumerate((1.0, 1.01, 0.99, 1.02))]
    odd = _obs(tmp_path / "not applied", 0.70)
    (corr,), findings = fit_memory([*honest, odd], FitBounds(min_jobs=3))
    assert corr.factor == pytest.approx(1.005)
    (outlier,) = [f for f in findings if "median/MAD" in f.text]
    assert "not applied" in outlier.text and not outlier.refused


def test_too_few_jobs_is_refused_and_a_vote_note_is_not(tmp_path):
    few = [_obs(tmp_path / "a", 1.0)]
    _, findings = fit_memory(few, FitBounds(min_jobs=3))
    assert [(f.refused, f.text) for f in findings] == [
        (True, "memory bf16-mixed/full: 1 job(s), fewer than min_jobs(3); not applied")
    ]
