"""The plan in each framework's own command-line form: what `$FRENZY_FRAMEWORK_ARGS` becomes in entry.args.

A script that passes `$FRENZY_FRAMEWORK_ARGS` to its framework's parser runs the plan MARP predicted (batch
split, parallel degrees, sharding, activation checkpointing, precision, steps) without the user copying the
numbers. Each builder reads the FRENZY_* variables of the plan (scriptenv.PLAN_NAMES) and the runtime's paths
and Slurm's task layout, and writes the flags of the framework release its profile describes
(marp/frameworks.py); each was checked against that release's own parser (tests/test_runtime_framework_argv.py, where
the framework is installed; docs/runtime.md, "What the script is handed"). Standard library only, like
scriptenv: the runtime calls it before torch is imported.

What a framework has no flag for stays with the script (a Lightning script's batch size, a plain torch loop's
everything): the FRENZY_* variables and plan.json carry it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

Env = Mapping[str, str]

# TrainingArguments.fsdp's names for model.yaml's FSDP shardings (parallel.sharding)
HF_FSDP = {"full-shard": "full_shard", "shard-grad-op": "shard_grad_op", "hybrid-shard": "hybrid_shard"}


def _world(env: Env) -> int:
    return (
        int(env.get("FRENZY_DP", "1"))
        * int(env.get("FRENZY_TP", "1"))
        * int(env.get("FRENZY_PP", "1"))
        * int(env.get("FRENZY_CP", "1"))
    )


def _layout(env: Env) -> tuple[int, int]:
    """(nodes, tasks per node) of this job step: Slurm's (srun starts one task per GPU), else the plan's ranks on
    one node (a script started outside Slurm)."""
    tasks = int(env.get("SLURM_NTASKS") or _world(env))
    nodes = int(env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or 1)
    return nodes, max(1, tasks // max(1, nodes))


def _on(env: Env, name: str) -> bool:
    return env.get(name, "0") == "1"


def _interval(env: Env) -> str:
    return env.get("FRENZY_CHECKPOINT_INTERVAL", "0")


def _hf_fsdp(strategy: str, offload: bool) -> list[str]:
    """The Trainer's FSDP flags: the strategy words `--fsdp` reads in transformers 4.x and 5.x (in 5 translated
    into fsdp_config, deprecated, to be removed in 5.20; `--fsdp true` from a command line is read as a word).
    hybrid_shard is FSDP1's in transformers 5, whose default is FSDP2."""
    argv = ["--fsdp", " ".join([strategy, "auto_wrap"] + (["offload"] if offload else []))]
    return argv + (["--fsdp_config", json.dumps({"version": 1})] if strategy == "hybrid_shard" else [])


def hf_trainer(env: Env) -> list[str]:
    """TrainingArguments flags HfArgumentParser reads: the batch split, learning rate, steps, warm-up, seed,
    precision, gradient checkpointing, output directory, and --deepspeed with the rendered config (whose batch and
    optimizer values are "auto" so that HF fills them from these), or `--fsdp` where parallel.sharding names an
    FSDP sharding; neither under naive model parallelism (FRENZY_SCHEDULE sequential)."""
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
    if _interval(env) != "0":
        argv += ["--save_strategy", "steps", "--save_steps", _interval(env)]
    fsdp = HF_FSDP.get(env.get("FRENZY_SHARDING", ""))
    if env.get("FRENZY_SCHEDULE") == "sequential":
        pass  # naive model parallelism: the script's device_map places the model; neither DeepSpeed nor FSDP wraps it
    elif fsdp is not None:  # torch FSDP through the Trainer (accelerate's FSDP plugin) instead of DeepSpeed
        argv += _hf_fsdp(fsdp, _on(env, "FRENZY_OFFLOAD_PARAMS"))
    elif env.get("FRENZY_DS_CONFIG"):
        argv += ["--deepspeed", env["FRENZY_DS_CONFIG"]]
    return argv


def deepspeed(env: Env) -> list[str]:
    """`--deepspeed_config PATH`, the flag deepspeed.add_config_arguments gives a script's parser."""
    return ["--deepspeed_config", env["FRENZY_DS_CONFIG"]] if env.get("FRENZY_DS_CONFIG") else []


