"""Slurm's time format: reading the time strings Slurm takes and prints, and writing durations the way Slurm does.

    from frenzy_slurm.slurm.timefmt import format_slurm_time, parse_slurm_time
    parse_slurm_time("1-12:00")      # 2160 (minutes, rounded up)
    format_slurm_time(93784)         # "1-02:03:04"

The seam owns Slurm's formats: this module is where the package learns how Slurm spells a time, so the seam's
parsers (slurm/parse.py), the spec's validators of `--time` and `limits.time_limit` (jobspec/job.py), HAS and
the CLI's tables all read and write times through it. It imports nothing from other stages (nor from the rest of
the seam), so any stage may use it without pulling in another.
"""

from __future__ import annotations

import re

# `\Z`, never `$`, ends the pattern: Python's `$` also matches before a trailing newline, and a newline in a
# value ends its #SBATCH line (sbatch then ignores every directive after it).
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\Z", re.ASCII)

# Slurm stores time limits as minutes in 32 bits; all ones means INFINITE (slurm.h: INFINITE).
SLURM_INFINITE_MIN = 0xFFFFFFFF


def parse_slurm_time(value: str | int, allow_zero: bool = False) -> int:
    """Slurm time formats (`M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`) to minutes, rounded up."""
    if isinstance(value, int):
        if value < 0 or (value == 0 and not allow_zero):
            raise ValueError("time must be a positive number of minutes")
        if value >= SLURM_INFINITE_MIN:
            raise ValueError(f"{value} minutes is longer than Slurm can represent; ask for a realistic time limit")
        return value
    m = _TIME_RE.match(value.strip(" "))  # spaces only: a newline or tab is not part of a time
    if not m:
        raise ValueError(f"'{value}' is not a Slurm time; use minutes, HH:MM:SS or D-HH:MM:SS")
    days, a, b, c = m.groups()
    if days is not None:  # D-H[:M[:S]]
        seconds = int(days) * 86400 + int(a) * 3600 + int(b or 0) * 60 + int(c or 0)
    elif c is not None:  # H:M:S
        seconds = int(a) * 3600 + int(b) * 60 + int(c)
    elif b is not None:  # M:S
        seconds = int(a) * 60 + int(b)
    else:
        seconds = int(a) * 60
    if seconds == 0 and not allow_zero:
        raise ValueError("time must be positive")
    minutes = -(-seconds // 60)
    if minutes >= SLURM_INFINITE_MIN:
        raise ValueError(f"'{value}' is longer than Slurm can represent; ask for a realistic time limit")
    return minutes


def format_slurm_time(seconds: float) -> str:
    """A duration in Slurm's `[D-]HH:MM:SS` (as squeue prints TIME), rounded to the second."""
    s = int(round(seconds))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return (f"{d}-" if d else "") + f"{h:02d}:{m:02d}:{s:02d}"
