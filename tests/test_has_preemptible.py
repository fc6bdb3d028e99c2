"""The opt-in preemptible mode: `fsbatch --preemptible` / model.yaml's `slurm.preemptible` runs a job in
the site's preemptible QOS (the site file's `preemption:`), with up to `preemption.max_job_share` of a pool."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.jobspec.sbatch_env import check_sbatch_env
from frenzy_slurm.planning import SiteFile
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.site.config import Preemption, SiteConfig

from .helpers import LOCAL, make_spec, planned

LONG = {"model": {"preset": "gpt2-medium"}, "training__steps": 200_000}  # hours on any pool of LOCAL


def _site(**preemption) -> SiteConfig:
    site = synthetic_site(LOCAL)
    return site.model_copy(update={"preemption": Preemption(qos="preemptible", **preemption)})


def test_the_site_file_names_the_preemptible_qos_and_checks_it():
    p = SiteConfig.model_validate({**synthetic_site(LOCAL).model_dump(), "preemption": {"qos": "scavenger"}}).preemption
    assert p is not None and (p.qos, p.min_run_min, p.max_job_share) == ("scavenger", 60, None)
    for bad in ({"qos": "a b"}, {"qos": "x", "max_job_share": 0}, {"qos": "x", "min_run_min": -1}, {}):
        with pytest.raises(ValidationError):
            Preemption.model_validate(bad)


def test_preemptible_and_a_qos_are_refused_together():
    with pytest.raises(ValidationError, match="drop one of them"):
        SlurmOptions(qos="normal", preemptible=True)
    with pytest.raises(InputError, match="qos normal and preemptible both choose the QOS"):
        SlurmOptions(qos="normal").overridden(preemptible=True)
    # SBATCH_QOS would override the preemptible QOS's #SBATCH line: refused, as for -q
    with pytest.raises(InputError, match="SBATCH_QOS='debug' would set sbatch --qos"):
        check_sbatch_env(SlurmOptions(preemptible=True), {"SBATCH_QOS": "debug"})
    assert check_sbatch_env(SlurmOptions(), {"SBATCH_QOS": "debug"})  # honoured (a note) for other jobs


def test_a_site_without_a_preemptible_qos_refuses_the_job(tmp_path):
    view = synthetic(LOCAL)
    with pytest.raises(InputError, match=r"names no preemptible QOS \(preemption: qos: \.\.\.\)") as exc:
        planned(make_spec(**LONG), view, options=SlurmOptions(preemptible=True))
    assert exc.value.exit_code == 2


def test_a_long_preemptible_job_runs_in_that_qos_and_may_take_a_whole_pool():
    view = synthetic(LOCAL)
    normal = planned(make_spec(**LONG), view, site=SiteFile(_site(max_job_share=1.0)))
    assert normal.plan.decision.chosen.gpus <= 8 and "--qos" not in normal.script  # max_job_share 0.5 of v100
    pre = planned(
        make_spec(**LONG), view, site=SiteFile(_site(max_job_share=1.0)), options=SlurmOptions(preemptible=True)
    )
    chosen = pre.plan.decision.chosen
    assert "#SBATCH --qos=preemptible\n" in pre.script and "#SBATCH --requeue\n" in pre.script
    assert chosen.gpus > normal.plan.decision.chosen.gpus  # beyond half a pool: later jobs preempt it instead
    assert chosen.run_time_s < normal.plan.decision.chosen.run_time_s
    held = planned(make_spec(**LONG), view, site=SiteFile(_site()), options=SlurmOptions(preemptible=True))
    assert held.plan.decision.chosen.gpus == normal.plan.decision.chosen.gpus and "--qos=preemptible" in held.script


def test_a_short_job_marked_preemptible_stays_in_its_own_qos_with_a_note():
    view = synthetic(LOCAL)
    short = make_spec(model={"preset": "gpt2"}, training__steps=50)
    req = planned(short, view, site=SiteFile(_site(min_run_min=600)), options=SlurmOptions(preemptible=True))
    assert "--qos" not in req.script
    assert any("not preemptible: its predicted run" in n and "min_run_min (600 min)" in n for n in req.notes)
