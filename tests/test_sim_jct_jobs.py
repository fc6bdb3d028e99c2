"""benchmarks/jct_jobs.py: two policies, or one policy with and without a calibrating site, job by job."""

from __future__ import annotations

import argparse

from .helpers import load_benchmark

jj = load_benchmark("jct_jobs")

SHAPE, SEED = "small-a", 1


def _args(**kw: object) -> argparse.Namespace:
    base = dict(a="has", b="has", calibrate_a=None, calibrate_b=None, knobs=None, max_jobs=20, top=3, who="own")
    return argparse.Namespace(**{**base, **kw})


def _causes(args: argparse.Namespace, capsys) -> tuple[dict[str, list[float]], str]:
    causes: dict[str, list[float]] = {}
    load = jj.shape_load(SHAPE, "auto")[0]
    jj.one_run(SHAPE, load, SEED, args, causes)
    return causes, capsys.readouterr().out


def test_a_policy_against_itself_differs_in_no_job(capsys):
    causes, out = _causes(_args(), capsys)
    assert "seed 1: has against has" in out
    assert set(causes) == {"same type and width"}
    assert all(d == 0.0 for d in causes["same type and width"])


def test_a_calibrated_side_is_planned_on_the_calibrated_site(capsys):
    causes, out = _causes(_args(calibrate_a=24.0), capsys)
    assert "seed 1: has (calibrated every 24 h) against has" in out
    # the calibration moves some decisions: some job runs elsewhere, or for another time, than uncalibrated
    diffs = [d for ds in causes.values() for d in ds]
    assert len(diffs) >= 10
    assert any(abs(d) > 1e-6 for d in diffs) or set(causes) != {"same type and width"}
    assert jj.side(_args(calibrate_b=12.0), "b") == "has (calibrated every 12 h)"
    assert jj.side(_args(calibrate_b=12.0), "a") == "has"
