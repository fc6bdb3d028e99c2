"""Reading measurement rows as a careful person would (frenzy_slurm/eval/reading.py, eval/dataset.py)."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import MeasuredRow, RowError, interpret_row, measurement


@pytest.mark.parametrize(
    "text,expected",
    [
        ("DP=8", dict(dp=8)),
        ("TP=8 x PP=8", dict(tp=8, pp=8)),
        ("FSDP=4, CP=2", dict(fsdp=4, cp=2)),
        ("FSDP 32 x TP 8", dict(fsdp=32, tp=8)),
        ("tensor parallel 2", dict(tp=2)),
        ("8-way tensor parallel", dict(tp=8)),
        ("DP(FSDP)=8", dict(fsdp=8)),
        ("3D (TP=2, PP=4, DP=8)", dict(dp=8, tp=2, pp=4)),
        ("HSDP shard group 8, DP=32", dict(dp=32, shard_group=8)),
        ("PP=4 interleaved VPP=2", dict(pp=4, virtual_stages=2, schedule="interleaved")),
        ("PP=2 GPipe, 8 microbatches", dict(pp=2, schedule="gpipe", microbatches=8)),
    ],
)
def test_parallelism_phrasings(text, expected):
    got = reading.parallelism(text)
    for key, value in expected.items():
        assert getattr(got, key) == value, (text, key, got)


def test_device_map_and_single_gpu():
    assert reading.parallelism('naive model parallel, device_map="auto"').device_map
    assert reading.parallelism("single GPU (devices=1)").single


@pytest.mark.parametrize(
    "text,expected",
    [
        ("GA 16", dict(grad_accum=16)),
        ("gradient_accumulation_steps=4", dict(grad_accum=4)),
        ("GBS 512", dict(global_batch=512)),
        ("minibatch 128 (grad accumulation)", dict(global_batch=128)),
        ("local batch 32 (split into PP microbatches)", dict(local_batch=32)),
        ("max_length=512", dict(seq_len=512)),
        ("per_device_train_batch_size=8", dict(micro_batch=8)),
    ],
)
def test_batch_phrasings(text, expected):
    got = reading.batch(text)
    for key, value in expected.items():
        assert getattr(got, key) == value, (text, got)


@pytest.mark.parametrize(
    "text,precision,fp8",
    [
        ("pure bf16 (params, grads, optimizer states bf16)", "bf16-pure", False),
        ("bf16-true", "bf16-pure", False),
        ("states in param dtype (bf16)", "bf16-pure", False),
        ("bf16 mixed (fp32 master weights)", "bf16-mixed", False),
        ("fp16 AMP", "fp16-mixed", False),
        ("fp8 linears, bf16 mixed", "bf16-mixed", True),
        ("no fp8; bf16 mixed", "bf16-mixed", False),
        ("fp32", "fp32", False),
        ("AMP", "fp16-mixed", False),
        ("int3 magic", None, False),
    ],
)
def test_precision_phrasings(text, precision, fp8):
    got = reading.precision(text)
    assert (got.precision, got.fp8) == (precision, fp8)


def test_yes_no_keeps_unknown_apart():
    assert reading.yes_no("yes (full, per layer)") is True
    assert reading.yes_no("no CPU offload") is False
    assert reading.yes_no("not stated") is None and reading.yes_no("unclear") is None


def test_annotated_architecture_cells():
    assert reading.annotated_int("50257 (padded 50304)") == 50304
    assert reading.annotated_int("32000 (padded)") == 32000
    assert reading.annotated_int("50000 (padded)") == 50048
    assert reading.annotated_int("128,256") == 128256


def test_lora_settings_and_named_configs():
    assert reading.lora_setting("LoRA r=8 on query+value") == (8, ("q", "v"))
    assert reading.lora_setting("lora_r: 64, all linear layers") == (64, ("q", "k", "v", "o", "mlp"))
    # a list of module names: the MLP's gate/up/down count as the MLP
    assert reading.lora_setting("LoRA rank 64, targets q,k,v,gate,up,down") == (64, ("q", "k", "v", "mlp"))
    assert reading.lora_setting("r=16 on q_proj, v_proj, down_proj") == (16, ("q", "v", "mlp"))
    assert reading.named_config_lora("llama3_2/3B_lora_single_device defaults") == (64, ("q", "v", "o", "mlp"))
    assert reading.named_config_lora("config_hub/finetune/llama-2-7b/lora.yaml") == (32, ("q", "v"))
    assert reading.named_config_lora("phi-2/qlora.yaml: bnb nf4 base") == (8, ("q", "k", "v", "o", "mlp", "head"))


def test_frameworks_from_settings_not_sources():
    assert reading.frameworks("bert-large (BertForSequenceClassification) | AdamW") == {"transformers"}
    assert reading.frameworks("torchtune SDPA") == {"torchtune"}
    from frenzy_slurm.eval.dataset import SETTING_COLUMNS

    assert not {"source", "location", "notes", "confidence"} & set(SETTING_COLUMNS)


ROW = dict(
    row_id="T1",
    category="full training",
    model="GPT-2 medium",
    params_B="0.355",
    layers="24",
    hidden="1024",
    heads="16",
    kv_heads="16",
    ffn="4096",
    vocab="50257 (padded 50304)",
    tied_emb="yes",
    seq_len="1024",
    micro_batch="4",
    grad_accum_or_global_batch="GBS 512",
    num_gpus="16",
    gpu="A100",
    precision="bf16 mixed",
    optimizer="AdamW",
    parallelism="TP=2 x PP=2 x DP=4, 1F1B",
    sharding_offload="ZeRO-1, no CPU offload",
    activation_ckpt="no",
    attention_impl="flash",
    compile="no",
    other_settings="Megatron-LM",
    value_GiB="20",
    metric_type="max_allocated",
    source="https://example.org/a",
    confidence="high",
    notes="",
)


def _row(**changes):
    raw = ROW | changes
    return MeasuredRow(raw["row_id"], raw["category"], raw["confidence"], raw["model"], float(raw["value_GiB"]), raw)


def test_row_with_degrees_is_read_as_3d():
    it = interpret_row(_row())
    p, w = it.plan, it.workload
    assert (p.dp, p.tp, p.pp, p.zero, p.micro_batch, p.grad_accum) == (4, 2, 2, 1, 4, 32)
    assert not p.offload_optimizer  # "no CPU offload" is a negation
    assert w.framework == "megatron" and w.arch.vocab == 50304 and w.arch.norm == "layernorm"
    assert w.arch.position == "learned" and w.arch.tied_embeddings and w.arch.activation == "gelu"


def test_source_url_does_not_change_the_reading():
    a = interpret_row(_row())
    b = interpret_row(
        _row(source="https://github.com/pytorch/torchtune/blob/main/README.md", notes="2022; kernels alone 1343 MB")
    )
    assert a == b


def test_rows_skipped_with_reasons():
    with pytest.raises(RowError, match="multiply to"):
        interpret_row(_row(parallelism="TP=8 x PP=8", num_gpus="16"))
    # an encoder-decoder row is read (tests/test_eval_encoder_decoder.py), but needs its decoder's length
    with pytest.raises(RowError, match=r"decoder \(target\) length is not stated"):
        interpret_row(_row(model="flan-t5-xl"))
    # litgpt has no single default (its FSDP strategy checkpoints blocks, its single-device scripts do not)
    with pytest.raises(RowError, match="not stated"):
        interpret_row(
            _row(
                activation_ckpt="not stated",
                parallelism="DP=16",
                sharding_offload="none",
                other_settings="litgpt",
                grad_accum_or_global_batch="",
            )
        )


def test_gpu_counts_and_hybrid_shard():
    it = interpret_row(
        _row(
            num_gpus="2 nodes x 8",
            parallelism="FSDP HYBRID_SHARD, DP=16",
            sharding_offload="none",
            other_settings="torch FSDP",
        )
    )
    assert (it.plan.dp, it.plan.zero, it.plan.shard_group) == (16, 3, 8)


def test_optimizers_by_state_count():
    assert interpret_row(_row(optimizer="Lion")).workload.states.optimizer == "sgd-momentum"
    assert interpret_row(_row(optimizer="LAMB")).workload.states.optimizer == "adamw"
    with pytest.raises(RowError, match="no state model"):
        interpret_row(_row(optimizer="Shampoo"))


def test_named_config_global_batch():
    assert reading.named_config_global_batch("see tiny-llama/full.yaml") == 32
    assert reading.named_config_global_batch("config_hub/finetune/llama-2-7b/lora.yaml") == 8
    assert reading.named_config_global_batch("my/own.yaml") is None


def test_cuda_context_by_stated_torch_version():
    # the stated version becomes model.yaml's entry.torch_version, whose context the product gives (eager module
    # loading before torch 1.13); an unstated version is a current release, as it is for any model.yaml
    from frenzy_slurm.marp.overheads import EAGER_LOADING_CONTEXT_GIB, LAZY_LOADING_CONTEXT_GIB

    assert interpret_row(_row()).overheads.context_gib == LAZY_LOADING_CONTEXT_GIB == 0.5
    assert interpret_row(_row(other_settings="Megatron-LM, PyTorch 2.1")).overheads.context_gib == 0.5
    old = interpret_row(_row(other_settings="Megatron-LM, torch 1.12"))
    assert old.spec.entry.torch_version == "1.12"
    assert old.overheads.context_gib == EAGER_LOADING_CONTEXT_GIB == 1.3
    # a version named outside the settings columns (here the notes) is read too
    assert interpret_row(_row(notes="measured with PyTorch 1.10")).overheads.context_gib == 1.3
    assert interpret_row(_row(notes="kernels alone: 600 MB")).overheads.context_gib == 0.5


def test_separate_projections_by_family_and_framework():
    hf = dict(
        model="bert-large-uncased (BertForSequenceClassification)",
        layers="24",
        hidden="1024",
        heads="16",
        kv_heads="16",
        ffn="4096",
        vocab="30522",
        tied_emb="yes",
        params_B="0.335",
        parallelism="single GPU",
        num_gpus="1",
        other_settings="",
        sharding_offload="none",
        grad_accum_or_global_batch="1",
        seq_len="512",
    )
    assert not interpret_row(_row(**hf)).workload.activations.fused_projections  # HF BERT: query, key, value linears
    assert interpret_row(_row()).workload.activations.fused_projections  # Megatron fuses q/k/v
    assert interpret_row(_row(**hf | dict(other_settings="litgpt"))).workload.activations.fused_projections


def test_devices_of_a_named_config_and_assumed_degrees():
    assert reading.named_config_devices("4 (machine 4xA10G; devices per phi-2/full.yaml)") == 2
    assert reading.named_config_devices("4 (4xA10G)") is None
    fsdp = dict(
        parallelism="DP(FSDP) if devices>1",
        sharding_offload="litgpt FSDPStrategy (full shard) when devices>1",
        other_settings="litgpt",
        grad_accum_or_global_batch="",
    )
    it = interpret_row(_row(num_gpus="4 (machine 4xA10G; devices per phi-2/full.yaml)", **fsdp))
    assert (it.plan.dp, it.plan.zero) == (2, 3)
    assert interpret_row(_row(num_gpus="4", **fsdp)).plan.dp == 4
    # a degree the row marks as assumed is planned, and the measurement says it is assumed (scored low)
    assumed = _row(
        num_gpus="4 (4xA10G)",
        parallelism="DP(FSDP)=4 (assumed)",
        other_settings="litgpt",
        sharding_offload="litgpt FSDP full shard",
    )
    assert (interpret_row(assumed).plan.dp, interpret_row(assumed).plan.zero) == (4, 3)
    m = measurement(assumed)
    assert m.assumed == ["parallelism"] and m.confidence == "high" and m.scored_confidence == "low"


def test_torchtune_recipe_behaviour():
    tt = dict(
        model="Llama-3.2-3B",
        layers="28",
        hidden="3072",
        heads="24",
        kv_heads="8",
        ffn="8192",
        vocab="128256",
        tied_emb="yes",
        params_B="3.21",
        parallelism="single GPU",
        num_gpus="1",
        sharding_offload="none",
        grad_accum_or_global_batch="",
        seq_len="4096",
        micro_batch="2",
        precision="pure bf16",
        compile="yes",
        attention_impl="torchtune SDPA",
        optimizer="torch AdamW",
        other_settings="packed",
    )
    w = interpret_row(_row(**tt)).workload
    # recipes `del logits` before backward; rotary embedding before the transpose (no attention-output copy);
    # compile_loss's compiled copy of a plain loss is discarded by the recipes
    assert (w.loss.hold_logits, w.activations.unfused_rope, w.activations.compile, w.loss.compile_loss) == (
        False,
        False,
        True,
        False,
    )
    w = interpret_row(_row(**tt | dict(other_settings="packed; chunked CE"))).workload
    assert (w.loss.loss_chunks, w.loss.compile_loss) == (8, True)
    # a Hugging Face model class is read as the HF Trainer (framework hf-trainer): its compute_loss returns the loss
    # only, so the logits are not held; HF's rotation keeps q/k sequence-major (no attention-output copy)
    hf = interpret_row(_row(**tt | dict(attention_impl="sdpa", model="Llama-3.2-3B (LlamaForCausalLM)")))
    assert hf.spec.entry.framework == "hf-trainer"
    assert (hf.workload.loss.hold_logits, hf.workload.activations.unfused_rope, hf.workload.loss.compile_loss) == (
        False,
        False,
        True,
    )
    # a plain PyTorch loop over the same model binds its output through backward
    plain = interpret_row(_row(**tt | dict(attention_impl="sdpa", model="Llama-3.2-3B", other_settings="pytorch")))
    assert plain.spec.entry.framework == "torch" and plain.workload.loss.hold_logits
    # a row that ran a shipped config's defaults runs that file's loss and adapters: CEWithChunkedOutputLoss,
    # lora_dropout 0.0; a row that states its loss, or does not say defaults, is read as it states
    assert interpret_row(_row(**tt)).workload.adapters.lora_dropout
    w = interpret_row(_row(**tt | dict(activation_ckpt="config default", other_settings=""))).workload
    assert (w.loss.loss_chunks, w.adapters.lora_dropout) == (8, False)
    w = interpret_row(_row(**tt | dict(activation_ckpt="config default", other_settings="standard CE loss"))).workload
    assert w.loss.loss_chunks == 1


def test_litgpt_keeps_an_untied_head_and_fabrics_fp32_logits():
    lit = dict(
        model="gemma-2b",
        layers="18",
        hidden="2048",
        heads="8",
        kv_heads="1",
        ffn="16384",
        vocab="256000",
        tied_emb="yes",
        params_B="2.51",
        parallelism="single GPU",
        num_gpus="1",
        sharding_offload="",
        grad_accum_or_global_batch="",
        seq_len="512",
        micro_batch="2",
        precision="bf16-true",
        attention_impl="SDPA (litgpt CausalSelfAttention)",
        compile="no",
        optimizer="AdamW",
        other_settings="config_hub/finetune/gemma-2b/lora.yaml",
        category="LoRA",
    )
    w = interpret_row(_row(**lit)).workload
    assert not w.arch.tied_embeddings and w.loss.loss_chunks == 4 and w.adapters.qlora_quantized_head
    # Lightning Fabric's precision plugin hands the logits back in fp32: the loop holds them and the loss runs on them
    assert w.loss.output_fp32 and w.loss.loss_fp32
    assert w.loss.keeps_previous_output  # its fit loops bind `logits = model(...)` until the next forward returns
    hf = interpret_row(_row(**lit | dict(attention_impl="sdpa", other_settings="transformers Trainer"))).workload
    assert (
        hf.arch.tied_embeddings
        and hf.loss.loss_fp32
        and not hf.adapters.qlora_quantized_head
        and not hf.loss.keeps_previous_output
    )


def test_ms_swift_runs_the_transformers_trainer_its_release_pins():
    # ms-swift trains with transformers' Trainer (swift/trainers/trainers.py); its 1.x requirements pin
    # transformers < 4.39 and its 2.x < 4.48, so a row naming the release line ran a Trainer older than 4.54,
    # whose default optimizer is adamw_torch (foreach), not the fused one (marp/framework_facts.py)
    assert reading.frameworks("https://github.com/modelscope/ms-swift/blob/<v1.x>/docs/Benchmark.md") == {
        "transformers"
    }
    assert reading.transformers_version("https://github.com/modelscope/ms-swift/blob/<v1.x>/docs/x.md") == (4, 38)
    assert reading.transformers_version("ms-swift v2.x") == (4, 47)
    assert reading.transformers_version("ms-swift 1.7") == (4, 38)
    assert reading.transformers_version("transformers==4.36.2, ms-swift 2.6") == (4, 36)  # its own release wins
    assert reading.transformers_version("ms-swift/blob/main/README.md") is None  # no release: the newest
    assert reading.transformers_version("ms-swift v9.1") is None  # a line whose pin was not read
    row = _row(
        category="full finetune",
        other_settings="",
        parallelism="single GPU",
        sharding_offload="none",
        num_gpus="1",
        micro_batch="1",
        grad_accum_or_global_batch="GA 16",
        precision="bf16 model weights (AdamW states in param dtype)",
        optimizer="AdamW",
        metric_type="max_reserved",
        source="https://github.com/modelscope/ms-swift/blob/<v1.x>/docs/source_en/LLM/Benchmark.md",
    )
    it = interpret_row(row)
    assert it.spec.entry.framework == "hf-trainer" and it.spec.entry.framework_version == "4.38"
    assert not it.workload.states.fused_optimizer  # foreach: a state-sized temporary at the step
    newest = interpret_row(_row(**(row.raw | {"source": "https://github.com/modelscope/ms-swift/blob/main/x.md"})))
    assert newest.spec.entry.framework_version is None and newest.workload.states.fused_optimizer
    # a Megatron run that ms-swift's tests drive stays Megatron (the framework that lays out the states)
    mega = interpret_row(_row(notes="ms-swift v2.x test script"))
    assert mega.workload.framework == "megatron" and mega.spec.entry.framework_version is None


def test_transformers_release_from_a_stated_year():
    assert reading.transformers_of_year("eager (HF GPT2, 2022)") == (4, 25)
    assert reading.transformers_of_year("Hugging Face transformers (2023)") == (4, 36)
    assert reading.transformers_of_year("eager | 2022") is None  # no Hugging Face name before the year
    assert reading.transformers_of_year("HF GPT2 | 2022") is None  # not in the same cell
    assert reading.transformers_of_year("HF GPT2, 1999") is None
    # a DeepSpeed script on Hugging Face's GPT-2 class: the release bounds the loss's dtype (transformers_version)
    row = _row(
        other_settings="DeepSpeed ZeRO-3",
        sharding_offload="DeepSpeed ZeRO-3",
        parallelism="DP=16",
        attention_impl="eager (HF GPT2, 2022)",
        precision="fp16 (DeepSpeed fp16)",
    )
    assert interpret_row(row).spec.entry.transformers_version == "4.25"
    # under the Trainer the release is the framework's own (entry.framework_version), never transformers_version
    trainer = interpret_row(_row(other_settings="HF Trainer", parallelism="DP=16", attention_impl="sdpa (HF, 2023)"))
    assert trainer.spec.entry.framework == "hf-trainer"
    assert trainer.spec.entry.transformers_version is None


@pytest.mark.parametrize(
    "text,variable",
    [
        ("2048", False),
        ("4096 (packed)", False),
        ("max_length=2048", True),
        ("max_seq_length 512 (truncated)", True),
        ("<=512 (Alpaca2k, max_seq_length=512 truncation, padded to longest in batch)", True),
        ("1044 (longest Alpaca sample for this tokenizer; batches padded to longest)", True),
        ("2048 (padded to the longest in the batch)", True),
        ("8192 (unpacked, truncated)", True),
    ],
)
def test_a_truncation_limit_is_a_variable_length_statement(text, variable):
    assert reading.variable_lengths(text) is variable


def test_stated_length_statistics_are_read_in_any_column_phrasing():
    assert reading.length_statistics("max_length=512 (dataset 3234±2548 tokens, truncated)") == (3234.0, 2548.0)
    assert reading.length_statistics("samples 1,210 +- 830 tokens") == (1210.0, 830.0)
    assert reading.length_statistics("mean 812.5 +/- 301 tokens per sample") == (812.5, 301.0)
    assert reading.length_statistics("2048 tokens") is None
    assert reading.length_statistics("loss 3.2 ± 0.1") is None  # not a length


def test_a_truncated_row_is_written_with_variable_lengths_and_its_statistics():
    it = interpret_row(_row(seq_len="max_length=1024 (dataset 900±400 tokens, truncated)"))
    assert it.spec.data.lengths == "variable" and (it.spec.data.mean, it.spec.data.sd) == (900.0, 400.0)
    assert (it.workload.seq_len, it.workload.length_mean, it.workload.length_sd) == (1024, 900.0, 400.0)
    it = interpret_row(_row(seq_len="max_length=1024", notes="dataset lengths 700 +- 100 tokens"))
    assert (it.spec.data.mean, it.spec.data.sd) == (700.0, 100.0)
    it = interpret_row(_row(seq_len="max_length=1024"))
    assert it.spec.data.lengths == "variable" and it.spec.data.mean is None and it.workload.median_seq_len == 512
    assert interpret_row(_row()).spec.data.lengths == "fixed"  # a bare length
    # a row whose longest is not stated stays unreadable (counted as a failure)
    with pytest.raises(RowError, match="not stated"):
        interpret_row(_row(seq_len="variable (unpacked)"))
