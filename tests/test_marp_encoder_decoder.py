"""Encoder-decoder models (T5, BART): parameter counts, config.json mapping, refusals, FLOPs, and the memory
terms against a real tiny T5ForConditionalGeneration trained on the CPU (transformers 5.17, the `examples`
extra)."""

from __future__ import annotations

import gc
import json

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.hf import architecture_from_hf_config
from frenzy_slurm.marp import estimate_memory, pinned_plan, workload_from_spec
from frenzy_slurm.marp.params import count_params, lora_encoder_params, lora_params_per_layer
from frenzy_slurm.marp.speed import flops_per_token

T5_3B = dict(
    layers=24,
    encoder_layers=24,
    hidden=1024,
    heads=32,
    d_kv=128,
    ffn=16384,
    vocab=32128,
    activation="relu",
    tied_embeddings=True,
    position="relative",
    norm="rmsnorm",
    bias="none",
)


def _spec(arch: Architecture, seq: int, target: int | None, mb: int, **training: object) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "encdec",
            "model": {"arch": arch.model_dump(exclude_defaults=True)},
            "training": {
                "seq_len": seq,
                **({"target_len": target} if target else {}),
                "global_batch": mb,
                "micro_batch": mb,
                "steps": 1,
                "activation_checkpointing": "none",
                **training,
            },
            "parallel": {"sharding": "none", "tp": 1, "pp": 1},
            "entry": {"trainer": "script", "script": "train.py", "framework": "torch"},
        }
    )


@pytest.mark.parametrize(
    "arch,params",
    [
        # torch's own count of T5ForConditionalGeneration / BartForConditionalGeneration (transformers 5.17) for
        # these configs: t5-small, t5-3b, bart-large (BartConfig() defaults)
        (dict(T5_3B, layers=6, encoder_layers=6, hidden=512, heads=8, d_kv=64, ffn=2048), 60_506_624),
        (T5_3B, 2_851_598_336),
        (
            dict(
                layers=12,
                encoder_layers=12,
                hidden=1024,
                heads=16,
                ffn=4096,
                vocab=50265,
                activation="gelu",
                tied_embeddings=True,
                max_positions=1024,
                position="learned",
                norm="layernorm",
                bias="all",
            ),
            406_291_456,
        ),
    ],
)
def test_parameter_counts_are_the_real_models(arch, params):
    a = Architecture(**arch)
    assert count_params(a).total(a.layers) == params


def test_t5_heads_are_d_kv_wide_not_hidden_over_heads():
    a = Architecture(**T5_3B)
    assert a.head_dim == 128 and a.inner == 4096
    pc = count_params(a)
    # a decoder block: self- and cross-attention (q, k, v, o: 1024 x 4096 each), relu FFN, three norms
    assert pc.per_layer == 2 * 4 * 1024 * 4096 + 2 * 1024 * 16384 + 3 * 1024
    assert pc.encoder == 24 * (4 * 1024 * 4096 + 2 * 1024 * 16384 + 2 * 1024) + 1024 + 32 * 32
    decoder_only = Architecture(**{**T5_3B, "encoder_layers": 0, "d_kv": None, "position": "learned"})
    assert decoder_only.inner == decoder_only.hidden


def test_peft_targets_q_and_v_in_both_attentions_of_a_decoder_block():
    """PEFT 0.21 (utils/constants.py TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: t5 -> ["q", "v"]) matches
    module names by suffix, so a T5 decoder block's EncDecAttention.q/.v are adapted beside SelfAttention's."""
    a = Architecture(**T5_3B)
    r, qv = 8, ("q", "v")
    one = r * (1024 + 4096) + r * (1024 + 4096)  # q: 1024 -> 4096, v: 1024 -> 4096
    assert lora_params_per_layer(a, r, qv) == 2 * one
    assert lora_encoder_params(a, r, qv) == 24 * one


def test_hf_configs_map_t5_and_bart_fields(tmp_path):
    t5 = {
        "model_type": "t5",
        "d_model": 768,
        "d_ff": 2048,
        "d_kv": 64,
        "num_heads": 12,
        "num_layers": 12,
        "num_decoder_layers": 8,
        "vocab_size": 32128,
        "feed_forward_proj": "gated-gelu",
        "tie_word_embeddings": False,
        "dropout_rate": 0.1,
        "relative_attention_num_buckets": 32,
        "is_encoder_decoder": True,
    }
    bart = {
        "model_type": "bart",
        "d_model": 1024,
        "encoder_layers": 12,
        "decoder_layers": 12,
        "encoder_attention_heads": 16,
        "decoder_ffn_dim": 4096,
        "vocab_size": 50265,
        "max_position_embeddings": 1024,
        "activation_function": "gelu",
        "dropout": 0.1,
        "activation_dropout": 0.0,
        "is_encoder_decoder": True,
    }
    (tmp_path / "t5.json").write_text(json.dumps(t5))
    (tmp_path / "bart.json").write_text(json.dumps(bart))
    a = architecture_from_hf_config(tmp_path / "t5.json")
    assert (a.encoder_layers, a.layers, a.d_kv, a.activation, a.position, a.tied_embeddings) == (
        12,
        8,
        64,
        "geglu",
        "relative",
        False,
    )
    assert a.dropout == a.activation_dropout == 0.1 and a.bias == "none" and a.norm == "rmsnorm"
    b = architecture_from_hf_config(tmp_path / "bart.json")
    assert count_params(b).total(b.layers) == 406_291_456
    assert (b.position, b.bias, b.norm, b.activation_dropout) == ("learned", "all", "layernorm", 0.0)
    (tmp_path / "bad.json").write_text(json.dumps({**t5, "d_kv": "wide"}))
    with pytest.raises(InputError, match="d_kv: 'wide' is not a whole number"):
        architecture_from_hf_config(tmp_path / "bad.json")


