"""`$FRENZY_FRAMEWORK_ARGS`: the plan in each framework's own flags (frenzy_slurm/runtime/framework_argv.py).

The values are checked here; where the framework is installed (the `grid` extras, a framework's own venv) its
own parser reads them back (torchtitan's tyro config, litgpt's and LightningCLI's jsonargparse, torchtune's
recipe parser), otherwise those checks skip.
"""

from __future__ import annotations

import pytest

from frenzy_slurm.jobdir.scriptenv import PLAN_NAMES
from frenzy_slurm.runtime.framework_argv import (
    BUILDERS,
    framework_args,
    lightning,
    litgpt,
    megatron,
    torchtitan,
    torchtune,
)


def plan(**over: str) -> dict[str, str]:
    env = {
        "FRENZY_DP": "4",
        "FRENZY_TP": "1",
        "FRENZY_PP": "1",
        "FRENZY_CP": "1",
        "FRENZY_ZERO": "3",
        "FRENZY_SHARDING": "full-shard",
        "FRENZY_SHARD_GROUP": "4",
        "FRENZY_SEQUENCE_PARALLEL": "0",
        "FRENZY_SCHEDULE": "1f1b",
        "FRENZY_VIRTUAL_STAGES": "1",
        "FRENZY_MICRO_BATCH": "2",
        "FRENZY_GRAD_ACCUM": "4",
        "FRENZY_GLOBAL_BATCH": "32",
        "FRENZY_SEQ_LEN": "1024",
        "FRENZY_LEARNING_RATE": "0.0003",
        "FRENZY_WARMUP_STEPS": "10",
        "FRENZY_STEPS": "100",
        "FRENZY_RECOMPUTE": "full",
        "FRENZY_PRECISION": "bf16-mixed",
        "FRENZY_OPTIMIZER": "adamw",
        "FRENZY_METHOD": "full",
        "FRENZY_LORA_RANK": "16",
        "FRENZY_DOUBLE_QUANT": "1",
        "FRENZY_OFFLOAD_OPTIMIZER": "0",
        "FRENZY_OFFLOAD_PARAMS": "0",
        "FRENZY_SEED": "7",
        "FRENZY_CHECKPOINT_INTERVAL": "50",
        "FRENZY_JOB_DIR": "/jobs/run",
        "FRENZY_CHECKPOINT_DIR": "/jobs/run/checkpoints",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NUM_NODES": "2",
    }
    return env | over


