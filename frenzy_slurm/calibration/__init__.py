"""Per-site calibration: measured jobs correct MARP's memory and step-time predictions.

    observe (job dir -> Observation) -> fit (bounded, minimum jobs) -> CalibrationFile beside the site file
    -> calibrated_site() at every fsbatch (MARP and HAS see calibrated GPU specs)

Needs no torch; fitting needs numpy and scipy (`pip install 'frenzy-slurm[calibrate]'`).
"""

from frenzy_slurm.calibration.apply import (
    Applied,
    calibrated_site,
    explain_lines,
    find_calibration,
    for_job,
    job_record,
)
from frenzy_slurm.calibration.model import (
    SITE_WIDE,
    CalibrationFile,
    FitBounds,
    MemoryCorrection,
    StepTimeCorrection,
    calibration_path,
    load_calibration,
    site_fingerprint,
    write_calibration,
)
from frenzy_slurm.calibration.observe import Observation, measured_step_time, observe, steady_step_time

__all__ = [
    "Applied",
    "CalibrationFile",
    "FitBounds",
    "MemoryCorrection",
    "Observation",
    "SITE_WIDE",
    "StepTimeCorrection",
    "calibrated_site",
    "calibration_path",
    "explain_lines",
    "for_job",
    "job_record",
    "find_calibration",
    "load_calibration",
    "measured_step_time",
    "observe",
    "site_fingerprint",
    "steady_step_time",
    "write_calibration",
]
