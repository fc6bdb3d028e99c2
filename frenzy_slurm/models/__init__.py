"""Torch model definitions shared by the tracer and the in-job trainer (imports torch)."""
