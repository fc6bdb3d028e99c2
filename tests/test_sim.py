"""A small end-to-end simulation (seconds): workloads, truth vs prediction, policies, metrics, the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from frenzy_slurm.cli.admin import main as admin
from frenzy_slurm.cli.simulate import DEV_TRACE
from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.speed import flops_per_token
from frenzy_slurm.sim import ErrorModel, load_workload, parse_compact, sample_philly, save_workload, simulate
from frenzy_slurm.sim.metrics import markdown, summarize
from frenzy_slurm.sim.policies import expand_policies
from frenzy_slurm.sim.workload import job_spec, reference_rate

DATA = Path(__file__).parent / "data" / "sim"
WORKLOAD = DATA / "philly-seed5-12.yaml"
CLUSTER = "A100-80GB:1x8,V100-32GB:1x8,T4:1x4"


@pytest.fixture(scope="module")
def wl():
    return load_workload(WORKLOAD)


def test_every_job_completes_under_has_and_the_baselines(wl):
    cluster = parse_compact(CLUSTER)
    rows = {}
    for policy in ("has", "user-fixed:fastest", "ilp"):
        r = simulate(wl, cluster, policy, seed=5, errors=ErrorModel.exact())
        s = summarize(r)
        rows[policy] = s
        assert s["completed"] == 12 and s["ooms"] == 0 and s["gpus"] == 20
        assert 0 < s["gpu_util"] <= 1
        assert s["avg_jct_s"] >= s["avg_queue_s"] >= 0 and s["p99_jct_s"] >= s["p50_jct_s"]
        assert s["decisions"] > 0 and s["decision_ms_median"] > 0
        for rec in r.records:  # a job cannot finish before its arrival plus its run time
            assert rec.end >= rec.submit + rec.run_s - 1e-6
    assert "| 20 | has |" in markdown(list(rows.values()))
    # the same seed gives the same run
    again = summarize(simulate(wl, cluster, "has", seed=5, errors=ErrorModel.exact()))
    assert again["avg_jct_s"] == rows["has"]["avg_jct_s"]


def test_memory_under_prediction_causes_ooms_that_the_policy_learns_from(wl):
    r = simulate(
        wl, parse_compact(CLUSTER), "has", seed=5, errors=ErrorModel(mem_bias=1.6, mem_sd=0.0, time_sd=0.0, type_sd=0.0)
    )
    s = summarize(r)
    assert s["ooms"] > 0 and s["completed"] == 12
    failed = [x for x in r.records if x.ooms]
    assert all(x.attempts == x.ooms + 1 for x in failed)  # one OOM, then a plan with the measured excess fits
    assert all(x.run_s >= 120.0 * (x.ooms + 1) for x in failed)  # each OOM cost the start-up time


def test_slower_than_predicted_jobs_hit_the_time_limit_and_resume(wl):
    r = simulate(
        wl,
        parse_compact(CLUSTER),
        "has",
        seed=5,
        errors=ErrorModel(mem_bias=1.0, mem_sd=0.0, time_bias=4.0, time_sd=0.0, type_sd=0.0),
    )
    s = summarize(r)
    assert s["timeouts"] > 0 and s["completed"] == 12


def test_a_frenzy_job_at_its_time_limit_requeues_itself_with_the_same_request(wl):
    # 4x slower than predicted: HAS's --time runs out; the runtime requeues the job (`scontrol requeue`), so every
    # run of a job is the same request, where a new decision would give the steps left a shorter --time
    from frenzy_slurm.sim.runner import Runner

    errors = ErrorModel(mem_bias=1.0, mem_sd=0.0, time_bias=4.0, time_sd=0.0, type_sd=0.0)
    runner = Runner(wl, parse_compact(CLUSTER), "has", 5, errors=errors)
    runs: dict[int, list[tuple]] = {}
    submit = runner._submit

    def recording(a, p):
        runs.setdefault(a.job.id, []).append(tuple((c.request.partition, c.request.time_min) for c in p.components))
        return submit(a, p)

    runner._submit = recording  # type: ignore[method-assign]  # records each submission of the run
    r = runner.run()
    timed_out = [x for x in r.records if x.timeouts]
    assert timed_out and all(x.state == "done" for x in timed_out)
    for x in timed_out:
        assert len(runs[x.id]) == x.attempts == x.timeouts + 1 and len(set(runs[x.id])) == 1, runs[x.id]
    # a baseline's job is resubmitted by its policy, a new --time for the steps left
    base = Runner(wl, parse_compact(CLUSTER), "slurm-multi", 5, errors=errors)
    assert base.policy.requeues_at_time_limit is False


def test_workload_files_round_trip_and_name_the_bad_field(wl, tmp_path):
    for name in ("w.yaml", "w.csv"):
        save_workload(wl, tmp_path / name)
        back = load_workload(tmp_path / name)
        assert [j.model_dump() for j in back.jobs] == [j.model_dump() for j in wl.jobs]
    bad = (tmp_path / "w.csv").read_text().replace(",420,", ",-3,", 1)
    (tmp_path / "bad.csv").write_text(bad)
    with pytest.raises(InputError, match=r"bad.csv:2: steps"):
        load_workload(tmp_path / "bad.csv")


@pytest.mark.skipif(not DEV_TRACE.is_file(), reason=f"the Philly trace is not at {DEV_TRACE}")
def test_philly_sampling_is_seeded_and_matches_gpu_time():
    a = sample_philly(DEV_TRACE, 3, 30)
    assert a == sample_philly(DEV_TRACE, 3, 30) and a != sample_philly(DEV_TRACE, 4, 30)
    assert [j.submit_s for j in a.jobs] == sorted(j.submit_s for j in a.jobs) and a.jobs[0].submit_s == 0
    for j in a.jobs:
        assert j.trace_gpu_time_s >= 60 and j.trace_gpu_time_s < 1000 * 3600
        if j.steps < 20:
            continue
        spec = job_spec(j)
        work = (
            flops_per_token(workload_from_spec(spec, resolve_model(spec, Path("."))), "none")
            * j.global_batch
            * j.seq_len
            * j.steps
        )
        assert work == pytest.approx(j.trace_gpu_time_s * reference_rate(), rel=0.05)


def test_policy_names():
    assert expand_policies("has,user-fixed") == [
        "has",
        "user-fixed:fastest",
        "user-fixed:largest",
        "user-fixed:usual",
        "user-fixed:biggest",
    ]
    with pytest.raises(ValueError, match="unknown policy"):
        expand_policies("has,sjf")


def test_simulate_command_writes_json_runs(tmp_path):
    out = tmp_path / "o.json"
    res = CliRunner().invoke(
        admin,
        [
            "simulate",
            str(WORKLOAD),
            "--cluster",
            CLUSTER,
            "--policy",
            "has,user-fixed:largest",
            "--seed",
            "1,2",
            "--exact",
            "--json",
            str(out),
        ],
    )
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert [(r["policy"], r["seed"]) for r in runs] == [
        ("has", 1),
        ("user-fixed:largest", 1),
        ("has", 2),
        ("user-fixed:largest", 2),
    ]
    for r in runs:
        for key in (
            "policy",
            "seed",
            "gpus",
            "jobs",
            "avg_jct_s",
            "p50_jct_s",
            "p99_jct_s",
            "makespan_s",
            "ooms",
            "decision_ms_median",
            "decision_ms_p95",
        ):
            assert key in r
    assert "| 20 | has |" in res.output


def test_simulate_command_runs_the_baselines_with_plain_users_and_a_restart_cost(tmp_path):
    out = tmp_path / "o.json"
    args = ["simulate", str(WORKLOAD), "--cluster", CLUSTER, "--policy", "slurm-multi,sia", "--seed", "5"]
    args += ["--plain-share", "0.5", "--truth", "published", "--restart-s", "300", "--json", str(out)]
    res = CliRunner().invoke(admin, args)
    assert res.exit_code == 0, res.output
    runs = json.loads(out.read_text())["runs"]
    assert [r["policy"] for r in runs] == ["slurm-multi", "sia"]
    assert all(r["completed"] == 12 and r["plain_jobs"] > 0 for r in runs)
    assert runs[1]["per_job_ms_median"] > 0 and "moves" in runs[1]
    bad = CliRunner().invoke(admin, ["simulate", str(WORKLOAD), "--cluster", CLUSTER, "--plain-share", "2"])
    assert bad.exit_code == 2 and "--plain-share" in bad.output
    sized = tmp_path / "sized.json"
    args = ["simulate", str(WORKLOAD), "--cluster", CLUSTER, "--policy", "sia", "--seed", "5"]
    res = CliRunner().invoke(admin, [*args, "--checkpoint-gbs", "0.5", "--json", str(sized)])
    assert res.exit_code == 0, res.output
    assert json.loads(sized.read_text())["runs"][0]["completed"] == 12
    bad = CliRunner().invoke(admin, [*args, "--checkpoint-gbs", "0"])
    assert bad.exit_code == 2 and "--checkpoint-gbs" in bad.output


def test_simulate_command_errors_are_one_line_with_exit_2(tmp_path):
    res = CliRunner().invoke(admin, ["simulate", "nope.yaml", "--cluster", CLUSTER])
    assert res.exit_code == 2 and "no such file" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(admin, ["simulate", str(WORKLOAD), "--cluster", "A100:2"])
    assert res.exit_code == 2 and "GPU:NODESxGPUS" in res.output


def test_replay_jobs_are_scaled_and_scripted_like_the_simulation(wl, tmp_path):
    from frenzy_slurm.sim.replay import ReplayJob, compare, replay_jobs, simulate_replay, write_script
    from frenzy_slurm.slurm.backend import ComponentRequest

    cluster = parse_compact(CLUSTER)
    jobs = replay_jobs(simulate(wl, cluster, "has", seed=5, errors=ErrorModel.exact()), makespan_s=60.0)
    assert len(jobs) == 12 and jobs[0].submit_s == 0
    assert all(j.run_s >= 3.0 and all(c.time_min * 60 >= j.run_s for c in j.components) for j in jobs)
    sim = simulate_replay(jobs, cluster)
    assert max(e for _, e in sim.values()) == pytest.approx(60.0, rel=0.25)  # about the asked-for makespan
    het = ReplayJob(7, 0.0, [ComponentRequest("a", "a100", 1, 4, 2), ComponentRequest("b", "v100", 2, 8, 2)], 5.0)
    text = write_script(het, tmp_path).read_text()
    assert text.count("#SBATCH hetjob") == 1 and "--gres=gpu:v100:8" in text and text.rstrip().endswith("sleep 5.00")
    report = compare({1: (0.0, 5.0), 2: (5.0, 9.0)}, {1: (0.5, 5.5), 2: (7.0, 11.0)})
    assert report["start_diff_median_s"] == pytest.approx(1.25) and report["start_diff_max_s"] == 2.0
    assert report["start_diff_median_pct_of_makespan"] == pytest.approx(100 * 1.25 / 10.5)


def test_max_job_share_reaches_has_in_the_simulation():
    """The site's max_job_share as the simulator's site file: job 0 takes the whole A100 node only at 1.0."""
    from frenzy_slurm.sim.runner import Runner

    wl = load_workload(WORKLOAD)
    cluster = parse_compact(CLUSTER)
    first = {
        share: Runner(wl, cluster, "has", 1, errors=ErrorModel.exact(), max_job_share=share).run().records[0]
        for share in (1.0, 0.5)
    }
    assert (first[1.0].gpus, first[0.5].gpus) == (8, 4)
    assert first[0.5].label == "4xA100-80GB(a10080gb)"
    res = CliRunner().invoke(admin, ["simulate", str(WORKLOAD), "--cluster", CLUSTER, "--max-job-share", "1.5"])
    assert res.exit_code == 2 and "--max-job-share" in res.output
