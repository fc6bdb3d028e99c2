"""The workloads shipped in tests/data/sim are what `sample_philly` draws from the Philly trace with their seed.

The tests replay these files, so they run in a checkout without ../shared/data (the 3.4 MB trace is not in the
repository: ../shared/data/traces/README.md says where it comes from, Microsoft's msr-fiddle/philly-traces in the
Pollux/Sia form). Where the trace is here, each file must still be its sample; elsewhere this check skips.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from frenzy_slurm.cli.simulate import trace_path
from frenzy_slurm.sim import load_workload, sample_philly

SHIPPED = sorted((Path(__file__).parent / "data" / "sim").glob("philly-seed*-*.yaml"))
TRACE = trace_path(None)  # $FRENZY_PHILLY_TRACE, else ../shared/data/traces/philly.csv


def test_the_deep_queue_workloads_are_shipped():
    names = {p.name for p in SHIPPED}
    assert {"philly-seed2-80.yaml", "philly-seed4-30.yaml"} <= names
    assert all(p.stat().st_size < 50_000 for p in SHIPPED)  # small: the trace itself stays out


@pytest.mark.skipif(
    not TRACE.is_file(),
    reason=f"the Philly trace is not at {TRACE} (../shared/data/traces/philly.csv of the development checkout, "
    "or FRENZY_PHILLY_TRACE; its README says where it comes from)",
)
@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_workload_is_its_sample_of_the_trace(path):
    seed, jobs = map(int, re.fullmatch(r"philly-seed(\d+)-(\d+)\.yaml", path.name).groups())
    assert load_workload(path) == sample_philly(TRACE, seed, jobs)
