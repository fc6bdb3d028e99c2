"""The built-in model runs the attention kernel model.yaml names and the plan's selective recomputation, so the
built-in trainer's memory is what MARP predicted for that model.yaml (no adjustment in the runtime)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.models.gpt import GPT, lm_loss  # noqa: E402

ARCH = Architecture(layers=2, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=256, max_positions=64)


def _run(attention: str, recompute_core: bool) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """Loss, gradients and the bytes autograd saved for backward in one step of a seeded model."""
    torch.manual_seed(0)
    model = GPT(ARCH, attention=attention, recompute_core=recompute_core)
    tokens = torch.randint(0, ARCH.vocab, (2, 33), generator=torch.Generator().manual_seed(1))
    saved = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = lm_loss(model(tokens[:, :-1]), tokens[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()], sum(saved)


def test_eager_and_selective_compute_what_sdpa_computes():
    loss, grads, _ = _run("sdpa", False)
    for attention, core in (("eager", False), ("eager", True), ("sdpa", True), ("flash", False)):
        other, other_grads, _ = _run(attention, core)
        assert torch.allclose(other, loss, atol=1e-5), (attention, core)
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(grads, other_grads, strict=True))


def test_eager_keeps_the_scores_and_selective_drops_them():
    s, h = 32, ARCH.heads
    scores = 2 * 2 * h * s * s * 4  # batch 2, per block: the softmax output and the masked scores, fp32
    _, _, sdpa = _run("sdpa", False)
    _, _, eager = _run("eager", False)
    _, _, selective = _run("eager", True)
    assert eager - sdpa >= ARCH.layers * scores  # the s x s tensors eager attention saves
    assert selective < sdpa < eager  # recomputed core: only q, k, v (and the checkpoint's inputs) kept
