"""model.yaml's parallel.fsdp_version (FSDP1's FullyShardedDataParallel or FSDP2's fully_shard): its validation,
each framework's default at its versions, and the FSDP1 terms it wires into the reserved estimate
(marp/memory_reserved.py fsdp1_reserved; marp/fsdp_init.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import MeasuredRow, interpret_row
from frenzy_slurm.jobspec import ResolvedModel, resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.frameworks import fsdp_version, profile_summary
from frenzy_slurm.marp.fsdp_init import pre_unshard_pool, stage_units, unshard_pool, wrap_cache
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.memory_job import job
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import make_spec
from .test_eval_reading import ROW


def _script(framework: str, version: str | None = None, torch: str | None = None, **over):
    entry: dict[str, object] = {"trainer": "script", "script": "train.py", "framework": framework}
    if version:
        entry["framework_version"] = version
    if torch:
        entry["torch_version"] = torch
    over.setdefault("parallel__sharding", "full-shard")
    return make_spec(entry=entry | over.pop("entry_extra", {}), **over)


@pytest.mark.parametrize(
    ("framework", "version", "torch", "expected"),
    [
        ("hf-trainer", "4.57.1", None, 1),  # accelerate's plugin: FSDP_VERSION unset -> 1
        ("hf-trainer", "5.9.0", None, 1),  # fsdp_config.get("version", 1)
        ("hf-trainer", "5.10.1", None, 2),  # fsdp_config.get("version", 2)
        ("hf-trainer", None, None, 2),  # the newest release described (5.17)
        ("lightning", None, None, 1),  # FSDPStrategy
        ("litgpt", None, None, 1),  # Fabric's FSDPStrategy
        ("torchtune", None, None, 2),
        ("torchtitan", None, None, 2),
        ("torch", None, "2.3", 1),  # no fully_shard before 2.4
        ("torch", None, "2.6", 2),
        ("torch", None, None, 2),
    ],
)
def test_each_frameworks_default_at_its_versions(framework, version, torch, expected):
    spec = _script(framework, version, torch)
    assert fsdp_version(spec) == expected
    assert profile_summary(spec)["defaults_taken"]["parallel.fsdp_version"] == expected  # type: ignore[index]


def test_no_fsdp_version_without_fsdp():
    assert fsdp_version(_script("hf-trainer", parallel__sharding="zero3")) is None  # DeepSpeed's engine
    assert fsdp_version(_script("torch", parallel__sharding="none")) is None  # DDP
    assert fsdp_version(make_spec()) is None  # the built-in DeepSpeed trainer
    assert fsdp_version(_script("torch", parallel__sharding="auto")) == 2  # the search may pick FSDP


@pytest.mark.parametrize("sharding", ["none", "zero1", "zero2", "zero3"])
def test_fsdp_version_needs_an_fsdp_sharding(sharding):
    with pytest.raises(ValidationError, match="fsdp_version: 1 needs an FSDP sharding"):
        _script("torch", parallel__sharding=sharding, parallel__fsdp_version=1)


@pytest.mark.parametrize(
    ("framework", "asked", "runs"),
    [("torchtune", 1, "fully_shard"), ("torchtitan", 1, "fully_shard"), ("litgpt", 2, "FullyShardedDataParallel")],
)
def test_a_framework_that_cannot_run_the_version_is_refused_by_name(framework, asked, runs):
    spec = _script(framework, parallel__fsdp_version=asked)
    with pytest.raises(InputError, match=rf"fsdp_version: {asked}: {framework} .* shards only with {runs}"):
        search_space_from_spec(spec)


def test_the_stated_version_wins_and_picks_the_wrapping():
    """hf-trainer 4.57 defaults to FSDP1, whose root unit holds the output layer (no FSDP2 tail unit); stating 2
    brings accelerate's FSDP2 wrapping back."""
    one = _script("hf-trainer", "4.57.1")
    two = _script("hf-trainer", "4.57.1", parallel__fsdp_version=2)
    model = resolve_model(one, ".")
    w1, w2 = workload_from_spec(one, model), workload_from_spec(two, model)
    assert (w1.comm.fsdp1, w1.comm.fsdp_tail_unit, w1.comm.fsdp1_sync) == (True, False, True)
    assert (w2.comm.fsdp1, w2.comm.fsdp_tail_unit) == (False, True)


