"""Unsloth's profile (marp/frameworks.py "unsloth", its releases' facts in marp/framework_facts.py): its loss kernels
by release, its offloaded checkpointing, a model.yaml naming it planned end to end, and a measurement row naming it.
Read from Unsloth's source, not measured (its kernels need a GPU): the values asserted are those the source implies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import REQUIRED_COLUMNS, MeasuredRow, interpret_row
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.framework_facts import (
    unsloth_fused_chunk_bytes,
    unsloth_loss_kernel,
    unsloth_offloads_checkpoints,
)
from frenzy_slurm.marp.memory import _fused_linear_loss_bytes, _job
from frenzy_slurm.marp.memory_activations import layer_activation_terms
from frenzy_slurm.marp.memory_loss import logit_bytes_per_token, loss_requests, target_chunk_rows
from frenzy_slurm.marp.memory_saved import saved_activations
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.render.environment import FRAMEWORK_PACKAGES
from tests.helpers import make_spec

VOCAB = 128256  # Llama 3's
ONE_GPU = ParallelPlan(dp=1, micro_batch=1, grad_accum=1, recompute="full")


def unsloth(version: str | None = None, framework: str = "unsloth", **over):
    """Llama-3-8B QLoRA at 4096 tokens a step under `framework`'s script, at an Unsloth release."""
    entry = {"trainer": "script", "script": "train.py", "framework": framework}
    if version:
        entry["framework_version"] = version
    over.setdefault("training__seq_len", 4096)
    over.setdefault("training__method", "qlora")
    spec = make_spec(entry=entry, model={"preset": "llama-3-8b"}, training__micro_batch=1, **over)
    from frenzy_slurm.jobspec import resolve_model

    return spec, workload_from_spec(spec, resolve_model(spec, Path(".")))


@pytest.mark.parametrize(
    "version, tokens, kernel",
    [
        ((2024, 10), 4096, "in-place"),  # Fast_CrossEntropyLoss, its only loss before 2024.11.7
        ((2024, 11, 7), 512, "cce"),  # Cut Cross-Entropy on every step at first
        ((2024, 12, 4), 512, "in-place"),  # from 2024.12.4 small steps return their logits
        ((2025, 3, 14), 4096, "cce"),
        ((2025, 8, 5), 4096, "fused"),  # unsloth_fused_ce_loss
        ((2025, 8, 5), 1024, "in-place"),
        ((2025, 10, 10), 1024, "fused"),  # every step from 2025.10.10
        (None, 512, "fused"),
    ],
)
def test_unsloths_loss_kernel_follows_its_release(version, tokens, kernel):
    assert unsloth_loss_kernel(version, None, tokens) == kernel


def test_cut_cross_entropy_needs_torch_2_4_and_the_chunk_cap_came_in_2026_7():
    assert unsloth_loss_kernel((2025, 3, 14), (2, 3), 4096) == "in-place"
    assert unsloth_fused_chunk_bytes((2025, 9, 1)) is None  # half the free memory: one chunk
    assert unsloth_fused_chunk_bytes((2026, 7, 1)) == unsloth_fused_chunk_bytes(None) == 4 * GiB
    assert not unsloth_offloads_checkpoints((2024, 3)) and unsloth_offloads_checkpoints((2024, 4))


def test_the_in_place_kernel_keeps_only_the_16_bit_logits():
    """Fast_CrossEntropyLoss saves the bf16 logits and writes their gradient into them: 2 bytes per vocabulary entry
    and token, against the Trainer's fp32 log-softmax output and the two fp32 gradients of its backward (12)."""
    _, old = unsloth("2024.10")
    _, hf = unsloth(framework="hf-trainer")
    assert old.loss.ce_in_place and not old.loss.fused_linear_loss
    assert logit_bytes_per_token(old, 1) == 2 * VOCAB
    assert logit_bytes_per_token(hf, 1) == 12 * VOCAB
    fwd, bwd = loss_requests(old, 1, 4096)
    assert fwd == [(True, "logits", 2 * VOCAB * 4096)] and bwd == [(False, "logits", 0)]


