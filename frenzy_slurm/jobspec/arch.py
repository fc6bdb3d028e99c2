"""Model architecture: the shape numbers MARP needs, with their consistency checks.

An `Architecture` comes from a preset, an explicit `arch:` block, a Hugging Face
`config.json`, or tracing a torch module factory; every path ends here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Upper bounds far beyond any model trained (the largest have ~10^2 layers, widths of ~10^4-10^5 and vocabularies
# of ~10^6): a value past them is a typo or an attack, and would make the plan search run for hours on the
# login node (it factors layer counts and widths).
_MAX_LAYERS = 10_000
_MAX_WIDTH = 1 << 20
_MAX_VOCAB = 1 << 26
_MAX_TOKENS = 1 << 30


class Architecture(BaseModel):
    """A decoder (GPT/Llama-style) or encoder (BERT-style) transformer."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    layers: int = Field(gt=0, le=_MAX_LAYERS, description="Number of transformer blocks.")
    hidden: int = Field(gt=0, le=_MAX_WIDTH, description="Model (residual stream) width.")
    heads: int = Field(gt=0, le=_MAX_WIDTH, description="Attention (query) heads.")
    kv_heads: int | None = Field(None, gt=0, description="Key/value heads (GQA/MQA); defaults to `heads`.")
    ffn: int = Field(gt=0, le=_MAX_WIDTH * 8, description="Feed-forward inner width.")
    activation: Literal["gelu", "swiglu"] = Field(
        "swiglu", description="FFN activation: GELU (2 matrices) or SwiGLU (3 matrices)."
    )
    vocab: int = Field(gt=0, le=_MAX_VOCAB, description="Vocabulary size.")
    tied_embeddings: bool = Field(False, description="Output layer shares the input embedding matrix.")
    max_positions: int = Field(4096, gt=0, le=_MAX_TOKENS, description="Longest sequence the model supports.")
    norm: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="Normalisation layer type.")
    position: Literal["rope", "learned"] = Field(
        "rope", description="Rotary (no parameters) or learned position embeddings."
    )
    bias: Literal["none", "qkv", "all"] = Field("none", description="Which linear layers carry a bias.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability (adds 1-byte masks to saved activations)."
    )
    head: Literal["lm", "mlm", "classification"] = Field(
        "lm",
        description="Output head: causal LM logits, BERT masked-LM head, or a pooled classifier "
        "(no vocabulary logits).",
    )
    experts: int = Field(
        1,
        ge=1,
        le=1 << 16,
        description="Routed experts per FFN layer: 1 for a dense model. Mixture-of-Experts (more than 1) is not "
        "modelled, so it is refused by name (a config.json with experts is refused likewise).",
    )

    @field_validator("experts")
    @classmethod
    def _no_moe(cls, v: int) -> int:
        if v > 1:
            raise ValueError(
                f"experts: {v}: this is a Mixture-of-Experts model, and MoE is not modelled (experts, top-k routing "
                "and expert parallelism change memory and step time); frenzy-slurm refuses it rather than plan it as "
                "a dense model. Set experts: 1 for a dense model"
            )
        return v

    @model_validator(mode="after")
    def _check_shapes(self) -> Architecture:
        if self.hidden % self.heads:
            raise ValueError(
                f"heads({self.heads}) must divide hidden({self.hidden}); hidden/heads is the head size. "
                "Fix heads or hidden."
            )
        kv = self.kv_heads or self.heads
        if kv > self.heads or self.heads % kv:
            raise ValueError(f"kv_heads({kv}) must divide heads({self.heads}). Fix kv_heads (1 = MQA, heads = MHA).")
        return self

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads
