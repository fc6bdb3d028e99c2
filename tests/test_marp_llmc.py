"""llm.c's static buffer layout (marp/llmc.py) against its source's formulas, its refusals, and the reader on the
llm.c rows of the dev2 measurements."""

from __future__ import annotations

import json

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import estimate_memory, predict_pinned, search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.allocator import MiB
from frenzy_slurm.marp.llmc import buffer_bytes, parameter_count, printed_mib
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import ROOT, run_cli

GPT2 = dict(
    activation="gelu", norm="layernorm", position="learned", bias="all", tied_embeddings=True, max_positions=1024
)
SMALL = Architecture(layers=2, hidden=64, heads=4, ffn=256, vocab=300, **GPT2)  # Vp = 384
GPT2_124M = Architecture(layers=12, hidden=768, heads=12, ffn=3072, vocab=50257, **GPT2)
DATA = ROOT / "tests" / "data"
DEV2 = ROOT.parent / "shared" / "data" / "memory_measurements_dev2.csv"


def _spec(arch: Architecture = SMALL, *, version="2024.05.13", mb=2, seq=64, sharding="none", **over) -> JobSpec:
    training = dict(seq_len=seq, global_batch=mb * 4, micro_batch=mb, steps=1, activation_checkpointing="none")
    entry = dict(trainer="script", script="train_gpt2cu", framework="llm.c", framework_version=version)
    data = dict(
        name="llmc",
        model={"arch": arch.model_dump()},
        training=training | over.pop("training", {}),
        parallel=dict(sharding=sharding, tp=1, pp=1),
        entry=entry | over.pop("entry", {}),
    )
    return JobSpec.model_validate(data | over)


def _buffers(spec: JobSpec, arch: Architecture = SMALL, dp=4, zero=0, mb=2):
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="gpt2"))
    assert w.llmc is not None
    plan = ParallelPlan(dp=dp, zero=zero, micro_batch=mb)
    return w, plan, buffer_bytes(arch, w.llmc, plan, w.seq_len)


def test_parameters_are_fill_in_parameter_sizes():
    # Vp*C + maxT*C + L*(3C*C + 3C + C*C + C + 4C*C + 4C + 4C*C + C + 4C) + 2C, Vp = 300 padded to 384
    c, n = 64, 2
    want = 384 * c + 1024 * c + n * (12 * c * c + 13 * c) + 2 * c
    w, _, buf = _buffers(_spec())
    assert parameter_count(SMALL, w.llmc) == want == 190_208
    assert buf["parameters"] == buf["parameter gradients"] == want * 2  # bf16 floatX
    assert buf["AdamW m"] == buf["AdamW v"] == buf["master copy of params"] == want * 4  # -z 0: whole


def test_activations_at_pr_309_are_the_sum_of_its_twenty_tensors():
    """train_gpt2.cu at 750c5fd (2024.05.13), cuDNN: fill_in_activation_sizes, all floatX (bf16) elements."""
    b, t, c, n, nh, vp = 2, 64, 64, 2, 4, 384
    bt = b * t
    elements = (
        bt * c  # encoded
        + 18 * n * bt * c  # ln1, atty, attproj, residual2, ln2, fch (4), fch_gelu (4), fcproj, residual3, qkvr (3)
        + 4 * n * bt  # ln1/ln2 mean and rstd
        + n * b * nh * t * 2  # cuDNN's fp32 stats, counted as 2 floatX each
        + bt * c
        + 2 * bt  # lnf, its mean and rstd
    )
    output = bt * max(3 * c, nh * t, vp)
    _, _, buf = _buffers(_spec())
    assert buf["activations"] == elements * 2
    assert buf["output (logits, scratch)"] == output * 2
    assert buf["activation gradients"] == (bt * 4 * c + bt * c) * 2  # bt4c, residual3
    assert buf["cuBLASLt workspace"] == 2 * 32 * MiB  # common_start allocated it twice until 2024.05.17
    assert buf["inputs and targets"] == 2 * bt * 4


