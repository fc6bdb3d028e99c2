"""Reading a Hugging Face `config.json` into an Architecture, without transformers installed."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from frenzy_slurm.errors import InputError
from frenzy_slurm.spec.arch import Architecture
from frenzy_slurm.yamlfile import format_validation_error

# Field names differ between model families (GPT-2 uses n_layer, n_embd, ...).
_ALIASES = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads",),
    "ffn": ("intermediate_size", "n_inner", "ffn_dim"),
    "vocab": ("vocab_size",),
    "max_positions": ("max_position_embeddings", "n_positions"),
}
_GELU = {"gelu", "gelu_new", "gelu_pytorch_tanh", "gelu_fast", "quick_gelu"}


def architecture_from_hf_config(path: Path) -> Architecture:
    try:
        cfg = json.loads(path.read_text())
    except OSError as exc:
        raise InputError(f"{path}: cannot read Hugging Face config ({exc.strerror}).") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}.") from None
    values: dict[str, object] = {}
    for field, names in _ALIASES.items():
        for name in names:
            if cfg.get(name) is not None:
                values[field] = cfg[name]
                break
    model_type = str(cfg.get("model_type", ""))
    act = str(cfg.get("hidden_act") or cfg.get("activation_function") or "silu")
    values["activation"] = "gelu" if act in _GELU else "swiglu"
    if "ffn" not in values and "hidden" in values:
        values["ffn"] = 4 * int(values["hidden"])  # GPT-2 leaves n_inner null: 4 * n_embd
    values["tied_embeddings"] = bool(cfg.get("tie_word_embeddings", model_type in ("gpt2", "bert")))
    if model_type in ("gpt2", "bert", "roberta", "opt", "gpt_neox", "phi"):
        values.update(norm="layernorm", bias="all")
    if model_type in ("gpt2", "bert", "roberta", "opt"):
        values["position"] = "learned"
    if model_type == "qwen2":
        values["bias"] = "qkv"
    if model_type == "bert":
        values["head"] = "mlm"
    dropout = cfg.get("hidden_dropout_prob", cfg.get("resid_pdrop", cfg.get("attention_dropout", 0.0)))
    values["dropout"] = float(dropout or 0.0)
    try:
        return Architecture(**values)
    except ValidationError as exc:
        raise InputError(format_validation_error(str(path), exc)) from None