def test_encoder_decoder_settings_marp_does_not_model_are_refused_by_name():
    a = Architecture(**T5_3B)
    model = ResolvedModel(arch=a, name="t5")
    with pytest.raises(InputError, match="training.target_len is not given"):
        workload_from_spec(_spec(a, 512, None, 1), model)
    with pytest.raises(InputError, match="activation_offload"):
        workload_from_spec(_spec(a, 512, 128, 1, activation_offload=True), model)
    llama = Architecture(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
    with pytest.raises(InputError, match="has no encoder"):
        workload_from_spec(_spec(llama, 512, 128, 1), ResolvedModel(arch=llama, name="llama"))
    with pytest.raises(ValueError, match="head: lm"):
        Architecture(**{**T5_3B, "head": "classification"})


def test_plans_of_an_encoder_decoder_model_are_one_stage():
    from frenzy_slurm.marp import search_space_from_spec
    from frenzy_slurm.marp.candidates import plan_groups

    a = Architecture(**T5_3B)
    data = _spec(a, 512, 128, 1).model_dump(exclude_defaults=True)
    data["training"].update(global_batch=8, micro_batch="auto")
    data["parallel"] = {"pp": "auto"}
    spec = JobSpec.model_validate(data)
    w = workload_from_spec(spec, ResolvedModel(arch=a, name="t5"))
    groups = list(plan_groups(w, 8, 8, search_space_from_spec(spec), gpus_per_node=8))
    assert groups and {g.pp for g in groups} == {1}


def test_flops_count_both_stacks_and_the_cross_attention():
    a = Architecture(**T5_3B)
    s, t = 512, 128
    w = workload_from_spec(_spec(a, s, t, 1), ResolvedModel(arch=a, name="t5"))
    pc = count_params(a)
    kv = 2 * 1024 * 4096
    linear = 2 * pc.encoder * s + 2 * (pc.per_layer - kv) * 24 * t + 2 * kv * 24 * s + 2 * 32128 * 1024 * t
    attn = 4 * 4096 * 24 * (s * s + t * t + t * s)
    assert flops_per_token(w) * s == pytest.approx(3 * (linear + attn))
    assert flops_per_token(w, "full") * s == pytest.approx(4 * (linear + attn))


# --- against a real tiny T5 on the CPU --------------------------------------------------------------------------

TINY = dict(hidden=64, heads=6, d_kv=16, ffn=192, vocab=2048, encoder_layers=3, layers=2)
# what the real step's peak may differ from MARP's by: measured 0.1-1.2 % on these configs (docs/marp.md)
PEAK_TOLERANCE = 0.02
# the saved activations of the forward (eager, or SDPA with a padding mask): measured within 0.2 %
SAVED_TOLERANCE = 0.005


def _tiny(proj: str, drop: float, attn: str, ckpt: bool = False):
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=TINY["vocab"],
        d_model=TINY["hidden"],
        d_ff=TINY["ffn"],
        d_kv=TINY["d_kv"],
        num_heads=TINY["heads"],
        num_layers=TINY["encoder_layers"],
        num_decoder_layers=TINY["layers"],
        feed_forward_proj=proj,
        dropout_rate=drop,
        attn_implementation=attn,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = T5ForConditionalGeneration(cfg).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    # transformers 5.17 ties T5's LM head to the shared embedding whatever the config says
    # (models/t5/configuration_t5.py: tie_word_embeddings = True)
    assert model.lm_head.weight is model.shared.weight
    arch = Architecture(
        **TINY,
        activation="geglu" if proj.startswith("gated") else "relu",
        tied_embeddings=True,
        position="relative",
        norm="rmsnorm",
        bias="none",
        dropout=drop,
        activation_dropout=drop,
    )
    return model, arch


def _batch(s: int, t: int, b: int):
    import torch

    x = torch.randint(0, TINY["vocab"], (b, s))
    y = torch.randint(0, TINY["vocab"], (b, t))
    mask = torch.ones_like(x)
    mask[0, -4:] = 0  # a padded sample, as a collator's batches have
    return x, y, mask


@pytest.mark.slow
@pytest.mark.parametrize(
    "proj,drop,attn,s,t",
    [
        ("relu", 0.1, "eager", 64, 32),
        ("gated-gelu", 0.1, "eager", 64, 32),
        ("relu", 0.0, "sdpa", 64, 32),
        ("gated-gelu", 0.0, "sdpa", 16, 128),
        ("relu", 0.1, "eager", 128, 16),
    ],
)
def test_saved_activations_are_the_real_models(proj, drop, attn, s, t):
    """The tensors a T5ForConditionalGeneration forward saves for backward (distinct storages, parameters left
    out) against MARP's activation terms (both stacks, the cross-attention, the encoder output, the LM head's
    input). SDPA with dropout falls back to the math kernel on the CPU (scores saved), so it is checked without."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from frenzy_slurm.marp.memory_encdec import encdec_saved_activations
    from frenzy_slurm.marp.memory_job import job
    from frenzy_slurm.marp.memory_loss import logits_and_loss
    from frenzy_slurm.marp.memory_states import model_states

    model, arch = _tiny(proj, drop, attn)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        # (a detached alias keeps the storage alive, so no later tensor reuses its address; the tensor itself would
        # make a reference cycle through its grad_fn that outlives the test)
        return x.detach()

    x, y, mask = _batch(s, t, 2)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=x, attention_mask=mask, decoder_input_ids=y)
    spec = _spec(arch, s, t, 2, precision="fp32", attention="eager" if attn == "eager" else "sdpa")
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="t5"), device="cpu")
    j = job(w, pinned_plan(spec, w, 1))
    predicted = encdec_saved_activations(j, arch.layers, 1.0)[0] + logits_and_loss(j, model_states(j, 0, 2), False)[2]
    measured = sum(seen.values())
    assert predicted == pytest.approx(measured, rel=SAVED_TOLERANCE)


@pytest.mark.slow
@pytest.mark.parametrize(
    "proj,drop,attn,ckpt",
    [
        ("relu", 0.1, "eager", False),
        ("gated-gelu", 0.1, "eager", False),
        ("relu", 0.0, "sdpa", False),
        ("relu", 0.1, "eager", True),
        ("relu", 0.0, "sdpa", True),
    ],
)
def test_training_step_peak_is_predicted(proj, drop, attn, ckpt):
    """One training step of a tiny T5 (forward with labels, backward, AdamW step) on the CPU: the peak of the
    allocator's running total (the profiler's memory events) against the `allocated` estimate of its model.yaml
    through the product path (workload_from_spec, pinned_plan, estimate_memory)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from frenzy_slurm.runtime.memory import CpuMemoryRecorder

    model, arch = _tiny(proj, drop, attn, ckpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    x, y, mask = _batch(64, 32, 4)

    def step() -> None:
        # the usual loop: the model's output (its logits) stays bound through the backward
        out = model(input_ids=x, attention_mask=mask, labels=y)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's states exist from the first step on
    gc.collect()  # (earlier tests' models, in reference cycles, would count as live tensors of this step)
    recorder = CpuMemoryRecorder().start()
    measured, _ = recorder.peak_of(step)
    spec = _spec(
        arch,
        64,
        32,
        4,
        precision="fp32",
        attention="eager" if attn == "eager" else "sdpa",
        activation_checkpointing="full" if ckpt else "none",
        optimizer_impl="fused",  # torch's per-tensor step (foreach=False): no state-sized temporary
    )
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="t5"), device="cpu")
    predicted = estimate_memory(w, pinned_plan(spec, w, 1), "allocated").peak
    assert predicted == pytest.approx(measured, rel=PEAK_TOLERANCE)


