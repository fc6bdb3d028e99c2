"""Encoder-decoder rows of a measurements CSV (T5, BART) read through the product path: the architecture from
the row's cells (both stacks, T5's head size by the published parameter count), the decoder length from its
words, and a failure by name where a setting the model.yaml needs is not stated."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import MeasuredRow, RowError, interpret_row
from frenzy_slurm.marp import estimate_memory

# a row shaped like dev2's T0_3B rows (the PEFT README's table), with the settings they lack filled in
ROW = {
    "row_id": "T1",
    "category": "full finetune",
    "model": "bigscience/T0_3B (T5 enc-dec)",
    "params_B": "2.85",
    "layers": "24+24",
    "hidden": "1024",
    "heads": "32",
    "kv_heads": "32",
    "ffn": "16384",
    "vocab": "32128",
    "tied_emb": "no",
    "seq_len": "512",
    "micro_batch": "8",
    "grad_accum_or_global_batch": "",
    "num_gpus": "1",
    "gpu": "A100 80GB",
    "precision": "bf16 mixed",
    "optimizer": "AdamW",
    "parallelism": "single GPU",
    "sharding_offload": "",
    "activation_ckpt": "no",
    "attention_impl": "",
    "compile": "",
    "other_settings": "max_target_length=128",
    "value_GiB": "40",
    "metric_type": "unspecified",
    "source": "https://example.org/t0",
    "confidence": "low",
}


def _row(**changes: str) -> MeasuredRow:
    raw = ROW | changes
    return MeasuredRow(raw["row_id"], raw["category"], raw["confidence"], raw["model"], float(raw["value_GiB"]), raw)


def test_a_t5_row_is_read_with_both_stacks_and_its_target_length():
    it = interpret_row(_row())
    a, w = it.workload.arch, it.workload
    assert (a.encoder_layers, a.layers, a.d_kv, a.activation, a.position) == (24, 24, 128, "relu", "relative")
    assert not a.tied_embeddings and a.dropout == a.activation_dropout == 0.1
    assert (w.seq_len, w.target_len) == (512, 128)
    assert it.spec.training.target_len == 128
    assert estimate_memory(w, it.plan, it.metric, it.overheads).peak > 0


def test_lora_on_a_t5_row_adapts_peft_default_q_and_v():
    it = interpret_row(_row(category="LoRA", optimizer="AdamW (LoRA)"))
    assert it.workload.method == "lora" and it.workload.adapters.lora_targets == ("q", "v")


@pytest.mark.parametrize(
    "changes,reason",
    [
        # dev2's J rows: nothing says the micro-batch, the source length or the target length
        ({"micro_batch": "not stated"}, "micro_batch 'not stated' has no number"),
        ({"seq_len": "short (max len not stated)"}, r"seq_len 'short \(max len not stated\)' has no number"),
        ({"other_settings": ""}, r"decoder \(target\) length is not stated"),
        ({"model": "google/pegasus-large"}, "family MARP does not model"),
    ],
)
def test_a_row_missing_a_setting_fails_by_name(changes, reason):
    with pytest.raises(RowError, match=reason):
        interpret_row(_row(**changes))


@pytest.mark.parametrize(
    "text,length",
    [
        ("max_target_length=128", 128),
        ("target length 64", 64),
        ("decoder seq len: 256", 256),
        ("labels truncated, label length 32", 32),
        ("source/target 512/128", 128),
        ("max_source_length=512", None),
        ("", None),
    ],
)
def test_target_length_phrasings(text, length):
    assert reading.target_length(text) == length


@pytest.mark.parametrize("text,stacks", [("24+24", (24, 24)), ("12 + 6", (12, 6)), ("12", (12, 12)), ("", None)])
def test_layer_cells_of_both_stacks(text, stacks):
    assert reading.stacks(text) == stacks
