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
    """A decoder (GPT/Llama-style), encoder (BERT-style) or encoder-decoder (T5/BART-style) transformer.

    An encoder-decoder model has `encoder_layers` > 0: `layers` then counts the decoder's blocks (each with
    self-attention, cross-attention over the encoder's output and an FFN), `encoder_layers` the encoder's
    (self-attention and FFN); both stacks share the width, heads, FFN and the token embedding (Hugging Face
    transformers 5.17, models/t5/modeling_t5.py `T5Model.shared`, models/bart/modeling_bart.py `BartModel.shared`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    layers: int = Field(
        gt=0, le=_MAX_LAYERS, description="Number of transformer blocks (an encoder-decoder model's decoder blocks)."
    )
    encoder_layers: int = Field(
        0,
        ge=0,
        le=_MAX_LAYERS,
        description="Encoder blocks of an encoder-decoder model (T5's num_layers, BART's encoder_layers); 0 for a "
        "decoder-only or encoder-only model. With an encoder, `layers` counts the decoder's blocks and "
        "training.target_len gives the decoder's length.",
    )
    hidden: int = Field(gt=0, le=_MAX_WIDTH, description="Model (residual stream) width.")
    heads: int = Field(gt=0, le=_MAX_WIDTH, description="Attention (query) heads.")
    kv_heads: int | None = Field(None, gt=0, description="Key/value heads (GQA/MQA); defaults to `heads`.")
    d_kv: int | None = Field(
        None,
        gt=0,
        le=_MAX_WIDTH,
        description="Width of one attention head (T5's d_kv); defaults to hidden / heads. T5 sets it on its own: "
        "t5-3b has 32 heads of 128 over a width of 1024, so q/k/v/o are 1024 x 4096.",
    )
    ffn: int = Field(gt=0, le=_MAX_WIDTH * 8, description="Feed-forward inner width.")
    activation: Literal["gelu", "swiglu", "relu", "geglu"] = Field(
        "swiglu",
        description="FFN activation: GELU or ReLU (2 matrices: original T5 is relu), or a gated FFN of 3 matrices: "
        "SwiGLU, or GEGLU (T5 v1.1 / Flan-T5 `gated-gelu`).",
    )
    vocab: int = Field(gt=0, le=_MAX_VOCAB, description="Vocabulary size.")
    tied_embeddings: bool = Field(False, description="Output layer shares the input embedding matrix.")
    max_positions: int = Field(4096, gt=0, le=_MAX_TOKENS, description="Longest sequence the model supports.")
    norm: Literal["rmsnorm", "layernorm"] = Field("rmsnorm", description="Normalisation layer type.")
    position: Literal["rope", "learned", "relative"] = Field(
        "rope",
        description="Rotary (no parameters), learned position embeddings (BART: one table per stack), or T5's "
        "relative position bias (one buckets x heads table per stack, shared by its layers).",
    )
    relative_buckets: int = Field(
        32, gt=0, le=1 << 16, description="With position: relative: T5's relative_attention_num_buckets."
    )
    bias: Literal["none", "qkv", "all"] = Field("none", description="Which linear layers carry a bias.")
    dropout: float = Field(
        0.0, ge=0.0, lt=1.0, description="Dropout probability (adds 1-byte masks to saved activations)."
    )
    activation_dropout: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Dropout inside the FFN, after its activation (T5: dropout_rate, BART: activation_dropout): an "
        "FFN-wide mask and the dropped copy the down projection saves.",
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
        if self.d_kv is None and self.hidden % self.heads:
            raise ValueError(
                f"heads({self.heads}) must divide hidden({self.hidden}); hidden/heads is the head size. "
                "Fix heads or hidden."
            )
        kv = self.kv_heads or self.heads
        if kv > self.heads or self.heads % kv:
            raise ValueError(f"kv_heads({kv}) must divide heads({self.heads}). Fix kv_heads (1 = MQA, heads = MHA).")
        if self.encoder_layers and self.head != "lm":
            raise ValueError(
                f"encoder_layers({self.encoder_layers}) with head: {self.head}: an encoder-decoder model is planned "
                "with its decoder's LM head (T5ForConditionalGeneration, BartForConditionalGeneration); set head: lm"
            )
        if self.encoder_layers and self.position == "rope":
            raise ValueError(
                f"encoder_layers({self.encoder_layers}) with position: rope: the encoder-decoder models MARP plans "
                "use T5's relative position bias (position: relative) or BART's learned positions (position: learned)"
            )
        return self

    @property
    def kv(self) -> int:
        return self.kv_heads or self.heads

    @property
    def head_dim(self) -> int:
        return self.d_kv or self.hidden // self.heads

    @property
    def inner(self) -> int:
        """The query (and attention output) width: heads x head size (T5's inner_dim; `hidden` elsewhere)."""
        return self.heads * self.head_dim

    @property
    def gated(self) -> bool:
        """A gated FFN of three matrices (SwiGLU, GEGLU) rather than two."""
        return self.activation in ("swiglu", "geglu")

    @property
    def encoder_decoder(self) -> bool:
        return self.encoder_layers > 0
