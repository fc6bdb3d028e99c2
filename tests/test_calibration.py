"""Calibration: fitting with bounds and minimum job counts, the file format, staleness, applying it."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from frenzy_slurm import __version__
from frenzy_slurm.calibration import (
    SITE_WIDE,
    CalibrationFile,
    FitBounds,
    Observation,
    calibrated_site,
    load_calibration,
    site_fingerprint,
    steady_step_time,
    write_calibration,
)
from frenzy_slurm.calibration.fit import fit, fit_step_time
from frenzy_slurm.errors import InputError
from frenzy_slurm.site.config import SiteConfig

ROOT = Path(__file__).resolve().parent.parent


def obs(
    measured: float,
    compute: float = 1e-4,
    other: float = 0.0,
    slots: int = 5,
    gpu: str = "A100-40GB",
    precision: str = "fp32",
    memory=((1.0, 1.1),),
) -> Observation:
    return Observation(
        job_dir=Path("/j"),
        job_id="1",
        kind="homogeneous",
        gpus=(gpu,),
        precision=precision,
        mode=f"{precision}/full",
        slots=slots,
        compute_s=compute,
        other_s=other,
        measured_step_s=measured,
        memory=list(memory),
    )


def site() -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "cluster": "c",
            "pools": [
                {
                    "partition": "a100",
                    "gres_type": "a100",
                    "gpu": "A100-40GB",
                    "gpus_per_node": 4,
                    "intra_node": "nvlink3",
                },
                {"partition": "t4", "gres_type": "t4", "gpu": "T4", "gpus_per_node": 4, "intra_node": "pcie3"},
            ],
        }
    )


def test_steady_step_time_drops_warmup_and_profiled_step():
    assert steady_step_time([5.0, 9.0, 0.2, 0.3, 0.25, 0.2]) == pytest.approx(0.225)
    assert steady_step_time([0.4]) == 0.4
    assert steady_step_time([]) is None


def test_fixed_overhead_dominates_tiny_steps():
    # the tiny CPU job: 0.16 ms of predicted FLOPs, ~0.2 s measured, same plan every time
    corr, notes = fit_step_time([obs(0.19), obs(0.21), obs(0.20)], "A100-40GB", "fp32", FitBounds())
    assert corr is not None
    assert corr.efficiency_factor == 1.0  # compute never varied: efficiency keeps its prior
    assert corr.microbatch_overhead_s == 0.0  # slots never varied: per-step only
    assert corr.step_overhead_s == pytest.approx(0.2, rel=0.05)
    assert corr.raw_error > 0.99 and corr.calibrated_error < 0.06
    assert any("per-micro-batch" in n.text and not n.refused for n in notes)


def test_efficiency_and_microbatch_overhead_are_recovered_where_the_jobs_tell_them_apart():
    truth_k, t, m = 1 / 0.5, 0.05, 0.01  # half the assumed efficiency
    jobs = [
        obs(c * truth_k + 0.1 + t + m * s, compute=c, other=0.1, slots=s)
        for c, s in [(1.0, 1), (2.0, 4), (4.0, 8), (8.0, 2), (0.5, 16)]
    ]
    corr, _ = fit_step_time(jobs, "A100-40GB", "bf16-mixed", FitBounds())
    assert corr.efficiency_factor == pytest.approx(0.5, rel=1e-3)
    assert corr.step_overhead_s == pytest.approx(t, abs=1e-3)
    assert corr.microbatch_overhead_s == pytest.approx(m, abs=1e-4)
    assert corr.calibrated_error < 1e-3


def test_too_few_jobs_and_out_of_bounds_are_reported_not_applied():
    corr, notes = fit_step_time([obs(0.2), obs(0.2)], "A100-40GB", "fp32", FitBounds(min_jobs=3))
    assert corr is None and "fewer than min_jobs(3)" in notes[0].text and notes[0].refused
    # compute varies and matters, but would need a 10x efficiency cut: refused, overhead-only fit instead
    jobs = [obs(c * 10, compute=c, slots=5) for c in (1.0, 2.0, 4.0)]
    corr, notes = fit_step_time(jobs, "A100-40GB", "fp32", FitBounds(max_efficiency_factor=4))
    assert corr is not None and corr.efficiency_factor == 1.0
    assert any("outside the bound" in n.text and n.refused for n in notes)
    corr, notes = fit_step_time([obs(100.0)] * 3, "A100-40GB", "fp32", FitBounds(max_step_overhead_s=30))
    assert corr is None and "exceeds the bound" in notes[-1].text and notes[-1].refused


def test_memory_factor_bounded_and_per_mode():
    steps, memory, notes = fit(
        [obs(0.2, memory=[(1.0, 1.2)])] * 3 + [obs(0.2, precision="bf16-mixed", memory=[(1.0, 3.0)])] * 3, FitBounds()
    )
    assert [(m.mode, round(m.factor, 3), m.jobs) for m in memory] == [("fp32/full", 1.2, 3)]
    assert any("bf16-mixed/full" in n.text and "outside the bound" in n.text and n.refused for n in notes)
    assert {(s.gpu, s.precision) for s in steps} == {
        ("A100-40GB", "fp32"),
        (SITE_WIDE, "fp32"),
        ("A100-40GB", "bf16-mixed"),
        (SITE_WIDE, "bf16-mixed"),
    }


def _cal(s: SiteConfig, **kw) -> CalibrationFile:
    steps, memory, notes = fit([obs(0.2), obs(0.21), obs(0.19)], FitBounds())
    base = dict(
        site_file="site.yaml",
        site_fingerprint=site_fingerprint(s),
        created_at=time.time(),
        valid_until=time.time() + 86400,
        frenzy_version=__version__,
        step_time=steps,
        memory=memory,
        not_applied=[n.text for n in notes],
    )
    return CalibrationFile(**(base | kw))


def test_apply_uses_own_fit_else_site_wide_and_scales_usable_memory(tmp_path):
    s = site()
    path = tmp_path / "site.calibration.yaml"
    write_calibration(path, _cal(s))
    cal = load_calibration(path, s)
    cs, applied = calibrated_site(s, cal, path, "fp32", "full")
    a100, t4 = cs.pool("a100", "a100").spec(), cs.pool("t4", "t4").spec()
    assert a100.step_overhead_s == pytest.approx(0.2, rel=0.05)
    assert t4.step_overhead_s == pytest.approx(a100.step_overhead_s)  # T4 has no jobs: the site-wide fit
    assert applied.pools["t4/t4"]["fit"] == SITE_WIDE and applied.pools["a100/a100"]["fit"] == "A100-40GB"
    assert applied.memory_factor == pytest.approx(1.1)
    assert cs.usable_fraction(cs.pool("a100", "a100")) == pytest.approx(0.95 / 1.1)
    # another precision: nothing applies
    cs2, applied2 = calibrated_site(s, cal, path, "bf16-mixed", "full")
    assert cs2.pool("a100", "a100").spec().step_overhead_s == 0.0 and applied2.pools == {}


def test_stale_or_bad_calibration_is_an_error(tmp_path):
    s = site()
    path = tmp_path / "c.yaml"
    write_calibration(path, _cal(s, valid_until=time.time() - 5 * 86400))
    with pytest.raises(InputError, match="valid_until passed 5 days ago"):
        load_calibration(path, s)
    write_calibration(path, _cal(s, site_fingerprint="0" * 16))
    with pytest.raises(InputError, match="different version of the site file"):
        load_calibration(path, s)
    write_calibration(path, _cal(s, frenzy_version="0.0.1"))
    with pytest.raises(InputError, match="fitted by frenzy-slurm 0.0.1"):
        load_calibration(path, s)
    path.write_text("version: 1\nsite_file: x\nbogus: 1\n")
    with pytest.raises(InputError, match="bogus"):
        load_calibration(path, s)


def test_calibrated_overhead_enters_marp_step_time():
    from frenzy_slurm.jobspec import load_job_spec, resolve_model
    from frenzy_slurm.marp import workload_from_spec
    from frenzy_slurm.marp.plan import ParallelPlan
    from frenzy_slurm.marp.speed import Links, plan_costs

    spec = load_job_spec(ROOT / "examples" / "tiny-cpu.yaml")
    w = workload_from_spec(spec, resolve_model(spec, ROOT / "examples"))
    plan = ParallelPlan(pp=2, micro_batch=2, grad_accum=4)
    gpu = site().pool("a100", "a100").spec()
    costs = plan_costs(w, plan, 8)
    raw = costs.seconds_on(gpu, Links(300, 12.5, 4))
    cal = costs.seconds_on(
        gpu.model_copy(update={"step_overhead_s": 0.2, "microbatch_overhead_s": 0.01}), Links(300, 12.5, 4)
    )
    assert cal - raw == pytest.approx(0.2 + 0.01 * (4 + 2 - 1))


def test_sacct_gpumem_parser():
    from frenzy_slurm.slurm.cli import parse_gpumem

    # sacct -n -P --noconvert -o JobID,TRESUsageInMax on Slurm 23.02+ with AccountingStorageTRES=gres/gpu
    text = (
        "123|\n"
        "123.batch|cpu=00:00:01,energy=0,fs/disk=5323,mem=4032K,pages=0,vmem=0\n"
        "123.0|cpu=00:10:00,energy=0,fs/disk=9,gres/gpumem=40960M,gres/gpuutil=97,mem=8G,pages=3,vmem=0\n"
        "124+1.0|cpu=00:01:00,gres/gpumem=21474836480,gres/gpuutil=50,mem=1G\n"
        "125.0|cpu=00:01:00,energy=0,mem=1G\n"
    )  # Slurm 22.05: no gpumem
    assert parse_gpumem(text) == {123: 40.0, 124: 20.0}


def test_heterogeneous_pipeline_pays_the_slowest_groups_fixed_overheads():
    from frenzy_slurm.has import hetero
    from frenzy_slurm.jobspec import load_job_spec, resolve_model
    from frenzy_slurm.marp import workload_from_spec

    spec = load_job_spec(ROOT / "examples" / "tiny-cpu.yaml")
    w = workload_from_spec(spec, resolve_model(spec, ROOT / "examples"))

    def groups(a=(0.0, 0.0), b=(0.0, 0.0)):
        return [
            hetero.StageGroup("a", 1, 1e14, 1e9, 0.0, 300, 25, 4, *a),
            hetero.StageGroup("b", 1, 5e13, 1e9, 0.0, 300, 25, 4, *b),
        ]

    raw = hetero.build(w, groups(), 1, 2, 8, "none")
    cal = hetero.build(w, groups((0.2, 0.01), (0.5, 0.002)), 1, 2, 8, "none")
    slots = raw.plan.grad_accum + raw.plan.pp - 1
    assert cal.step_time_s - raw.step_time_s == pytest.approx(0.5 + 0.01 * slots)
