"""A time limit shorter than the checkpoint signal's lead, or one that is not a Slurm time, is refused in
model.yaml and as fsbatch's -t (exit 2); the minimum itself is accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec import load_job_spec

from .test_core_input_files import _run, offline  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = ROOT / "examples"

GOOD = (EXAMPLES / "tiny-cpu.yaml").read_text()


def _input_error(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    return exc.value.message


# --- time limits shorter than the checkpoint signal -----------------------------------------------------


@pytest.mark.parametrize(
    "value,needle",
    [
        ("1", "too short"),
        ("6", "too short"),
        ("0:30", "too short"),
        ("soon", "not a Slurm time"),
        ("-5", "not a Slurm time"),
        ("1-99999999999999999999", "longer than Slurm can represent"),
        ("٣٠", "not a Slurm time"),
    ],
)
def test_short_or_invalid_time_is_refused(write_yaml, value, needle):
    path = write_yaml(GOOD + f"slurm:\n  time: '{value}'\n")
    msg = _input_error(load_job_spec, path)
    assert "slurm.time" in msg and needle in msg


def test_time_at_the_minimum_is_accepted(write_yaml):
    from frenzy_slurm.jobspec.job import MIN_TIME_MIN, SIGNAL_LEAD_S, STARTUP_S

    assert MIN_TIME_MIN * 60 >= SIGNAL_LEAD_S + STARTUP_S
    assert load_job_spec(write_yaml(GOOD + f"slurm:\n  time: {MIN_TIME_MIN}\n")).slurm.time == MIN_TIME_MIN


@pytest.mark.parametrize("value", ["1", "abc", "0", "-3", "99999999999999999999999"])
def test_fsbatch_bad_time_flag_is_exit_2(offline, value, tmp_path):
    res = _run(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        *offline,
        "-t",
        value,
        "--job-dir",
        str(tmp_path / "job"),
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--time" in res.stderr, res.stderr