def test_the_allocator_sees_both_stacks_tensors():
    """The caching allocator's replay packs the tensors of both stacks and of the cross-attention, and the
    adapters of every attention PEFT adapts (the two relative-bias tables, 2 x 32 x 32 elements, are too small to
    matter and are left out)."""
    from frenzy_slurm.marp.allocator import adapter_shapes, parameter_shapes

    a = Architecture(**T5_3B)
    shapes = parameter_shapes(a, 24, True, True, 1, 1)
    assert sum(n * c for n, c in shapes) == count_params(a).total(a.layers) - 2 * 32 * 32
    adapters = adapter_shapes(a, 24, 8, ("q", "v"), 1)
    assert sum(n * c for n, c in adapters) == lora_params_per_layer(a, 8, ("q", "v")) * 24 + lora_encoder_params(
        a, 8, ("q", "v")
    )


def test_a_pipeline_plan_given_by_hand_is_an_input_error():
    """`frenzy-slurm memory --plan pp=2` of such a model: exit 2 with the reason, no traceback."""
    from frenzy_slurm.marp.plan import ParallelPlan

    a = Architecture(**T5_3B)
    w = workload_from_spec(_spec(a, 512, 128, 1), ResolvedModel(arch=a, name="t5"))
    with pytest.raises(InputError, match="pipeline stages and context parallelism of an encoder-decoder model"):
        estimate_memory(w, ParallelPlan(dp=1, pp=2, micro_batch=1, grad_accum=2))
