"""Two reference estimators that MARP is compared against in the accuracy benchmark.

- ``deepspeed_states``: DeepSpeed's `estimate_zero{2,3}_model_states_mem_needs` style
  (model states only, 16 bytes/param mixed-precision Adam, sharded by ZeRO stage).
- ``megatron_formula``: Megatron-LM's theoretical memory report style: 18 bytes/param
  for weights and optimizer plus Korthikanti et al.'s activation formula (GPT-3 constants).
"""

from __future__ import annotations

from frenzy_slurm.marp.params import count_params
from frenzy_slurm.marp.plan import ParallelPlan, Workload


def deepspeed_states(w: Workload, plan: ParallelPlan) -> float:
    pc = count_params(w.arch)
    total = pc.total(w.arch.layers) / (plan.tp * plan.pp)
    n = plan.dp
    largest = pc.largest_matrix
    if plan.zero == 3:
        return 4 * largest + 18 * total / n
    if plan.zero == 2:
        return 4 * total + 16 * total / n
    if plan.zero == 1:
        return 4 * total + 12 * total / n
    return 16 * total


def megatron_formula(w: Workload, plan: ParallelPlan) -> float:
    a = w.arch
    pc = count_params(a)
    total = pc.total(a.layers) / (plan.tp * plan.pp)
    states = 18 * total if plan.zero == 0 else (6 + 12 / plan.dp) * total
    s, b, h = w.seq_len, plan.micro_batch, a.hidden
    layers = a.layers / plan.pp
    if plan.recompute == "full":
        acts = 2 * s * b * h * layers
    else:
        acts = s * b * h * layers * (34 + 5 * a.heads * s / h) / plan.tp
    logits = 4 * s * b * a.vocab / plan.tp
    return states + acts + logits
