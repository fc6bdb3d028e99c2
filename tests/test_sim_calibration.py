"""A simulated site that calibrates (`sim/calibrating.py`): the product's fit on the simulated jobs' measurements
reaches the policies that plan with MARP, never the plain users, and never the truth."""

from __future__ import annotations

import pytest

from frenzy_slurm.calibration.model import CalibrationFile, site_fingerprint
from frenzy_slurm.sim import ErrorModel, load_workload, parse_compact
from frenzy_slurm.sim.calibrating import SiteCalibration
from frenzy_slurm.sim.runner import Runner, warmed_calibration
from tests.test_sim import CLUSTER, WORKLOAD  # the small end-to-end simulation's workload and cluster


@pytest.fixture(scope="module")
def wl():
    return load_workload(WORKLOAD)


def _empty(site) -> CalibrationFile:
    return CalibrationFile(
        site_file="s", site_fingerprint=site_fingerprint(site), created_at=0, valid_until=1, frenzy_version="x"
    )


def test_the_raw_step_of_a_plan_is_what_the_search_predicted_on_the_site_file(wl):
    """With a calibration that corrects nothing, the step recomputed from a placement's plan on the uncalibrated
    pool (what the truth scales) is the step the policy's decision predicted, for HAS's and sia's placements."""
    for policy in ("has", "sia"):
        runner = Runner(wl, parse_compact(CLUSTER), policy, seed=5, errors=ErrorModel.exact())
        cal = SiteCalibration(runner.ctx.site, every_s=3600.0)
        cal.current = _empty(runner.ctx.site)
        seen = []
        outcome = runner._outcome

        def check(sj, outcome=outcome, runner=runner, cal=cal, seen=seen):
            a, p = runner.running[sj.job_id]
            if p.plan is not None and len(p.components) == 1:
                seen.append((cal.raw_step_s(a, p), p.step_time_s))
            return outcome(sj)

        runner._outcome = check  # type: ignore[method-assign]
        runner.sim.outcome = check
        runner.run()
        assert len(seen) >= 10, policy
        for raw, predicted in seen:
            assert raw == pytest.approx(predicted, rel=1e-9), policy


def test_a_calibrated_site_learns_each_types_speed_from_its_jobs_and_only_for_marp_planners():
    """The published truth runs a T4 and a V100 faster than MARP's catalog rates (x1.78 and x1.52): the site fitted
    from one period's jobs (the product's fit) moves each type's efficiency by about that; the plain users' policy
    is never given it."""
    from frenzy_slurm.cli.simulate import DEV_TRACE
    from frenzy_slurm.sim import sample_philly
    from frenzy_slurm.sim.jobs import Attempt
    from frenzy_slurm.sim.truth import marp_relative, speed_table

    wl = sample_philly(DEV_TRACE, 7, 30)
    cluster = parse_compact("V100-32GB:1x8,T4:2x4")
    cal = warmed_calibration(wl, cluster, "has", 1007, 6 * 3600.0, errors=ErrorModel())
    assert cal is not None and cal.current is not None and cal.fits >= 1
    table = speed_table()
    for gpu in ("T4", "V100-32GB"):
        truth = table.relative(gpu, "bf16-mixed") / marp_relative(gpu, "bf16-mixed", table.reference)
        corr = cal.current.step_correction(gpu, "bf16-mixed")
        assert corr is not None and corr.gpu == gpu and corr.jobs >= 3
        assert corr.efficiency_factor == pytest.approx(truth, rel=0.1), gpu
    raw = {p.spec().name: p.spec().efficiency for p in cal.site.pools}
    fitted = {p.spec().name: p.spec().efficiency for p in cal.site_for("bf16-mixed", "full").pools}
    assert fitted["T4"] > 1.5 * raw["T4"] and fitted["V100-32GB"] > 1.3 * raw["V100-32GB"]
    # a policy standing for users (slurm-multi, the plain users) is never given a calibration
    assert warmed_calibration(wl, cluster, "slurm-multi", 1007, 6 * 3600.0) is None
    runner = Runner(wl, cluster, "has", seed=7, calibration=cal)
    job = runner.workload.jobs[0]
    attempt = Attempt(job, job.steps)
    assert runner.ctx.site_for(attempt, calibrated=False) is runner.ctx.site
    assert runner.ctx.site_for(attempt, calibrated=True) is cal.site_for(job.precision, job.method)


def test_calibration_changes_decisions_not_the_truth_of_the_same_plan(wl):
    """The same job on the same plan runs the same true step whether its policy planned with the calibrated site
    or not: the truth scales the uncalibrated prediction."""
    cluster = parse_compact(CLUSTER)
    cal = warmed_calibration(wl, cluster, "has", 1005, 6 * 3600.0, errors=ErrorModel())
    assert cal is not None
    plain = Runner(wl, cluster, "has", seed=5)
    calibrated = Runner(wl, cluster, "has", seed=5, calibration=cal)
    steps: dict[str, dict] = {"plain": {}, "calibrated": {}}
    for name, runner in (("plain", plain), ("calibrated", calibrated)):
        outcome = runner._outcome

        def record(sj, outcome=outcome, runner=runner, name=name):
            a, p = runner.running[sj.job_id]
            got = outcome(sj)
            if sj.job_id in runner._start_step and p.plan is not None and len(p.components) == 1:
                key = (a.job.id, p.label, p.plan.dp, p.plan.pp, p.plan.micro_batch, p.plan.grad_accum, p.plan.zero)
                steps[name][key] = (runner._start_step[sj.job_id], p.step_time_s)
            return got

        runner.sim.outcome = record
        runner.run()
    common = set(steps["plain"]) & set(steps["calibrated"])
    assert common
    for key in common:
        assert steps["calibrated"][key][0] == pytest.approx(steps["plain"][key][0], rel=1e-9)
    # ... while the calibrated policy predicted them differently (closer to the truth)
    assert any(steps["calibrated"][k][1] != pytest.approx(steps["plain"][k][1], rel=1e-6) for k in common)


