"""Evaluation of the prediction stages, kept out of them: reading published memory measurements
(`dataset`) and the reference estimators MARP is compared against (`reference`).

Only the benchmarks and tests import this package; `fsbatch` never does.
"""
