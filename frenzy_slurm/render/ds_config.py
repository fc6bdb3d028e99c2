"""ds_config.json as a dict: the DeepSpeed configuration the job runs with, built from the spec and HAS's plan.

Built in Python rather than in a template because it is data with logic (which ZeRO keys a stage takes,
which optimizer block): a dict is checked by the code that writes it and cannot render invalid JSON.
"""

from __future__ import annotations

from typing import Any

from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.marp.plan import DeepSpeedBuckets, ParallelPlan


def ds_config(spec: JobSpec, plan: ParallelPlan, buckets: DeepSpeedBuckets | None = None) -> dict[str, Any]:
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
