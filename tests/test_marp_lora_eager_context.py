"""Under LoRA with eager attention, a frozen o_proj keeps no input: one block's saved bytes against PEFT's.

A frozen nn.Linear saves only its weight for backward (its input is needed only for the weight's gradient), and
`probs @ v` saves probs and v, not its output; so the attention's context is kept only where o_proj trains, or
its adapter's lora_A reads it undropped. Measured on a tiny Hugging Face Llama with PEFT adapters on the CPU:
the saved storages of a 2-block model less those of a 1-block model (the second block's input needs a gradient,
as every block's but the first does behind a frozen embedding) against `layer_activation_bytes` for the same
model.yaml, read through `workload_from_spec` as fsbatch reads it.
"""

from __future__ import annotations

import pytest

from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.memory_activations import layer_activation_bytes

TINY = dict(layers=2, hidden=64, heads=4, kv_heads=4, ffn=176, vocab=128)
SEQ, BATCH = 32, 2


def _model(layers: int, targets: list[str]):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=TINY["vocab"],
        hidden_size=TINY["hidden"],
        intermediate_size=TINY["ffn"],
        num_hidden_layers=layers,
        num_attention_heads=TINY["heads"],
        num_key_value_heads=TINY["kv_heads"],
        attn_implementation="eager",
    )
    base = LlamaForCausalLM(cfg).train()
    return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=targets))


def _saved_bytes(model) -> int:
    import torch

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(x):
        st = x.untyped_storage()
        if st.data_ptr() not in params:
            seen[st.data_ptr()] = st.nbytes()
        return x.detach()  # keeps the storage alive, so no later tensor reuses its address

    ids = torch.randint(0, TINY["vocab"], (BATCH, SEQ), generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(input_ids=ids)
    return sum(seen.values())


def _predicted(targets: list[str]) -> float:
    arch = Architecture(**TINY, activation="swiglu", norm="rmsnorm", bias="none", position="rope")
    spec = JobSpec.model_validate(
        {
            "name": "lora-eager",
            "model": {"arch": arch.model_dump(exclude_defaults=True)},
            "training": {
                "seq_len": SEQ,
                "global_batch": BATCH,
                "micro_batch": BATCH,
                "steps": 1,
                "precision": "fp32",
                "attention": "eager",
                "activation_checkpointing": "none",
                "method": "lora",
                "lora": {"rank": 4, "targets": targets, "dropout": 0.0},
            },
            "parallel": {"sharding": "none", "tp": 1, "pp": 1},
            "entry": {"trainer": "script", "script": "train.py", "framework": "torch"},
        }
    )
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="tiny-llama"), device="cpu")
    return layer_activation_bytes(w, 1, False, "none") * SEQ * BATCH


@pytest.mark.parametrize(
    "targets,peft_targets",
    [
        (["q", "v"], ["q_proj", "v_proj"]),  # o_proj frozen: the context is not kept
        (["q", "v", "o"], ["q_proj", "v_proj", "o_proj"]),  # o_proj's lora_A keeps it
    ],
)
def test_one_blocks_saved_bytes_are_peft_s(targets, peft_targets):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    measured = _saved_bytes(_model(2, peft_targets)) - _saved_bytes(_model(1, peft_targets))
    assert _predicted(targets) == pytest.approx(measured, rel=0.02)


def test_the_context_is_the_difference():
    """Adapting o_proj adds the context (tokens x hidden, fp32), which its lora_A keeps, and lora_A's rank-wide
    output, which its lora_B keeps."""
    assert _predicted(["q", "v", "o"]) - _predicted(["q", "v"]) == SEQ * BATCH * (TINY["hidden"] + 4) * 4
