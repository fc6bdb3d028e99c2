"""Where the GPU is known, the reserved and device peaks stay within it: the caching allocator frees its cached
blocks and retries before it reports out of memory, so the variable-length cache gives way first
(`MemoryEstimate.on_gpu`/`within`); what a rank needs is unchanged."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.units import GiB
from frenzy_slurm.marp.allocator_replay import CachingAllocator
from frenzy_slurm.marp.candidates import GpuOption, SearchSpace, search
from frenzy_slurm.marp.memory import Overheads, estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan

from .test_marp_variable_lengths import _spec, _workload

VARIED = {"lengths": "variable", "mean": 3000, "sd": 2500}
PLAN = ParallelPlan(dp=1, micro_batch=1, grad_accum=16)
A100 = catalog()["A100-80GB"]


def _varied():
    return _workload(_spec(VARIED, training__seq_len=8192, training__global_batch=16))


def test_the_cache_gives_way_down_to_the_limit_and_no_further():
    est = estimate_memory(_varied(), PLAN, "reserved")
    stage = est.stages[0]
    assert est.needed / GiB == pytest.approx(55.23, abs=0.01)
    assert stage.cached / GiB == pytest.approx(62.77, abs=0.01)  # the replayed cache: more than fits beside it
    assert est.within(est.peak + GiB) == est  # room to spare: nothing given back
    assert est.within(est.peak + GiB).released == 0.0
    limit = est.needed + 20 * GiB
    capped = est.within(limit)
    assert capped.peak == pytest.approx(limit)
    assert capped.needed == pytest.approx(est.needed)
    assert capped.released == pytest.approx(est.peak - limit)
    assert capped.stages[0].cached == pytest.approx(20 * GiB)
    # a need past the GPU is an out of memory, not a smaller reading: the need stays
    gone = est.within(est.needed - GiB)
    assert gone.peak == pytest.approx(est.needed)
    assert gone.stages[0].cached == 0.0


def test_on_a_gpu_the_reading_is_its_memory_less_the_device_terms():
    w, o = _varied(), Overheads()
    device = estimate_memory(w, PLAN, "device", o).on_gpu(A100.memory_gib * GiB, o)
    reserved = estimate_memory(w, PLAN, "reserved", o).on_gpu(A100.memory_gib * GiB, o)
    assert device.peak / GiB == pytest.approx(80.0)
    assert reserved.peak == pytest.approx(80.0 * GiB - o.device_bytes(1))
    assert reserved.peak / GiB == pytest.approx(79.4375)  # less 0.5 GiB of context and 2 x 32 MiB of cuBLAS
    assert device.needed / GiB == pytest.approx(55.79, abs=0.01)
    assert device.released / GiB == pytest.approx(118.57 - 80.0, abs=0.01)
    # a GPU with room: unchanged; the allocated reading counts no cache
    h200 = catalog()["H200"].memory_gib * GiB
    assert estimate_memory(w, PLAN, "device", o).on_gpu(h200, o).released == 0.0
    allocated = estimate_memory(w, PLAN, "allocated", o)
    assert allocated.on_gpu(A100.memory_gib * GiB, o) is allocated
    # fixed lengths keep no cache: nothing to give back, even on a GPU they overflow
    fixed = estimate_memory(_workload(_spec(training__seq_len=8192, training__global_batch=16)), PLAN, "device", o)
    assert fixed.on_gpu(10 * GiB, o).peak == fixed.peak


def test_the_replayer_frees_its_cache_before_it_fails():
    """The behaviour `within` rests on, in the allocator port: at a capacity, freed blocks are released and the
    request retried, and the reserved peak stays within the capacity."""
    a = CachingAllocator("", capacity=64 << 20)
    first = a.malloc(40 << 20)
    a.free(first)
    second = a.malloc(50 << 20)  # 40 MiB cached + 50 MiB > 64 MiB: the cache goes, then it fits
    assert a.memory_stats()["reserved_bytes.all.peak"] <= 64 << 20
    assert a.total_mapped == 50 << 20
    a.free(second)


def test_the_search_caps_each_gpu_types_plans_at_its_memory():
    w = _varied()
    opts = [GpuOption("a100", A100, 1), GpuOption("h200", catalog()["H200"], 1)]
    got = search(w, opts, global_batch=16, steps=10, space=SearchSpace(micro_batch=1, recompute=("none",)))
    a100, h200 = got["a100"][0], got["h200"][0]
    assert a100.plan == h200.plan
    assert a100.peak_gib == pytest.approx(80.0)  # reserved + context + cuBLAS = the whole GPU
    assert a100.memory.released > 0
    assert h200.memory.released == 0.0 and h200.peak_gib > 80.0
    assert a100.memory.needed == pytest.approx(h200.memory.needed)


def _model_yaml(tmp_path, **over):
    spec = _spec(VARIED, training__seq_len=8192, training__global_batch=16, training__micro_batch=1, **over)
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    return path


def test_memory_with_world_and_gpu_reports_the_capped_peak(tmp_path):
    from frenzy_slurm.cli.admin import main

    path = _model_yaml(
        tmp_path, parallel={"sharding": "none", "tp": 1, "pp": 1}, training__activation_checkpointing="none"
    )
    args = ["memory", str(path), "--world", "1", "--metric", "device", "--json"]
    bare = json.loads(CliRunner().invoke(main, args).stdout)
    res = CliRunner().invoke(main, [*args, "--gpu", "A100-80GB"])
    assert res.exit_code == 0, res.output
    on = json.loads(res.stdout)
    assert bare["peak_gib"] == pytest.approx(118.57, abs=0.01) and "capped" not in bare
    assert on["peak_gib"] == pytest.approx(80.0)
    assert on["needed_gib"] == pytest.approx(bare["needed_gib"])
    assert on["capped"]["gpu"] == "A100-80GB"
    assert on["capped"]["released_gib"] == pytest.approx(bare["peak_gib"] - 80.0)
    assert on["stages"][0]["released"] == pytest.approx(on["capped"]["released_gib"])
    text = CliRunner().invoke(main, [*args[:-1], "--gpu", "A100-80GB"])
    assert text.exit_code == 0, text.output
    assert "capped: 38.57 GiB of the variable-length cache left out on A100-80GB" in text.stdout
    assert "A100-80GB: 80.0 GiB of 76.0 usable -> does NOT fit" in text.stdout
    roomy = json.loads(CliRunner().invoke(main, [*args, "--gpu", "H200"]).stdout)
    assert roomy["peak_gib"] == pytest.approx(bare["peak_gib"]) and "capped" not in roomy


def test_fsbatch_shows_the_capped_peak_per_component(tmp_path):
    """fsbatch's search knows each pool's GPU: the devcluster's A100-40GB reads 40 GiB, not the 49 GiB the
    replayed cache would add to, and --explain and --json say the cache was capped."""
    from frenzy_slurm.cli.fsbatch import main

    from .test_marp_frameworks import ROOT

    spec = _spec(
        {"lengths": "variable", "mean": 1500, "sd": 1200},
        training__seq_len=4096,
        training__global_batch=16,
        training__micro_batch=1,
        training__activation_checkpointing="full",
        parallel={"sharding": "none", "tp": 1, "pp": 1},
        limits={"max_gpus": 1},
    )
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec.model_dump(mode="json", exclude_defaults=True)))
    (tmp_path / "train.py").write_text("")
    common = [
        str(path),
        "--dry-run",
        "--backend",
        "static",
        "--snapshot",
        str(ROOT / "examples" / "offline" / "cluster.json"),
        "--site",
        str(ROOT / "site_configs" / "devcluster.yaml"),
    ]
    out = CliRunner().invoke(main, [*common, "--json"])
    assert out.exit_code == 0, out.output
    (comp,) = json.loads(out.stdout)["decision"]["chosen"]["components"]
    assert comp["gpu_model"] == "A100-40GB"
    assert comp["peak_gib"] == pytest.approx(40.0)
    assert comp["capped_gib"] == pytest.approx(48.96 - 40.0, abs=0.01)
    # the fit, and so the out-of-memory fallbacks' error factor, is decided without the cache
    from frenzy_slurm.has.fallback import failing_factor
    from frenzy_slurm.has.model import Allocation

    assert comp["needed_gib"] < comp["capacity_gib"] < comp["peak_gib"]
    chosen = Allocation.model_validate(json.loads(out.stdout)["decision"]["chosen"])
    assert failing_factor(chosen) == pytest.approx(comp["capacity_gib"] / comp["needed_gib"])
    assert failing_factor(chosen) > 1.0
    shown = CliRunner().invoke(main, [*common, "--explain"])
    assert shown.exit_code == 0, shown.output
    assert "40G/38G (cache capped)" in shown.output
    assert "on a known GPU it counts only up to the GPU's memory less the CUDA context, NCCL and cuBLAS" in shown.output


def test_a_heterogeneous_pipelines_stages_are_capped_at_their_own_gpus():
    from frenzy_slurm.has.hetero import HeteroPlan, StageGroup, stage_peaks_gib

    w = _varied()
    plan = ParallelPlan(dp=1, pp=2, micro_batch=1, grad_accum=16, layer_split=(8, 8))
    est = estimate_memory(w, plan, "reserved")
    extra = Overheads().device_bytes(2)

    def group(name: str, memory_gib: float | None) -> StageGroup:
        memory = None if memory_gib is None else memory_gib * GiB
        return StageGroup(name, 1, 1e14, 70 * GiB, extra, 300, 25, 8, memory_bytes=memory)

    small, roomy = group("small", 50.0), group("unknown", None)  # no memory known: as before
    peaks = stage_peaks_gib(HeteroPlan(plan, (small, roomy), est, 1.0))
    first, last = est.stages
    assert first.peak + extra > 50 * GiB > first.needed + extra  # the first stage's cache overflows its GPU
    assert peaks[0][0] == pytest.approx(50.0)
    assert peaks[0][1] == pytest.approx((first.peak + extra) / GiB - 50.0)
    assert peaks[1] == pytest.approx(((last.peak + extra) / GiB, 0.0))
