"""The simulator's paired comparison over the jobs two policies both completed (`sim.metrics.paired_common`): a
run's average JCT counts only the jobs a policy completed, so completing a long job the other never places raises
it; averaged over the same jobs, the comparison is not moved by that job."""

from __future__ import annotations

import pytest

from frenzy_slurm.sim.metrics import paired, paired_common


def _run(policy: str, seed: int, jct: dict[str, tuple[float, bool]]) -> dict:
    done = {k: [v, plain] for k, (v, plain) in jct.items()}
    own = [v for v, plain in jct.values() if not plain]
    plain = [v for v, p in jct.values() if p]
    return {
        "cluster": "c",
        "load": 1.0,
        "seed": seed,
        "policy": policy,
        "avg_jct_s": sum(v for v, _ in jct.values()) / len(jct),
        "avg_jct_own_s": sum(own) / len(own),
        "avg_jct_plain_s": sum(plain) / len(plain),
        "done_jct": done,
    }


def test_a_long_job_only_one_policy_completes_moves_the_average_but_not_the_common_comparison():
    rows = []
    for seed in (1, 2, 3):
        common = {"1": (3600.0, False), "2": (7200.0, True), "3": (1800.0 * seed, False)}
        rows.append(_run("b", seed, common))
        # `a` completes the same jobs 10% sooner, and a job of 1,000 h `b` never places
        faster = {k: (v * 0.9, p) for k, (v, p) in common.items()}
        rows.append(_run("a", seed, faster | {"9": (3.6e6, False)}))
    assert paired(rows, "a", "b")["reduction"] < -100  # the long job dominates the completed-jobs average
    for who in ("all", "own", "plain"):
        got = paired_common(rows, "a", "b", who)
        assert (got["pairs"], got["reduction"]) == (3, pytest.approx(0.1)), who
    # runs without per-job records (an older --reuse file) are left out
    old = [{k: v for k, v in r.items() if k != "done_jct"} for r in rows]
    assert paired_common(old, "a", "b")["pairs"] == 0
