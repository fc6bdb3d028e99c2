"""What a user's script is handed: the FRENZY_* environment of the plan, and `$FRENZY_*` in entry.args.

Shared by render (which writes the plan's variables into job.sbatch and checks entry.args at plan time) and
the in-job runtime (which expands entry.args from the environment it set, before it execs the script). It
imports nothing beyond the standard library: the runtime reads it before torch, and a login node without
torch plans with it.

Expansion is the runtime's, not a shell's: only `$FRENZY_NAME` and `${FRENZY_NAME}` are replaced, `$$` is a
literal `$`, and every other `$` is left as it is. An argument that is exactly `$FRENZY_FRAMEWORK_ARGS`
becomes the framework's own arguments (for hf-trainer: TrainingArguments flags carrying the batch split,
learning rate, steps and DeepSpeed config), zero or more arguments; anywhere else it is refused.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

# Set by the runtime in every task (runtime/__main__.py), whatever the plan.
RUNTIME_NAMES: dict[str, str] = {
    "FRENZY_JOB_DIR": "the job directory",
    "FRENZY_DS_CONFIG": "ds_config.json, the DeepSpeed config in the framework's form",
    "FRENZY_PLAN": "plan.json, the whole decision",
    "FRENZY_CHECKPOINT_DIR": "JOBDIR/checkpoints, where a script saves what a requeued run resumes from",
    "FRENZY_SUBMISSION": "the submission hash",
    "FRENZY_GPU": "the task's GPU index (unset on the CPU: expands to empty)",
    "FRENZY_STOP_SIGNAL": "SIGUSR2 or SIGTERM if one came before the script started (else unset: empty)",
}

# Written into job.sbatch from the plan (`plan_env`), so every task of every component sees the same values.
PLAN_NAMES: dict[str, str] = {
    "FRENZY_FRAMEWORK": "entry.framework (or its default)",
    "FRENZY_FRAMEWORK_VERSION": "entry.framework_version (empty: the newest the profile describes)",
    "FRENZY_DP": "data-parallel degree",
    "FRENZY_TP": "tensor-parallel degree",
    "FRENZY_PP": "pipeline stages",
    "FRENZY_CP": "context-parallel degree",
    "FRENZY_ZERO": "ZeRO stage (FSDP: 3 full sharding, 2 SHARD_GRAD_OP)",
    "FRENZY_SHARDING": "the stage in the framework's words: none, zero1-3, full-shard, shard-grad-op, hybrid-shard",
    "FRENZY_MICRO_BATCH": "sequences per rank per forward/backward",
    "FRENZY_GRAD_ACCUM": "micro-batches per optimizer step",
    "FRENZY_GLOBAL_BATCH": "sequences per optimizer step over all ranks (training.global_batch)",
    "FRENZY_SEQ_LEN": "tokens per sequence",
    "FRENZY_LEARNING_RATE": "peak learning rate",
    "FRENZY_WARMUP_STEPS": "linear warm-up steps",
    "FRENZY_STEPS": "optimizer steps to run",
    "FRENZY_RECOMPUTE": "activation checkpointing: none, selective or full",
    "FRENZY_PRECISION": "training.precision",
    "FRENZY_OPTIMIZER": "training.optimizer",
    "FRENZY_METHOD": "training.method: full, lora or qlora",
    "FRENZY_LORA_RANK": "training.lora.rank",
    "FRENZY_OFFLOAD_OPTIMIZER": "1 if optimizer states live in host memory, else 0",
    "FRENZY_OFFLOAD_PARAMS": "1 if ZeRO-3 parameters live in host memory, else 0",
    "FRENZY_SEED": "training.seed",
    "FRENZY_CHECKPOINT_INTERVAL": "save every this many steps (0: only at the end and at the stop signal)",
}

# TrainingArguments.fsdp's names for model.yaml's FSDP shardings (parallel.sharding)
HF_FSDP = {"full-shard": "full_shard", "shard-grad-op": "shard_grad_op", "hybrid-shard": "hybrid_shard"}

FRAMEWORK_ARGS = "FRENZY_FRAMEWORK_ARGS"  # a whole argument: the framework's own flags (see framework_args)

KNOWN_NAMES: tuple[str, ...] = (*RUNTIME_NAMES, *PLAN_NAMES, FRAMEWORK_ARGS)

# $$, ${NAME}, $NAME; the name part of the last two is any shell-style name, checked against KNOWN_NAMES
_REF = re.compile(r"\$(?:(\$)|\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class ArgsError(ValueError):
    """An entry.args reference that cannot be expanded; the message names the argument and the known names."""


def _known_list() -> str:
    return ", ".join(KNOWN_NAMES)


def _references(arg: str) -> list[str]:
    """The FRENZY_ names an argument refers to (other `$` forms are left alone, as the runtime does)."""
    out = []
    for m in _REF.finditer(arg):
        name = m.group(2) or m.group(3)
        if name is not None and name.startswith("FRENZY_"):
            out.append(name)
    return out


def check_args(args: list[str]) -> None:
    """Refuse (ArgsError) an entry.args item naming an unknown FRENZY_ variable, or $FRENZY_FRAMEWORK_ARGS
    inside a longer argument: at plan time, so that the job never starts with an argument it cannot expand."""
    for i, arg in enumerate(args):
        for name in _references(arg):
            if name not in KNOWN_NAMES:
                raise ArgsError(
                    f"entry.args[{i}] {arg!r} names ${name}, which the job does not set. Known names: "
                    f"{_known_list()}. Write $$ for a literal $."
                )
            if name == FRAMEWORK_ARGS and arg not in (f"${FRAMEWORK_ARGS}", f"${{{FRAMEWORK_ARGS}}}"):
                raise ArgsError(
                    f"entry.args[{i}] {arg!r}: ${FRAMEWORK_ARGS} becomes several arguments, so it must be an "
                    "argument of its own (the whole list item)."
                )


def expand_args(args: list[str], env: Mapping[str, str], framework_argv: list[str]) -> list[str]:
    """entry.args with `$FRENZY_*`/`${FRENZY_*}` replaced from `env` (unset: empty), `$$` -> `$`, and an
    argument `$FRENZY_FRAMEWORK_ARGS` replaced by `framework_argv`. Unknown FRENZY_ names: ArgsError."""
    check_args(args)
    out: list[str] = []
    for arg in args:
        if arg in (f"${FRAMEWORK_ARGS}", f"${{{FRAMEWORK_ARGS}}}"):
            out.extend(framework_argv)
            continue

        def sub(m: re.Match[str]) -> str:
            if m.group(1) is not None:
                return "$"
            name = m.group(2) or m.group(3)
            if not name.startswith("FRENZY_"):
                return m.group(0)  # not ours: left as written
            return env.get(name, "")

        out.append(_REF.sub(sub, arg))
    return out


def _hf_fsdp(strategy: str, offload: bool) -> list[str]:
    """The Trainer's FSDP flags: the strategy words `--fsdp` reads in transformers 4.x and 5.x (in 5 translated
    into fsdp_config, deprecated, to be removed in 5.20; `--fsdp true` from a command line is read as a word).
    hybrid_shard is FSDP1's in transformers 5, whose default is FSDP2."""
    argv = ["--fsdp", " ".join([strategy, "auto_wrap"] + (["offload"] if offload else []))]
    return argv + (["--fsdp_config", json.dumps({"version": 1})] if strategy == "hybrid_shard" else [])