def test_empty_cache_after_setup_defaults():
    """Lightning's Trainer empties the cache after wrapping (resume_end); litgpt and accelerate do not; the
    model.yaml setting wins."""
    lit = _script("lightning")
    assert workload_from_spec(lit, resolve_model(lit, ".")).comm.fsdp1_cache_emptied
    assert profile_summary(lit)["defaults_taken"]["entry.empty_cache_after_setup"] is True  # type: ignore[index]
    gpt = _script("litgpt")
    assert not workload_from_spec(gpt, resolve_model(gpt, ".")).comm.fsdp1_cache_emptied
    said = _script("litgpt", entry_extra={"empty_cache_after_setup": True})
    assert workload_from_spec(said, resolve_model(said, ".")).comm.fsdp1_cache_emptied


def _llama7_lora(fsdp: int, **over):
    return _script(
        "torch",
        parallel__fsdp_version=fsdp,
        model={"preset": "llama-2-7b"},
        training={
            "seq_len": 512,
            "global_batch": 2,
            "micro_batch": 1,
            "steps": 1,
            "precision": "bf16-pure",
            "method": "lora",
            "activation_checkpointing": "full",
            # fsdp_qlora's March 2024 runs: a peft before 0.12, whose adapters take the base's bf16
            "lora": {"rank": 64, "targets": ["q", "k", "v", "mlp"], "peft_version": "0.10.0"},
        },
        **over,
    )


def _reserved(spec) -> tuple[float, float]:
    model = resolve_model(spec, ".")
    w = workload_from_spec(spec, model)
    plan = ParallelPlan(dp=2, zero=3, micro_batch=1, recompute="full")
    return estimate_memory(w, plan, "reserved").peak, estimate_memory(w, plan, "allocated").peak


def test_llama2_7b_lora_units_and_the_wired_reserved_estimate():
    """Llama-2-7B LoRA r64 (q, k, v, gate, up, down) in pure bf16 on 2 ranks, FSDP1 in a plain torch loop: each
    block a unit of its nine tensors and twelve adapter matrices (0.385 GiB gathered), the root the embedding,
    final norm and head (0.488 GiB). Wrapping without a broadcast (torch's sync_module_states=False) leaves
    7.96 GiB reserved for 6.43 GiB of shards (8.35 with fsdp_qlora's broadcast, whose buckets wait for the NCCL
    stream); the pool is 0.488 + 3 x 0.385,
    each rounded to 2 MiB: 1.65 GiB. The reserved estimate is 7.96 + 1.65 = 9.61 GiB (fsdp_qlora's F03 reads
    10.24); FSDP2's is the allocator's packing alone, 7.97 GiB; the allocated estimate is the same for both (both
    shard the adapters with the frozen weights: 0.13 GiB of bf16 adapters a rank, not 0.27)."""
    spec = _llama7_lora(1)
    w = workload_from_spec(spec, resolve_model(spec, "."))
    j = job(w, ParallelPlan(dp=2, zero=3, micro_batch=1, recompute="full"))
    units = stage_units(j, 32)
    assert len(units.units) == 33 and len(units.units[0]) == 9 + 12
    assert units.unit_gathered / GiB == pytest.approx(0.3853, abs=1e-4)
    assert units.root_gathered / GiB == pytest.approx(0.4883, abs=1e-4)
    cache = wrap_cache(units.units, 2, False, units.resident)
    assert cache.allocated / GiB == pytest.approx(6.432, abs=0.001)
    assert cache.reserved / GiB == pytest.approx(7.957, abs=0.001)
    assert wrap_cache(units.units, 2, True, units.resident).reserved / GiB == pytest.approx(8.346, abs=0.001)
    assert unshard_pool(units.root_gathered, [units.unit_gathered]) / GiB == pytest.approx(1.650, abs=0.001)
    r1, a1 = _reserved(spec)
    r2, a2 = _reserved(_llama7_lora(2))
    assert a1 == a2
    assert r1 / GiB == pytest.approx(9.607, abs=0.001)
    assert r2 / GiB == pytest.approx(7.969, abs=0.001)