def test_the_site_refits_on_its_cadence_during_a_run(wl):
    r = Runner(wl, parse_compact(CLUSTER), "has", seed=5, calibrate_every_s=1800.0)
    result = r.run()
    assert result.extra["calibrations"] >= 1
    assert r.ctx.calibration is not None and r.ctx.calibration.next_fit_s > 1800.0
    # a user policy gets no calibration, whatever the option says
    u = Runner(wl, parse_compact(CLUSTER), "slurm-multi", seed=5, calibrate_every_s=1800.0)
    assert "calibrations" not in u.run().extra


def test_the_simulate_command_runs_a_calibrated_site(tmp_path):
    import json

    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main as admin

    out = tmp_path / "o.json"
    args = ["simulate", str(WORKLOAD), "--cluster", CLUSTER, "--policy", "has,slurm-multi", "--seed", "5"]
    res = CliRunner().invoke(admin, [*args, "--calibrate-every", "6", "--json", str(out)])
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert runs[0]["policy"] == "has" and runs[0]["calibrations"] >= 1 and runs[0]["completed"] == 12
    assert "calibrations" not in runs[1]  # slurm-multi stands for users: no calibration
    bad = CliRunner().invoke(admin, [*args, "--calibrate-every", "0"])
    assert bad.exit_code == 2 and "--calibrate-every" in bad.output


def test_the_plain_users_jobs_run_as_on_an_uncalibrated_site():
    """Users who do not use frenzy-slurm plan on the site file: under a calibrated site their jobs run exactly as
    before, job for job (the same request, the same true step), as long as nothing else changes (here the only other
    policy's jobs are theirs: plain share 1)."""
    from frenzy_slurm.cli.simulate import DEV_TRACE
    from frenzy_slurm.sim import sample_philly

    wl = sample_philly(DEV_TRACE, 7, 20)
    cluster = parse_compact("V100-32GB:1x8,T4:2x4")
    cal = warmed_calibration(sample_philly(DEV_TRACE, 1007, 30), cluster, "has", 1007, 6 * 3600.0)
    assert cal is not None and cal.current is not None
    before = Runner(wl, cluster, "has", seed=7, plain_share=1.0).run()
    after = Runner(wl, cluster, "has", seed=7, plain_share=1.0, calibration=cal).run()
    assert [(r.end, r.run_s, r.label) for r in after.records] == [(r.end, r.run_s, r.label) for r in before.records]
    assert all(r.plain for r in after.records)


def test_a_placement_without_a_one_pool_plan_undoes_the_calibration_of_its_types(wl):
    """A pipeline across pools (or a placement without its plan) gets its raw step back by the largest ratio of
    calibrated to raw efficiency of its types, the calibration's added fixed costs taken off first."""
    from frenzy_slurm.calibration.model import StepTimeCorrection
    from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
    from frenzy_slurm.slurm.backend import ComponentRequest

    runner = Runner(wl, parse_compact(CLUSTER), "has", seed=5)
    cal = SiteCalibration(runner.ctx.site, every_s=3600.0)

    def corr(gpu: str, factor: float, overhead_s: float = 0.0) -> StepTimeCorrection:
        return StepTimeCorrection(
            gpu=gpu,
            precision="bf16-mixed",
            efficiency_factor=factor,
            step_overhead_s=overhead_s,
            jobs=3,
            raw_error=0.3,
            calibrated_error=0.05,
        )

    cal.current = _empty(runner.ctx.site).model_copy(
        update={"step_time": [corr("T4", 1.5, overhead_s=0.2), corr("V100-32GB", 1.2)]}
    )
    job = next(j for j in wl.jobs if j.precision == "bf16-mixed")
    comps = [
        PlacedComponent(
            ComponentRequest(partition=part, gpu_type=part, nodes=1, gpus_per_node=2, time_min=60), gpu, 1, 16
        )
        for part, gpu in (("t4", "T4"), ("v10032gb", "V100-32GB"))
    ]
    raw_t4 = next(p for p in cal.site.pools if p.partition == "t4").spec().efficiency
    cal_t4 = next(p for p in cal.site_for("bf16-mixed", job.method).pools if p.partition == "t4").spec().efficiency
    got = cal.raw_step_s(Attempt(job, job.steps), Placement(comps, 2.0, "pipeline", kind="heterogeneous"))
    assert got == pytest.approx((2.0 - 0.2) * cal_t4 / raw_t4)
    assert cal_t4 / raw_t4 == pytest.approx(1.5)


def test_the_earlier_period_of_a_trace_workload_is_other_jobs_of_the_same_size():
    from frenzy_slurm.cli.simulate import DEV_TRACE, earlier_workload
    from frenzy_slurm.sim import sample_philly

    wl = sample_philly(DEV_TRACE, 5, 12)
    earlier = earlier_workload("philly:5:12", DEV_TRACE, wl, 5)
    assert len(earlier.jobs) == 12 and earlier.source != wl.source
    assert earlier_workload(str(WORKLOAD), None, wl, 0) is wl  # a workload file: its own jobs