def test_the_fused_loss_chunks_keep_4_gib_of_fp32_logits_and_the_hidden_gradient():
    """UnslothFusedLoss: one chunk where a step's fp32 logits fit 4 GiB (4096 tokens: 1.96 GiB), else the next multiple
    of 4 of chunks (16384 tokens: 7.8 GiB -> 4 chunks of 4096 rows); a chunk's bf16 logits and bf16 gradient, plus the
    hidden states' bf16 gradient; no head gradient under QLoRA."""
    assert target_chunk_rows(4096, VOCAB, 4 * GiB) == 4096
    assert target_chunk_rows(16384, VOCAB, 4 * GiB) == 4096
    assert target_chunk_rows(16384, VOCAB, float("inf")) == 16384
    _, w = unsloth()
    assert w.loss.fused_linear_loss and w.loss.fused_chunk_fp32_bytes == 4 * GiB
    tensors, grads = _fused_linear_loss_bytes(_job(w, ONE_GPU), 0.0)
    assert tensors == 4096 * VOCAB * 4 + 4096 * 4096 * 2 and grads == 0.0
    _, cce = unsloth("2025.3.14")  # Cut Cross-Entropy: no logits stored, the hidden states' gradient only
    assert cce.loss.fused_chunk_fp32_bytes == 0.0
    assert _fused_linear_loss_bytes(_job(cce, ONE_GPU), 0.0) == (4096 * 4096 * 2, 0.0)


def test_offloaded_checkpointing_keeps_two_block_inputs_on_the_gpu():
    """use_gradient_checkpointing="unsloth": each block's input goes to the host, two staging buffers stay on the
    GPU; torch's checkpointing under the Trainer keeps all 32 inputs (4096 x 4096 residual-stream elements each)."""
    _, w = unsloth()
    _, hf = unsloth(framework="hf-trainer")
    _, before = unsloth("2024.3")  # use_gradient_checkpointing=True: torch's checkpoint
    kept = {name: saved_activations(_job(x, ONE_GPU), 0, 32, 1.0)[0] for name, x in (("u", w), ("hf", hf))}
    assert w.activations.checkpoint_inputs_on_host and not before.activations.checkpoint_inputs_on_host
    r = _job(w, ONE_GPU).r  # the residual stream's bytes (bf16-mixed: fp32)
    assert kept["u"] == 2 * 4096 * 4096 * r
    assert kept["hf"] == 32 * 4096 * 4096 * r
    assert reading.checkpointing('use_gradient_checkpointing="unsloth"') and reading.checkpointing("unsloth")


def test_unsloths_lora_block_saves_what_its_kernels_keep():
    """Llama-3-8B QLoRA (rank 32 on every linear, bf16, no adapter dropout) per token: the Triton RMSNorm's input
    (8192 bytes), LoRA_QKV's input (8192), q, k, v (8192 + 2 x 2048), the attention kernel's output and log-sum-exp
    (8192 + 4 x 32), the second norm's input and LoRA_MLP's input (8192 each), lora_A's rank-32 outputs in bf16 (7 x
    64: the adapters run in the input's dtype), and LoRA_MLP's gate and up outputs (2 x 2 x 14336): no product,
    no fp32 norm copy, no adapter input copies. With adapter dropout Unsloth keeps PEFT's forward."""
    lora = {"rank": 32, "targets": ["q", "k", "v", "o", "mlp"]}
    _, w = unsloth("2024.12.4", training__precision="bf16-pure", training__lora=lora)
    terms = layer_activation_terms(w, 1, False, "full", False, 1)
    assert terms == (8192, 8192, 12288, 8320, 8192, 8192, 448, 2 * 2 * 14336)
    _, dropped = unsloth("2024.12.4", training__precision="bf16-pure", training__lora=lora | {"dropout": 0.05})
    assert not dropped.activations.lora_mlp_saves_gate_up and not dropped.adapters.lora_in_input_dtype


