"""Naive model parallelism (`parallel.schedule: sequential`, Hugging Face's device_map): the spec, the search space,
the per-stage memory terms and the step-time model."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import JobSpec, resolve_model
from frenzy_slurm.marp import pinned_plan, predict_pinned, search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import plan_groups
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.memory_activations import in_flight
from frenzy_slurm.marp.memory_buffers import pipeline_buffers
from frenzy_slurm.marp.memory_job import job
from frenzy_slurm.marp.memory_states import gradients_persist
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.marp.speed import PlanPricer

from .helpers import make_spec


def _hf(**parallel) -> JobSpec:
    """A Llama-3.2-1B full fine-tune under HF Trainer on 2 GPUs: micro-batch 1, 8 accumulated, checkpointing off."""
    return make_spec(
        model={"preset": "llama-3.2-1b"},
        entry={"trainer": "script", "script": "train.py", "framework": "hf-trainer"},
        training={
            "seq_len": 2048,
            "global_batch": 8,
            "micro_batch": 1,
            "steps": 1,
            "precision": "bf16-mixed",
            "activation_checkpointing": "none",
        },
        parallel={"sharding": "none", "tp": 1, **parallel},
    )


def test_hf_trainer_runs_pipeline_stages_only_sequentially():
    with pytest.raises(InputError, match="only as naive model parallelism .* set parallel.schedule: sequential"):
        search_space_from_spec(_hf(pp=2))
    space = search_space_from_spec(_hf(pp=2, schedule="sequential"))
    assert space.pp_degrees == (2,) and space.max_zero_with_pp == 0 and not space.heterogeneous
    # pp unset (auto) under hf-trainer stays one stage whatever the schedule's default
    assert search_space_from_spec(_hf()).pp_degrees == (1,)
    # frameworks with a pipeline engine of their own do not run stages one GPU at a time
    ds = make_spec(
        entry={"trainer": "script", "script": "t.py", "framework": "deepspeed"}, parallel={"schedule": "sequential"}
    )
    with pytest.raises(InputError, match="schedule: sequential is not a schedule deepspeed runs"):
        search_space_from_spec(ds)


def test_the_pinned_plan_is_sequential_and_unsharded():
    spec = _hf(pp=2, schedule="sequential")
    w = workload_from_spec(spec, resolve_model(spec, "."))
    plan = pinned_plan(spec, w, 2)
    assert (plan.dp, plan.pp, plan.zero, plan.grad_accum, plan.schedule) == (1, 2, 0, 8, "sequential")
    # no FSDP/ZeRO plan is proposed over a device_map model, even where sharding is left to the search
    auto = _hf(pp=2, schedule="sequential").model_copy(deep=True)
    auto.parallel.sharding = "auto"
    groups = list(plan_groups(w, 2, 8, search_space_from_spec(auto), gpus_per_node=2))
    assert {g.zero for g in groups} == {0}


def test_each_stage_holds_one_micro_batch_and_keeps_its_gradients():
    one_f_one_b = ParallelPlan(pp=2, micro_batch=1, grad_accum=8)
    seq = one_f_one_b.with_(schedule="sequential")
    assert [in_flight(one_f_one_b, i) for i in (0, 1)] == [2.0, 1.0]
    assert [in_flight(seq, i) for i in (0, 1)] == [1.0, 1.0]
    spec = _hf(pp=2, schedule="sequential")
    w = workload_from_spec(spec, resolve_model(spec, "."))
    # a stage finishes a micro-batch's backward before the next forward: its gradients live through every forward
    assert gradients_persist(job(w, seq), 0) and gradients_persist(job(w, seq), 1)
    assert not gradients_persist(job(w, ParallelPlan(pp=2, micro_batch=1, grad_accum=2)), 0)
    assert not gradients_persist(job(w, seq.with_(grad_accum=1)), 0)


def test_per_stage_memory_embeddings_first_head_and_loss_last():
    spec = _hf(pp=2, schedule="sequential")
    w, plan, est = predict_pinned(spec, resolve_model(spec, "."), 2, "allocated")
    first, last = est.stages
    assert (first.layers, last.layers) == (8, 8)
    vocab, hidden = w.arch.vocab, w.arch.hidden
    # Llama-3.2-1B ties its head: the last stage holds a copy of the embedding, the logits and the loss
    assert first.logits == 0.0 and last.logits > 0.0
    assert last.params - first.params == w.arch.hidden  # the final norm; the embedding and the tied head cancel
    assert first.params > 8 * 60_000_000 + vocab * hidden - 1
    # one micro-batch in flight on stage 0, where 1F1B keeps two: one micro-batch's saved block activations less
    piped = estimate_memory(w, plan.with_(schedule="1f1b"), "allocated")
    saved_per_micro_batch = piped.stages[0].activations - first.activations
    assert saved_per_micro_batch > 0.25 * first.activations
    assert last.activations == piped.stages[1].activations  # the last stage holds one in either schedule
    assert first.buffers == piped.stages[0].buffers  # (autocast's 16-bit weight copies, as in any schedule)


def test_no_pipeline_engine_buffers_between_sequential_stages():
    """DeepSpeed's PipelineEngine keeps pipe buffers; naive model parallelism moves a stage's output with .to()."""
    spec = make_spec()  # the built-in DeepSpeed trainer's layout
    w = workload_from_spec(spec, resolve_model(spec, "."))
    engine = ParallelPlan(pp=2, micro_batch=2, grad_accum=4)
    assert pipeline_buffers(job(w, engine), 0, 2.0) > 0
    assert pipeline_buffers(job(w, engine.with_(schedule="sequential")), 0, 1.0) == 0.0


def test_step_time_counts_one_gpu_active_at_a_time():
    spec = _hf(pp=2, schedule="sequential")
    w = workload_from_spec(spec, resolve_model(spec, "."))
    plan = pinned_plan(spec, w, 2)
    pricer = PlanPricer(w, 8)
    seq, piped = pricer.costs(plan), pricer.costs(plan.with_(schedule="1f1b"))
    assert seq.bubble_fraction == 1.0 and piped.bubble_fraction == pytest.approx(1 / 8)
    assert (seq.micro_slots, piped.micro_slots) == (16, 9)
    # the search prices a group by its shape: the schedule travels with it
    (group,) = plan_groups(w, 2, 8, search_space_from_spec(spec), gpus_per_node=2)
    assert pricer.costs(group.shape(1)) == seq


def test_one_process_drives_a_nodes_stages():
    """fsbatch launches one task per pp GPUs for naive model parallelism (the script's device_map sees them)."""
    from pathlib import Path

    from frenzy_slurm.render.shapes import srun_as_given, tasks_per_node
    from frenzy_slurm.sim.synthetic import synthetic

    from .helpers import LOCAL, fill, planned

    assert tasks_per_node(4, 2) == 2 and tasks_per_node(4, 1) == 4
    with pytest.raises(InputError, match="puts 2 pipeline stages in one process"):
        tasks_per_node(3, 2)
    assert '--ntasks-per-node="$((SLURM_GPUS_ON_NODE / 2))"' in srun_as_given(2)
    spec = _hf(pp=2, schedule="sequential").model_copy(deep=True)
    spec.limits.min_gpus = spec.limits.max_gpus = 2
    req = planned(spec, fill(synthetic(LOCAL), "a100"), Path("/scratch/jobs/seq-0001"))
    assert req.decision.chosen.plan.schedule == "sequential"
    c = req.decision.chosen.components[0]
    assert (c.nodes, c.gpus_per_node) == (1, 2)
    assert "#SBATCH --ntasks-per-node=1\n" in req.script
    assert f"#SBATCH --cpus-per-task={2 * c.cpus_per_task}\n" in req.script


def test_the_trainer_gets_no_deepspeed_or_fsdp_over_a_device_map_model():
    from frenzy_slurm.runtime.framework_argv import framework_args

    env = {
        "FRENZY_FRAMEWORK": "hf-trainer",
        "FRENZY_MICRO_BATCH": "1",
        "FRENZY_GRAD_ACCUM": "16",
        "FRENZY_LEARNING_RATE": "0.0001",
        "FRENZY_STEPS": "10",
        "FRENZY_WARMUP_STEPS": "0",
        "FRENZY_SEED": "7",
        "FRENZY_CHECKPOINT_DIR": "/tmp/unused-ckpt",
        "FRENZY_PRECISION": "bf16-pure",
        "FRENZY_RECOMPUTE": "full",
        "FRENZY_SHARDING": "none",
        "FRENZY_DS_CONFIG": "/j/ds_config.json",
        "FRENZY_PP": "2",
    }
    assert "--deepspeed" in framework_args(env | {"FRENZY_SCHEDULE": "1f1b"})
    argv = framework_args(env | {"FRENZY_SCHEDULE": "sequential"})
    assert "--deepspeed" not in argv and "--fsdp" not in argv
    assert argv[argv.index("--gradient_accumulation_steps") + 1] == "16" and "--gradient_checkpointing" in argv


def test_explain_says_which_schedules_a_framework_runs():
    from frenzy_slurm.marp.frameworks import profile_lines, profile_summary

    assert profile_summary(_hf())["can_run"]["pipeline schedules"] == "sequential"  # type: ignore[index]
    assert (
        "pipeline schedules"
        not in profile_summary(
            _hf().model_copy(update={"entry": _hf().entry.model_copy(update={"framework": "torchtune"})})
        )["can_run"]
    )  # type: ignore[operator]
    assert any("pipeline schedules sequential" in line for line in profile_lines(_hf()))