def test_eager_attention_keeps_the_score_matrix():
    """Without cuDNN: att is (L, B, NH, T, T) floatX and the backward keeps a (B, NH, T, T) preatt."""
    b, t, n, nh = 2, 64, 2, 4
    _, _, flash = _buffers(_spec())
    _, _, eager = _buffers(_spec(training={"attention": "eager"}))
    assert eager["activations"] - flash["activations"] == (n * b * nh * t * t - n * b * nh * t * 2) * 2
    assert eager["activation gradients"] - flash["activation gradients"] == b * nh * t * t * 2


def test_later_layouts_follow_the_source():
    """2024.08.16 (0ddedf9) at -r 1: no attproj/fcproj, one layer's fch_gelu, fp32 statistics and losses,
    scratch_bt4c/scratch_btc instead of the activation-gradient buffer, one cuBLASLt workspace."""
    b, t, c, n, nh = 2, 64, 64, 2, 4
    bt = b * t
    _, _, buf = _buffers(_spec(version="2024.08.16"))
    floatx = bt * c + n * bt * c * (1 + 1 + 1 + 1 + 4 + 1 + 3) + bt * 4 * c + bt * c + bt * 4 * c + bt * c
    fp32 = 4 * n * bt + 2 * bt + bt + n * b * nh * t
    assert buf["activations"] == floatx * 2 + fp32 * 4
    assert buf["activation gradients"] == 0
    assert buf["cuBLASLt workspace"] == 32 * MiB
    _, _, r2 = _buffers(_spec(version="2024.08.16", entry={"llmc": {"recompute": 2}}))
    assert buf["activations"] - r2["activations"] == 2 * n * bt * c * 2  # ln1, ln2 gone (lnf is the buffer)
    _, _, r0 = _buffers(_spec(version="2024.08.16", entry={"llmc": {"recompute": 0}}))
    assert r0["activations"] - buf["activations"] == (n - 1) * bt * 4 * c * 2  # every layer's GELU output


def test_zero1_shards_m_v_master_only_where_they_divide():
    w, plan, buf = _buffers(_spec(sharding="zero1"), zero=1)
    p = parameter_count(SMALL, w.llmc)
    assert p % 4 == 0 and buf["AdamW m"] == buf["master copy of params"] == p // 4 * 4
    assert buf["parameter gradients"] == p * 2  # stage 1: the gradients stay whole
    _, _, odd = _buffers(_spec(sharding="zero1"), dp=3, zero=1)
    assert odd["AdamW m"] == p * 4  # set_zero_configs: "Can't equally partition parameters" -> stage 0
    _, _, no_master = _buffers(_spec(entry={"llmc": {"master_weights": False}}))
    assert no_master["master copy of params"] == 0


def test_i02_breakdown_is_what_llmc_printed():
    """dev2 I02: GPT-2 124M, B=32, T=1024, 4 GPUs, -z 1 at PR #309: llm.c printed 237 MiB parameters, 13629 MiB
    activations, 237 MiB gradients, 240 MiB activation gradients, 118 MiB each for m, v and the master copy."""
    spec = _spec(GPT2_124M, mb=32, seq=1024, sharding="zero1")
    w, plan, buf = _buffers(spec, GPT2_124M, zero=1, mb=32)
    assert printed_mib(buf) == {
        "parameters": 237,
        "parameter gradients": 237,
        "activation gradients": 240,
        "activations": 13629,
        "AdamW m": 118,
        "AdamW v": 118,
        "master copy of params": 118,
    }


