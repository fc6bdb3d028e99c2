"""Sweeps: `--set KEY=V1,V2` flags -> the combinations (cartesian product), each one job's overrides and name.

    grid = parse_set(("training.learning_rate=1e-4,3e-4", "training.seq_len=1024,2048"))
    for combo in combinations(grid):          # 4 of them, in the order the flags and values were given
        load_job(path, combo.overrides, combo.name(spec_name))

Each combination is planned on its own (`planning.plan_job`): a longer sequence may need more GPUs, so the
plans of a sweep can differ, and each job has its own directory, plan.json, metrics.json and checkpoints
(which a Slurm job array, one directory for all its tasks, would share; see docs/python-api.md). The name of
a combination is model.yaml's name with the values appended (`tiny-cpu_1e-4_1024`), which gives each its own
submission hash and job directory. Values are validated through the JobSpec model like the file's own.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from frenzy_slurm.core.errors import InputError

MAX_COMBINATIONS = 256  # more jobs than anyone reviews from one command: refused, as a typo (1e-4,...,) would be
NAME_MAX = 64  # JobSpec.name's pattern: 1 + up to 63 characters
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]+")


@dataclass(frozen=True)
class Value:
    """One value of a --set: as written (for the job's name) and as model.yaml would hold it."""

    text: str
    value: Any


@dataclass(frozen=True)
class Combination:
    """One job of a sweep: the overrides it applies, and its position among all."""

    index: int
    total: int
    items: tuple[tuple[str, Value], ...]

    @property
    def overrides(self) -> dict[str, Any]:
        return {key: v.value for key, v in self.items}

    def name(self, base: str) -> str | None:
        """The job's name: `base` with the values appended (safe characters only, at most NAME_MAX), or
        None for a single combination (an override, not a sweep: the name stays model.yaml's)."""
        if self.total == 1:
            return None
        suffix = "_".join(_UNSAFE.sub("-", v.text).strip("-") or "x" for _, v in self.items)
        name = f"{base}_{suffix}"
        if len(name) > NAME_MAX:  # long values: the index keeps names apart, the values are in plan.json
            tag = f"_{self.index}"
            name = f"{base[: NAME_MAX - len(tag)]}{tag}"
        return name

    def label(self) -> str:
        """`training.learning_rate=1e-4 training.seq_len=1024`, as the user wrote it."""
        return " ".join(f"{key}={v.text}" for key, v in self.items)


def parse_value(text: str) -> Any:
    """A value as model.yaml would hold it: YAML's reading (1024, true, null, a string). A string such as
    `1e-4` (PyYAML's reading of an exponent without a dot) becomes a number where the field is one: the
    JobSpec model converts it, as it does the file's own."""
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        return text
    return text if isinstance(value, (list, dict)) else value  # a flow list or mapping is not one value


def parse_set(flags: Sequence[str]) -> dict[str, list[Value]]:
    """`KEY=V1[,V2...]` per flag -> KEY: its values, in order. A key twice, an empty value list or a value
    given twice for one key is refused naming the flag."""
    grid: dict[str, list[Value]] = {}
    for flag in flags:
        key, eq, values = flag.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"--set {flag}: write KEY=VALUE[,VALUE...], e.g. --set training.learning_rate=1e-4,3e-4.")
        if key in grid:
            raise InputError(f"--set {key} is given twice: give all its values in one flag ({key}=A,B).")
        texts = [t.strip() for t in values.split(",")]
        if any(not t for t in texts):
            raise InputError(f"--set {flag}: an empty value; separate values by single commas ({key}=A,B).")
        if len(set(texts)) != len(texts):
            raise InputError(f"--set {flag}: a value is given twice; each combination must differ.")
        grid[key] = [Value(t, parse_value(t)) for t in texts]
    return grid


def combinations(grid: Mapping[str, Sequence[Value]]) -> list[Combination]:
    """Every combination of the values (the first key varies slowest), at most MAX_COMBINATIONS; no keys
    give one combination that overrides nothing."""
    total = math.prod(len(v) for v in grid.values())
    if total > MAX_COMBINATIONS:
        sizes = " x ".join(f"{len(v)} ({k})" for k, v in grid.items())
        raise InputError(
            f"--set: {sizes} = {total} combinations, more than {MAX_COMBINATIONS} jobs from one command; "
            "sweep fewer values, or split the sweep over several fsbatch runs."
        )
    keys = list(grid)
    return [
        Combination(i, total, tuple(zip(keys, values, strict=True)))
        for i, values in enumerate(itertools.product(*(grid[k] for k in keys)))
    ]


def check_max_running(max_running: int | None, total: int, dependency: str | None = None) -> None:
    """A sweep's cap on jobs running at once (submitit's slurm_array_parallelism): at least 1, for a sweep
    (several combinations), and joinable with the plan's own dependency (`,` means all; `?` cannot be mixed)."""
    if max_running is None:
        return
    if isinstance(max_running, bool) or not isinstance(max_running, int) or max_running < 1:
        raise InputError(f"--max-running {max_running}: give a whole number of jobs, at least 1.")
    if total < 2:
        raise InputError(
            "--max-running caps how many jobs of a sweep run at once; this is one job. Sweep values with "
            "--set KEY=A,B (fs.sweep in Python), or drop --max-running."
        )
    if dependency and "?" in dependency:
        raise InputError(
            f"--max-running with --dependency {dependency}: each job of the sweep also waits for an earlier one "
            "(afterany, joined by ','), and Slurm cannot mix ',' with '?'; use ',' or drop one of them."
        )


def waits_for(index: int, max_running: int | None) -> int | None:
    """The sweep job that job `index` waits for under --max-running N: job index-N (afterany), so the sweep runs
    as N chains and at most N of its jobs run at once; None for the first N."""
    return index - max_running if max_running is not None and index >= max_running else None


def grid_of(values: Mapping[str, Sequence[Any]]) -> dict[str, list[Value]]:
    """The API's grid (`{"training.learning_rate": [1e-4, 3e-4]}`, Python values) in --set's form."""
    grid: dict[str, list[Value]] = {}
    for key, options in values.items():
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence) or not options:
            raise InputError(f"sweep {key}: give a non-empty list of values, e.g. {{{key!r}: [1, 2]}}.")
        texts = [str(v) for v in options]
        if len(set(texts)) != len(texts):
            raise InputError(f"sweep {key}: a value is given twice; each combination must differ.")
        grid[key] = [Value(t, v) for t, v in zip(texts, options, strict=True)]
    return grid
