"""The framework profiles. model.yaml names how the job runs (entry.framework); its profile
turns the spec into MARP's Workload and the search's plans; the accuracy benchmark and the CPU grid predict
through the same functions as fsbatch, from model.yaml files a user could save and run."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import JobSpec, ResolvedModel, load_job_spec, resolve_model
from frenzy_slurm.marp import pinned_plan, search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import plan_groups
from frenzy_slurm.marp.frameworks import PROFILES, profile_summary
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.plan import ParallelPlan, Workload

from .helpers import LOCAL, make_spec, plan

ROOT = Path(__file__).resolve().parent.parent
DEV = ROOT.parent / "shared" / "data" / "memory_measurements_dev.csv"
FROZEN = ROOT / "tests" / "data" / "marp_frozen.json"


def script(framework: str, **over) -> JobSpec:
    """A Llama-style 1B LoRA-capable job run by `framework`'s script; `section__field=value` overrides."""
    over.setdefault("entry", {"trainer": "script", "script": "train.py", "framework": framework})
    over.setdefault("model", {"preset": "llama-3.2-1b"})
    return make_spec(**over)


# model.yaml variations and the Workload fields each one changes, against the hf-trainer baseline; together they
# reach every field the memory model reads
VARIATIONS: list[tuple[str, dict]] = [
    ("Liger's fused linear cross-entropy", {"training__fused_linear_loss": True}),
    ("framework deepspeed", {"entry": {"trainer": "script", "script": "t.py", "framework": "deepspeed"}}),
    ("framework litgpt", {"entry": {"trainer": "script", "script": "t.py", "framework": "litgpt"}}),
    (
        "torchtitan with its chunked loss",  # DTensor TP's gathered linear inputs, ChunkedLossWrapper's copies
        {"entry": {"trainer": "script", "script": "t.py", "framework": "torchtitan"}, "training__loss_chunks": 8},
    ),
    (
        "litgpt in pure bf16",
        {
            "entry": {"trainer": "script", "script": "t.py", "framework": "litgpt"},
            "training__precision": "bf16-pure",
        },
    ),
    ("framework torchtune", {"entry": {"trainer": "script", "script": "t.py", "framework": "torchtune"}}),
    # UnslothFusedLoss (4 GiB chunks) and the offloaded checkpointing; before 2024.11.7, Fast_CrossEntropyLoss
    (
        "framework unsloth",
        {"entry": {"trainer": "script", "script": "t.py", "framework": "unsloth"}, "training__method": "lora"},
    ),
    (
        "unsloth's first loss kernel",
        {"entry": {"trainer": "script", "script": "t.py", "framework": "unsloth", "framework_version": "2024.10"}},
    ),
    ("variable sequence lengths", {"data": {"lengths": "variable", "median": 300}}),
    ("stated length distribution", {"data": {"lengths": "variable", "mean": 900, "sd": 300}}),
    ("framework lightning", {"entry": {"trainer": "script", "script": "t.py", "framework": "lightning"}}),
    ("framework megatron", {"entry": {"trainer": "script", "script": "t.py", "framework": "megatron"}}),
    (
        "frenzy model code",
        {"entry": {"trainer": "script", "script": "t.py", "framework": "torch", "model_code": "frenzy"}},
    ),
    (
        "old torch",
        {"entry": {"trainer": "script", "script": "t.py", "framework": "hf-trainer", "torch_version": "1.13"}},
    ),
    ("eager attention", {"training__attention": "eager"}),
    ("seq_len", {"training__seq_len": 2048}),
    ("fp32", {"training__precision": "fp32"}),
    ("pure bf16", {"training__precision": "bf16-pure"}),
    (
        "16-bit loss",
        {
            "entry": {"trainer": "script", "script": "t.py", "framework": "hf-trainer", "loss_upcast": False},
            "training__precision": "bf16-pure",
        },
    ),
    ("sgd", {"training__optimizer": "sgd"}),
    ("paged", {"training__optimizer": "paged-adamw-8bit"}),
    ("foreach", {"training__optimizer_impl": "foreach"}),
    ("in backward", {"training__optimizer_in_backward": True}),
    ("offload activations", {"training__activation_offload": True}),
    ("fp8", {"training__fp8": True}),
    ("chunks", {"training__loss_chunks": 4}),
    ("compile", {"training__compile": True, "training__compile_loss": False}),
    ("lora", {"training__method": "lora", "training__lora": {"rank": 64, "targets": ["q", "k"], "dropout": 0.0}}),
    (
        "qlora",
        {
            "training__method": "qlora",
            "training__lora": {"quantize_head": True, "double_quant": False, "quantizer": "torchao"},
        },
    ),
    ("keep gathered weights", {"parallel": {"sharding": "full-shard", "reshard_after_forward": False}}),
    ("buffers", {"deepspeed": {"reduce_bucket_size": 1000}}),
    ("tied gpt-2", {"model": {"preset": "gpt2-medium"}}),
    (
        "logits held",
        {"entry": {"trainer": "script", "script": "t.py", "framework": "hf-trainer", "holds_logits": True}},
    ),
    (
        "expandable segments",
        {
            "entry": {
                "trainer": "script",
                "script": "t.py",
                "framework": "hf-trainer",
                "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
            }
        },
    ),
]