def test_device_metric_adds_context_and_nccl_not_torch_workspaces():
    spec = _spec(GPT2_124M, mb=32, seq=1024, sharding="zero1")
    w = workload_from_spec(spec, ResolvedModel(arch=GPT2_124M, name="gpt2"))
    plan = ParallelPlan(dp=4, zero=1, micro_batch=32)
    alloc = estimate_memory(w, plan, "allocated")
    reserved = estimate_memory(w, plan, "reserved")
    device = estimate_memory(w, plan, "device", Overheads())
    assert alloc.peak == reserved.peak  # no caching allocator
    assert device.peak - alloc.peak == pytest.approx((0.5 + 0.25) * GiB)
    assert sum(buffer_bytes(GPT2_124M, w.llmc, plan, 1024).values()) == alloc.peak


def test_predict_pinned_searches_only_what_llmc_runs():
    spec = _spec(GPT2_124M, mb=32, seq=1024, sharding="auto", training={"activation_checkpointing": "auto"})
    space = search_space_from_spec(spec)
    assert space.recompute == ("none",) and space.zero_stages == (0, 1)
    w, plan, est = predict_pinned(
        _spec(GPT2_124M, mb=32, seq=1024), ResolvedModel(arch=GPT2_124M, name="g"), 4, "device"
    )
    assert plan.short().startswith("dp=4,tp=1,pp=1,zero=0,mb=32") and est.stages[0].phase == "start-up"


@pytest.mark.parametrize(
    "over,needle",
    [
        (dict(training={"activation_checkpointing": "full"}), "checkpoints no blocks"),
        (dict(training={"activation_checkpointing": "selective"}), "not something llm.c does"),
        (dict(training={"precision": "bf16-pure"}), "entry.llmc.master_weights: false"),
        (dict(training={"optimizer": "sgd"}), "training.optimizer: llm.c steps with its own AdamW"),
        (dict(training={"compile": True}), "training.compile/fp8"),
        (dict(training={"precision": "fp32"}), "cuDNN is not supported in FP32 mode"),
        (dict(entry={"framework_version": "2.3"}), "as YYYY.MM.DD"),
        (dict(entry={"framework_version": "2024.04.20"}), "describes llm.c's train_gpt2.cu from 2024.05.13"),
        (dict(entry={"llmc": {"recompute": 1}}), "no -r before 2024.05.16"),
        (dict(entry={"framework_version": "2024.05.20", "llmc": {"recompute": 2}}), "has -r 2"),
        (dict(seq=2048), "asserts T <= maxT"),
    ],
)
def test_refusals_name_field_and_fix(over, needle):
    seq = over.pop("seq", 64)
    with pytest.raises(InputError, match=needle):
        spec = _spec(seq=seq, **over)
        search_space_from_spec(spec)
        workload_from_spec(spec, ResolvedModel(arch=SMALL, name="gpt2"))


def test_refusals_of_architecture_and_plans():
    llama = Architecture(layers=2, hidden=64, heads=4, ffn=256, vocab=300)
    with pytest.raises(InputError, match="trains GPT-2 only"):
        workload_from_spec(_spec(llama), ResolvedModel(arch=llama, name="llama"))
    with pytest.raises(InputError, match="zero3 is not one llm.c runs"):
        search_space_from_spec(_spec(sharding="zero3"))
    with pytest.raises(ValueError, match="llmc: llm.c's flags are read only with framework: llm.c"):
        _spec(entry={"framework": "torch", "llmc": {"recompute": 1}})


def test_reader_reads_the_llmc_rows_through_the_product_path():
    from frenzy_slurm.eval.dataset import interpret_row, read_measurements

    if not DEV2.exists():
        pytest.skip(f"{DEV2} not here")
    rows = [r for r in read_measurements(DEV2) if "llm.c" in r.model]
    assert len(rows) == 4
    for row in rows:
        it = interpret_row(row)
        assert it.spec.entry.framework == "llm.c" and it.metric == "device"
        assert it.workload.llmc is not None and it.workload.llmc.version == (2024, 5, 13)
        assert it.workload.llmc.recompute == 0 and it.workload.llmc.cudnn
        est = estimate_memory(it.workload, it.plan, it.metric, it.overheads)
        assert est.peak_gib == pytest.approx(row.measured_gib, rel=0.01)  # 99.6-99.8 % (docs/accuracy.md)
        assert est.peak_gib < row.measured_gib  # cuDNN's workspace is not counted


