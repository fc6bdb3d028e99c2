"""Parameter counts derived from an Architecture: per layer, embeddings, head, LoRA adapters."""

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

    def total(self, layers: int) -> int:
        return self.embedding + self.per_layer * layers + self.final + self.head


@lru_cache(maxsize=4096)  # bounded: a long simulation or a service sees many architectures
def count_params(a: Architecture) -> ParamCounts:
    h, f, kvd = a.hidden, a.ffn, a.kv * a.head_dim
    norm = 2 * h if a.norm == "layernorm" else h
    attn_w = h * h + 2 * h * kvd + h * h
    attn_b = {"none": 0, "qkv": h + 2 * kvd, "all": h + 2 * kvd + h}[a.bias]
    mlp_mats = 3 if a.activation == "swiglu" else 2
    mlp_w = mlp_mats * h * f
    mlp_b = (f + h if a.activation == "gelu" else 2 * f + h) if a.bias == "all" else 0
    per_layer = attn_w + attn_b + mlp_w + mlp_b + 2 * norm
    embedding = a.vocab * h + (a.max_positions * h if a.position == "learned" else 0)
    final = norm
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
        linear_per_layer=attn_w + mlp_w,
        final=final,
        head=head,
        largest_matrix=max(a.vocab * h, h * f),
        # a fused q/k/v projection (litgpt, GPT-2, NeoX) is one h x (h + 2 kv) matrix
        largest_linear=max(h * f, h * (h + 2 * kvd)),
    )


def lora_params_per_layer(a: Architecture, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    """Adapter parameters in one block: r * (in + out) per adapted matrix."""
    h, f, kvd = a.hidden, a.ffn, a.kv * a.head_dim
    shapes = {"q": [(h, h)], "k": [(h, kvd)], "v": [(h, kvd)], "o": [(h, h)]}
    shapes["mlp"] = [(h, f), (h, f), (f, h)] if a.activation == "swiglu" else [(h, f), (f, h)]
    return sum(rank * (i + o) for t in targets if t in shapes for i, o in shapes[t])


def lora_head_params(a: Architecture, rank: int, targets: list[str] | tuple[str, ...]) -> int:
    return rank * (a.hidden + a.vocab) if "head" in targets else 0
