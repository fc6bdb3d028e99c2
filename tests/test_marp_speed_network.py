"""The data-parallel ring over several nodes, and a cross-type pipeline's element-wise and optimizer time, priced as
MARP's homogeneous step time prices them (marp/speed.py `ring_gbs`, has/hetero.py `step_time`)."""

from __future__ import annotations

import pytest

from frenzy_slurm.has.hetero import StageGroup, head_in_blocks, step_time
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp.plan import ParallelPlan, Workload
from frenzy_slurm.marp.speed import (
    ADAM_BYTES_PER_PARAM,
    Links,
    PlanPricer,
    elementwise_bytes_per_token,
    ring_gbs,
)

LLAMA_7B = Architecture(layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, activation="swiglu", vocab=32000)


def test_ring_inside_a_node_runs_at_the_node_link():
    assert ring_gbs(8, 300.0, 25.0, 8) == 300.0
    assert ring_gbs(4, 300.0, 25.0, 8, tp=2) == 300.0  # 4 ranks x tp 2 fill the node


def test_ring_over_nodes_uses_every_card_of_a_node():
    # 16 ranks on two nodes of 8, a 25 GB/s card per GPU: 8 rings, each crossing through its own card
    assert ring_gbs(16, 300.0, 25.0, 8) == pytest.approx(200.0)
    # with tp 4 inside the node, a node holds 2 ranks of the data-parallel group: 2 cards carry its rings
    assert ring_gbs(8, 300.0, 25.0, 8, tp=4) == pytest.approx(50.0)
    # never faster than the link inside the node (PCIe nodes with fast cards)
    assert ring_gbs(16, 32.0, 25.0, 8) == pytest.approx(32.0)
    # a node with one 25 GB/s card for 8 GPUs states 25/8 per GPU: the card alone paces the ring
    assert ring_gbs(16, 300.0, 25.0 / 8, 8) == pytest.approx(25.0)


def test_a_two_node_data_parallel_step_pays_the_nodes_cards_not_one():
    w = Workload.of(arch=LLAMA_7B, seq_len=4096, precision="bf16-mixed")
    plan = ParallelPlan(dp=16, zero=1, micro_batch=1)
    costs = PlanPricer(w, 16).costs(plan)
    links = Links(intra_node_gbs=300.0, inter_node_gbs=25.0, gpus_per_node=8)
    one_node = Links(intra_node_gbs=300.0, inter_node_gbs=25.0, gpus_per_node=16)
    # 16 ranks on two nodes: the ring at 200 GB/s (8 cards), against 300 GB/s were all 16 in one node
    expected = 0.5 * costs.dp_bytes * (1 / 200e9 - 1 / 300e9)
    assert costs._comm_s(links) - costs._comm_s(one_node) == pytest.approx(expected, rel=1e-9)


def _group(stages: int, rate: float, bw: float | None) -> StageGroup:
    return StageGroup("p", stages, rate, 1e12, 0.0, 300.0, 25.0, 8, mem_bw_gbs=bw)


def test_pipeline_stages_pay_their_element_wise_bytes_and_the_optimizer_step():
    w = Workload.of(arch=LLAMA_7B, seq_len=2048, precision="bf16-mixed")
    plan = ParallelPlan(pp=2, micro_batch=1, grad_accum=1, layer_split=(16, 16))
    rate = 300e12
    plain = step_time(w, plan, [_group(2, rate, None)], [rate, rate], head_in_blocks(w.arch))
    priced = step_time(w, plan, [_group(2, rate, 2000.0)], [rate, rate], head_in_blocks(w.arch))
    per_layer, loss = elementwise_bytes_per_token(w, "none")
    n = 6_738_415_616  # Llama-2-7B
    params = PlanPricer(w, 2).n
    assert params == pytest.approx(n, rel=0.01)
    # grad_accum 1: each stage once (fill and drain), the last stage also the loss; the optimizer of one stage
    elementwise = 2048 * (32 * per_layer + loss) / 2000e9
    optimizer = ADAM_BYTES_PER_PARAM * 16 * params / 32 / 2000e9
    assert priced - plain == pytest.approx(elementwise + optimizer, rel=1e-6)
