"""The simulator's baselines on hand-made cases with known answers: slurm-multi, sia, ilp's speed floor."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.sim import ErrorModel, parse_compact, simulate
from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, PlacedComponent, Placement
from frenzy_slurm.sim.metrics import summarize
from frenzy_slurm.sim.policies import SlurmMulti, make_policy
from frenzy_slurm.sim.sia import SiaPolicy, restart_factor
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.sim.truth import ErrorModel as EM
from frenzy_slurm.sim.truth import Truth
from frenzy_slurm.sim.workload import WorkloadFile, WorkloadJob
from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest

pytest.importorskip("scipy")


def _batch(name: str, *comps: ComponentRequest) -> BatchJob:
    return BatchJob(script=Path(f"{name}/job.sbatch"), workdir=Path(name), components=list(comps), name=name)


def _req(partition: str, gres: str, gpus: int, minutes: int) -> ComponentRequest:
    return ComponentRequest(partition=partition, gpu_type=gres, nodes=1, gpus_per_node=gpus, time_min=minutes)


def test_a_multi_partition_job_starts_in_the_partition_that_frees_first():
    sim = SimSlurm(parse_compact("A100-80GB:1x8,V100-32GB:1x8"))
    sim.submit(_batch("a", _req("a10080gb", "a100_80gb", 8, 120)))  # both partitions full, a100 for longer
    sim.submit(_batch("v", _req("v10032gb", "v100_32gb", 8, 60)))
    ans = sim.submit_any(_batch("m", _req("a10080gb", "a100_80gb", 4, 30)), [[_req("v10032gb", "v100_32gb", 8, 30)]])
    job = sim.jobs_by_id[ans.job_id]
    assert job.state == "PENDING" and job.planned_start == 3600.0  # reserved where it starts first: the V100s
    assert job.components[0].partition == "v10032gb"
    sim.advance(3600.0)
    assert job.state == "RUNNING" and job.start == 3600.0 and job.components[0].gpus_per_node == 8
    # listed first wins a tie
    sim2 = SimSlurm(parse_compact("A100-80GB:1x8,V100-32GB:1x8"))
    ans2 = sim2.submit_any(_batch("m", _req("a10080gb", "a100_80gb", 4, 30)), [[_req("v10032gb", "v100_32gb", 8, 30)]])
    assert sim2.jobs_by_id[ans2.job_id].components[0].partition == "a10080gb"


def test_slurm_multi_lists_each_fitting_partition_with_its_count_and_a_loose_time():
    cluster = parse_compact("A100-80GB:1x8,V100-32GB:2x8,T4:1x4")
    sim = SimSlurm(cluster)
    truth = Truth(EM.exact(), 1)
    ctx = Context(sim, cluster.site(), truth)
    job = WorkloadJob(id=0, submit_s=0, model="llama-3.2-1b", seq_len=1024, global_batch=64, steps=200, trace_gpus=1)
    p = SlurmMulti(time_factor=1.5).place(Attempt(job, job.steps), ctx)
    assert p is not None and len(p.alternatives) >= 2
    by = {x.components[0].request.partition: x for x in p.alternatives}
    # 1.24 B params x 18 bytes = 22 GB: 1 A100-80GB, 1 V100-32GB, 2 T4 (16 GB) by the rule of thumb
    assert by["a10080gb"].gpus == 1 and by["v10032gb"].gpus == 1
    assert by["t4"].gpus == 2
    assert list(by)[0] == "a10080gb"  # fastest listed first
    limits = {x.components[0].request.time_min for x in p.alternatives}
    assert len(limits) == 1 and limits.pop() % 60 == 0  # one --time, whole hours
    slowest = max(120.0 + x.step_time_s * job.steps for x in p.alternatives)
    assert p.components[0].request.time_min * 60 >= 1.5 * slowest


def test_slurm_multi_asks_for_what_the_largest_partition_has_when_none_has_the_usual_count():
    # one 8-GPU node per type: a user who usually runs on 16 GPUs is refused at submission and asks for 8
    cluster = parse_compact("H100-SXM:1x8,A100-40GB:1x8")
    ctx = Context(SimSlurm(cluster), cluster.site(), Truth(EM.exact(), 1))
    job = WorkloadJob(id=0, submit_s=0, model="llama-3-8b", seq_len=4096, global_batch=64, steps=100, trace_gpus=16)
    p = SlurmMulti().place(Attempt(job, job.steps), ctx)
    assert p is not None
    assert {x.gpus for x in p.alternatives} == {8}  # both partitions, each at all it has
    # where a partition has the usual count, the others are not listed at a smaller one
    big = parse_compact("H100-SXM:2x8,A100-40GB:1x8")
    p2 = SlurmMulti().place(Attempt(job, job.steps), Context(SimSlurm(big), big.site(), Truth(EM.exact(), 1)))
    assert p2 is not None and (p2.label, p2.alternatives) == ("16xH100-SXM(h100sxm)", ())


def test_slurm_multi_does_not_send_the_same_request_again_where_an_oom_says_it_cannot_fit():
    # 3B parameters, full fine-tune: 16 V100-16GB hold it only by the frugal configuration's estimate; after an
    # OOM that taught it needs 1.5x the memory, the V100-16GB partition (already at its 16) is left out
    cluster = parse_compact("V100-16GB:2x8,V100-32GB:1x8")
    ctx = Context(SimSlurm(cluster), cluster.site(), Truth(EM.exact(), 1))
    job = WorkloadJob(id=0, submit_s=0, model="llama-3.2-3b", seq_len=4096, global_batch=32, steps=100, trace_gpus=1)
    first = SlurmMulti().place(Attempt(job, job.steps), ctx)
    assert first is not None and "v10016gb" in {x.components[0].request.partition for x in first.alternatives}
    again = SlurmMulti().place(Attempt(job, job.steps, number=2, mem_correction=1.5, ooms=1), ctx)
    assert again is not None and (again.label, again.alternatives) == ("8xV100-32GB(v10032gb)", ())


def test_slurm_multi_runs_a_small_workload_to_completion():
    jobs = [
        WorkloadJob(id=i, submit_s=60 * i, model="gpt2-medium", seq_len=1024, global_batch=32, steps=300)
        for i in range(6)
    ]
    r = simulate(
        WorkloadFile(jobs=jobs),
        parse_compact("A100-80GB:1x4,T4:1x4"),
        "slurm-multi",
        seed=1,
        load=None,
        errors=ErrorModel.exact(),
    )
    s = summarize(r)
    assert s["completed"] == 6
    parts = {rec.components[0].partition for rec in r.records}
    assert parts <= {"a10080gb", "t4"} and "a10080gb" in parts


def test_restart_factor_is_sias():
    assert restart_factor(60.0, 0, 120.0) == 1.0  # younger than one restart: not penalised
    assert restart_factor(600.0, 0, 120.0) == pytest.approx(600 / 720)
    assert restart_factor(600.0, 2, 120.0) == pytest.approx(360 / 720)
    assert restart_factor(600.0, 9, 120.0) == 0.0


def test_sia_moves_a_running_job_onto_faster_gpus_when_they_free_up():
    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 10)))  # someone else's job: the A100s, 10 min
    sia = SiaPolicy(60.0)
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=32, steps=20000
    )
    a = Attempt(job, job.steps)
    sia.place(a, ctx)
    placed = sia.tick(ctx)
    assert len(placed) == 1 and "T4" in placed[0][1].label  # only the T4s are free
    assert sia.stop_now() == []
    jid = sim.next_job_id
    sim.submit(_batch("j0", *[c.request for c in placed[0][1].components]))
    sia.submitted(a, placed[0][1], jid, ctx)
    sim.advance(700.0)  # the A100s are free since 600 s
    assert sim.jobs_by_id[jid].state == "RUNNING"
    placed = sia.tick(ctx)
    assert sia.stop_now() == [jid]  # checkpointed and stopped ...
    assert len(placed) == 1 and "A100" in placed[0][1].label  # ... and moved onto the A100s
    assert sia.moves == 1 and sia.jobs[0].restarts == 1


def test_sia_keeps_a_job_inside_its_restart_then_moves_it():
    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 1)))  # the A100s for one minute
    sia = SiaPolicy(60.0, restart_s=120.0)
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=32, steps=20000
    )
    a = Attempt(job, job.steps)
    sia.place(a, ctx)
    (placed,) = sia.tick(ctx)
    jid = sim.next_job_id
    sim.submit(_batch("j0", *[c.request for c in placed[1].components]))
    sia.submitted(a, placed[1], jid, ctx)
    sim.advance(90.0)  # the A100s are free, but the job started 90 s ago: still inside its 120 s restart
    assert sia.tick(ctx) == [] and sia.stop_now() == []
    sim.advance(200.0)
    (moved,) = sia.tick(ctx)
    assert sia.stop_now() == [jid] and "A100" in moved[1].label


def test_sia_runs_a_workload_to_completion():
    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    jobs = [
        WorkloadJob(id=i, submit_s=300 * i, model="gpt2-medium", seq_len=1024, global_batch=32, steps=2000)
        for i in range(5)
    ]
    r = simulate(WorkloadFile(jobs=jobs), cluster, "sia", seed=1, load=None, errors=ErrorModel.exact())
    s = summarize(r)
    assert s["completed"] == 5 and s["decisions"] > 0
    assert s["per_job_ms_median"] > 0 and s["policy_cpu_s_per_sim_hour"] > 0 and s["marp_search_s"] > 0


def test_ilp_speed_floor_holds_a_job_rather_than_place_it_far_too_slow():
    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 10)))
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="bf16-mixed", seq_len=1024, global_batch=32, steps=2000
    )
    floored = make_policy("ilp", knobs={"ilp_speed_floor": 2.0})
    floored.place(Attempt(job, job.steps), ctx)
    assert floored.tick(ctx) == []  # T4 in bf16 is far more than 2x slower than the A100s: it waits
    loose = make_policy("ilp", knobs={"ilp_speed_floor": 1e9})
    loose.place(Attempt(job, job.steps), ctx)
    got = loose.tick(ctx)
    assert len(got) == 1 and "T4" in got[0][1].label


# ---- the ground truth apart from MARP -------------------------------------------------------------------


def test_truth_speed_ratios_are_the_data_files():
    import math

    import yaml

    from frenzy_slurm.sim.truth import THROUGHPUT_SOURCES, speed_table

    data = yaml.safe_load(THROUGHPUT_SOURCES.read_text())
    rows = data["sources"][0]["rows"]
    t = speed_table()
    ref = rows["A100-80GB"]
    for gpu in ("V100-16GB", "H100-SXM", "A10"):
        want = math.sqrt(
            rows[gpu]["bert_large_squad"]
            / ref["bert_large_squad"]
            * rows[gpu]["transformerxllarge"]
            / ref["transformerxllarge"]
        )
        assert t.speed[gpu] == pytest.approx(want)
    assert t.speed["V100-16GB"] == pytest.approx(math.sqrt(57 / 152 * 6071 / 17918))  # the figures themselves
    assert t.speed["V100-32GB"] == t.speed["V100-16GB"]  # derived: the same chip
    assert t.speed["A100-80GB"] == 1.0 and "measured" in t.how["A100-80GB"] and "derived" in t.how["T4"]
    # bf16 on a V100 runs at its fp32 rate (no bf16 tensor cores): the catalog's ratio scales it down
    assert t.relative("V100-32GB", "bf16-mixed") == pytest.approx(t.speed["V100-32GB"] * 15.7 / 125.0)
    # in-node scaling: the mean 8-GPU efficiency of the three measured 8-GPU rows, per doubling
    assert 0.9 < t.per_doubling < 1.0


def test_truth_step_time_errs_against_marp_per_type_width_and_spread():
    from frenzy_slurm.sim.truth import marp_relative, speed_table

    t = speed_table()
    truth = Truth(EM(time_sd=0.0, step_overhead_s=0.05), 1)
    # one reference GPU: MARP's speed is the truth's, so only the per-step overhead is added
    assert truth.step_time(0, 2.0, ["A100-80GB"], "bf16-mixed") == pytest.approx(2.05)
    # a V100 is faster than MARP thinks (published 0.36 of an A100, MARP 0.27): the truth is shorter
    v = truth.step_time(0, 2.0, ["V100-32GB"], "fp16-mixed")
    want = 2.0 * marp_relative("V100-32GB", "fp16-mixed", "A100-80GB") / t.speed["V100-32GB"] + 0.05
    assert v == pytest.approx(want) and v < 2.0
    # 8 GPUs lose the measured in-node scaling; two nodes and two partitions add their losses
    eight = truth.step_time(0, 2.0, ["A100-80GB"], "bf16-mixed", gpus=8)
    assert eight == pytest.approx(2.0 / t.per_doubling**3 + 0.05)
    spread = truth.step_time(0, 2.0, ["A100-80GB"], "bf16-mixed", gpus=8, nodes=2, partitions=2)
    assert spread == pytest.approx(2.0 / t.per_doubling**3 * 1.10 * 1.20 + 0.05)
    # the older model is still there
    old = Truth(EM(time_sd=0.0, type_sd=0.0, truth="marp"), 1)
    assert old.step_time(0, 2.0, ["V100-32GB"], "fp16-mixed", gpus=8, nodes=2) == 2.0


def test_plain_users_submit_with_loose_whole_hour_limits_under_every_policy():
    jobs = [
        WorkloadJob(id=i, submit_s=120 * i, model="gpt2-medium", seq_len=1024, global_batch=32, steps=300)
        for i in range(10)
    ]
    r = simulate(
        WorkloadFile(jobs=jobs), parse_compact("A100-80GB:1x8,T4:1x8"), "has", seed=3, load=None, plain_share=0.5
    )
    s = summarize(r)
    plain = [x for x in r.records if x.plain]
    assert 0 < len(plain) < 10 and s["plain_jobs"] == len(plain) and s["completed"] == 10
    assert all(c.time_min % 60 == 0 for x in plain for c in x.components)  # whole hours, as users write them
    assert s["decisions"] == 10 - len(plain)  # HAS decided only its own jobs
    assert s["avg_jct_own_s"] > 0 and s["avg_jct_plain_s"] > 0


# ---- HAS's width rule per set of pools (issue 20) -------------------------------------------------------


def _v100_case(rule: str, monkeypatch: pytest.MonkeyPatch):
    from importlib import import_module

    from frenzy_slurm.sim.policies import HasPolicy

    monkeypatch.setattr(import_module("frenzy_slurm.has.decide"), "WIDTH_RULE", rule)
    cluster = parse_compact("A100-80GB:1x8,V100-32GB:2x8")
    sim = SimSlurm(cluster)
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 20)))  # the A100s busy for 20 min
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=64, steps=4000
    )
    p = HasPolicy().place(Attempt(job, job.steps), ctx)
    assert p is not None
    return p


def test_the_width_rule_per_pool_lets_an_fp16_job_take_idle_v100s(monkeypatch):
    per_pool = _v100_case("per-pool", monkeypatch)
    across = _v100_case("all", monkeypatch)
    # across types, 8 V100s count as 8x one A100 and lose the width rule; per pool they are judged as V100s
    assert "A100" in across.label and across.gpus <= 4
    assert "V100" in per_pool.label and per_pool.gpus >= 4
    # and they finish sooner: the A100s start only when the other job frees them, 20 minutes on (with the matmul
    # efficiencies read from published runs, docs/marp.md "Step time", 4 A100s step about as fast as 8 V100s)
    assert per_pool.step_time_s * 4000 < 20 * 60 + across.step_time_s * 4000


def test_a_resumed_start_pays_the_restart_cost_and_sia_plans_with_it():
    from frenzy_slurm.sim.runner import Runner

    jobs = [WorkloadJob(id=0, submit_s=0, model="gpt2-medium", seq_len=1024, global_batch=32, steps=2000)]
    errors = ErrorModel.exact().model_copy(update={"startup_s": 100.0, "restart_s": 500.0})
    r = Runner(WorkloadFile(jobs=jobs), parse_compact("A100-80GB:1x8"), "sia", 1, errors=errors, load=None)
    assert r._startup(Attempt(jobs[0], 2000)) == 100.0  # a fresh start
    assert r._startup(Attempt(jobs[0], 700)) == 600.0  # a resumed one loads its checkpoint too
    # sia's R defaults to that: a job started 200 s ago is still inside its restart, so it is not moved
    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(errors, 1))
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 1)))
    sia = SiaPolicy(60.0)
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=32, steps=20000
    )
    a = Attempt(job, job.steps)
    sia.place(a, ctx)
    (placed,) = sia.tick(ctx)
    jid = sim.next_job_id
    sim.submit(_batch("j0", *[c.request for c in placed[1].components]))
    sia.submitted(a, placed[1], jid, ctx)
    sim.advance(200.0)
    assert sia.tick(ctx) == [] and sia.stop_now() == []  # R = 600 s: pinned (with R = 120 s it would move)
    sim.advance(700.0)
    (moved,) = sia.tick(ctx)
    assert sia.stop_now() == [jid] and "A100" in moved[1].label


def test_a_checkpoints_size_sets_its_restart_cost_when_a_bandwidth_is_given():
    from frenzy_slurm.jobspec.presets import presets
    from frenzy_slurm.sim.truth import true_checkpoint_bytes

    params = presets()["llama-2-7b"].params_b
    # a full fine-tune writes and reads 14 bytes per parameter (16-bit weights, fp32 master and two moments)
    assert true_checkpoint_bytes(params, "full") == pytest.approx(params * 14e9)
    assert true_checkpoint_bytes(params, "lora") == pytest.approx(params * 14e9 / 100)  # the adapters alone
    plain = Truth(EM.exact().model_copy(update={"restart_s": 30.0}), 1)
    assert plain.restart_s(params, "full") == 30.0  # no bandwidth given: the constant alone, as before
    slow = Truth(EM.exact().model_copy(update={"restart_s": 30.0, "checkpoint_gbs": 2.0}), 1)
    assert slow.restart_s(params, "full") == pytest.approx(30.0 + 2 * params * 14e9 / 2e9)  # 7B: 30 + 94 s
    assert slow.restart_s(params, "lora") == pytest.approx(30.0 + 2 * params * 0.14e9 / 2e9)
    assert slow.restart_s(10 * params, "full") > 10 * (slow.restart_s(params, "full") - 30.0)  # scales with size
    # what a move costs each job in the truth: Sia's R and has-preempt's watcher plan with it
    cluster = parse_compact("A100-80GB:1x8")
    ctx = Context(SimSlurm(cluster), cluster.site(), slow)
    big = WorkloadJob(id=0, submit_s=0, model="llama-2-7b", seq_len=1024, global_batch=32, steps=100)
    small = WorkloadJob(id=1, submit_s=0, model="llama-2-7b", method="lora", seq_len=1024, global_batch=32, steps=100)
    assert ctx.move_cost(Attempt(big, 100)) == pytest.approx(120.0 + slow.restart_s(params, "full"))
    assert ctx.move_cost(Attempt(small, 100)) < ctx.move_cost(Attempt(big, 100)) - 80.0
    assert SiaPolicy(60.0)._restart(ctx, Attempt(big, 100)) == ctx.move_cost(Attempt(big, 100))
    assert SiaPolicy(60.0, restart_s=45.0)._restart(ctx, Attempt(big, 100)) == 45.0  # a given R wins
    # a resumed start's --time allows for the checkpoint (sia's; has-preempt's watcher uses has/moves.restore_s)
    assert ctx.resume_allowance(Attempt(big, 100)) == 0.0  # a fresh start reads no checkpoint
    assert ctx.resume_allowance(Attempt(big, 40)) == pytest.approx(2 * params * 14e9 / 2e9)


def test_queue_length_over_time_counts_jobs_waiting_for_their_first_start():
    from frenzy_slurm.sim.metrics import queue_length

    jobs = [WorkloadJob(id=i, submit_s=0, model="gpt2", seq_len=512, global_batch=16, steps=200) for i in range(3)]
    r = simulate(
        WorkloadFile(jobs=jobs),
        parse_compact("A100-80GB:1x1"),
        "slurm-multi",
        seed=1,
        load=None,
        errors=ErrorModel.exact(),
    )
    ts, counts = queue_length(r)
    assert max(counts) == 2 and counts[-1] == 0  # one GPU: two wait at first, then none
    assert ts == sorted(ts)


def test_has_replan_moves_a_pending_job_onto_gpus_that_finish_it_sooner():
    from frenzy_slurm.sim.policies import HasReplan

    # a job queued behind 10 h of A100 work is re-decided, and the idle V100s finish it sooner
    cluster = parse_compact("A100-80GB:1x8,V100-32GB:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    sim.submit(_batch("a", _req("a10080gb", "a100_80gb", 8, 600)))
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=64, steps=4000
    )
    a = Attempt(job, job.steps)
    comp = PlacedComponent(_req("a10080gb", "a100_80gb", 8, 60), "A100-80GB", 10.0, 80.0)
    queued = Placement([comp], 0.1, "8xA100-80GB(a10080gb)")
    jid = sim.submit(_batch("j", *[c.request for c in queued.components])).job_id
    (upd,) = HasReplan().replan(ctx, [(jid, a, queued)])  # the V100s are free now: finish sooner there
    assert upd[0] == jid and "V100" in upd[1].label


def test_has_preempt_moves_a_running_job_onto_gpus_that_finish_it_sooner():
    from frenzy_slurm.sim.policies import HasPreempt

    cluster = parse_compact("A100-80GB:1x8,T4:1x8")
    sim = SimSlurm(cluster)
    ctx = Context(sim, cluster.site(), Truth(EM.exact(), 1))
    sim.submit(_batch("other", _req("a10080gb", "a100_80gb", 8, 5)))  # the A100s for 5 min
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=32, steps=20000
    )
    a = Attempt(job, job.steps)
    # started on the T4s while the A100s were busy (predicted 1.5 s a step there)
    on_t4 = Placement([PlacedComponent(_req("t4", "t4", 8, 600), "T4", 5.0, 15.0)], 1.5, "8xT4(t4)")
    jid = sim.submit(_batch("j", *[c.request for c in on_t4.components])).job_id
    policy = HasPreempt()
    sim.advance(60.0)
    assert policy.move(ctx, [(jid, a, on_t4, 0.0, 19_000)]) == []  # inside its restart (120 s): stays
    sim.advance(600.0)  # the A100s are free
    ((moved_id, there),) = policy.move(ctx, [(jid, a, on_t4, 0.0, 19_000)])
    assert moved_id == jid and "A100" in there.label and policy.moves == 1
    # a job nearly done stays: the move's restart cost is not worth it
    assert policy.move(ctx, [(jid, a, on_t4, 0.0, 20)]) == []


def test_a_pending_job_whose_allocation_is_no_candidate_is_measured_by_slurms_start():
    """A pending job whose own allocation is not among a new decision's candidates (a preempted pipeline requeued
    at the width it grew to, a pool gone) is measured by when Slurm expects it to end where it waits (the watcher's
    `_staying`); before, it was never moved and waited for its old allocation."""
    from frenzy_slurm.has.moves import pending_move, without_job

    cluster = parse_compact("A100-80GB:1x8,V100-32GB:1x8")
    sim = SimSlurm(cluster)
    site = cluster.site()
    sim.submit(_batch("a", _req("a10080gb", "a100_80gb", 8, 600)))  # the A100s for 10 h
    job = WorkloadJob(
        id=0, submit_s=0, model="gpt2-medium", precision="fp16-mixed", seq_len=1024, global_batch=64, steps=4000
    )
    a = Attempt(job, job.steps)
    view = without_job(sim.load(), 0)
    gone = "8xA100-80GB(a10080gb) + 8xH100(h100)"  # no such pool here: no candidate

    def move(staying: float | None) -> str | None:
        found = pending_move(a.requirements, a.workload, a.space, view, site, sim, sim.now, gone, staying)
        return None if found is None else found.label()

    assert move(None) is None  # nothing to measure it by: left where it is (Slurm says why)
    assert move(sim.now + 10 * 3600.0) == "4xV100-32GB(v10032gb)"  # 10 h away: half the idle V100s (the share)
    assert move(sim.now + 60.0) is None  # it would end in a minute where it waits
