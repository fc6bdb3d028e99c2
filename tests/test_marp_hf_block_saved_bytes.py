"""One transformer block's saved-for-backward bytes against Hugging Face's Llama (and PEFT's LoRA) on the CPU.

The saved storages of a 2-block model less those of a 1-block model (the second block's input needs a gradient,
as every block's but the first does behind a frozen embedding under LoRA) against `layer_activation_bytes` for
the same model.yaml, read through `workload_from_spec` as fsbatch reads it. Under autocast the bf16 copies of the
weights (autocast's cast cache, which MARP counts with the weights, not per token) are left out.

What it pins (transformers 5.17, peft 0.21, torch 2.13):
- a frozen nn.Linear saves only its weight, and `probs @ v` saves probs and v, not its output: under LoRA with
  eager attention the context is kept only where o_proj trains or its adapter's lora_A reads it undropped;
- HF's rotary embedding (`q * cos + rotate_half(q) * sin`) keeps q and k sequence-major, and the SDPA kernel
  writes its output sequence-major, so o_proj saves the kernel's output itself: no copy;
- under autocast the RMSNorm's normalised value is fp32 (`weight * x.to(input_dtype)`, the residual stream's
  dtype), and eager attention keeps the fp32 softmax beside the 16-bit copy `probs @ v` reads.
- PEFT 0.21 keeps a bf16 model's adapters in fp32 (get_peft_model's autocast_adapter_dtype, from peft 0.12) and
  casts each adapter's input to them (lora/layer.py Linear.forward, `_cast_input_dtype`): each adapter keeps an
  fp32 copy of its own and an fp32 lora_A output; under autocast each adapter's matmul casts its input to bf16 by
  itself (autocast caches only the casts of leaf tensors), so there too the adapters share no saved input.
- QLoRA on bitsandbytes 0.50's NF4 (pure bf16; skipped without bitsandbytes): its 4-bit matmul keeps no input and
  PEFT's Linear4bit casts like Linear outside autocast, so the bytes are LoRA's over a bf16 base.
"""

from __future__ import annotations

import contextlib

import pytest

from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.memory_activations import layer_activation_bytes

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, ffn=176, vocab=128)
SEQ, BATCH = 24, 2  # 48 tokens: no activation has a weight's shape
PEFT_NAMES = {
    "q": ["q_proj"],
    "k": ["k_proj"],
    "v": ["v_proj"],
    "o": ["o_proj"],
    "mlp": ["gate_proj", "up_proj", "down_proj"],
}


def _config(layers: int, **settings: object):
    """The tiny Llama's transformers config with `layers` blocks."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=TINY["vocab"],
        hidden_size=TINY["hidden"],
        intermediate_size=TINY["ffn"],
        num_hidden_layers=layers,
        num_attention_heads=TINY["heads"],
        num_key_value_heads=TINY["kv_heads"],
        **settings,
    )


def _model(
    layers: int, attention: str, precision: str, targets: list[str] | None, dropout: float = 0.0, fp32_adapters=True
):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    cfg = _config(layers, attn_implementation=attention)
    model = LlamaForCausalLM(cfg).train()
    if precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    if targets is None:
        return model
    from peft import LoraConfig, get_peft_model

    names = [n for t in targets for n in PEFT_NAMES[t]]
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules=names)
    # autocast_adapter_dtype=False: what peft before 0.12 did (adapters in the base weights' dtype)
    return get_peft_model(model, config, autocast_adapter_dtype=fp32_adapters)


def _saved_bytes(model, precision: str) -> int:
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    weight_shapes = {tuple(p.shape) for p in model.parameters() if p.dim() == 2}
    weight_shapes |= {s[::-1] for s in weight_shapes}
    seen: dict[int, int] = {}

    def pack(x):
        st = x.untyped_storage()
        cast_weight = precision == "bf16-mixed" and tuple(x.shape) in weight_shapes
        if st.data_ptr() not in params and not cast_weight:
            seen[st.data_ptr()] = st.nbytes()
        return x.detach()  # keeps the storage alive, so no later tensor reuses its address

    ids = torch.randint(0, TINY["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    amp = torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16-mixed" else contextlib.nullcontext()
    with amp, torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids)
    return sum(seen.values())


def _predicted(
    attention: str,
    precision: str,
    targets: list[str] | None,
    dropout: float = 0.0,
    peft: str | None = None,
    method: str = "lora",
    **adapter_settings: object,
) -> float:
    """One block's saved bytes for these settings, as fsbatch derives them from a model.yaml."""
    arch = Architecture(**TINY, activation="swiglu", norm="rmsnorm", bias="none", position="rope")
    adapters = {"rank": 4, "targets": targets, "dropout": dropout, "peft_version": peft, **adapter_settings}
    lora = {} if targets is None else {"method": method, "lora": adapters}
    spec = JobSpec.model_validate(
        {
            "name": "hf-block",
            "model": {"arch": arch.model_dump(exclude_defaults=True)},
            "training": {
                "seq_len": SEQ,
                "global_batch": BATCH,
                "micro_batch": BATCH,
                "steps": 1,
                "precision": precision,
                "attention": attention,
                "activation_checkpointing": "none",
                **lora,
            },
            "parallel": {"sharding": "none", "tp": 1, "pp": 1},
            "entry": {"trainer": "script", "script": "train.py", "framework": "hf-trainer"},
        }
    )
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="tiny-llama"), device="cpu")
    return layer_activation_bytes(w, 1, False, "none", precision == "bf16-mixed") * SEQ * BATCH


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("precision", ["fp32", "bf16-pure", "bf16-mixed"])
@pytest.mark.parametrize(
    "targets",
    [None, ["q", "v"], ["q", "v", "o"], ["q", "k", "v", "o", "mlp"]],
    ids=["full", "lora-qv", "lora-qvo", "lora-all"],
)
def test_one_blocks_saved_bytes_are_hf_s(attention, precision, targets):
    """PEFT 0.21 keeps a 16-bit model's adapters in fp32 and casts each adapter's input to them: every adapter
    keeps an fp32 copy of its own and an fp32 lora_A output; under autocast each adapter's matmul casts its input
    to 16 bits by itself, so the adapters share no saved input either."""
    _need(targets)
    measured = _saved_bytes(_model(2, attention, precision, targets), precision)
    measured -= _saved_bytes(_model(1, attention, precision, targets), precision)
    assert _predicted(attention, precision, targets) == pytest.approx(measured, rel=0.02)


