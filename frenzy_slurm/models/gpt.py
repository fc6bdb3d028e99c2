"""A GPT/Llama-style decoder built from an Architecture: the built-in trainer's model.

Uses PyTorch's fused kernels (nn.RMSNorm/LayerNorm, scaled_dot_product_attention with native GQA),
so its saved activations are the ones MARP models for the built-in trainer. model.yaml's
`training.attention: eager` runs the attention core in eager ops (scores, softmax, probs @ v), and the plan's
`selective` recomputation checkpoints that core (only q, k and v are kept): what MARP predicts for them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import nn

from frenzy_slurm.jobspec.arch import Architecture


def _norm(a: Architecture) -> nn.Module:
    return nn.RMSNorm(a.hidden, eps=1e-5) if a.norm == "rmsnorm" else nn.LayerNorm(a.hidden, bias=True)


def _rope(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary embedding over the last dim of (batch, heads, seq, head_dim)."""
    d, s = x.shape[-1], x.shape[-2]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    def __init__(self, a: Architecture, attention: str = "sdpa", recompute_core: bool = False):
        super().__init__()
        self.a = a
        self.eager = attention == "eager"  # flash and sdpa: torch's scaled_dot_product_attention
        self.recompute_core = recompute_core  # activation_checkpointing: selective
        qkv_bias = a.bias in ("qkv", "all")
        kvd = a.kv * a.head_dim
        self.norm1 = _norm(a)
        self.q = nn.Linear(a.hidden, a.hidden, bias=qkv_bias)
        self.k = nn.Linear(a.hidden, kvd, bias=qkv_bias)
        self.v = nn.Linear(a.hidden, kvd, bias=qkv_bias)
        self.o = nn.Linear(a.hidden, a.hidden, bias=a.bias == "all")
        self.norm2 = _norm(a)
        if a.activation == "swiglu":
            self.gate = nn.Linear(a.hidden, a.ffn, bias=False)
        self.up = nn.Linear(a.hidden, a.ffn, bias=a.bias == "all")
        self.down = nn.Linear(a.ffn, a.hidden, bias=a.bias == "all")
        self.drop = nn.Dropout(a.dropout)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over (batch, heads, seq, head_dim); with `recompute_core` its core is recomputed in
        backward (selective recomputation: the checkpoint keeps only q, k and v)."""
        core = self._eager_core if self.eager else self._sdpa_core
        if self.recompute_core and self.training:
            return torch.utils.checkpoint.checkpoint(core, q, k, v, use_reentrant=False)
        return core(q, k, v)

    def _sdpa_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            is_causal=True,
            dropout_p=self.a.dropout if self.training else 0.0,
            enable_gqa=q.shape[1] != k.shape[1],
        )

    def _eager_core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Scores, causal softmax and probs @ v in eager ops, K/V repeated to every query head (training.attention:
        eager): the s x s scores and probabilities are saved, as MARP counts them."""
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = q.shape[-2]
        scores = (q @ k.transpose(-2, -1)) * (self.a.head_dim**-0.5)
        mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
        probs = F.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        if self.training and self.a.dropout:
            probs = F.dropout(probs, self.a.dropout)
        return probs @ v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.a
        b, s, _ = x.shape
        h = self.norm1(x)
        # heads from the projections' width: under tensor parallelism each rank holds a share of them
        q = self.q(h).view(b, s, -1, a.head_dim).transpose(1, 2)
        k = self.k(h).view(b, s, -1, a.head_dim).transpose(1, 2)
        v = self.v(h).view(b, s, -1, a.head_dim).transpose(1, 2)
        if a.position == "rope":
            q, k = _rope(q), _rope(k)
        att = self.attention(q, k, v)
        x = x + self.drop(self.o(att.transpose(1, 2).reshape(b, s, -1)))
        h = self.norm2(x)
        if a.activation == "swiglu":
            m = F.silu(self.gate(h)) * self.up(h)
        else:
            m = F.gelu(self.up(h))
        return x + self.drop(self.down(m))


class GPT(nn.Module):
    def __init__(
        self, a: Architecture, checkpoint: bool = False, attention: str = "sdpa", recompute_core: bool = False
    ):
        super().__init__()
        self.a = a
        self.checkpoint = checkpoint  # full activation recomputation, block by block
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.max_positions, a.hidden) if a.position == "learned" else None
        self.blocks = nn.ModuleList(Block(a, attention, recompute_core) for _ in range(a.layers))
        self.norm = _norm(a)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)
        if a.tied_embeddings:
            self.head.weight = self.embed.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        for blk in self.blocks:
            if self.checkpoint and self.training:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
