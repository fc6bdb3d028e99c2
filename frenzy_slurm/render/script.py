"""What job.sbatch hands a user's script (trainer: script): the plan as FRENZY_* variables, entry.args checked.

The variables (`scriptenv.PLAN_NAMES`) are written as `export` lines of job.sbatch, so every task of every
component sees the same values and Slurm keeps them with the script (nothing for the trust checks to
digest). The runtime adds the paths (`scriptenv.RUNTIME_NAMES`) and expands entry.args from all of them.
"""

from __future__ import annotations

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobdir.scriptenv import KNOWN_NAMES, ArgsError, check_args
from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.marp.llmc import LOSSES_BUFFER, RECOMPUTE_GELU, llmc_version, recompute_level
from frenzy_slurm.marp.plan import ParallelPlan


def plan_env(spec: JobSpec, plan: ParallelPlan) -> dict[str, str]:
    """The FRENZY_* variables of `plan` for a script (empty for the built-in trainer, which reads plan.json)."""
    if spec.entry.trainer != "script":
        return {}
    t = spec.training
    return {
        **_llmc_env(spec),
        "FRENZY_FRAMEWORK": spec.entry.runs_with,
        "FRENZY_FRAMEWORK_VERSION": spec.entry.framework_version or "",
        "FRENZY_DP": str(plan.dp),
        "FRENZY_TP": str(plan.tp),
        "FRENZY_PP": str(plan.pp),
        "FRENZY_CP": str(plan.cp),
        "FRENZY_ZERO": str(plan.zero),
        "FRENZY_SHARDING": sharding(spec, plan),
        "FRENZY_SHARD_GROUP": str(plan.shard_group or plan.dp),
        "FRENZY_SEQUENCE_PARALLEL": "1" if plan.sequence_parallel else "0",
        "FRENZY_SCHEDULE": plan.schedule,
        "FRENZY_VIRTUAL_STAGES": str(plan.virtual_stages),
        "FRENZY_MICRO_BATCH": str(plan.micro_batch),
        "FRENZY_GRAD_ACCUM": str(plan.grad_accum),
        "FRENZY_GLOBAL_BATCH": str(t.global_batch),
        "FRENZY_SEQ_LEN": str(t.seq_len),
        "FRENZY_LEARNING_RATE": repr(t.learning_rate),
        "FRENZY_WARMUP_STEPS": str(t.warmup_steps),
        "FRENZY_STEPS": str(t.total_steps),
        "FRENZY_RECOMPUTE": plan.recompute,
        "FRENZY_PRECISION": t.precision,
        "FRENZY_OPTIMIZER": t.optimizer,
        "FRENZY_METHOD": t.method,
        "FRENZY_LORA_RANK": str(t.lora.rank),
        # (the memory model's default where model.yaml says nothing: double-quantised, marp.workload_from_spec)
        "FRENZY_DOUBLE_QUANT": "0" if t.lora.double_quant is False else "1",
        "FRENZY_OFFLOAD_OPTIMIZER": "1" if plan.offload_optimizer else "0",
        "FRENZY_OFFLOAD_PARAMS": "1" if plan.offload_params else "0",
        "FRENZY_SEED": str(t.seed),
        "FRENZY_CHECKPOINT_INTERVAL": str(t.checkpoint_interval or 0),
    }


def _llmc_env(spec: JobSpec) -> dict[str, str]:
    """llm.c's own flags for its framework_argv builder, as its source at entry.framework_version takes them."""
    if spec.entry.runs_with != "llm.c":
        return {}
    version = llmc_version(spec.entry.framework_version)
    level = recompute_level(spec, version)
    return {
        "FRENZY_LLMC_RECOMPUTE": "" if version < RECOMPUTE_GELU else str(level),
        "FRENZY_LLMC_MASTER_WEIGHTS": "1" if spec.entry.llmc.master_weights else "0",
        "FRENZY_LLMC_ACCUMULATES": "1" if version >= LOSSES_BUFFER else "0",
    }


# frameworks whose sharding is torch FSDP (FSDP/FSDP2 or Fabric's FSDP strategy): ZeRO stages in FSDP's words
_FSDP_FRAMEWORKS = ("torch", "torchtune", "torchtitan", "litgpt", "lightning")


def sharding(spec: JobSpec, plan: ParallelPlan) -> str:
    """The plan's sharding in the framework's words: model.yaml's parallel.sharding where it pins one, else
    zeroN for DeepSpeed and the HF Trainer (whose rendered config is DeepSpeed's), FSDP's names for torch-based
    frameworks (hybrid-shard where a shard group is smaller than dp), none without sharding."""
    pinned = spec.parallel.sharding
    if pinned != "auto":
        return pinned
    if plan.zero == 0:
        return "none"
    if spec.entry.runs_with not in _FSDP_FRAMEWORKS or plan.zero == 1:
        return f"zero{plan.zero}"
    if plan.zero == 3 and plan.shard_group is not None and plan.shard_group < plan.dp:
        return "hybrid-shard"
    return "full-shard" if plan.zero == 3 else "shard-grad-op"


def check_script_entry(spec: JobSpec) -> None:
    """Plan-time checks of what a script is handed: entry.args references, entry.env not shadowing them."""
    if spec.entry.trainer != "script":
        return
    try:
        check_args(spec.entry.args)
    except ArgsError as exc:
        raise InputError(f"model.yaml {exc}") from None
    taken = sorted(k for k in spec.entry.env if k in KNOWN_NAMES)
    if taken:
        raise InputError(
            f"model.yaml entry.env sets {', '.join(taken)}, which frenzy-slurm sets from the plan; remove it "
            "(change the plan through training:/limits: instead)."
        )
