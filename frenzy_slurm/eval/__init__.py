"""Evaluation of the prediction stages, kept out of them: reading published memory measurements
(`dataset`, with the free-text phrasings in `reading`), the reference estimators MARP is compared
against (`reference`), and the CPU ground-truth grid's dataset and predictions (`grid`).

Only the benchmarks and tests import this package; `fsbatch` never does.
"""
