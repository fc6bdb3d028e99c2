"""Parameter counts derived from an Architecture: per layer, embeddings, head, LoRA adapters.

An encoder-decoder model (T5, BART) counts its decoder's blocks as the layers (each with a cross-attention block
beside its self-attention: Hugging Face transformers 5.17 models/t5/modeling_t5.py `T5Block.layer[1]`
T5LayerCrossAttention, models/bart/modeling_bart.py `BartDecoderLayer.encoder_attn`) and its whole encoder stack as
one part of its own (`encoder`); the token embedding is shared by both stacks (`T5Model.shared`)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from frenzy_slurm.jobspec.arch import Architecture


@dataclass(frozen=True)
class ParamCounts:
    """Parameter counts by location; `linear_per_layer` is the part QLoRA quantises."""

    embedding: int  # token (+ learned position, + token type) embeddings, norm after embeddings
    per_layer: int  # one transformer block, everything
    linear_per_layer: int  # weight matrices of one block (no biases, no norms)
    final: int  # final norm + pooler / MLM transform
    head: int  # output projection; 0 when tied to the embedding
    largest_matrix: int  # elements of the biggest single weight (ZeRO-3 gathers at least this)
    largest_linear: int  # elements of the biggest weight inside a block (QLoRA dequantises one such at a time)
    # an encoder-decoder model's encoder stack: its blocks, final norm, position table or bias (its own), and
    # the weight matrices of its blocks
    encoder: int = 0
    encoder_linear: int = 0

    def total(self, layers: int) -> int:
        return self.embedding + self.per_layer * layers + self.final + self.head + self.encoder


@lru_cache(maxsize=4096)  # bounded: a long simulation or a service sees many architectures
def count_params(a: Architecture) -> ParamCounts:
    h, f, kvd, inner = a.hidden, a.ffn, a.kv * a.head_dim, a.inner
    norm = 2 * h if a.norm == "layernorm" else h
    # q and o are hidden x heads*head_size (T5's inner_dim), k and v hidden x kv_heads*head_size
    attn_w = h * inner + 2 * h * kvd + inner * h
    attn_b = {"none": 0, "qkv": inner + 2 * kvd, "all": inner + 2 * kvd + h}[a.bias]
    mlp_mats = 3 if a.gated else 2
    mlp_w = mlp_mats * h * f
    mlp_b = (2 * f + h if a.gated else f + h) if a.bias == "all" else 0
    self_block = attn_w + attn_b + mlp_w + mlp_b + 2 * norm
    # a decoder block of an encoder-decoder model: one more attention (cross-attention) and its norm
    per_layer = self_block + (attn_w + attn_b + norm if a.encoder_decoder else 0)
    # T5: one relative-bias table (buckets x heads) per stack, in its first block's self-attention
    rel = a.relative_buckets * a.heads if a.position == "relative" else 0
    positions = a.max_positions * h if a.position == "learned" else 0
    embedding = a.vocab * h + positions + rel
    final = norm
    encoder = encoder_linear = 0
    if a.encoder_decoder:
        # BART: each stack has its own learned positions and embedding LayerNorm (layernorm_embedding)
        emb_norm = norm if a.norm == "layernorm" and a.position == "learned" else 0
        embedding += emb_norm
        encoder = self_block * a.encoder_layers + norm + positions + rel + emb_norm
        encoder_linear = (attn_w + mlp_w) * a.encoder_layers
    if a.head == "mlm":  # BERT: token-type embeddings + embedding LayerNorm; pooler; MLM transform + decoder bias
        embedding += 2 * h + norm
        final = (h * h + h) + (h * h + h + norm) + a.vocab
    elif a.head == "classification":
        embedding += 2 * h + norm if a.norm == "layernorm" and a.position == "learned" else 0
        final = (h * h + h) + 2 * h + 2
    head = 0 if a.tied_embeddings or a.head == "classification" else a.vocab * h
    return ParamCounts(
        embedding=embedding,
        per_layer=per_layer,
        linear_per_layer=attn_w * (2 if a.encoder_decoder else 1) + mlp_w,
        final=final,
        head=head,
        largest_matrix=max(a.vocab * h, h * f, h * inner if inner != h else 0),
        # a fused q/k/v projection (litgpt, GPT-2, NeoX) is one h x (h + 2 kv) matrix
        largest_linear=max(h * f, h * (inner + 2 * kvd)),
        encoder=encoder,
        encoder_linear=encoder_linear,
    )


def lora_params_per_layer(
    a: Architecture, rank: int, targets: list[str] | tuple[str, ...], encoder: bool = False
) -> int:
    """Adapter parameters in one block: r * (in + out) per adapted matrix. A decoder block of an encoder-decoder
    model adapts its cross-attention's matrices too: PEFT matches target modules by name suffix (peft 0.21
    tuners/tuners_utils.py `check_target_module_exists`), and T5's cross-attention q/k/v/o are named like the
    self-attention's (EncDecAttention.q, ...); `encoder`: a block of the encoder stack (self-attention only)."""
    h, f, kvd, inner = a.hidden, a.ffn, a.kv * a.head_dim, a.inner
    shapes = {"q": [(h, inner)], "k": [(h, kvd)], "v": [(h, kvd)], "o": [(inner, h)]}
    shapes["mlp"] = [(h, f), (h, f), (f, h)] if a.gated else [(h, f), (f, h)]
    attentions = 2 if (a.encoder_decoder and not encoder) else 1
    return sum(rank * (i + o) * (attentions if t != "mlp" else 1) for t in targets if t in shapes for i, o in shapes[t])


def lora_encoder_params(a: Architecture, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    """Adapter parameters of an encoder-decoder model's encoder stack (0 for other models)."""
    return lora_params_per_layer(a, rank, targets, encoder=True) * a.encoder_layers


def lora_head_params(a: Architecture, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    return rank * (a.hidden + a.vocab) if "head" in targets else 0