def _need(targets) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    if targets is not None:
        pytest.importorskip("peft")


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("precision", ["bf16-pure", "bf16-mixed"])
def test_adapters_in_the_base_dtype_before_peft_0_12(attention, precision):
    """peft 0.11 built the adapters in the base weights' dtype (get_peft_model(autocast_adapter_dtype=False) does
    the same in 0.21): under pure bf16 the q/k/v/gate/up adapters share one bf16 input again."""
    targets = ["q", "k", "v", "o", "mlp"]
    _need(targets)
    measured = _saved_bytes(_model(2, attention, precision, targets, fp32_adapters=False), precision)
    measured -= _saved_bytes(_model(1, attention, precision, targets, fp32_adapters=False), precision)
    assert _predicted(attention, precision, targets, peft="0.11.1") == pytest.approx(measured, rel=0.02)
    if precision == "bf16-pure":
        assert _predicted(attention, precision, targets, peft="0.11.1") < _predicted(attention, precision, targets)


@pytest.mark.parametrize("precision", ["fp32", "bf16-pure", "bf16-mixed"])
def test_adapter_dropout_keeps_a_mask_as_wide_as_its_input(precision):
    """With adapter dropout each adapter keeps its dropped copy and the mask, which on the CPU has the dropout
    input's dtype: fp32 where PEFT casts to fp32 adapters or autocast leaves the residual side in fp32."""
    targets = ["q", "k", "v", "o", "mlp"]
    _need(targets)
    measured = _saved_bytes(_model(2, "sdpa", precision, targets, dropout=0.1), precision)
    measured -= _saved_bytes(_model(1, "sdpa", precision, targets, dropout=0.1), precision)
    assert _predicted("sdpa", precision, targets, dropout=0.1) == pytest.approx(measured, rel=0.02)


def test_the_context_is_the_difference():
    """Adapting o_proj under eager attention adds the context (tokens x hidden, fp32), which its lora_A keeps,
    and lora_A's rank-wide output, which its lora_B keeps."""
    diff = _predicted("eager", "fp32", ["q", "v", "o"]) - _predicted("eager", "fp32", ["q", "v"])
    assert diff == SEQ * BATCH * (TINY["hidden"] + 4) * 4


def _qlora_model(layers: int, attention: str, targets: list[str], fp32_adapters: bool, where):
    """A bitsandbytes NF4 Llama (bf16 compute and non-quantised weights), loaded as from_pretrained loads a
    checkpoint, with PEFT's adapters."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import BitsAndBytesConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = _config(layers)
    path = where / f"llama-{layers}"
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    nf4 = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_compute_dtype=torch.bfloat16,
        bnb_4bit_use_double_quant=True,
    )
    model = LlamaForCausalLM.from_pretrained(
        path, quantization_config=nf4, dtype=torch.bfloat16, attn_implementation=attention, device_map="cpu"
    ).train()
    names = [n for t in targets for n in PEFT_NAMES[t]]
    config = LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=names)
    return get_peft_model(model, config, autocast_adapter_dtype=fp32_adapters)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("peft", ["0.21.0", "0.11.1"])
def test_qlora_adapters_on_bitsandbytes_nf4(attention, peft, tmp_path):
    """QLoRA in pure bf16: bitsandbytes 0.50's 4-bit matmul keeps no input (from 0.43.2), and PEFT's Linear4bit
    casts each adapter's input to the adapters' dtype outside autocast (lora/bnb.py `requires_conversion`): the
    same bytes as LoRA over a bf16 base, fp32 copies from peft 0.12, one shared bf16 input before."""
    targets = ["q", "k", "v", "o", "mlp"]
    _need(targets)
    pytest.importorskip("bitsandbytes", minversion="0.50")  # (its CPU 4-bit kernels; the `grid-litgpt` extra)
    fp32 = peft != "0.11.1"
    measured = _saved_bytes(_qlora_model(2, attention, targets, fp32, tmp_path), "bf16-pure")
    measured -= _saved_bytes(_qlora_model(1, attention, targets, fp32, tmp_path), "bf16-pure")
    predicted = _predicted(
        attention, "bf16-pure", targets, peft=peft, method="qlora", quantizer="bitsandbytes", quantizer_version="0.50.2"
    )
    assert predicted == pytest.approx(measured, rel=0.02)
