"""The caching-allocator model (frenzy_slurm/marp/allocator.py): PyTorch's documented block and segment sizes, and
what it adds to MARP's reserved estimate."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import ParallelPlan, Workload, estimate_memory, workload_from_spec
from frenzy_slurm.marp.allocator import (
    AllocatorConfig,
    parameter_shapes,
    parse_alloc_conf,
    request_bytes,
    reserved_excess,
    reserved_for,
    segment_bytes,
    step_excess,
)
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.params import count_params

MiB = 1024**2
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def test_request_rounding_and_segment_sizes():
    assert request_bytes(1) == 512
    assert request_bytes(513) == 1024
    assert segment_bytes(4096) == 2 * MiB  # small pool
    assert segment_bytes(1 * MiB) == 2 * MiB  # 1 MiB is still small
    assert segment_bytes(1.5 * MiB) == 20 * MiB  # a 1-10 MiB request makes a 20 MiB segment
    assert segment_bytes(9 * MiB) == 20 * MiB
    assert segment_bytes(10 * MiB) == 10 * MiB  # from 10 MiB: its own segment, rounded to 2 MiB
    assert segment_bytes(11 * MiB) == 12 * MiB


def test_a_small_mid_request_reserves_a_20_mib_segment():
    assert reserved_for([(1.5 * MiB, 1)]) == 20 * MiB
    # 13 of them fit one segment (13 x 1.5 = 19.5 MiB), the 14th opens a second
    assert reserved_for([(1.5 * MiB, 13)]) == 20 * MiB
    assert reserved_for([(1.5 * MiB, 14)]) == 40 * MiB
    # a smaller size fills the last segment's free tail before a new one is made
    assert reserved_for([(6 * MiB, 3), (2 * MiB, 1)]) == 20 * MiB
    assert reserved_for([(100 * 1024, 20)]) == 2 * MiB  # 20 x 100 KiB pack one 2 MiB small segment
    assert reserved_for([(100 * 1024, 21)]) == 4 * MiB
    assert reserved_for([(33 * MiB, 2)]) == 2 * 34 * MiB


def test_expandable_segments_reserve_the_bytes_rounded_to_pages():
    tensors = [(1.5 * MiB, 1), (33 * MiB, 2), (100 * 1024, 3)]
    allocated = sum(request_bytes(n) * c for n, c in tensors)
    # the large pool: 67.5 MiB -> four 20 MiB pages; the small pool: 300 KiB -> one 2 MiB page
    assert reserved_for(tensors, EXPANDABLE) == 80 * MiB + 2 * MiB
    assert reserved_excess(tensors, EXPANDABLE) == pytest.approx(80 * MiB + 2 * MiB - allocated)
    assert reserved_excess(tensors) == pytest.approx(20 * MiB + 68 * MiB + 2 * MiB - allocated)
    assert step_excess(1000 * MiB, 11 * MiB, EXPANDABLE) == 0.0
    assert step_excess(1100 * MiB, 11 * MiB) == pytest.approx(100 * MiB)  # 100 tensors of 11 MiB, 1 MiB each
    assert step_excess(1000 * MiB, 4 * MiB) == 0.0  # tails of 20 MiB segments serve the step's smaller tensors


def test_alloc_conf_parsing():
    assert parse_alloc_conf("expandable_segments:True") == EXPANDABLE
    assert parse_alloc_conf("max_split_size_mb:512,expandable_segments:True") == EXPANDABLE
    assert parse_alloc_conf("garbage_collection_threshold:0.8") == AllocatorConfig()
    with pytest.raises(ValueError, match="True or False"):
        parse_alloc_conf("expandable_segments:yes")
    with pytest.raises(ValueError, match="key:value"):
        parse_alloc_conf("expandable_segments")


def test_parameter_shapes_count_every_parameter():
    for arch in (
        Architecture(layers=4, hidden=512, heads=8, kv_heads=2, ffn=1408, vocab=32000),
        Architecture(layers=2, hidden=256, heads=4, ffn=1024, vocab=1000, norm="layernorm", bias="all",
                     activation="gelu", position="learned", max_positions=512, tied_embeddings=True),
    ):  # fmt: skip
        pc = count_params(arch)
        total = sum(n * c for n, c in parameter_shapes(arch, arch.layers, True, True, 1, 1))
        assert total == pytest.approx(pc.total(arch.layers))


LLAMA = Architecture(layers=8, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000)


def _spec(env: dict[str, str]) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "alloc",
            "model": {"arch": LLAMA.model_dump()},
            "training": {
                "seq_len": 2048,
                "global_batch": 8,
                "steps": 10,
                "precision": "bf16-mixed",
                "optimizer": "adamw",
            },
            "entry": {"framework": "hf-trainer", "trainer": "script", "script": "train.py", "env": env},
        }
    )


def test_expandable_segments_from_the_job_environment():
    plain = workload_from_spec(_spec({}), ResolvedModel(arch=LLAMA, name="x"))
    exp = workload_from_spec(
        _spec({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}), ResolvedModel(arch=LLAMA, name="x")
    )
    assert not plain.alloc.expandable_segments and exp.alloc.expandable_segments
    plan = ParallelPlan(dp=1, micro_batch=2, grad_accum=4)
    alloc = estimate_memory(plain, plan, "allocated").peak
    res_plain = estimate_memory(plain, plan, "reserved").peak
    res_exp = estimate_memory(exp, plan, "reserved").peak
    assert estimate_memory(exp, plan, "allocated").peak == alloc
    # with expandable segments: allocated rounded to pages, the cuBLAS workspaces and the previous step's gradients
    # (freed by zero_grad, still mapped); without: also the measured step fragmentation
    assert alloc < res_exp < res_plain
    assert res_exp - alloc < 0.5 * (res_plain - alloc)  # the step rate is the larger part
    with pytest.raises(InputError, match="entry.env.PYTORCH_CUDA_ALLOC_CONF"):
        workload_from_spec(
            _spec({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:maybe"}), ResolvedModel(arch=LLAMA, name="x")
        )


def test_device_counts_the_cublas_workspace_context_and_nccl():
    w = Workload.of(arch=LLAMA, seq_len=1024, framework="deepspeed")
    plan = ParallelPlan(dp=2, zero=2, micro_batch=1)
    none = Overheads(step_fragmentation=0.0, cublas_workspace_mib=0.0)
    base = estimate_memory(w, plan, "reserved", none).peak
    dev = estimate_memory(w, plan, "device", none).peak
    assert dev - base == pytest.approx((none.context_gib + none.nccl_gib) * GiB)
    ws = estimate_memory(w, plan, "device", none.model_copy(update={"cublas_workspace_mib": 64.0})).peak
    assert ws - dev == pytest.approx(64 * MiB)
    assert Overheads().nccl_gib == pytest.approx(0.25)  # 16 channels x 2 peers x 2 protocols x 4 MiB
    assert Overheads().cublas_workspace_mib == 64.0  # 2 x 32 MiB (Hopper)
    # a site-measured rate still adds what the model does not derive
    frag = estimate_memory(w, plan, "reserved", none.model_copy(update={"fragmentation": 0.1})).peak
    s = estimate_memory(w, plan, "allocated").stages[0]
    assert frag - base == pytest.approx(0.1 * (s.weights + s.optimizer), rel=0.05)


def test_expandable_pages_agree_with_the_allocator_replayer():
    """reserved_for's page rounding is what the port of PyTorch's allocator maps for the same requests."""
    from frenzy_slurm.marp.allocator_replay import CachingAllocator
    from frenzy_slurm.marp.allocator_settings import parse_settings

    tensors = [(1.5 * MiB, 1), (33 * MiB, 2), (100 * 1024, 3), (10 * MiB + 512, 3)]
    replay = CachingAllocator(parse_settings("expandable_segments:True"))
    for n, count in tensors:
        for _ in range(count):
            replay.malloc(int(n))
    assert reserved_for(tensors, EXPANDABLE) == replay.stat("reserved_bytes")
