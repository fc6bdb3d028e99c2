"""What a user's script is handed: the FRENZY_* environment of the plan, and `$FRENZY_*` in entry.args.

Shared by render (which writes the plan's variables into job.sbatch and checks entry.args at plan time) and
the in-job runtime (which expands entry.args from the environment it set, before it execs the script). It
imports nothing beyond the standard library: the runtime reads it before torch, and a login node without
torch plans with it.

Expansion is the runtime's, not a shell's: only `$FRENZY_NAME` and `${FRENZY_NAME}` are replaced, `$$` is a
literal `$`, and every other `$` is left as it is. An argument that is exactly `$FRENZY_FRAMEWORK_ARGS`
becomes the framework's own arguments (framework_argv.py: for hf-trainer TrainingArguments flags carrying the
batch split, learning rate, steps and DeepSpeed config, for torchtune its key=value overrides, ...), zero or more
arguments; anywhere else it is refused.
"""

from __future__ import annotations

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
    "FRENZY_SHARD_GROUP": "ranks one copy of the model states is sharded over (hybrid-shard: fewer than FRENZY_DP)",
    "FRENZY_SEQUENCE_PARALLEL": "1 if activations outside the TP regions are split over the TP ranks, else 0",
    "FRENZY_SCHEDULE": "pipeline schedule: 1f1b, interleaved, gpipe or sequential (device_map model parallelism)",
    "FRENZY_VIRTUAL_STAGES": "model chunks per pipeline rank (interleaved schedule)",
    "FRENZY_SHARDING": "the stage in the framework's words: none, zero1-3, full-shard, shard-grad-op, hybrid-shard",
    "FRENZY_MICRO_BATCH": "sequences per rank per forward/backward",
    "FRENZY_GRAD_ACCUM": "micro-batches per optimizer step",
    "FRENZY_GLOBAL_BATCH": "sequences per optimizer step over all ranks (training.global_batch)",
    "FRENZY_SEQ_LEN": "tokens per sequence",
    "FRENZY_LEARNING_RATE": "peak learning rate",
    "FRENZY_WARMUP_STEPS": "linear warm-up steps",
    "FRENZY_STEPS": "optimizer steps to run",
    "FRENZY_RECOMPUTE": "activation checkpointing: none, selective, full or op (torchtitan's per-op policy)",
    "FRENZY_PRECISION": "training.precision",
    "FRENZY_OPTIMIZER": "training.optimizer",
    "FRENZY_METHOD": "training.method: full, lora or qlora",
    "FRENZY_LORA_RANK": "training.lora.rank",
    "FRENZY_DOUBLE_QUANT": "QLoRA: 1 if the NF4 absmax is double-quantised (training.lora.double_quant), else 0",
    "FRENZY_OFFLOAD_OPTIMIZER": "1 if optimizer states live in host memory, else 0",
    "FRENZY_OFFLOAD_PARAMS": "1 if ZeRO-3 parameters live in host memory, else 0",
    "FRENZY_SEED": "training.seed",
    "FRENZY_CHECKPOINT_INTERVAL": "save every this many steps (0: only at the end and at the stop signal)",
    # llm.c jobs only (framework llm.c): its flags that have no model.yaml field of their own
    "FRENZY_LLMC_RECOMPUTE": "llm.c's -r (entry.llmc.recompute or its default; empty where its source has no -r)",
    "FRENZY_LLMC_MASTER_WEIGHTS": "llm.c's -w: 1 to keep an fp32 master copy, else 0",
    "FRENZY_LLMC_ACCUMULATES": "1 where llm.c's source takes -d (the total batch in tokens), else 0",
}

FRAMEWORK_ARGS = "FRENZY_FRAMEWORK_ARGS"  # a whole argument: the framework's own flags (framework_argv.py)

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
