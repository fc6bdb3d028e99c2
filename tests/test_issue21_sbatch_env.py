"""Issue 21: -C/--exclusive in every hetjob component; a user's SBATCH_* environment against the plan."""

from __future__ import annotations

import re

from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, make_spec
from .test_render import HETERO_SPEC, hetero_view, normalize, rendered


def component_blocks(script: str) -> list[str]:
    """The #SBATCH lines of each component: the first from the top, each next one after `#SBATCH hetjob`."""
    head = script.split("\nsrun ", 1)[0]
    return head.split("#SBATCH hetjob")


def test_hetjob_constraint_and_exclusive_in_every_component():
    options = SlurmOptions(constraint="ib", exclusive=True)
    req = rendered(make_spec(**HETERO_SPEC), hetero_view(), options=options)
    assert req.kind == "heterogeneous"
    blocks = component_blocks(normalize(req.script))
    assert len(blocks) == 2
    for block in blocks:
        assert re.findall(r"^#SBATCH --constraint=(\S+)$", block, re.M) == ["ib"]
        assert re.findall(r"^#SBATCH (--exclusive)$", block, re.M) == ["--exclusive"]
    # the job-wide header still carries the job-wide flags once, and only them
    assert req.script.count("--job-name=") == 1


def test_homogeneous_constraint_and_exclusive_once():
    req = rendered(make_spec(), synthetic(LOCAL), options=SlurmOptions(constraint="ib", exclusive=True))
    assert req.kind == "homogeneous"
    assert req.script.count("#SBATCH --constraint=ib\n") == 1
    assert req.script.count("#SBATCH --exclusive\n") == 1
