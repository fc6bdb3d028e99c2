"""HAS plans within the QOS's GPU limits (MaxTRESPerJob, MaxTRESPerUser, GrpTRES on gres/gpu), read
through the seam (`qos_limits`); without accounting nothing changes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import NoFitError
from frenzy_slurm.has.model import Allocation, Component
from frenzy_slurm.has.qos import QOS_START_SOURCE, cap, within_qos
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
from frenzy_slurm.slurm.cli import enforces_qos_limits, qos_from_tres
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.parse import SlurmUnexpected, default_qos, parse_qos_rows, parse_tres_gpus
from frenzy_slurm.slurm.view import ClusterView, GpuLimit, Job, QosLimits

from .helpers import LOCAL, make_spec

# recorded on the local cluster (Slurm 22.05, AccountingStorageEnforce=limits), after
#   sacctmgr add qos gpu2 set MaxTRESPerJob=gres/gpu=2 MaxTRESPerUser=gres/gpu=3 GrpTRES=gres/gpu=6,cpu=100
#   sacctmgr add qos t4one set MaxTRESPerJob=gres/gpu:t4=1; sacctmgr modify user root set qos+=gpu2,t4one
QOS_ROWS = "normal|||\ngpu2|gres/gpu=2|gres/gpu=3|cpu=100,gres/gpu=6\nt4one|gres/gpu:t4=1||\n"
USER_ASSOC = "root|root||gpu2,normal,t4one|\n"


def test_tres_strings_give_gpu_counts_typed_and_untyped():
    assert parse_tres_gpus("cpu=100,gres/gpu=6") == (6, {})
    assert parse_tres_gpus("gres/gpu:t4=1") == (None, {"t4": 1})
    assert parse_tres_gpus("gres/gpu=4,gres/gpu:a100=2,gres/gpumem=40G,mem=10G") == (4, {"a100": 2})
    assert parse_tres_gpus("") == (None, {})


def test_sacctmgr_qos_rows():
    rows = parse_qos_rows(QOS_ROWS)
    assert rows["gpu2"] == ("gres/gpu=2", "gres/gpu=3", "cpu=100,gres/gpu=6")
    q = qos_from_tres("gpu2", "root", *rows["gpu2"])
    assert (q.per_job.gpus, q.per_user.gpus, q.group.gpus) == (2, 3, 6)
    assert cap(q, "a100") == 2 and cap(qos_from_tres("t4one", "u", *rows["t4one"]), "t4") == 1
    assert cap(qos_from_tres("t4one", "u", *rows["t4one"]), "a100") is None
    with pytest.raises(SlurmUnexpected):
        parse_qos_rows("garbage")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (USER_ASSOC, "normal"),  # several QOS, no default: slurmctld uses normal
        ("u|acct||gpu2|\n", "gpu2"),  # the only QOS
        ("u|acct||gpu2,normal|gpu2\n", "gpu2"),  # the association's DefaultQOS
        ("u|a||normal|\nu|b||big|big\nu|a|gpu|big|big\n", "normal"),  # the default account's, partition-less row
        ("", None),  # no association
    ],
)
def test_default_qos(text, expected):
    assert default_qos(text) == expected


def test_qos_limits_count_only_where_slurm_enforces_them():
    base = "AccountingStorageType = accounting_storage/slurmdbd\n"
    assert enforces_qos_limits(base + "AccountingStorageEnforce = associations,limits\n")
    assert enforces_qos_limits(base + "AccountingStorageEnforce = associations,limits,qos,safe\n")
    assert not enforces_qos_limits(base + "AccountingStorageEnforce = none\n")
    assert not enforces_qos_limits("AccountingStorageType = accounting_storage/none\nAccountingStorageEnforce = limits")


def _plan(fake: FakeSlurm, qos: str | None = None, **spec):
    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job

    s = make_spec(**spec)
    job = JobFile(Path("/home/u/model.yaml"), s, resolve_model(s, "."))
    opts = PlanOptions(slurm=SlurmOptions(qos=qos), job_dir=Path("/home/u/jobs/j"), now=fake.now)
    return plan_job(job, SiteFile(synthetic_site(LOCAL)), fake, opts)


def _limits(name: str, **limits: GpuLimit) -> QosLimits:
    return QosLimits(name=name, user="", **limits)


def test_a_plan_needing_more_gpus_than_the_qos_allows_a_job_is_not_proposed():
    free = _plan(FakeSlurm(synthetic(LOCAL)))
    assert free.plan.decision.chosen.gpus > 2  # the control: without limits this job takes more than 2
    fake = FakeSlurm(synthetic(LOCAL))
    fake.qos = {"normal": _limits("normal", per_job=GpuLimit(gpus=2))}
    req = _plan(fake)
    assert req.plan.decision.chosen.gpus <= 2
    assert "--gres=gpu:" in req.script


def test_dash_q_selects_the_qos():
    fake = FakeSlurm(synthetic(LOCAL))
    fake.qos = {"normal": _limits("normal", per_job=GpuLimit(gpus=1)), "big": _limits("big")}
    assert _plan(fake).plan.decision.chosen.gpus == 1
    assert _plan(fake, qos="big").plan.decision.chosen.gpus > 2


def test_a_typed_qos_limit_caps_only_that_gpu_type():
    fake = FakeSlurm(synthetic(LOCAL))
    fake.qos = {"normal": _limits("normal", per_job=GpuLimit(by_type={"a100_40gb": 1, "v100_32gb": 1, "t4": 0}))}
    chosen = _plan(fake).plan.decision.chosen
    assert all(c.gpus <= 1 for c in chosen.components)
    assert all(c.partition != "t4" for c in chosen.components)


def test_without_accounting_nothing_changes():
    fake = FakeSlurm(synthetic(LOCAL), accounting=False)
    fake.qos = {"normal": _limits("normal", per_job=GpuLimit(gpus=1))}
    free = _plan(FakeSlurm(synthetic(LOCAL)))
    assert _plan(fake).plan.decision.chosen.label() == free.plan.decision.chosen.label()


def _hold(fake: FakeSlurm, partition: str, gpus: int, minutes: int) -> None:
    """A running job of the fake's user holding `gpus` GPUs of `partition` for `minutes`."""
    fake.submit(
        BatchJob(
            script=Path("/jobs/other/job.sbatch"),
            workdir=Path("/jobs/other"),
            components=[ComponentRequest(partition, None, 1, gpus, minutes)],
            name="other",
        )
    )