def test_fsbatch_dry_run_renders_an_llmc_job(tmp_path):
    import yaml

    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    pools = [("a100", "A100-80GB", 2, 4)]
    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(pools).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site(pools).model_dump(mode="json")))
    model = tmp_path / "llmc.yaml"
    model.write_text((DATA / "llmc-gpt2.yaml").read_text())
    (tmp_path / "llm.c").mkdir()
    (tmp_path / "llm.c" / "train_gpt2cu").write_text("")
    res = run_cli(
        "fsbatch",
        str(model),
        "--dry-run",
        "--json",
        "--backend",
        "static",
        "--snapshot",
        str(snap),
        "--site",
        str(site),
        "--job-dir",
        str(tmp_path / "job"),
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert "export FRENZY_FRAMEWORK=llm.c" in out["script"] and "train_gpt2cu" in out["script"]
    comps = out["decision"]["chosen"]["components"]
    assert comps and all(c["gpu_model"] == "A100-80GB" for c in comps)
    assert not (tmp_path / "job").exists()


def test_example_is_planned():
    res = run_cli(
        "frenzy-slurm", "memory", str(DATA / "llmc-gpt2.yaml"), "--world", "4", "--metric", "device", "--json"
    )
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["stages"][0]["peak"] == pytest.approx(15532.3 * MiB / GiB, rel=1e-3)


def test_framework_args_are_llmc_flags_at_its_date():
    from frenzy_slurm.render.script import plan_env
    from frenzy_slurm.runtime.framework_argv import framework_args

    plan = ParallelPlan(dp=4, zero=1, micro_batch=2, grad_accum=2)
    old = plan_env(_spec(sharding="zero1", training={"global_batch": 16}), plan)
    assert framework_args(old) == ["-b", "2", "-t", "64", "-z", "1", "-l", "0.0003", "-x", "1", "-w", "1"]
    new = plan_env(_spec(version="2024.08.16", entry={"llmc": {"recompute": 2, "master_weights": False}}), plan)
    assert framework_args(new)[10:] == ["-w", "0", "-r", "2", "-d", str(8 * 64)]


def test_explain_names_the_llmc_defaults_taken():
    from frenzy_slurm.marp.frameworks import profile_summary

    taken = profile_summary(_spec(entry={"framework_version": None}))["defaults_taken"]
    assert taken == {"entry.framework_version": "2024.08.16 (the newest layout described)", "entry.llmc.recompute": 1}
    assert profile_summary(_spec())["defaults_taken"] == {"entry.llmc.recompute": 0}  # no -r before 2024.05.16


def test_runtime_execs_the_llmc_program_itself_with_its_flags(tmp_path):
    """llm.c's train_gpt2cu is a compiled program: the runtime execs it, not the job's Python on it."""
    import os
    import subprocess
    import sys

    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    program = tmp_path / "train_gpt2cu"
    program.write_text('#!/bin/sh\necho "$0 $*"\n')
    program.chmod(0o755)
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FRENZY_NVML_SAMPLER": "0",
        **{k: v for k, v in _env_of(_spec(version="2024.08.16")).items()},
    }
    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir), "--script", str(program)]
        + ["--", "$FRENZY_FRAMEWORK_ARGS", "-i", "train_*.bin"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    got = res.stdout.strip().splitlines()[-1]
    assert got == f"{program} -b 2 -t 64 -z 0 -l 0.0003 -x 1 -w 1 -r 1 -d 512 -i train_*.bin"


def _env_of(spec: JobSpec) -> dict[str, str]:
    from frenzy_slurm.render.script import plan_env

    return plan_env(spec, ParallelPlan(dp=4, micro_batch=2))