def torchtune(env: Env) -> list[str]:
    """key=value overrides of a torchtune 0.6 recipe (`--config FILE` then these; torchtune.config.parse merges
    them into the YAML): the batch split, steps (one epoch of FRENZY_STEPS optimizer steps), the optimizer's
    learning rate, precision, activation checkpointing, FSDP's reshard and CPU offload (keys the distributed
    recipes read), sequence length, LoRA rank, seed and output directory; tensor parallelism is
    full_finetune_distributed's tensor_parallel_dim. The warm-up stays in the config: a recipe config without an
    lr_scheduler (the full fine-tunes) would get one without a component."""
    p = env.get("FRENZY_PRECISION", "bf16-pure")
    argv = [
        f"batch_size={env['FRENZY_MICRO_BATCH']}",
        f"gradient_accumulation_steps={env['FRENZY_GRAD_ACCUM']}",
        "epochs=1",
        f"max_steps_per_epoch={env['FRENZY_STEPS']}",
        f"optimizer.lr={env['FRENZY_LEARNING_RATE']}",
        f"dtype={'fp32' if p == 'fp32' else 'bf16'}",  # torchtune trains in one dtype: bf16 or fp32
        f"enable_activation_checkpointing={env.get('FRENZY_RECOMPUTE', 'none') != 'none'}",
        f"tokenizer.max_seq_len={env['FRENZY_SEQ_LEN']}",
        f"seed={env['FRENZY_SEED']}",
        f"output_dir={env['FRENZY_CHECKPOINT_DIR']}",
    ]
    if int(env.get("FRENZY_DP", "1")) * int(env.get("FRENZY_TP", "1")) > 1:  # the distributed recipes' keys
        argv.append(f"fsdp_reshard_after_forward={env.get('FRENZY_SHARDING') != 'shard-grad-op'}")
        argv.append(f"fsdp_cpu_offload={_on(env, 'FRENZY_OFFLOAD_PARAMS') or _on(env, 'FRENZY_OFFLOAD_OPTIMIZER')}")
    if env.get("FRENZY_TP", "1") != "1":
        argv.append(f"tensor_parallel_dim={env['FRENZY_TP']}")
    if env.get("FRENZY_METHOD", "full") != "full":
        argv.append(f"model.lora_rank={env['FRENZY_LORA_RANK']}")
    return argv


