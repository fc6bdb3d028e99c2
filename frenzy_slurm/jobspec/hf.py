"""Reading a Hugging Face `config.json` into an Architecture, without transformers installed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import read_config_text
from frenzy_slurm.jobspec.arch import Architecture

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


def _moe_key(cfg: dict[str, Any], prefix: str = "", depth: int = 0) -> tuple[str, int] | None:
    """The first key naming experts with a count above 1 (Mixtral's num_local_experts / num_experts_per_tok,
    Qwen-MoE's num_experts, DeepSeek's n_routed_experts, DBRX's ffn_config.moe_num_experts, ...), looked
    for in the config and in its nested objects (text_config, ffn_config) a few levels down; None if dense."""
    nested = []
    for key, value in cfg.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            nested.append((name, value))
        elif "expert" in str(key).lower() and isinstance(value, int) and not isinstance(value, bool) and value > 1:
            return name, value
    if depth < 3:
        for name, value in nested:
            found = _moe_key(value, f"{name}.", depth + 1)
            if found:
                return found
    return None


def _refuse_moe(path: Path, cfg: dict[str, Any]) -> None:
    """Mixture-of-Experts configs are refused: read as dense (the alias keys alone), one expert's FFN would
    stand for all of them, and the plan's memory, time and parallelism would be silently wrong."""
    found = _moe_key(cfg)
    if found:
        key, value = found
        raise InputError(
            f"{path}: {key}: {value}: this is a Mixture-of-Experts model, and MoE models are not modelled yet "
            "(experts, top-k routing and expert parallelism change memory and step time); frenzy-slurm refuses "
            "it rather than plan it as a dense model. Plan a dense model instead."
        )


def _encoder_decoder_values(cfg: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]] | None:
    """An encoder-decoder config's sizes under our field names, with the config's key for each; None for other
    models. T5/mT5/UMT5 (transformers 5.17 models/t5/configuration_t5.py): num_layers is the encoder's,
    num_decoder_layers the decoder's (num_layers where null), d_kv the head size, feed_forward_proj relu or
    gated-gelu, relative_attention_num_buckets, dropout_rate (also inside the FFN), RMS-style T5LayerNorm, no
    biases, tie_word_embeddings (true for the original T5, false for v1.1 / Flan-T5 / mT5). BART/mBART/PEGASUS/
    Marian (models/bart/configuration_bart.py): encoder_layers, decoder_layers, d_model, encoder_attention_heads,
    decoder_ffn_dim, learned positions (BartLearnedPositionalEmbedding), LayerNorm, biases everywhere, the LM head
    tied to the shared embedding."""
    model_type = str(cfg.get("model_type", ""))
    if model_type in ("t5", "mt5", "umt5", "longt5"):
        keys = {
            "encoder_layers": "num_layers",
            "layers": "num_decoder_layers" if cfg.get("num_decoder_layers") is not None else "num_layers",
            "hidden": "d_model",
            "heads": "num_heads",
            "d_kv": "d_kv",
            "ffn": "d_ff",
            "vocab": "vocab_size",
            "relative_buckets": "relative_attention_num_buckets",
        }
        proj = str(cfg.get("feed_forward_proj", "relu"))
        values = {f: cfg[k] for f, k in keys.items() if cfg.get(k) is not None}
        values.update(
            activation="geglu" if proj.startswith("gated") else ("gelu" if "gelu" in proj else "relu"),
            position="relative",
            norm="rmsnorm",
            bias="none",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        )
        rate = cfg.get("dropout_rate", 0.1)
        values["dropout"] = values["activation_dropout"] = rate
        return values, {**{f: k for f, k in keys.items()}, "dropout": "dropout_rate"}
    if cfg.get("is_encoder_decoder") and cfg.get("encoder_layers") is not None:
        keys = {
            "encoder_layers": "encoder_layers",
            "layers": "decoder_layers",
            "hidden": "d_model",
            "heads": "encoder_attention_heads",
            "ffn": "decoder_ffn_dim",
            "vocab": "vocab_size",
            "max_positions": "max_position_embeddings",
        }
        values = {f: cfg[k] for f, k in keys.items() if cfg.get(k) is not None}
        act = str(cfg.get("activation_function", "gelu"))
        values.update(
            activation="relu" if act == "relu" else "gelu",
            position="learned",
            norm="layernorm",
            bias="all",
            tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
            dropout=cfg.get("dropout", 0.1),
            activation_dropout=cfg.get("activation_dropout", 0.0),
        )
        return values, {**{f: k for f, k in keys.items()}, "dropout": "dropout"}
    return None


def architecture_from_hf_config(path: Path) -> Architecture:
    """config.json -> Architecture: sizes under each family's own key names; MoE configs refused."""
    text = read_config_text(path, "Hugging Face config")
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}:{exc.lineno}: not valid JSON: {exc.msg}.") from None
    except (ValueError, RecursionError) as exc:  # e.g. integers of thousands of digits, or [[[[...]]]]
        raise InputError(f"{path}: not a usable JSON config ({type(exc).__name__}: {str(exc)[:120]}).") from None
    if not isinstance(cfg, dict):
        raise InputError(f"{path}: a Hugging Face config.json is a JSON object, not {type(cfg).__name__}.")
    _refuse_moe(path, cfg)
    encdec = _encoder_decoder_values(cfg)
    if encdec is not None:
        return _validated(path, *encdec)
    values: dict[str, Any] = {}  # config.json's values (parsed JSON), checked here and by Architecture
    source: dict[str, str] = {}  # our field -> the config's key, so errors name what the user sees in the file
    for field, names in _ALIASES.items():
        for name in names:
            if cfg.get(name) is not None:
                values[field] = cfg[name]
                source[field] = name
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
    key = next((k for k in ("hidden_dropout_prob", "resid_pdrop", "attention_dropout") if k in cfg), None)
    dropout = cfg[key] if key else 0.0
    if dropout is not None and (isinstance(dropout, bool) or not isinstance(dropout, (int, float))):
        raise InputError(f"{path}: {key}: {dropout!r} is not a number between 0 and 1.")
    values["dropout"] = float(dropout or 0.0)
    source["dropout"] = key or "dropout"
    return _validated(path, values, source)


def _validated(path: Path, values: dict[str, Any], source: dict[str, str]) -> Architecture:
    """The Architecture of a config's values; InputError naming the config's own keys where they do not fit."""
    for field in ("layers", "encoder_layers", "hidden", "heads", "kv_heads", "d_kv", "ffn", "vocab", "max_positions"):
        v = values.get(field)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InputError(
                f"{path}: {source.get(field, field)}: {v!r} is not a whole number; a config.json states sizes as "
                "integers. Fix the file or describe the model with arch: in model.yaml."
            )
    for field in ("dropout", "activation_dropout"):
        v = values.get(field)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            raise InputError(f"{path}: {source.get(field, field)}: {v!r} is not a number between 0 and 1.")
    try:
        return Architecture(**values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():  # name the config's own key (num_hidden_layers), not ours (layers)
            loc = [str(p) for p in err["loc"]]
            if loc and loc[0] in source:
                loc[0] = source[loc[0]]
            problems.append(f"{path}: {'.'.join(loc) or '(config)'}: {err['msg'].removeprefix('Value error, ')}")
        missing = [f for f in ("layers", "hidden", "heads", "vocab") if f not in values]
        if missing:
            problems.append(
                f"{path}: the config has no key for {', '.join(missing)} (looked for "
                + "; ".join(f"{f}: {source.get(f) or '/'.join(_ALIASES[f])}" for f in missing)
                + ")"
            )
        raise InputError("\n".join(problems)) from None