def framework_args(env: Mapping[str, str]) -> list[str]:
    """The framework's own command-line flags for the plan in `env` (the FRENZY_* variables).

    hf-trainer: the TrainingArguments flags HfArgumentParser reads (the batch split, learning rate, steps,
    warm-up, seed, precision, gradient checkpointing, output directory, and --deepspeed with the rendered
    config, whose batch and optimizer values are "auto" so that HF fills them from these; `--fsdp` instead
    where model.yaml's parallel.sharding names an FSDP sharding). deepspeed:
    `--deepspeed_config PATH` (deepspeed.add_config_arguments). Other frameworks read plan.json and the
    environment: nothing.
    """
    fw = env.get("FRENZY_FRAMEWORK", "")
    if fw == "hf-trainer":
        argv = [
            "--per_device_train_batch_size",
            env["FRENZY_MICRO_BATCH"],
            "--gradient_accumulation_steps",
            env["FRENZY_GRAD_ACCUM"],
            "--learning_rate",
            env["FRENZY_LEARNING_RATE"],
            "--max_steps",
            env["FRENZY_STEPS"],
            "--warmup_steps",
            env["FRENZY_WARMUP_STEPS"],
            "--seed",
            env["FRENZY_SEED"],
            "--output_dir",
            env["FRENZY_CHECKPOINT_DIR"],
        ]
        if env.get("FRENZY_PRECISION", "").startswith("bf16"):
            argv.append("--bf16")
        elif env.get("FRENZY_PRECISION") == "fp16-mixed":
            argv.append("--fp16")
        if env.get("FRENZY_RECOMPUTE", "none") != "none":
            argv.append("--gradient_checkpointing")
        interval = env.get("FRENZY_CHECKPOINT_INTERVAL", "0")
        if interval != "0":
            argv += ["--save_strategy", "steps", "--save_steps", interval]
        fsdp = HF_FSDP.get(env.get("FRENZY_SHARDING", ""))
        if fsdp is not None:  # torch FSDP through the Trainer (accelerate's FSDP plugin) instead of DeepSpeed
            argv += _hf_fsdp(fsdp, env.get("FRENZY_OFFLOAD_PARAMS") == "1")
        elif env.get("FRENZY_DS_CONFIG"):
            argv += ["--deepspeed", env["FRENZY_DS_CONFIG"]]
        return argv
    if fw == "deepspeed" and env.get("FRENZY_DS_CONFIG"):
        return ["--deepspeed_config", env["FRENZY_DS_CONFIG"]]
    return []