def test_every_workload_field_is_reachable_from_model_yaml():
    """No Workload field is a knob only a benchmark can set: each one takes another value for some model.yaml."""
    base_spec = script("hf-trainer")
    base = workload_from_spec(base_spec, resolve_model(base_spec, "."))
    reached = {"exact_params"}  # from model.factory with --trace-factory (marp.with_exact_params)
    for name, over in VARIATIONS:
        spec = script("hf-trainer", **over)
        w = workload_from_spec(spec, resolve_model(spec, "."))
        changed = {f.name for f in dataclasses.fields(Workload) if getattr(w, f.name) != getattr(base, f.name)}
        assert changed, f"variation {name!r} changed nothing"
        reached |= changed
    # the built-in trainer on a site whose ranks run on the CPU (the site file's `device: cpu`, which fsbatch
    # hands to workload_from_spec: test_the_site_device_is_what_fsbatch_predicts_with)
    # an encoder-decoder model's decoder length (training.target_len)
    t5 = {"layers": 2, "encoder_layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256, "position": "relative"}
    encdec = script("hf-trainer", model={"arch": t5}, training__target_len=16)
    reached |= {"target_len"} if workload_from_spec(encdec, resolve_model(encdec, ".")).target_len == 16 else set()
    builtin = make_spec(model={"preset": "llama-3.2-1b"})
    reached |= {
        f.name
        for f in dataclasses.fields(Workload)
        if getattr(workload_from_spec(builtin, resolve_model(builtin, "."), device="cpu"), f.name)
        != getattr(base, f.name)
    }
    # llm.c's static layout (marp/llmc.py): a GPT-2 run by its train_gpt2cu
    llmc = script("llm.c", model={"preset": "gpt2"})
    reached |= {
        f.name
        for f in dataclasses.fields(Workload)
        if getattr(workload_from_spec(llmc, resolve_model(llmc, ".")), f.name) != getattr(base, f.name)
    }
    assert reached == {f.name for f in dataclasses.fields(Workload)}


def test_the_site_device_is_what_fsbatch_predicts_with():
    """The CPU-only Workload fields come from the site file (`device: cpu`, site_configs/devcluster-cpu.yaml), the
    same for fsbatch's plan as for the CPU grid's predictions: no knob only a benchmark sets."""
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.site.config import load_site

    from .helpers import planned

    site = load_site(ROOT / "site_configs" / "devcluster-cpu.yaml")
    assert site.device == "cpu"
    spec = load_job_spec(ROOT / "examples" / "tiny-cpu.yaml")
    model = resolve_model(spec, ROOT / "examples")
    view = synthetic(LOCAL)
    view = view.model_copy(update={"nodes": [n.model_copy(update={"gpu_type": n.partitions[0]}) for n in view.nodes]})
    chosen = planned(spec, view, site=site, model=model).decision.chosen
    plan_ = chosen.plan
    on_cpu = estimate_memory(workload_from_spec(spec, model, device="cpu"), plan_, "reserved")
    on_gpu = estimate_memory(workload_from_spec(spec, model), plan_, "reserved")
    assert on_cpu.peak != on_gpu.peak  # the device changes the prediction, so the comparison below can fail
    peaks = [st.peak for st in on_cpu.stages]
    assert max(c.peak_gib for c in chosen.components) == pytest.approx(max(peaks) / GiB)
    # no caching allocator on the CPU: reserved is what is allocated
    assert on_cpu.peak == estimate_memory(workload_from_spec(spec, model, device="cpu"), plan_, "allocated").peak


def test_frenzy_slurm_memory_names_the_profile_and_takes_the_sites_device(tmp_path):
    from frenzy_slurm.cli.admin import main

    spec = ROOT / "examples" / "tiny-cpu.yaml"
    args = ["memory", str(spec), "--plan", "dp=1,pp=2,mb=2", "--metric", "reserved", "--json"]
    cpu_site = str(ROOT / "site_configs" / "devcluster-cpu.yaml")
    shown = CliRunner().invoke(main, ["memory", str(spec), "--plan", "dp=1,pp=2,mb=2"])
    assert shown.exit_code == 0, shown.output
    assert "framework: frenzy (frenzy-slurm's built-in DeepSpeed trainer" in shown.output
    by = {}
    variants = {"site": ["--site", cpu_site], "flag": ["--device", "cpu"], "cuda": ["--device", "cuda"]}
    for name, extra in variants.items():
        out = CliRunner().invoke(main, [*args, *extra])
        assert out.exit_code == 0, out.output
        data = json.loads(out.stdout)
        assert data["profile"]["framework"] == "frenzy"
        by[name] = data["peak_gib"]
    assert by["site"] == by["flag"] != by["cuda"]


def test_nothing_adjusts_a_workload_after_the_profiles():
    """No code in the package or the benchmarks changes a Workload after workload_from_spec (the runtime used to
    turn eager attention into SDPA for its own prediction: the built-in model now runs what model.yaml names)."""
    for path in [*ROOT.joinpath("frenzy_slurm").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py")]:
        uses = re.findall(r"\bw\.with_\(|\bworkload\.with_\(", path.read_text())
        assert not uses, f"{path} adjusts a Workload outside the profiles"


def test_no_code_outside_the_profiles_builds_a_workload_from_settings():
    """Workload(...) (or Workload.of) is constructed only by marp.workload_from_spec in the package and the
    benchmarks that report accuracy (the grid and the dev set go through model.yaml)."""
    for path in [*ROOT.joinpath("frenzy_slurm").rglob("*.py"), *ROOT.joinpath("benchmarks").rglob("*.py")]:
        text = path.read_text()
        calls = re.findall(r"\bWorkload(?:\.of)?\(", text)
        if path == ROOT / "frenzy_slurm" / "marp" / "__init__.py":
            assert len(calls) == 1
        elif path.name != "workload.py":  # workload.py defines it
            assert not calls, f"{path} builds a Workload itself"


def test_the_profiles_defaults_reach_the_workload():
    tt = workload_from_spec(s := script("torchtune", training__method="lora"), resolve_model(s, "."))
    assert (
        tt.loss.loss_chunks == 8
        and not tt.adapters.lora_dropout
        and not tt.loss.hold_logits
        and not tt.adapters.nf4_saves_inputs
    )
    lit = workload_from_spec(s := script("litgpt", training__seq_len=1000), resolve_model(s, "."))
    assert (
        lit.loss.loss_chunks == 8
        and lit.loss.keeps_previous_output
        and lit.loss.hold_logits
        and lit.activations.fused_projections
    )
    hf = workload_from_spec(s := script("hf-trainer"), resolve_model(s, "."))
    # Trainer.compute_loss returns the loss only; transformers 5's SDPA path takes the K/V heads as they are
    assert hf.activations.norm_upcast and not hf.activations.unfused_rope and not hf.activations.fused_projections
    assert not hf.loss.hold_logits and not hf.activations.gqa_expand
    old = script(
        "hf-trainer",
        entry={"trainer": "script", "script": "t.py", "framework": "hf-trainer", "framework_version": "4.46"},
    )
    assert workload_from_spec(old, resolve_model(old, ".")).activations.gqa_expand
    eager = script("hf-trainer", training__attention="eager")
    assert workload_from_spec(eager, resolve_model(eager, ".")).activations.gqa_expand
    assert workload_from_spec(s := script("torch"), resolve_model(s, ".")).loss.hold_logits  # a plain loop binds them
    gpt2 = workload_from_spec(s := script("hf-trainer", model={"preset": "gpt2-medium"}), resolve_model(s, "."))
    assert gpt2.activations.fused_projections  # GPT-2's c_attn
    # torch's optimizers step per tensor on the CPU (foreach only for CUDA tensors)
    assert not workload_from_spec(s := script("torch"), resolve_model(s, ".")).states.fused_optimizer
    assert workload_from_spec(s, resolve_model(s, "."), device="cpu").states.fused_optimizer
    # litgpt's GPT has its own output matrix beside the embedding
    lit2 = workload_from_spec(s := script("litgpt", model={"preset": "gpt2-medium"}), resolve_model(s, "."))
    assert not lit2.arch.tied_embeddings


@pytest.mark.parametrize(
    ("framework", "tp", "pp", "hetero"),
    [
        ("frenzy", (1,), (1, 2, 4, 8, 16), True),
        ("deepspeed", (1,), (1, 2, 4, 8, 16), False),
        ("hf-trainer", (1,), (1,), False),
        ("torchtune", (1,), (1,), False),
        ("litgpt", (1,), (1,), False),
        ("torchtitan", (1, 2, 4, 8), (1, 2, 4, 8, 16), False),
        ("megatron", (1, 2, 4, 8), (1, 2, 4, 8, 16), False),
    ],
)
def test_the_search_proposes_only_what_the_framework_runs(framework, tp, pp, hetero):
    spec = make_spec() if framework == "frenzy" else script(framework)
    space = search_space_from_spec(spec)
    assert (space.tp_degrees, space.pp_degrees, space.heterogeneous) == (tp, pp, hetero)
    assert set(space.zero_stages) == set(PROFILES[framework].can.zero_stages)


def test_pinned_settings_the_framework_cannot_run_are_refused():
    with pytest.raises(InputError, match="parallel.tp: 2: framework frenzy cannot run tp"):
        search_space_from_spec(make_spec(parallel={"tp": 2}))
    with pytest.raises(InputError, match="parallel.pp: 2: framework torchtune cannot run pp"):
        search_space_from_spec(script("torchtune", parallel={"pp": 2}))
    with pytest.raises(InputError, match="sharding: zero2 is not one torchtune runs"):
        search_space_from_spec(script("torchtune", parallel={"sharding": "zero2"}))
    with pytest.raises(InputError, match="no context parallelism"):
        search_space_from_spec(script("hf-trainer", parallel={"cp": 2}))
    # torchtitan shards over the cp ranks whenever cp > 1 (parallel_dims.py): unsharded states are not its run
    with pytest.raises(InputError, match="sharding: none with cp: 2: torchtitan applies FSDP over the context"):
        search_space_from_spec(script("torchtitan", parallel={"cp": 2, "sharding": "none"}))
    assert search_space_from_spec(script("torchtitan", parallel={"cp": 2, "sharding": "full-shard"})).zero_stages == (
        3,
    )
    with pytest.raises(
        InputError, match="op .torchtitan's per-op selective checkpointing. is not something hf-trainer"
    ):
        search_space_from_spec(script("hf-trainer", training__activation_checkpointing="op"))
    assert "op" in search_space_from_spec(script("torchtitan")).recompute
    assert "op" not in search_space_from_spec(script("torch")).recompute  # a plain loop: only when pinned
    assert search_space_from_spec(script("torch", training__activation_checkpointing="op")).recompute == ("op",)
    with pytest.raises(InputError, match="runs no pipeline stages"):
        search_space_from_spec(script("torchtune", parallel={"heterogeneous": True}))
    with pytest.raises(InputError, match="runs its stages sequentially in one process"):
        search_space_from_spec(script("hf-trainer", parallel={"heterogeneous": True}))
    assert search_space_from_spec(script("deepspeed", parallel={"heterogeneous": True})).heterogeneous
    assert not search_space_from_spec(make_spec(parallel={"pp": 1})).heterogeneous
    # a TP-capable model the user brings: hf-trainer accepts tp when it is pinned
    assert search_space_from_spec(script("hf-trainer", parallel={"tp": 2})).tp_degrees == (2,)


def test_spec_refuses_a_framework_that_does_not_match_the_trainer():
    with pytest.raises(ValueError, match="set trainer: script"):
        make_spec(entry={"framework": "torchtune"})
    with pytest.raises(ValueError, match="framework frenzy is the built-in trainer"):
        make_spec(entry={"trainer": "script", "script": "t.py", "framework": "frenzy"})


def test_an_hf_trainer_script_gets_only_plans_it_can_run():
    """fsbatch's decision for an HF Trainer script: no tensor, pipeline or cross-type plan among the chosen
    allocation and its alternatives (the built-in trainer's job on the same cluster may use pipelines)."""
    from frenzy_slurm.sim.synthetic import synthetic

    view = synthetic(LOCAL)
    spec = script(
        "hf-trainer", model={"preset": "llama-2-7b"}, training={"seq_len": 2048, "global_batch": 64, "steps": 50}
    )
    d = plan(spec, view)
    allocs = [d.chosen, *(a.allocation for a in d.alternatives if a.allocation is not None)]
    assert len(allocs) > 1
    for alloc in allocs:
        assert alloc.kind == "homogeneous" and alloc.plan.tp == 1 and alloc.plan.pp == 1


def test_pinned_plan_names_one_plan_or_says_what_to_pin():
    spec = script(
        "torchtitan",
        training={
            "seq_len": 1024,
            "global_batch": 16,
            "steps": 1,
            "micro_batch": 2,
            "activation_checkpointing": "full",
        },
        parallel={"sharding": "full-shard", "tp": 2, "pp": 1},
    )
    w = workload_from_spec(spec, resolve_model(spec, "."))
    assert pinned_plan(spec, w, 8) == ParallelPlan(
        dp=4,
        tp=2,
        zero=3,
        micro_batch=2,
        grad_accum=2,
        recompute="full",
        sequence_parallel=True,
        layer_balance="middle",  # torchtitan's split (generate_split_points)
    )
    with pytest.raises(InputError, match="pin parallel.sharding"):
        pinned_plan(script("torchtitan"), w, 8)
    # hybrid-shard without a shard_group shards within a node: the GPUs per node the search is given
    hsdp = script(
        "torch",
        training={
            "seq_len": 1024,
            "global_batch": 32,
            "steps": 1,
            "micro_batch": 1,
            "activation_checkpointing": "full",
        },
        parallel={"sharding": "hybrid-shard", "tp": 1, "pp": 1},
    )
    wh = workload_from_spec(hsdp, resolve_model(hsdp, "."))
    space = search_space_from_spec(hsdp)
    assert {(g.dp, dict(g.pinned)["shard_group"]) for g in plan_groups(wh, 16, 32, space, gpus_per_node=4)} == {(16, 4)}
    assert {(g.dp, dict(g.pinned)["shard_group"]) for g in plan_groups(wh, 2, 32, space, gpus_per_node=4)} == {(2, 2)}


def _dev_rows():
    if not DEV.exists():
        pytest.skip(f"{DEV} is not here (the shared data set)")
    from frenzy_slurm.eval.dataset import RowError, interpret_row, read_measurements

    for row in read_measurements(DEV):
        try:
            if math.isfinite(row.measured_gib) and row.measured_gib > 0:
                yield row, interpret_row(row)
        except RowError:
            continue


def test_a_benchmark_row_is_a_model_yaml_and_fsbatch_predicts_it_the_same(tmp_path):
    """Each interpreted dev row's spec saved as model.yaml and estimated by `frenzy-slurm memory --world` gives the
    benchmark's number (allocated and reserved rows: the device context is the measurement's stack, not the spec's)."""
    from frenzy_slurm.cli.admin import main

    checked = 0
    for row, it in _dev_rows():
        path = tmp_path / f"{row.row_id}.yaml"
        path.write_text(yaml.safe_dump(it.spec.model_dump(mode="json", exclude_defaults=True), sort_keys=False))
        again = load_job_spec(path)
        assert again == it.spec
        assert it.spec.model.arch is not None
        assert workload_from_spec(again, ResolvedModel(arch=it.spec.model.arch, name=row.model)) == it.workload
        if it.metric == "device" or checked >= 6:
            continue
        res = CliRunner().invoke(
            main, ["memory", str(path), "--world", str(it.plan.world), "--metric", it.metric, "--json"]
        )
        assert res.exit_code == 0, res.output
        product = json.loads(res.stdout)["peak_gib"]
        bench = estimate_memory(it.workload, it.plan, it.metric, it.overheads).peak_gib
        assert product == pytest.approx(bench, rel=1e-9), row.row_id
        checked += 1
    assert checked == 6


def frozen_predictions() -> dict:
    """Today's predictions for every dev row, grid point and this file's model.yaml variations at a few plans (what
    tests/data/marp_frozen.json holds): a restructuring of the memory model must keep them where nothing was meant
    to change."""
    from frenzy_slurm.eval.grid import load_grid, predict

    out: dict = {"dev_rows": {}, "grid": {}, "examples": {}}
    if DEV.exists():
        for row, it in _dev_rows():
            out["dev_rows"][row.row_id] = estimate_memory(it.workload, it.plan, it.metric, it.overheads).peak
    for point in load_grid(ROOT / "benchmarks" / "data" / "cpu_memory_grid.json"):
        for g in predict(point):
            out["grid"][f"{g.point}/{g.stage}"] = g.predicted
    plans = [
        ParallelPlan(dp=1, micro_batch=1),
        ParallelPlan(dp=8, zero=1, micro_batch=2, grad_accum=4),
        ParallelPlan(dp=4, zero=3, micro_batch=1, recompute="full"),
        ParallelPlan(dp=2, pp=2, zero=1, micro_batch=1, grad_accum=8),
    ]
    for name, over in [("hf-trainer", {}), *VARIATIONS]:
        spec = script("hf-trainer", **over)
        w = workload_from_spec(spec, resolve_model(spec, "."))
        for p in plans:
            for metric in ("allocated", "reserved"):
                out["examples"][f"{name}/{p.short()}/{metric}"] = estimate_memory(w, p, metric).peak
    return out


def test_predictions_stay_frozen():
    """Regenerate after a deliberate change: python -c 'import json, tests.test_marp_frameworks as t;
    print(json.dumps(t.frozen_predictions(), indent=1, sort_keys=True))' > tests/data/marp_frozen.json"""
    frozen = json.loads(FROZEN.read_text())
    now = frozen_predictions()
    for part in ("grid", "examples", "dev_rows"):
        if part == "dev_rows" and not now["dev_rows"]:
            continue  # the shared data set is not here
        assert now[part].keys() == frozen[part].keys(), part
        changed = {
            k: (frozen[part][k], v) for k, v in now[part].items() if v != pytest.approx(frozen[part][k], rel=1e-9)
        }
        assert not changed, f"{part}: {len(changed)} predictions changed, e.g. {list(changed.items())[:3]}"


def test_explain_says_which_profile_and_defaults():
    s = profile_summary(script("torchtune", training__method="lora"))
    assert s["framework"] == "torchtune" and "0.3" in str(s["describes"])
    assert s["defaults_taken"]["training.loss_chunks"] == 8
    assert s["defaults_taken"]["training.lora.dropout"] == 0.0
    stated = profile_summary(script("torchtune", training__loss_chunks=1))
    assert "training.loss_chunks" not in stated["defaults_taken"]


def test_fsbatch_explain_and_json_name_the_profile(tmp_path):
    """`fsbatch --explain` prints the framework profile and the defaults it took; --json carries the same."""
    from frenzy_slurm.cli.fsbatch import main

    spec = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(spec))
    common = [
        str(path),
        "--dry-run",
        "--backend",
        "static",
        "--snapshot",
        str(ROOT / "examples" / "offline" / "cluster.json"),
        "--site",
        str(ROOT / "site_configs" / "devcluster-cpu.yaml"),
    ]
    out = CliRunner().invoke(main, [*common, "--json"])
    assert out.exit_code == 0, out.output
    framework = json.loads(out.stdout)["framework"]
    assert framework["framework"] == "frenzy" and framework["defaults_taken"]["training.loss_chunks"] == 1
    shown = CliRunner().invoke(main, [*common, "--explain"])
    assert shown.exit_code == 0 and "framework: frenzy (frenzy-slurm's built-in DeepSpeed trainer" in shown.output


def test_the_accuracy_benchmark_counts_a_category_it_has_no_goal_for(tmp_path):
    """A category label the summary has no goal for is counted in the class its training method gives (full or
    adapters), never left out of every class."""
    import csv
    import subprocess
    import sys

    if not DEV.exists():
        pytest.skip(f"{DEV} is not here (the shared data set)")
    with DEV.open(newline="") as fh:
        reader = csv.DictReader(fh)
        first = next(reader)
        fields = reader.fieldnames
    path = tmp_path / "rows.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerow(first | {"category": "continued pretraining"})
    out = tmp_path / "o.json"
    res = subprocess.run(
        [sys.executable, "benchmarks/marp_accuracy.py", "--data", str(path), "--json", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["by_class"]["full"]["rows"] == 1 and summary["by_class"]["lora/qlora"]["rows"] == 0


def test_a_fused_linear_loss_keeps_no_logits_and_makes_the_head_gradient_in_the_forward():
    """Liger's fused linear cross-entropy (liger_kernel/ops/fused_linear_cross_entropy.py) on Llama-3-8B, bf16,
    4k tokens: no logits (the 128k-vocab logits are 1 GiB in bf16 and their fp32 tensors 2 GiB each), one chunk of
    next_power_of_2(ceil(4096 / ceil(128256 / 4096))) = 128 rows of logits, the hidden states' gradient, and the
    head's weight gradient from the loss on."""
    from frenzy_slurm.marp.memory import _fused_linear_loss_bytes, _job

    over = {"model": {"preset": "llama-3-8b"}, "training__seq_len": 4096, "training__global_batch": 8}
    plain = make_spec(**over)
    fused = make_spec(**over, training__fused_linear_loss=True)
    plan_ = ParallelPlan(dp=8, zero=3, micro_batch=1, grad_accum=1, recompute="full")
    w_fused = workload_from_spec(fused, resolve_model(fused, "."))
    tensors, grads = _fused_linear_loss_bytes(_job(w_fused, plan_), 5.0)
    assert tensors == 128 * 128256 * 2 + 4096 * 4096 * 2 and grads == 5.0
    e_plain = estimate_memory(workload_from_spec(plain, resolve_model(plain, ".")), plan_, "allocated")
    e_fused = estimate_memory(w_fused, plan_, "allocated")
    assert e_plain.stages[-1].logits > 3 * GiB  # 16-bit logits and two fp32 tensors of the 128k vocabulary
    assert e_fused.stages[-1].logits < 0.2 * GiB
    # the loss no longer makes the peak: it moves to the optimizer step, 1.4 GiB lower here
    assert e_plain.stages[-1].phase == "backward-start" and e_fused.stages[-1].phase == "optimizer-step"
    assert e_fused.peak < e_plain.peak - GiB


def test_fsdp_cpu_offload_moves_the_parameters_with_the_optimizer():
    # FSDP's CPUOffload(offload_params=True) is its one offload switch, and the rendered run turns it on for either
    # setting (runtime/framework_argv.py): the optimizer alone is never offloaded under FSDP
    fsdp = script("torch", parallel={"sharding": "full-shard", "offload_optimizer": True})
    space = search_space_from_spec(fsdp)
    assert space.pinned["offload_params"] is True
    assert "parallel.offload_params" in profile_summary(fsdp)["defaults_taken"]
    # DeepSpeed's ZeRO offloads the optimizer alone (hf-trainer's ZeRO names run DeepSpeed's engine)
    zero = script("hf-trainer", parallel={"sharding": "zero3", "offload_optimizer": True})
    assert search_space_from_spec(zero).pinned["offload_params"] is False
    assert "parallel.offload_params" not in profile_summary(zero)["defaults_taken"]
    with pytest.raises(InputError, match="shard-grad-op: FSDP's CPU offload moves the parameters too"):
        search_space_from_spec(script("torch", parallel={"sharding": "shard-grad-op", "offload_optimizer": True}))


def test_deepspeeds_16_bit_engine_computes_the_loss_as_the_model_code_does():
    # DeepSpeed's fp16/bf16 engine casts the module and runs no autocast: the logits reach the loss in 16 bits and
    # are upcast only where the model code does (entry.loss_upcast, a current Transformers' loss by default)
    model = ResolvedModel(arch=resolve_model(script("deepspeed"), Path(".")).arch, name="m")
    entry = {"trainer": "script", "script": "t.py", "framework": "deepspeed"}
    upcast = workload_from_spec(script("deepspeed", training__precision="fp16-mixed"), model)
    assert upcast.loss.loss_fp32
    as_returned = script("deepspeed", training__precision="fp16-mixed", entry=entry | {"loss_upcast": False})
    assert not workload_from_spec(as_returned, model).loss.loss_fp32
    search_space_from_spec(as_returned)  # a setting that takes effect is accepted
    # under autocast the loss is fp32 whatever the model code does: a loss_upcast there would be dropped
    fsdp = script(
        "hf-trainer",
        training__precision="bf16-mixed",
        entry={"trainer": "script", "script": "t.py", "framework": "hf-trainer", "loss_upcast": False},
    )
    with pytest.raises(InputError, match="entry.loss_upcast: false: with training.precision bf16-mixed under"):
        search_space_from_spec(fsdp)


@pytest.mark.parametrize(
    ("preset", "release", "upcast"),
    [
        ("gpt2-medium", None, True),  # a current transformers: ForCausalLMLoss upcasts every causal LM
        ("gpt2-medium", "4.25", False),  # GPT-2's own CrossEntropyLoss on its 16-bit logits
        ("gpt2-medium", "4.48", False),
        ("gpt2-medium", "4.49", True),  # GPT-2 calls self.loss_function from 4.49.0
        ("llama-3.2-1b", "4.30", False),
        ("llama-3.2-1b", "4.31", True),  # LlamaForCausalLM: logits = logits.float() from 4.31.0
    ],
)
def test_hf_model_codes_loss_upcast_follows_its_transformers_release(preset, release, upcast):
    # DeepSpeed's fp16 engine runs the module in 16 bits, so the loss is what the Hugging Face class computes
    entry = {"trainer": "script", "script": "t.py", "framework": "deepspeed"}
    if release:
        entry["transformers_version"] = release
    spec = script("deepspeed", training__precision="fp16-mixed", entry=entry, model={"preset": preset})
    model = ResolvedModel(arch=resolve_model(spec, Path(".")).arch, name="m")
    w = workload_from_spec(spec, model)
    assert w.loss.loss_fp32 is upcast
    search_space_from_spec(spec)  # accepted: it takes effect
    # three vocabulary-sized tensors of the unchunked loss, at 4 or 2 bytes per logit element
    per_token = w.arch.vocab * (3 * (4 if upcast else 2))
    from frenzy_slurm.marp.memory_loss import logit_bytes_per_token

    assert logit_bytes_per_token(w, 1) == pytest.approx(per_token)


def test_transformers_version_is_refused_where_nothing_reads_it():
    hf = script(
        "hf-trainer",
        entry={"trainer": "script", "script": "t.py", "framework": "hf-trainer", "transformers_version": "4.40"},
    )
    with pytest.raises(InputError, match="write entry.framework_version: '4.40' instead"):
        search_space_from_spec(hf)
    titan = script(
        "torchtitan",
        entry={"trainer": "script", "script": "t.py", "framework": "torchtitan", "transformers_version": "4.40"},
    )
    with pytest.raises(InputError, match="entry.transformers_version: 4.40: the job runs torchtitan model code"):
        search_space_from_spec(titan)