def test_an_emptied_cache_leaves_the_pool_alone():
    """With the cache emptied after wrapping the wrap's floor goes: the compute stream's estimate without the two
    gathered blocks (7.97 - 2 x 0.385 = 7.20 GiB) plus the 1.65 GiB pool: 8.87 GiB."""
    r, _ = _reserved(_llama7_lora(1, entry_extra={"empty_cache_after_setup": True}))
    assert r / GiB == pytest.approx(8.865, abs=0.001)


def _llama7_qlora(**lora):
    return _script(
        "torch",
        parallel__fsdp_version=1,
        model={"preset": "llama-2-7b"},
        training={
            "seq_len": 512,
            "global_batch": 2,
            "micro_batch": 1,
            "steps": 1,
            "precision": "bf16-pure",
            "method": "qlora",
            "activation_checkpointing": "full",
            "lora": {"rank": 64, "targets": ["q", "k", "v", "mlp"], "peft_version": "0.10.0"} | lora,
        },
    )


def _offloaded(spec, metric="reserved"):
    w = workload_from_spec(spec, resolve_model(spec, "."))
    plan = ParallelPlan(dp=2, zero=3, micro_batch=1, recompute="full", offload_optimizer=True, offload_params=True)
    return w, plan, estimate_memory(w, plan, metric)


