"""A module factory for the tracing tests (model.factory: tests.tiny_factory:build)."""

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.models.gpt import GPT


def build(layers: int = 2):
    return GPT(Architecture(layers=layers, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=256, max_positions=128))
