"""ds_config.json as a dict: the DeepSpeed configuration the job runs with, built from the spec and HAS's plan.

Built in Python rather than in a template because it is data with logic (which ZeRO keys a stage takes,
which optimizer block): a dict is checked by the code that writes it and cannot render invalid JSON.

Its form depends on the framework that reads it. The built-in trainer and a DeepSpeed script get concrete
values. HF Trainer (`hf-trainer`) checks every concrete batch, optimizer and precision value against its own
TrainingArguments and refuses a mismatch (transformers/integrations/deepspeed.py, `trainer_config_process`),
so there those keys are "auto" and HF fills them from the arguments the plan hands the script
(`$FRENZY_FRAMEWORK_ARGS`, jobdir/scriptenv.py); what the plan decides and HF only fills where it is "auto" (ZeRO
stage, offload, bucket sizes, stage3_max_reuse_distance) stays concrete. No scheduler block: the script's
TrainingArguments (lr_scheduler_type, warmup_steps) keep the schedule.
"""

from __future__ import annotations

from typing import Any

from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.marp.plan import DeepSpeedBuckets, ParallelPlan

AUTO = "auto"  # HF Trainer's placeholder: filled from TrainingArguments instead of checked against them


def ds_config(
    spec: JobSpec, plan: ParallelPlan, buckets: DeepSpeedBuckets | None = None, framework: str | None = None
) -> dict[str, Any]:
    """The DeepSpeed config for `plan`, in the form `framework` reads (default: entry.framework or its default)."""
    fw = framework or spec.entry.runs_with
    if fw == "hf-trainer":
        return _hf_trainer(spec, plan, buckets)
    t = spec.training
    b = buckets or DeepSpeedBuckets()
    zero: dict[str, Any] = {
        "stage": plan.zero,
        "reduce_bucket_size": b.reduce_bucket_size,
        "allgather_bucket_size": b.allgather_bucket_size,
        "overlap_comm": b.overlap_comm,
        "contiguous_gradients": True,
    }
    if plan.zero == 3:
        zero["stage3_prefetch_bucket_size"] = b.stage3_prefetch_bucket_size
        zero["stage3_max_live_parameters"] = b.stage3_max_live_parameters
        zero["stage3_max_reuse_distance"] = b.stage3_max_reuse_distance
    if plan.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if plan.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    config: dict[str, Any] = {
        "train_batch_size": t.global_batch,
        "train_micro_batch_size_per_gpu": plan.micro_batch,
        "gradient_accumulation_steps": plan.grad_accum,
        "gradient_clipping": 1.0,
        "steps_per_print": max(1, t.total_steps // 20),
        "wall_clock_breakdown": False,
        "zero_optimization": zero,
        "bf16": {"enabled": t.precision == "bf16-mixed"},
        "fp16": {"enabled": t.precision == "fp16-mixed"},
    }
    if t.optimizer in ("adam", "adamw"):
        # torch's Adam: DeepSpeed's fused CPU/GPU Adam would compile an extension at job start
        config["optimizer"] = {
            "type": "AdamW" if t.optimizer == "adamw" else "Adam",
            "params": {
                "lr": t.learning_rate,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.1 if t.optimizer == "adamw" else 0.0,
                "torch_adam": True,
            },
        }
    return config


def _hf_trainer(spec: JobSpec, plan: ParallelPlan, buckets: DeepSpeedBuckets | None) -> dict[str, Any]:
    """The same ZeRO block; "auto" for every key HF Trainer fills from its TrainingArguments."""
    config = ds_config(spec, plan, buckets, framework="deepspeed")
    config.update(
        train_batch_size=AUTO,
        train_micro_batch_size_per_gpu=AUTO,
        gradient_accumulation_steps=AUTO,
        gradient_clipping=AUTO,
        bf16={"enabled": AUTO},
        fp16={"enabled": AUTO},
    )
    optimizer = config.get("optimizer")
    if optimizer is not None:
        # the type and torch_adam stay (torch's AdamW: no FusedAdam build at start); HF fills the numbers
        optimizer["params"].update(lr=AUTO, betas=AUTO, eps=AUTO, weight_decay=AUTO)
    return config