def test_cpu_offload_keeps_bitsandbytes_quant_states_and_copies_host_shards():
    """Llama-2-7B QLoRA r64, FSDP1 with CPU offload on 2 ranks. The weights left on the GPU are bitsandbytes'
    quantization states, whole on each rank: 6.48e9 linear weights x (4.127/8 - 0.5) bytes = 0.0957 GiB (they
    are not parameters, so FSDP neither shards nor offloads them); torchao's NF4 keeps its scales inside the
    tensor, offloaded with it: nothing. The pre-unshard stream's host-shard copies: the root's (0.244 GiB, 250 MiB
    as a segment) and two blocks' (52.5 MiB each): 0.352 GiB, in the reserved estimate (2.744 GiB) and not in
    the allocated one (1.024 GiB)."""
    w, plan, est = _offloaded(_llama7_qlora())
    j = job(w, plan)
    assert est.stages[0].gib()["weights"] == pytest.approx(0.0957, abs=1e-4)
    units = stage_units(j, 32)
    shards = tuple(-(-sum(u) // 2) for u in units.units)
    assert shards[-1] / GiB == pytest.approx(0.2441, abs=1e-4)
    assert shards[0] / GiB == pytest.approx(0.0513, abs=1e-4)
    assert pre_unshard_pool(shards[-1], shards[:-1]) / GiB == pytest.approx(0.3516, abs=1e-4)
    assert est.peak / GiB == pytest.approx(2.744, abs=0.001)
    assert _offloaded(_llama7_qlora(), "allocated")[2].peak / GiB == pytest.approx(1.024, abs=0.001)
    _, _, torchao = _offloaded(_llama7_qlora(quantizer="torchao"))
    assert torchao.stages[0].gib()["weights"] == 0.0


def test_reader_takes_fsdp_version_from_api_names_only():
    assert reading.fsdp_api("FSDP full shard x2, no CPU offload") == 1
    assert reading.fsdp_api("FullyShardedDataParallel, sharding_strategy=SHARD_GRAD_OP") == 1
    assert reading.fsdp_api("fully_shard on each block (FSDP2)") == 2
    assert reading.fsdp_api("DP(FSDP)=8") is None  # FSDP without an API's own name: the framework's default
    assert reading.fsdp_api("FSDP2 fully_shard, like FSDP1's FULL_SHARD") is None  # both named: not read


def test_a_model_without_fsdp_units_keeps_its_estimate():
    """The FSDP1 terms touch only FSDP1 jobs with full sharding: DDP's estimate is the same under either version's
    framework default."""
    spec = _script("torch", torch="2.3", parallel__sharding="none")
    w = workload_from_spec(spec, ResolvedModel(arch=resolve_model(spec, ".").arch, name="gpt2-medium"))
    assert not w.comm.fsdp1


def _fsdp_row(sharding: str, other: str) -> MeasuredRow:
    raw = ROW | {
        "parallelism": "DP=2",
        "num_gpus": "2",
        "grad_accum_or_global_batch": "",
        "sharding_offload": sharding,
        "other_settings": other,
        "metric_type": "max_reserved",
        "precision": "bf16 pure",
    }
    return MeasuredRow("T2", "full training", "medium", "GPT-2 medium", 20.0, raw)


@pytest.mark.parametrize(
    ("sharding", "other", "version", "fsdp1"),
    [
        ("FSDP full shard, no CPU offload", "", 1, True),  # ShardingStrategy.FULL_SHARD: FSDP1's name
        ("FSDP2 (fully_shard)", "", 2, False),
        ("FSDP", "", None, False),  # no API named: the plain loop's default (FSDP2, the newest torch described)
        ("FSDP full shard", "torchtune", None, False),  # torchtune runs only fully_shard: its default, not the phrase
        ("FSDP full shard", "litgpt", None, True),  # litgpt runs only FSDP1
    ],
)
def test_the_reader_states_fsdp_version_only_from_api_names(sharding, other, version, fsdp1):
    it = interpret_row(_fsdp_row(sharding, other))
    assert it.plan.zero == 3
    assert it.spec.parallel.fsdp_version == version
    assert it.workload.comm.fsdp1 is fsdp1


def test_full_sharding_shards_the_adapters_with_the_frozen_weights():
    """A unit's flat parameter holds its frozen weights and its adapters alike (FSDP1 `_flat_param.py`
    `flatten_tensors` then `shard`; FSDP2 and ZeRO-3 shard every parameter), so under full sharding each rank holds
    its share of the adapters too. Llama-2-7B LoRA r64 (143.1M adapter parameters, bf16 under peft 0.10) on 2
    ranks: (6738.4M + 143.1M) x 2 bytes / 2 = 6.409 GiB of weights a rank (6.542 with the adapters whole); under
    ZeRO-2 every rank holds all of them: 12.818 GiB."""
    spec = _llama7_lora(1)
    w = workload_from_spec(spec, resolve_model(spec, "."))
    gib = {
        zero: estimate_memory(w, ParallelPlan(dp=2, zero=zero, micro_batch=1, recompute="full"), "allocated")
        .stages[0]
        .gib()["weights"]
        for zero in (2, 3)
    }
    assert gib[3] == pytest.approx(6.409, abs=0.001)
    assert gib[2] == pytest.approx(12.818, abs=0.001)
    assert gib[2] == pytest.approx(2 * gib[3], rel=1e-9)


def test_with_the_broadcast_the_wrap_floor_holds_the_peak_from_512_to_2048_tokens():
    """fsdp_qlora's F03/F04 setting with the facts its rows leave out (train.py's rank-0 broadcast,
    sync_module_states=True, and peft 0.10's bf16 adapters): wrapping leaves 8.35 GiB reserved and the unshard
    pool is 1.65: 10.00 GiB at 512 tokens, where the step fits in the wrap's free blocks, and 10.06 at 2048, where
    the compute stream's estimate comes 0.06 GiB above the floor (measured 10.24 and 10.22). Without the broadcast
    the floor is 7.96 GiB: 9.61 and 10.06. The allocated estimate is the same either way (7.70 and 8.55 GiB)."""
    spec = _llama7_lora(1)
    w = workload_from_spec(spec, resolve_model(spec, "."))
    plan = ParallelPlan(dp=2, zero=3, micro_batch=1, recompute="full")
    got = {}
    for seq in (512, 2048):
        for sync in (False, True):
            ws = replace(w, seq_len=seq, comm=replace(w.comm, fsdp1_sync=sync))
            got[seq, sync] = (
                estimate_memory(ws, plan, "reserved").peak / GiB,
                estimate_memory(ws, plan, "allocated").peak / GiB,
            )
    assert got[512, True] == pytest.approx((9.996, 7.700), abs=0.001)
    assert got[2048, True] == pytest.approx((10.060, 8.550), abs=0.001)
    assert got[512, False] == pytest.approx((9.607, 7.700), abs=0.001)
    assert got[2048, False] == got[2048, True]
