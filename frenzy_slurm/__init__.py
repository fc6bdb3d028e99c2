"""frenzy-slurm: memory-aware, heterogeneity-aware LLM training on Slurm.

Pipeline, in data-flow order: spec -> marp -> cluster -> has -> render -> submit -> track.
"""

__version__ = "0.1.0"
