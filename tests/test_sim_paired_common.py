"""The simulator's paired comparisons beside the completed-jobs one: over the jobs two policies both completed
(`sim.metrics.paired_common`), and over every job, a job a policy did not complete counted until the run's end
(`paired_all`). A run's average over its completed jobs alone rises when a policy completes a long job the other
never places."""

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


def test_every_job_counts_a_job_a_policy_left_out_until_the_runs_end():
    from frenzy_slurm.sim.metrics import paired_all

    rows = []
    for seed in (1, 2):
        # `b` never places job 9 (arrived at 0); its run ends at 10 h, `a`'s, which runs job 9 for 20 h, at 20 h
        b = _run("b", seed, {"1": (3600.0, False), "2": (7200.0, True)})
        b |= {"open_jobs": {"9": [0.0, False]}, "last_end_s": 36000.0}
        a = _run("a", seed, {"1": (3600.0, False), "2": (7200.0, True), "9": (72000.0, False)})
        a |= {"open_jobs": {}, "last_end_s": 72000.0}
        rows += [a, b]
    # completed jobs only, `a` is far behind (its average carries the 20-h job, `b`'s does not)
    assert paired(rows, "a", "b")["reduction"] == pytest.approx(1 - 27600 / 5400)
    # every job: `b`'s job 9 counts until the later run's end (20 h), a lower bound, level with `a`'s 20 h
    got = paired_all(rows, "a", "b")
    assert (got["pairs"], got["reduction"]) == (2, pytest.approx(0.0))
    assert paired_all(rows, "a", "b", "plain")["reduction"] == pytest.approx(0.0)
    # a job `a` leaves out too counts alike: both until `b`'s end (10 h), job 1 twice as long under `a`
    for r in rows:
        if r["policy"] == "a":
            r["done_jct"] = {"1": [7200.0, False], "2": [7200.0, True]}
            r |= {"open_jobs": {"9": [0.0, False]}, "last_end_s": 7200.0}
    got = paired_all(rows, "a", "b", "own")
    assert got["reduction"] == pytest.approx(1 - (7200 + 36000) / (3600 + 36000))
    # runs without per-job records of the jobs left out (an older --reuse file) are left out
    old = [{k: v for k, v in r.items() if k != "open_jobs"} for r in rows]
    assert paired_all(old, "a", "b").get("pairs") == 0
