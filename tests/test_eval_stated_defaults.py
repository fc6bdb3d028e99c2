"""What the measurement reader does with settings a source leaves out or marks as assumed, frameworks it cannot
model, and how the accuracy benchmark counts failures (fail=0)."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval.dataset import MeasuredRow, RowError, interpret_row, measurement
from frenzy_slurm.marp.frameworks import PROFILES, UNMODELLED

from .helpers import load_benchmark

# a torchtune full fine-tune on one GPU whose source states neither checkpointing, optimizer nor sharding
TORCHTUNE_ROW = dict(
    row_id="T2",
    category="full finetune",
    model="Llama-3.2-1B",
    params_B="1.24",
    layers="16",
    hidden="2048",
    heads="32",
    kv_heads="8",
    ffn="8192",
    vocab="128256",
    tied_emb="yes",
    seq_len="2048",
    micro_batch="2",
    grad_accum_or_global_batch="",
    num_gpus="1",
    gpu="A100",
    precision="pure bf16",
    optimizer="unclear",
    parallelism="single GPU",
    sharding_offload="unclear",
    activation_ckpt="unclear",
    attention_impl="SDPA",
    compile="no",
    other_settings="torchtune",
    value_GiB="20",
    metric_type="max_allocated",
    source="https://example.org/t",
    confidence="medium",
    notes="",
)


def _row(**changes: str) -> MeasuredRow:
    raw = TORCHTUNE_ROW | changes
    return MeasuredRow(raw["row_id"], raw["category"], raw["confidence"], raw["model"], float(raw["value_GiB"]), raw)


def test_profiles_state_what_runs_when_checkpointing_is_left_unset():
    # read from the sources: TrainingArguments.gradient_checkpointing = False; torchtune's recipes
    # cfg.get("enable_activation_checkpointing", False) (its shipped configs set True: shipped_checkpointing)
    assert PROFILES["hf-trainer"].unset_checkpointing == "none"
    assert PROFILES["torchtune"].unset_checkpointing == "none"
    assert PROFILES["torchtune"].shipped_checkpointing == "full"
    assert PROFILES["litgpt"].unset_checkpointing is None  # its FSDP strategy checkpoints blocks, one device does not


def test_unstated_settings_resolve_to_the_frameworks_defaults_and_are_recorded_as_assumed():
    it = interpret_row(_row())
    assert it.plan.recompute == "none"  # the recipe's default, not the shipped configs'
    assert it.spec.training.activation_checkpointing == "none"
    assert it.workload.states.optimizer == "adamw" and it.plan.zero == 0 and not it.plan.offload_optimizer
    m = measurement(_row())
    assert m.assumed == ["activation_ckpt", "optimizer", "sharding_offload"]
    assert (m.confidence, m.scored_confidence) == ("medium", "low")
    # "config default" is the shipped configs' setting
    assert interpret_row(_row(activation_ckpt="config default")).plan.recompute == "full"
    # stated settings are not assumed
    stated = _row(activation_ckpt="yes", optimizer="AdamW", sharding_offload="none")
    assert measurement(stated).assumed == [] and measurement(stated).scored_confidence == "medium"


def test_llmc_rows_are_read_as_llmc_not_refused():
    """llm.c had no profile and was refused by name; its static layout is modelled now (marp/llmc.py,
    tests/test_marp_llmc.py reads the dev2 rows): nothing is refused by name at present."""
    from frenzy_slurm.eval.dataset import _framework

    assert not UNMODELLED
    assert _framework({"llm.c", "torch"}) == "llm.c"


def _benchmark():
    return load_benchmark("marp_accuracy")


def test_failures_count_as_zero_in_the_fail0_mean():
    bench = _benchmark()
    rows = [
        {"accuracy": 0.9, "confidence": "low", "predicted_gib": 9.0, "measured_gib": 10.0},
        {"accuracy": 0.8, "confidence": "high", "predicted_gib": 8.0, "measured_gib": 10.0},
        {"accuracy": None, "confidence": "low", "predicted_gib": None, "measured_gib": 10.0},
        {"accuracy": None, "confidence": "low", "predicted_gib": None, "measured_gib": 10.0},
    ]
    s = bench.summarize(rows)
    assert s["failures"] == 2
    assert s["mean_accuracy"] == pytest.approx(0.85)
    assert s["mean_failures_as_zero"] == pytest.approx(0.425)  # (0.9 + 0.8 + 0 + 0) / 4


def test_model_yaml_naming_llmc_is_planned():
    from .helpers import make_spec

    spec = make_spec(entry={"trainer": "script", "script": "train_gpt2cu", "framework": "llm.c"})
    assert spec.entry.runs_with == "llm.c"


def _sharded_row(gpus: str, parallelism: str, sharding: str, other: str = "") -> MeasuredRow:
    """A row that states its checkpointing and optimizer, with the parallel and sharding words given."""
    return interpret_row(
        _row(
            num_gpus=gpus,
            parallelism=parallelism,
            sharding_offload=sharding,
            other_settings=other,
            activation_ckpt="full",
            optimizer="AdamW",
        )
    )


def test_fsdp_over_one_data_parallel_rank_with_context_parallelism_still_shards():
    # FSDP over 1 x CP 8: the mesh FSDP shards over spans the context-parallel ranks, so the states are sharded
    row = _sharded_row(
        "8", "FSDP=1, CP=8", "FSDP2 over 1", "torchtitan; context parallel (ring attention) over CP ranks"
    )
    assert (row.plan.dp, row.plan.cp, row.plan.zero) == (1, 8, 3)
    assert row.spec.parallel.sharding == "full-shard"
    # a torchtitan run stated unsharded with CP is not one torchtitan runs: a counted failure naming why
    with pytest.raises(RowError, match="torchtitan applies FSDP over the context-parallel ranks"):
        _sharded_row("8", "DP=1, CP=8", "none", "torchtitan")


def test_a_stated_fsdp_cpu_offload_offloads_the_parameters_too():
    row = _sharded_row("2", "DP=2", "FSDP full shard + CPU offload")
    assert (row.plan.zero, row.plan.offload_optimizer, row.plan.offload_params) == (3, True, True)
    zero = _sharded_row("2", "DP=2", "DeepSpeed ZeRO-3 + CPU offload")
    assert (zero.plan.zero, zero.plan.offload_optimizer, zero.plan.offload_params) == (3, True, False)


def test_the_optimizer_in_backward_is_read_from_what_names_the_optimizer():
    def in_bwd(optimizer: str, other: str) -> bool:
        row = interpret_row(_row(optimizer=optimizer, other_settings=other, activation_ckpt="full"))
        return row.spec.training.optimizer_in_backward

    assert in_bwd("torch AdamW in bwd", "torchtune")
    assert in_bwd("AdamW", "torchtune; optimizer_in_bwd")
    assert in_bwd("AdamW fused into backward", "torchtune")
    # torchao's Float8 setting recomputes a weight's fp8 cast in backward: nothing of the optimizer
    assert not in_bwd("AdamW", "torchtune; Float8 + force_recompute_fp8_weight_in_bwd")


def test_no_distributed_optimizer_keeps_the_states_whole():
    assert _sharded_row("8", "DP=8", "Megatron distributed optimizer (ZeRO-1-like) over 8", "torchtune").plan.zero == 1
    assert _sharded_row("8", "DP=8", "none (no distributed optimizer)", "torchtune").plan.zero == 0