def torchtitan(env: Env) -> list[str]:
    """torchtitan 0.3 flags (its tyro config after `--module M --config C`, `--section.key value`): local and
    global batch (with pipeline parallelism the local batch is the micro-batches of one step), sequence length,
    steps, the data-parallel shard and replicate degrees (HSDP: replicas of FRENZY_SHARD_GROUP shards), TP with
    or without sequence parallelism, PP with its schedule and micro-batch, CP, FSDP's reshard after forward, the
    mixed-precision parameter dtype, warm-up, seed, the job directory as dump folder (checkpoints in
    FRENZY_CHECKPOINT_DIR) and the checkpoint interval, then the activation-checkpointing subcommand
    (`activation-checkpoint:full|selective|none`; selective is its per-op policy, model.yaml's `op`). The
    learning rate stays in the config: 0.3 reads it per parameter group."""
    dp, pp = int(env.get("FRENZY_DP", "1")), int(env.get("FRENZY_PP", "1"))
    mb, ga = int(env["FRENZY_MICRO_BATCH"]), int(env["FRENZY_GRAD_ACCUM"])
    sharded = env.get("FRENZY_SHARDING", "none") not in ("none", "zero1")
    shard = int(env.get("FRENZY_SHARD_GROUP") or dp) if env.get("FRENZY_SHARDING") == "hybrid-shard" else dp
    if not sharded:
        shard = 1  # replicas only (DDP)
    argv = [
        "--training.local-batch-size",
        str(mb * ga if pp > 1 else mb),
        "--training.global-batch-size",
        env["FRENZY_GLOBAL_BATCH"],
        "--training.seq-len",
        env["FRENZY_SEQ_LEN"],
        "--training.steps",
        env["FRENZY_STEPS"],
        "--training.mixed-precision-param",
        "float32" if env.get("FRENZY_PRECISION") == "fp32" else "bfloat16",
        "--parallelism.data-parallel-shard-degree",
        str(shard),
        "--parallelism.data-parallel-replicate-degree",
        str(dp // shard),
        "--parallelism.tensor-parallel-degree",
        env.get("FRENZY_TP", "1"),
        "--parallelism.pipeline-parallel-degree",
        str(pp),
        "--parallelism.context-parallel-degree",
        env.get("FRENZY_CP", "1"),
        "--parallelism.fsdp-reshard-after-forward",
        "never" if env.get("FRENZY_SHARDING") == "shard-grad-op" else "default",
        "--lr-scheduler.warmup-steps",
        env["FRENZY_WARMUP_STEPS"],
        "--debug.seed",
        env["FRENZY_SEED"],
        "--dump-folder",
        env.get("FRENZY_JOB_DIR", "."),
        "--checkpoint.folder",
        "checkpoints",  # under the dump folder: FRENZY_CHECKPOINT_DIR
    ]
    if env.get("FRENZY_TP", "1") != "1":
        sp = _on(env, "FRENZY_SEQUENCE_PARALLEL")
        argv.append("--parallelism.enable-sequence-parallel" if sp else "--parallelism.no-enable-sequence-parallel")
    if pp > 1:
        schedule = {"gpipe": "GPipe", "interleaved": "Interleaved1F1B"}.get(env.get("FRENZY_SCHEDULE", ""), "1F1B")
        argv += ["--parallelism.pipeline-parallel-schedule", schedule]
        argv += ["--parallelism.pipeline-parallel-microbatch-size", str(mb)]
        argv.append("--training.disable-cuda-graphs")  # 0.3 refuses CUDA graphs with pipeline parallelism
    if _interval(env) != "0":
        argv += ["--checkpoint.enable", "--checkpoint.interval", _interval(env)]
    policy = {"full": "full", "op": "selective", "none": "none"}.get(env.get("FRENZY_RECOMPUTE", "none"))
    if policy is not None:  # (a subcommand: after every other flag)
        argv.append(f"activation-checkpoint:{policy}")
    return argv


_LIGHTNING_PRECISION = {
    "fp32": "32-true",
    "bf16-mixed": "bf16-mixed",
    "bf16-pure": "bf16-true",
    "fp16-mixed": "16-mixed",
}


def litgpt(env: Env) -> list[str]:
    """litgpt 0.5 CLI flags (`litgpt finetune_lora|finetune_full|pretrain CHECKPOINT` then these): devices and
    nodes of the step, precision, 4-bit quantisation of a QLoRA base (bnb.nf4, -dq with double quantisation),
    LoRA rank, the global and micro batch, optimizer steps, sequence length, warm-up, save interval, seed and
    output directory."""
    nodes, per_node = _layout(env)
    argv = [
        "--devices",
        str(per_node),
        "--num_nodes",
        str(nodes),
        "--precision",
        _LIGHTNING_PRECISION.get(env.get("FRENZY_PRECISION", ""), "bf16-true"),
        "--train.global_batch_size",
        env["FRENZY_GLOBAL_BATCH"],
        "--train.micro_batch_size",
        env["FRENZY_MICRO_BATCH"],
        "--train.max_steps",
        env["FRENZY_STEPS"],
        "--train.max_seq_length",
        env["FRENZY_SEQ_LEN"],
        "--train.lr_warmup_steps",
        env["FRENZY_WARMUP_STEPS"],
        "--seed",
        env["FRENZY_SEED"],
        "--out_dir",
        env["FRENZY_CHECKPOINT_DIR"],
    ]
    if _interval(env) != "0":
        argv += ["--train.save_interval", _interval(env)]
    method = env.get("FRENZY_METHOD", "full")
    if method != "full":
        argv += ["--lora_r", env["FRENZY_LORA_RANK"]]
    if method == "qlora":
        argv += ["--quantize", "bnb.nf4-dq" if _on(env, "FRENZY_DOUBLE_QUANT") else "bnb.nf4"]
    return argv


_LIGHTNING_STRATEGY = {
    "none": "ddp",
    "zero1": "deepspeed_stage_1",
    "zero2": "deepspeed_stage_2",
    "zero3": "deepspeed_stage_3",
}


def lightning(env: Env) -> list[str]:
    """LightningCLI flags (`--trainer.*`): devices and nodes of the step, precision, the strategy (DDP, FSDP with
    its sharding, or DeepSpeed's stage), gradient accumulation, steps and seed. The batch size belongs to the
    script's DataModule and the checkpointing to its model: the FRENZY_* variables carry them."""
    nodes, per_node = _layout(env)
    sharding = env.get("FRENZY_SHARDING", "none")
    strategy = _LIGHTNING_STRATEGY.get(sharding, "fsdp")
    argv = [
        "--trainer.devices",
        str(per_node),
        "--trainer.num_nodes",
        str(nodes),
        "--trainer.precision",
        _LIGHTNING_PRECISION.get(env.get("FRENZY_PRECISION", ""), "32-true"),
        "--trainer.accumulate_grad_batches",
        env["FRENZY_GRAD_ACCUM"],
        "--trainer.max_steps",
        env["FRENZY_STEPS"],
        "--seed_everything",
        env["FRENZY_SEED"],
    ]
    if _world(env) > 1 or strategy != "ddp":
        offload = _on(env, "FRENZY_OFFLOAD_PARAMS") or _on(env, "FRENZY_OFFLOAD_OPTIMIZER")
        if strategy == "fsdp":  # FSDPStrategy's sharding_strategy, by model.yaml's words
            fsdp = {"shard-grad-op": "SHARD_GRAD_OP", "hybrid-shard": "HYBRID_SHARD"}.get(sharding, "FULL_SHARD")
            argv += ["--trainer.strategy", "FSDPStrategy", "--trainer.strategy.sharding_strategy", fsdp]
            if offload:
                argv += ["--trainer.strategy.cpu_offload", "true"]
        else:  # (Lightning's registered names: ddp, deepspeed_stage_N, deepspeed_stage_N_offload for 2 and 3)
            argv += ["--trainer.strategy", strategy + ("_offload" if offload and strategy[-1] in "23" else "")]
    return argv


def megatron(env: Env) -> list[str]:
    """Megatron-LM's training flags (megatron/training/arguments.py; pretrain_gpt.py and scripts built on
    Megatron-Core's training loop): TP, PP (virtual stages per rank for the interleaved schedule), CP, sequence
    parallelism, the distributed optimizer (ZeRO-1), micro and global batch, sequence length, iterations,
    learning rate and warm-up, precision, recomputation granularity, seed, and the save directory and interval."""
    argv = [
        "--tensor-model-parallel-size",
        env.get("FRENZY_TP", "1"),
        "--pipeline-model-parallel-size",
        env.get("FRENZY_PP", "1"),
        "--context-parallel-size",
        env.get("FRENZY_CP", "1"),
        "--micro-batch-size",
        env["FRENZY_MICRO_BATCH"],
        "--global-batch-size",
        env["FRENZY_GLOBAL_BATCH"],
        "--seq-length",
        env["FRENZY_SEQ_LEN"],
        "--train-iters",
        env["FRENZY_STEPS"],
        "--lr",
        env["FRENZY_LEARNING_RATE"],
        "--lr-warmup-iters",
        env["FRENZY_WARMUP_STEPS"],
        "--seed",
        env["FRENZY_SEED"],
        "--save",
        env["FRENZY_CHECKPOINT_DIR"],
    ]
    p = env.get("FRENZY_PRECISION", "")
    if p.startswith("bf16"):
        argv.append("--bf16")
    elif p.startswith("fp16"):
        argv.append("--fp16")
    if _on(env, "FRENZY_SEQUENCE_PARALLEL"):
        argv.append("--sequence-parallel")
    if env.get("FRENZY_ZERO", "0") != "0":
        argv.append("--use-distributed-optimizer")
    if int(env.get("FRENZY_VIRTUAL_STAGES", "1")) > 1:
        argv += ["--num-virtual-stages-per-pipeline-rank", env["FRENZY_VIRTUAL_STAGES"]]
    recompute = env.get("FRENZY_RECOMPUTE", "none")
    if recompute == "full":
        argv += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    elif recompute == "selective":
        argv += ["--recompute-granularity", "selective"]
    if _interval(env) != "0":
        argv += ["--save-interval", _interval(env)]
    return argv


def llmc(env: Env) -> list[str]:
    """train_gpt2cu's flags (karpathy/llm.c train_gpt2.cu, read at 750c5fd and 0ddedf9): -b micro-batch, -t
    sequence length, -z ZeRO stage, -l learning rate, -x steps, -w master weights; -r where its source takes it
    (from 2024.05.16) and -d, the total batch in tokens (gradient accumulation, from 2024.05.15)."""
    argv = ["-b", env["FRENZY_MICRO_BATCH"], "-t", env["FRENZY_SEQ_LEN"], "-z", env.get("FRENZY_ZERO", "0")]
    argv += ["-l", env["FRENZY_LEARNING_RATE"], "-x", env["FRENZY_STEPS"]]
    argv += ["-w", env.get("FRENZY_LLMC_MASTER_WEIGHTS", "1")]
    if env.get("FRENZY_LLMC_RECOMPUTE"):
        argv += ["-r", env["FRENZY_LLMC_RECOMPUTE"]]
    if _on(env, "FRENZY_LLMC_ACCUMULATES"):
        argv += ["-d", str(int(env["FRENZY_GLOBAL_BATCH"]) * int(env["FRENZY_SEQ_LEN"]))]
    return argv


BUILDERS: dict[str, Callable[[Env], list[str]]] = {
    "hf-trainer": hf_trainer,
    "deepspeed": deepspeed,
    "torchtune": torchtune,
    "torchtitan": torchtitan,
    "litgpt": litgpt,
    "lightning": lightning,
    "megatron": megatron,
    "llm.c": llmc,
}


def framework_args(env: Env) -> list[str]:
    """The framework's own command-line flags for the plan in `env` (the FRENZY_* variables, the runtime's paths
    and Slurm's layout); a framework without flags of its own (frenzy, torch) gets none."""
    build = BUILDERS.get(env.get("FRENZY_FRAMEWORK", ""))
    return build(env) if build else []