def test_the_users_running_gpus_count_against_max_tres_per_user():
    fake = FakeSlurm(synthetic(LOCAL))
    fake.qos = {"normal": _limits("normal", per_user=GpuLimit(gpus=4))}
    _hold(fake, "v100", 4, 30)
    req = _plan(fake)
    chosen = req.plan.decision.chosen
    assert chosen.start_source == QOS_START_SOURCE
    assert chosen.start == pytest.approx(fake.now + 30 * 60, abs=1)  # when the user's job reaches its limit
    assert chosen.gpus <= 4
    assert any("QOS normal" in n and "your running jobs hold 4" in n for n in req.notes)


def test_a_job_wider_than_max_tres_per_user_is_never_proposed():
    fake = FakeSlurm(synthetic(LOCAL))
    fake.qos = {"normal": _limits("normal", per_user=GpuLimit(gpus=1), per_job=GpuLimit(gpus=1))}
    with pytest.raises(NoFitError) as exc:
        _plan(fake, model={"preset": "llama-2-7b"})
    assert "QOS normal: MaxTRESPerJob gres/gpu=1, MaxTRESPerUser gres/gpu=1" in exc.value.message


def _alloc(*comps: tuple[str, str | None, int], start: float = 0.0) -> Allocation:
    return Allocation(
        kind="heterogeneous" if len(comps) > 1 else "homogeneous",
        components=[
            Component(
                partition=p,
                gpu_type=t,
                gpu_model="A100-40GB",
                nodes=1,
                gpus_per_node=g,
                stages=[i],
                peak_gib=1.0,
                capacity_gib=2.0,
            )
            for i, (p, t, g) in enumerate(comps)
        ],
        plan=ParallelPlan(pp=len(comps)),
        step_time_s=1.0,
        run_time_s=60.0,
        time_min=2,
        start=start,
        start_source="now",
    )


def _view(qos: QosLimits, *jobs: Job) -> ClusterView:
    return ClusterView(backend="fake", taken_at=0.0, jobs=list(jobs), qos=qos)


def test_within_qos_hetjob_total_and_group_limits():
    qos = QosLimits(name="q", user="me", per_job=GpuLimit(gpus=4), group=GpuLimit(by_type={"a100": 2}))
    alloc, why = within_qos(_view(qos), _alloc(("a", "a100", 2), ("v", "v100", 3)))
    assert why == "uses 5 GPUs > QOS q MaxTRESPerJob gres/gpu=4"
    other = Job(
        job_id=1, user="you", state="RUNNING", qos="q", gpu_type="a100", gpus_per_node=1, node_count=1, end_time=600
    )
    elsewhere = Job(
        job_id=2,
        user="you",
        state="RUNNING",
        qos="normal",
        gpu_type="a100",
        gpus_per_node=2,
        node_count=1,
        end_time=9000,
    )
    alloc, why = within_qos(_view(qos, other, elsewhere), _alloc(("a", "a100", 2)))
    assert why is None and (alloc.start, alloc.start_source) == (600, QOS_START_SOURCE)  # GrpTRES: QOS q's jobs
    alloc, why = within_qos(_view(qos, other), _alloc(("v", "v100", 2)))
    assert why is None and alloc.start == 0  # the typed limit does not hold other types
    endless = dataclasses.replace(other, end_time=None)
    assert "no end time" in (within_qos(_view(qos, endless), _alloc(("a", "a100", 2)))[1] or "")


def test_qos_through_sbatch_flags_is_refused_for_dash_q():
    from frenzy_slurm.jobspec.sbatch_flags import refuse_sbatch_flag

    for flag in ("--qos=big", "--qo=big", "-q big", "-qbig"):
        why = refuse_sbatch_flag(flag)
        assert why is not None and "use fsbatch -q or slurm.qos" in why, (flag, why)