def test_an_unsloth_model_yaml_is_planned_through_frenzy_slurm_memory(tmp_path):
    from frenzy_slurm.cli.admin import main

    doc = {
        "name": "unsloth-qlora",
        "model": {"preset": "llama-3-8b"},
        "entry": {"trainer": "script", "script": "train.py", "framework": "unsloth"},
        "training": {
            "seq_len": 4096,
            "global_batch": 8,
            "micro_batch": 1,
            "method": "qlora",
            "optimizer": "adam-8bit",
            "activation_checkpointing": "full",
            "steps": 10,
        },
    }
    peaks = {}
    for framework in ("unsloth", "hf-trainer"):
        doc["entry"]["framework"] = framework
        path = tmp_path / f"{framework}.yaml"
        path.write_text(yaml.safe_dump(doc))
        out = CliRunner().invoke(main, ["memory", str(path), "--plan", "dp=1,mb=1,ckpt=full", "--json"])
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        assert data["profile"]["framework"] == framework
        peaks[framework] = data["peak_gib"]
    # the Trainer's fp32 loss tensors (6 GiB at 4096 x 128k) and its 32 kept block inputs are gone under Unsloth
    assert peaks["unsloth"] < peaks["hf-trainer"] - 4.0


def test_unsloth_runs_one_gpu_or_ddp_and_says_so():
    spec, _ = unsloth()
    space = search_space_from_spec(spec)
    assert space.zero_stages == (0,) and space.tp_degrees == (1,) and space.pp_degrees == (1,)
    with pytest.raises(InputError, match="unsloth"):
        search_space_from_spec(unsloth(parallel={"sharding": "full-shard"})[0])
    with pytest.raises(InputError, match="framework unsloth cannot run tp"):
        search_space_from_spec(unsloth(parallel={"tp": 2})[0])
    with pytest.raises(ValueError, match="set trainer: script"):
        make_spec(entry={"framework": "unsloth"})
    assert FRAMEWORK_PACKAGES["unsloth"] == ("torch", "unsloth", "transformers")


def test_a_row_naming_unsloth_is_read_as_its_profile():
    """A synthetic row (the dev sets have none): Unsloth named with TRL and its release, QLoRA on Llama-3.1-8B."""
    assert reading.unsloth_release("Unsloth 2024.12.4 + TRL SFTTrainer") == (2024, 12, 4)
    assert reading.unsloth_release("unsloth==2025.3") == (2025, 3)
    assert reading.unsloth_release("blog post, 2024-12-26") == (2024, 12)
    assert reading.frameworks("Unsloth + TRL SFTTrainer, peft") == {"unsloth", "transformers"}
    raw = dict.fromkeys(REQUIRED_COLUMNS, "") | dict(
        row_id="U1",
        category="qlora",
        model="Llama-3.1-8B (Unsloth 2025.3.14, TRL SFTTrainer)",
        params_B="8.0",
        layers="32",
        hidden="4096",
        heads="32",
        kv_heads="8",
        ffn="14336",
        vocab="128256",
        tied_emb="no",
        seq_len="4096",
        micro_batch="1",
        num_gpus="1",
        precision="bf16, QLoRA 4-bit nf4 r=32 all linear",
        optimizer="adamw_8bit",
        parallelism="single GPU",
        sharding_offload="none",
        activation_ckpt="unsloth",
        attention_impl="sdpa",
        compile="no",
        value_GiB="9",
        metric_type="max_allocated",
        source="https://example.org/unsloth-table",
        confidence="high",
    )
    it = interpret_row(MeasuredRow("U1", "qlora", "high", raw["model"], 9.0, raw))
    assert it.spec.entry.framework == "unsloth" and it.spec.entry.framework_version == "2025.3.14"
    assert it.workload.loss.fused_linear_loss and it.workload.loss.fused_chunk_fp32_bytes == 0.0  # Cut CE
    assert it.workload.activations.checkpoint_inputs_on_host
