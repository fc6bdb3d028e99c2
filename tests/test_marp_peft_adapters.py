"""PEFT's adapter dtype as the profiles give it: fp32 adapters over a 16-bit base from peft 0.12
(get_peft_model's autocast_adapter_dtype), the base dtype before it, under DeepSpeed's engine (which casts the whole
module) and in the frameworks with LoRA modules of their own; and the bytes they add per block and to the states."""

from __future__ import annotations

import pytest

from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.memory_activations import layer_activation_bytes
from frenzy_slurm.marp.memory_job import param_bytes

from .helpers import make_spec

LORA = {"rank": 16, "targets": ["q", "k", "v", "o", "mlp"], "dropout": 0.0}


def _workload(framework: str, precision: str = "bf16-pure", sharding: str = "none", **lora):
    spec = make_spec(
        model={"preset": "llama-3.2-1b"},
        training__precision=precision,
        training__method="lora",
        training__lora={**LORA, **lora},
        parallel__sharding=sharding,
        entry={"trainer": "script", "script": "t.py", "framework": framework},
    )
    return workload_from_spec(spec, resolve_model(spec, "."))


@pytest.mark.parametrize(
    ("framework", "peft", "sharding", "fp32"),
    [
        ("hf-trainer", None, "none", True),  # a current peft
        ("hf-trainer", "0.12.0", "none", True),
        ("hf-trainer", "0.11.1", "none", False),
        ("hf-trainer", None, "zero2", False),  # DeepSpeed's engine: module.bfloat16(), adapters too
        ("lightning", None, "none", True),
        ("torch", "0.10.0", "none", False),
        ("torchtune", None, "none", False),  # its own LoRALinear, in the model's dtype
        ("litgpt", None, "none", False),
    ],
)
def test_which_jobs_train_fp32_adapters(framework, peft, sharding, fp32):
    w = _workload(framework, sharding=sharding, peft_version=peft)
    assert w.adapters.lora_fp32 is fp32
    assert w.adapters.lora_input_cast is (framework in ("hf-trainer", "lightning", "torch"))


def test_fp32_adapters_keep_an_fp32_input_each():
    """Pure bf16, 5 adapted inputs of hidden width (q, k, v, gate, up), o's (hidden) and down's (ffn): each an fp32
    copy of its own where peft 0.11's bf16 adapters shared one bf16 input, and 7 fp32 r-wide lora_A outputs."""
    new, old = _workload("hf-trainer"), _workload("hf-trainer", peft_version="0.11.1")
    h, f, r = new.arch.hidden, new.arch.ffn, 16
    diff = layer_activation_bytes(new, 1, False, "none") - layer_activation_bytes(old, 1, False, "none")
    # q/k/v: 3 x 4 B vs one shared 2 B; gate/up: 2 x 4 vs 2; the SDPA output o reads: an fp32 copy vs none;
    # down: 4 vs 2 B; lora_A outputs: 7 x (4 - 2) B
    assert diff == (3 * 4 - 2) * h + (2 * 4 - 2) * h + 4 * h + (4 - 2) * f + 7 * 2 * r


def test_fp32_adapters_train_fp32_states():
    assert param_bytes(_workload("hf-trainer"))[:3] == (4.0, 4.0, 8.0)  # weight, grad, AdamW's two states
    assert param_bytes(_workload("hf-trainer", peft_version="0.11.1"))[:3] == (2.0, 2.0, 4.0)
    assert param_bytes(_workload("torchtune"))[:3] == (2.0, 2.0, 4.0)


def test_autocast_casts_for_each_adapter_whatever_the_peft():
    """Under autocast every adapter's matmul casts its fp32 (residual-side) input to bf16 itself: the adapters share
    no saved input, in any release (the fp32 model's adapters are fp32 either way)."""
    new, old = _workload("hf-trainer", "bf16-mixed"), _workload("hf-trainer", "bf16-mixed", peft_version="0.11.1")
    assert layer_activation_bytes(new, 1, False, "none", True) == layer_activation_bytes(old, 1, False, "none", True)
    assert param_bytes(new)[:3] == param_bytes(old)[:3] == (4.0, 4.0, 8.0)