def flags(argv: list[str]) -> dict[str, str | None]:
    """`--name value` pairs and bare `--flag`s of an argv (a flag followed by another flag has no value)."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if a.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            out[a] = None if nxt is None or nxt.startswith("--") or ":" in nxt else nxt
    return out


def test_the_plan_variables_the_builders_read_are_documented():
    assert {"FRENZY_SHARD_GROUP", "FRENZY_SEQUENCE_PARALLEL", "FRENZY_SCHEDULE", "FRENZY_VIRTUAL_STAGES"} <= set(
        PLAN_NAMES
    )
    assert "FRENZY_DOUBLE_QUANT" in PLAN_NAMES
    assert set(BUILDERS) == {
        "hf-trainer",
        "deepspeed",
        "torchtune",
        "torchtitan",
        "litgpt",
        "lightning",
        "megatron",
        "llm.c",
    }
    assert (
        framework_args(plan(FRENZY_FRAMEWORK="torch")) == [] and framework_args(plan(FRENZY_FRAMEWORK="frenzy")) == []
    )


def test_torchtune_overrides_carry_the_batch_split_sharding_and_checkpointing():
    argv = torchtune(plan(FRENZY_SHARDING="shard-grad-op", FRENZY_METHOD="lora"))
    assert argv[:4] == ["batch_size=2", "gradient_accumulation_steps=4", "epochs=1", "max_steps_per_epoch=100"]
    assert "optimizer.lr=0.0003" in argv and "dtype=bf16" in argv and "enable_activation_checkpointing=True" in argv
    assert "fsdp_reshard_after_forward=False" in argv and "fsdp_cpu_offload=False" in argv
    assert "tokenizer.max_seq_len=1024" in argv and "model.lora_rank=16" in argv
    assert "output_dir=/jobs/run/checkpoints" in argv and "seed=7" in argv
    one = torchtune(plan(FRENZY_DP="1", FRENZY_PRECISION="fp32", FRENZY_RECOMPUTE="none"))
    assert "dtype=fp32" in one and "enable_activation_checkpointing=False" in one
    assert not any(a.startswith("fsdp_") for a in one) and not any(a.startswith("model.") for a in one)
    assert "tensor_parallel_dim=2" in torchtune(plan(FRENZY_TP="2"))


def test_torchtitan_flags_split_hsdp_pipeline_and_checkpointing():
    f = flags(torchtitan(plan()))
    assert f["--training.local-batch-size"] == "2" and f["--training.global-batch-size"] == "32"
    assert (
        f["--parallelism.data-parallel-shard-degree"] == "4"
        and f["--parallelism.data-parallel-replicate-degree"] == "1"
    )
    assert f["--dump-folder"] == "/jobs/run" and f["--checkpoint.folder"] == "checkpoints"
    assert f["--checkpoint.interval"] == "50" and "--checkpoint.enable" in f
    assert torchtitan(plan())[-1] == "activation-checkpoint:full"
    hsdp = flags(torchtitan(plan(FRENZY_DP="8", FRENZY_SHARDING="hybrid-shard", FRENZY_SHARD_GROUP="2")))
    assert hsdp["--parallelism.data-parallel-shard-degree"] == "2"
    assert hsdp["--parallelism.data-parallel-replicate-degree"] == "4"
    ddp = flags(torchtitan(plan(FRENZY_SHARDING="none", FRENZY_ZERO="0")))
    assert ddp["--parallelism.data-parallel-shard-degree"] == "1"
    assert ddp["--parallelism.data-parallel-replicate-degree"] == "4"
    piped = torchtitan(plan(FRENZY_PP="2", FRENZY_DP="2", FRENZY_SCHEDULE="interleaved", FRENZY_RECOMPUTE="op"))
    pf = flags(piped)
    assert pf["--training.local-batch-size"] == "8"  # the micro-batches of one step
    assert pf["--parallelism.pipeline-parallel-microbatch-size"] == "2"
    assert pf["--parallelism.pipeline-parallel-schedule"] == "Interleaved1F1B"
    assert "--training.disable-cuda-graphs" in pf and piped[-1] == "activation-checkpoint:selective"
    tp = torchtitan(plan(FRENZY_TP="2", FRENZY_DP="2", FRENZY_SEQUENCE_PARALLEL="1", FRENZY_RECOMPUTE="none"))
    assert "--parallelism.enable-sequence-parallel" in tp and tp[-1] == "activation-checkpoint:none"


def test_litgpt_flags_take_the_step_layout_and_the_quantisation():
    f = flags(litgpt(plan(FRENZY_METHOD="qlora", FRENZY_PRECISION="bf16-pure")))
    assert f["--devices"] == "2" and f["--num_nodes"] == "2"  # 4 tasks on 2 nodes
    assert f["--precision"] == "bf16-true" and f["--quantize"] == "bnb.nf4-dq" and f["--lora_r"] == "16"
    assert f["--train.global_batch_size"] == "32" and f["--train.micro_batch_size"] == "2"
    assert f["--train.max_steps"] == "100" and f["--out_dir"] == "/jobs/run/checkpoints"
    assert flags(litgpt(plan(FRENZY_METHOD="qlora", FRENZY_DOUBLE_QUANT="0")))["--quantize"] == "bnb.nf4"
    full = flags(litgpt(plan(SLURM_NTASKS="", SLURM_JOB_NUM_NODES="")))
    assert "--lora_r" not in full and full["--devices"] == "4" and full["--num_nodes"] == "1"  # outside Slurm


def test_lightning_strategy_follows_the_sharding():
    f = flags(lightning(plan()))
    assert (
        f["--trainer.devices"] == "2" and f["--trainer.num_nodes"] == "2" and f["--trainer.precision"] == "bf16-mixed"
    )
    assert f["--trainer.strategy"] == "FSDPStrategy" and f["--trainer.strategy.sharding_strategy"] == "FULL_SHARD"
    assert f["--trainer.accumulate_grad_batches"] == "4" and f["--trainer.max_steps"] == "100"
    assert flags(lightning(plan(FRENZY_SHARDING="zero2")))["--trainer.strategy"] == "deepspeed_stage_2"
    off = flags(lightning(plan(FRENZY_SHARDING="zero3", FRENZY_OFFLOAD_OPTIMIZER="1")))
    assert off["--trainer.strategy"] == "deepspeed_stage_3_offload"
    assert "--trainer.strategy" not in lightning(plan(FRENZY_DP="1", FRENZY_SHARDING="none", SLURM_NTASKS="1"))


def test_megatron_flags():
    argv = megatron(plan(FRENZY_TP="2", FRENZY_PP="2", FRENZY_DP="2", FRENZY_ZERO="1", FRENZY_SEQUENCE_PARALLEL="1"))
    f = flags(argv)
    assert f["--tensor-model-parallel-size"] == "2" and f["--pipeline-model-parallel-size"] == "2"
    assert f["--micro-batch-size"] == "2" and f["--global-batch-size"] == "32" and f["--train-iters"] == "100"
    assert "--bf16" in f and "--sequence-parallel" in f and "--use-distributed-optimizer" in f
    assert f["--recompute-granularity"] == "full" and f["--recompute-method"] == "uniform"
    assert f["--save"] == "/jobs/run/checkpoints" and f["--save-interval"] == "50"
    sel = flags(megatron(plan(FRENZY_RECOMPUTE="selective", FRENZY_ZERO="0", FRENZY_VIRTUAL_STAGES="2")))
    assert sel["--recompute-granularity"] == "selective" and "--recompute-method" not in sel
    assert sel["--num-virtual-stages-per-pipeline-rank"] == "2" and "--use-distributed-optimizer" not in sel


# --- the frameworks' own parsers, where installed ----------------------------------------------------------------


def test_torchtitan_reads_its_flags_back():
    pytest.importorskip("torchtitan.config.manager", reason="torchtitan (the grid extra) is not installed")
    from torchtitan.config.manager import ConfigManager

    env = plan(FRENZY_DP="4", FRENZY_SHARDING="hybrid-shard", FRENZY_SHARD_GROUP="2", FRENZY_TP="2", FRENZY_PP="2")
    cfg = ConfigManager().parse_args(["--module", "llama3", "--config", "llama3_debugmodel", *torchtitan(env)])
    p = cfg.parallelism
    assert (p.data_parallel_shard_degree, p.data_parallel_replicate_degree, p.pipeline_parallel_degree) == (2, 2, 2)
    assert cfg.training.local_batch_size == 8 and cfg.checkpoint.interval == 50
    assert type(cfg.activation_checkpoint).__qualname__ == "FullAC.Config"


def test_litgpt_reads_its_flags_back(tmp_path):
    pytest.importorskip("litgpt", reason="litgpt (the grid-litgpt extra) is not installed")
    import subprocess
    import sys

    argv = litgpt(plan(FRENZY_METHOD="qlora"))
    cli = [sys.executable, "-m", "litgpt", "finetune_lora", str(tmp_path), *argv, "--print_config"]
    out = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "quantize: bnb.nf4-dq" in out.stdout and "max_steps: 100" in out.stdout and "devices: 2" in out.stdout


def test_lightning_cli_reads_its_flags_back():
    pytest.importorskip("jsonargparse", reason="LightningCLI needs jsonargparse[signatures]")
    from lightning.pytorch import Trainer
    from lightning.pytorch.cli import LightningArgumentParser

    parser = LightningArgumentParser()
    parser.add_lightning_class_args(Trainer, "trainer")
    parser.add_argument("--seed_everything", type=int)
    ns = parser.parse_args(lightning(plan(FRENZY_SHARDING="shard-grad-op")))
    assert str(ns.trainer.strategy.init_args.sharding_strategy).endswith("SHARD_GRAD_OP")
    assert str(ns.trainer.devices) == "2" and ns.trainer.accumulate_grad_batches == 4  # (devices: int | str)


def test_torchtune_recipe_parser_reads_its_overrides_back(tmp_path):
    pytest.importorskip("torchtune", reason="torchtune (the grid extra) is not installed")
    from omegaconf import OmegaConf
    from torchtune.config._parse import TuneRecipeArgumentParser
    from torchtune.config._utils import _merge_yaml_and_cli_args

    cfg = tmp_path / "recipe.yaml"
    cfg.write_text("batch_size: 8\noptimizer:\n  _component_: torch.optim.AdamW\n  lr: 0.001\ntokenizer:\n  path: t\n")
    yaml_args, cli_args = TuneRecipeArgumentParser(description="x").parse_known_args(
        ["--config", str(cfg), *torchtune(plan(FRENZY_METHOD="lora"))]
    )
    conf = _merge_yaml_and_cli_args(yaml_args, cli_args)
    assert conf.batch_size == 2 and OmegaConf.select(conf, "optimizer.lr") == 0.0003
    assert conf.fsdp_reshard_after_forward is True and conf.model.lora_rank == 16
