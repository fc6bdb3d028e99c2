"""-C/--constraint and --exclusive in job.sbatch: in every component of a heterogeneous job, once in a
homogeneous one; a custom _component.j2 that would drop them is refused."""

from __future__ import annotations

import re

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, make_spec
from .test_render import HETERO_SPEC, hetero_view, normalize, rendered


def component_blocks(script: str) -> list[str]:
    """The #SBATCH lines of each component: the first from the top, each next one after `#SBATCH hetjob`."""
    head = script.split("\nsrun ", 1)[0]
    return head.split("#SBATCH hetjob")


def test_hetjob_constraint_and_exclusive_in_every_component():
    from pathlib import Path

    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.render import render_job

    # a heterogeneous plan (made with -C: the synthetic nodes' features are not known, so all are kept), rendered
    # with --exclusive too: under --exclusive HAS would not plan on these half-used nodes
    # (test_has_constraint_exclusive.py)
    spec = make_spec(**HETERO_SPEC)
    shared = rendered(spec, hetero_view(), options=SlurmOptions(constraint="ib"))
    assert shared.kind == "heterogeneous"
    options = SlurmOptions(constraint="ib", exclusive=True)
    model = resolve_model(spec, ".")
    req = render_job(spec, Path("/home/u/model.yaml"), model, shared.decision, options, shared.job_dir, None)
    blocks = component_blocks(normalize(req.files["job.sbatch"]))
    assert len(blocks) == 2
    for block in blocks:
        assert re.findall(r"^#SBATCH --constraint=(\S+)$", block, re.M) == ["ib"]
        assert re.findall(r"^#SBATCH (--exclusive)$", block, re.M) == ["--exclusive"]
    # the job-wide header still carries the job-wide flags once, and only them
    assert req.files["job.sbatch"].count("--job-name=") == 1


def test_homogeneous_constraint_and_exclusive_once():
    req = rendered(make_spec(), synthetic(LOCAL), options=SlurmOptions(constraint="ib", exclusive=True))
    assert req.kind == "homogeneous"
    assert req.script.count("#SBATCH --constraint=ib\n") == 1
    assert req.script.count("#SBATCH --exclusive\n") == 1


def test_custom_component_template_without_component_flags_is_refused(tmp_path):
    """A --templates _component.j2 from before -C/--exclusive moved out of the header would drop them silently."""
    templates = tmp_path / "templates"
    templates.mkdir()
    (templates / "_component.j2").write_text("#SBATCH --partition={{ c.partition }}\n#SBATCH --nodes={{ c.nodes }}\n")
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL), options=SlurmOptions(exclusive=True), template_dir=templates)
    assert "'#SBATCH --exclusive' in each of its 1 component(s)" in err.value.message
    assert "component_flags" in err.value.message
