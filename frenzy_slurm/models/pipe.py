"""The built-in GPT as a DeepSpeed PipelineModule with an exact, given layer split per stage."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.models.gpt import Block, _norm, lm_loss


class EmbedPipe(nn.Module):
    def __init__(self, a: Architecture):
        super().__init__()
        self.embed = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.max_positions, a.hidden) if a.position == "learned" else None

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


class HeadPipe(nn.Module):
    def __init__(self, a: Architecture):
        super().__init__()
        self.norm = _norm(a)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(x))


def pipeline_module(
    a: Architecture, layer_split: Sequence[int], checkpoint: bool, attention: str = "sdpa", recompute_core: bool = False
) -> nn.Module:
    """Stage i runs layer_split[i] blocks; stage 0 also the embedding, the last stage the head and loss.
    `attention` and `recompute_core` are each Block's (models/gpt.py).

    Tied embeddings are untied across stages (each end keeps its own matrix), as MARP counts them.
    """
    from deepspeed.pipe import LayerSpec, PipelineModule

    parts = [0]
    for i, n in enumerate(layer_split):
        parts.append(parts[-1] + n + (1 if i == 0 else 0) + (1 if i == len(layer_split) - 1 else 0))

    class ExplicitPipeline(PipelineModule):
        def _partition_layers(self, method: str = "uniform") -> None:  # noqa: ARG002 - DeepSpeed's signature
            stage = self._topo.get_coord(self.global_rank).pipe
            self.parts = parts
            self._set_bounds(start=parts[stage], stop=parts[stage + 1])

    # LayerSpecs, not modules: DeepSpeed builds only this stage's layers. Built modules would all be created on
    # every rank and stay referenced by the PipelineModule (its layer list), so each stage held the whole
    # model's weights besides its own - the pipeline stages' gap to MARP (docs/accuracy.md).
    layers = [
        LayerSpec(EmbedPipe, a),
        *[LayerSpec(Block, a, attention, recompute_core) for _ in range(a.layers)],
        LayerSpec(HeadPipe, a),
    ]
    return ExplicitPipeline(
        layers=layers,
        num_stages=len(layer_split),
        loss_fn=lm_loss,
        activation_checkpoint_interval=1 if checkpoint else 0,
        partition_method="uniform",
        # only blocks are recomputed: DeepSpeed's (reentrant) checkpoint of the embedding, whose
        # input is integer tokens, returns a tensor without grad_fn and backward fails
        checkpointable_layers=["Block"],
    )
