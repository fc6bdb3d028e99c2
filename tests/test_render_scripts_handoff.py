"""What a user's script is handed: the DeepSpeed config in its framework's form, the plan as FRENZY_* variables,
`$FRENZY_*` in entry.args expanded by the runtime (not a shell) and checked at plan time."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobdir.scriptenv import KNOWN_NAMES, ArgsError, check_args, expand_args
from frenzy_slurm.marp.plan import ParallelPlan
from frenzy_slurm.render.ds_config import ds_config
from frenzy_slurm.runtime.framework_argv import framework_args
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, make_spec, planned

ROOT = Path(__file__).resolve().parent.parent
TINY = {
    "arch": {"layers": 2, "hidden": 64, "heads": 4, "ffn": 172, "vocab": 256, "max_positions": 128},
}
TRAINING = {"seq_len": 64, "global_batch": 8, "micro_batch": 2, "steps": 5, "precision": "bf16-mixed"}


def script_spec(framework: str | None = "hf-trainer", args: list[str] | None = None, env=None, **over):
    entry = {"trainer": "script", "script": "train.py", "args": args or [], "env": env or {}}
    if framework is not None:
        entry["framework"] = framework
    return make_spec(model=TINY, training=over.pop("training", TRAINING), entry=entry, **over)


def exports(script: str) -> dict[str, str]:
    return dict(re.findall(r"^export (FRENZY_[A-Z_]+)=(\S*)$", script, re.M))


# --- the DeepSpeed config in the framework's form -------------------------------------------------------------


def test_hf_trainer_config_leaves_hf_its_values_and_keeps_the_plan():
    plan = ParallelPlan(dp=2, zero=3, micro_batch=2, grad_accum=2, offload_optimizer=True)
    hf = ds_config(script_spec(), plan)
    assert hf["train_batch_size"] == hf["train_micro_batch_size_per_gpu"] == "auto"
    assert hf["gradient_accumulation_steps"] == hf["gradient_clipping"] == "auto"
    assert hf["bf16"] == {"enabled": "auto"} and hf["fp16"] == {"enabled": "auto"}
    assert {k: hf["optimizer"]["params"][k] for k in ("lr", "betas", "eps", "weight_decay")} == dict.fromkeys(
        ("lr", "betas", "eps", "weight_decay"), "auto"
    )
    zero = hf["zero_optimization"]
    concrete = ds_config(script_spec(framework="deepspeed"), plan)
    assert zero == concrete["zero_optimization"], "what the plan decides stays as the plan has it"
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert isinstance(zero["stage3_max_reuse_distance"], int)
    assert concrete["train_batch_size"] == 8 and concrete["train_micro_batch_size_per_gpu"] == 2


def test_hf_trainer_accepts_the_config_and_the_planned_arguments():
    """Through transformers' own integration: the rendered config with the arguments the plan hands over passes
    HF's mismatch check, and the concrete (DeepSpeed-script) form with different arguments does not."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    spec = script_spec(args=["$FRENZY_FRAMEWORK_ARGS"])
    plan = ParallelPlan(dp=1, zero=2, micro_batch=2, grad_accum=4)
    env = {
        "FRENZY_FRAMEWORK": "hf-trainer",
        "FRENZY_MICRO_BATCH": "2",
        "FRENZY_GRAD_ACCUM": "4",
        "FRENZY_LEARNING_RATE": "0.0003",
        "FRENZY_STEPS": "5",
        "FRENZY_WARMUP_STEPS": "0",
        "FRENZY_SEED": "1234",
        "FRENZY_CHECKPOINT_DIR": "/tmp/unused-ckpt",
        "FRENZY_PRECISION": "fp32",
        "FRENZY_RECOMPUTE": "none",
        "FRENZY_CHECKPOINT_INTERVAL": "0",
    }
    argv = expand_args(spec.entry.args, env, framework_args(env))
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv + ["--use_cpu", "True"])
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.max_steps) == (2, 4, 5)

    class Model:
        class config:  # noqa: N801  # what HF reads: model.config.hidden_size
            hidden_size = 64

    hf = HfTrainerDeepSpeedConfig(ds_config(spec, plan))
    hf.trainer_config_process(args)
    hf.trainer_config_finalize(args, Model(), 5)  # raises on any mismatch
    assert hf.config["train_micro_batch_size_per_gpu"] == 2 and hf.config["gradient_accumulation_steps"] == 4
    assert hf.config["optimizer"]["params"]["lr"] == pytest.approx(3e-4)
    assert hf.config["zero_optimization"]["stage"] == 2

    strict = HfTrainerDeepSpeedConfig(
        ds_config(script_spec(framework="deepspeed"), plan.model_copy(update={"grad_accum": 3}))
    )
    strict.trainer_config_process(args)
    with pytest.raises(ValueError, match="mismatch"):
        strict.trainer_config_finalize(args, Model(), 5)


def test_rendered_job_writes_the_framework_form():
    req = planned(script_spec(), synthetic(LOCAL))
    assert json.loads(req.files["ds_config.json"])["train_batch_size"] == "auto"
    req = planned(script_spec(framework=None), synthetic(LOCAL))  # a script defaults to deepspeed: concrete
    assert json.loads(req.files["ds_config.json"])["train_batch_size"] == 8


# --- the plan as environment variables -------------------------------------------------------------------------


def test_job_sbatch_exports_the_plan_for_a_script():
    req = planned(script_spec(training={**TRAINING, "learning_rate": 0.002, "warmup_steps": 1}), synthetic(LOCAL))
    plan = req.plan.decision.chosen.plan
    env = exports(req.script)
    assert env["FRENZY_FRAMEWORK"] == "hf-trainer"
    assert (env["FRENZY_DP"], env["FRENZY_TP"], env["FRENZY_PP"]) == (str(plan.dp), str(plan.tp), str(plan.pp))
    assert (env["FRENZY_MICRO_BATCH"], env["FRENZY_GRAD_ACCUM"]) == (str(plan.micro_batch), str(plan.grad_accum))
    assert plan.micro_batch * plan.grad_accum * plan.dp == int(env["FRENZY_GLOBAL_BATCH"]) == 8
    assert (env["FRENZY_SEQ_LEN"], env["FRENZY_STEPS"], env["FRENZY_WARMUP_STEPS"]) == ("64", "5", "1")
    assert float(env["FRENZY_LEARNING_RATE"]) == 0.002
    assert env["FRENZY_ZERO"] == str(plan.zero) and env["FRENZY_RECOMPUTE"] == plan.recompute


def test_builtin_trainer_gets_no_plan_variables():
    req = planned(make_spec(model=TINY, training=TRAINING), synthetic(LOCAL))
    assert "FRENZY_MICRO_BATCH" not in exports(req.script)


def test_entry_env_may_not_shadow_the_plan():
    spec = script_spec(env={"FRENZY_MICRO_BATCH": "4", "OMP_NUM_THREADS": "1"})
    with pytest.raises(InputError, match=r"entry\.env sets FRENZY_MICRO_BATCH"):
        planned(spec, synthetic(LOCAL))


# --- $FRENZY_* in entry.args -----------------------------------------------------------------------------------


def test_expansion_is_ours_not_a_shells():
    env = {"FRENZY_DS_CONFIG": "/j/ds_config.json", "FRENZY_MICRO_BATCH": "2"}
    got = expand_args(
        ["--deepspeed", "$FRENZY_DS_CONFIG", "--mb=${FRENZY_MICRO_BATCH}x", "$$FRENZY_DS_CONFIG", "$HOME", "a$b", "$"],
        env,
        [],
    )
    assert got == ["--deepspeed", "/j/ds_config.json", "--mb=2x", "$FRENZY_DS_CONFIG", "$HOME", "a$b", "$"]
    assert expand_args(["$FRENZY_GPU"], {}, []) == [""], "a known name unset (no GPU) is empty"
    assert expand_args(["a", "${FRENZY_FRAMEWORK_ARGS}", "b"], {}, ["--x", "1"]) == ["a", "--x", "1", "b"]


def test_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(ArgsError) as exc:
        check_args(["--config", "$FRENZY_DS_CONFIGG"])
    msg = str(exc.value)
    assert "entry.args[1]" in msg and "$FRENZY_DS_CONFIGG" in msg and "FRENZY_DS_CONFIG," in msg
    with pytest.raises(ArgsError, match="argument of its own"):
        check_args(["--x=$FRENZY_FRAMEWORK_ARGS"])
    check_args(["$$FRENZY_NOPE", "$OTHER"])  # escaped, or not ours: fine


def test_unknown_name_refused_at_plan_time_exit_2(tmp_path):
    (tmp_path / "train.py").write_text("print('hi')\n")
    yaml_text = (ROOT / "examples" / "tiny-cpu.yaml").read_text() + (
        "entry:\n  trainer: script\n  script: train.py\n  args: [--cfg, $FRENZY_NOT_A_NAME]\n"
    )
    (tmp_path / "model.yaml").write_text(yaml_text)
    res = subprocess.run(
        [
            str(ROOT / ".venv" / "bin" / "fsbatch"),
            str(tmp_path / "model.yaml"),
            "--dry-run",
            "--backend",
            "static",
            "--snapshot",
            str(_snapshot(tmp_path)),
            "--site",
            str(ROOT / "site_configs" / "devcluster-cpu.yaml"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert res.returncode == 2, res.stderr
    assert "entry.args[1]" in res.stderr and "$FRENZY_NOT_A_NAME" in res.stderr and "FRENZY_PLAN" in res.stderr


def _snapshot(tmp_path: Path) -> Path:
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL, gres_types={p: p for p, *_ in LOCAL}).model_dump_json())  # the site's GRES
    return snap


def test_every_documented_name_is_known():
    doc = (ROOT / "docs" / "runtime.md").read_text()
    documented = set(re.findall(r"`\$?(FRENZY_[A-Z_]+)", doc))
    assert set(KNOWN_NAMES) <= documented, set(KNOWN_NAMES) - documented


# --- the runtime expands them from the environment it sets -----------------------------------------------------


def test_runtime_expands_args_and_runs_the_named_python(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    script = tmp_path / "train.py"
    script.write_text("import json, sys; print(json.dumps([sys.executable, *sys.argv[1:]]))\n")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "FRENZY_FRAMEWORK": "deepspeed",
        "FRENZY_MICRO_BATCH": "3",
        "FRENZY_JOB_PYTHON": sys.executable,
        "FRENZY_NVML_SAMPLER": "0",
    }
    args = ["--mb", "${FRENZY_MICRO_BATCH}", "$FRENZY_DS_CONFIG", "$$x", "$FRENZY_FRAMEWORK_ARGS"]
    res = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "frenzy_slurm.runtime",
            "--job-dir",
            str(job_dir),
            "--script",
            str(script),
            "--",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    ds = str(job_dir / "ds_config.json")
    assert got == [sys.executable, "--mb", "3", ds, "$x", "--deepspeed_config", ds]


def test_runtime_refuses_an_unknown_name_exit_2(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir(mode=0o700)
    script = tmp_path / "train.py"
    script.write_text("print('must not run')\n")
    res = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "frenzy_slurm.runtime",
            "--job-dir",
            str(job_dir),
            "--script",
            str(script),
            "--",
            "$FRENZY_BOGUS",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    )
    assert res.returncode == 2 and "must not run" not in res.stdout
    assert "$FRENZY_BOGUS" in res.stderr and "Traceback" not in res.stderr


# --- the sharding in the framework's words ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("framework", "pinned", "plan", "want"),
    [
        ("hf-trainer", "auto", ParallelPlan(dp=2, zero=3), "zero3"),
        ("deepspeed", "auto", ParallelPlan(dp=2, zero=2), "zero2"),
        ("torch", "auto", ParallelPlan(dp=2, zero=3), "full-shard"),
        ("torch", "auto", ParallelPlan(dp=2, zero=2), "shard-grad-op"),
        ("torchtitan", "auto", ParallelPlan(dp=4, zero=3, shard_group=2), "hybrid-shard"),
        ("torch", "auto", ParallelPlan(dp=2, zero=0), "none"),
        ("hf-trainer", "full-shard", ParallelPlan(dp=2, zero=3), "full-shard"),
    ],
)
def test_sharding_in_the_frameworks_words(framework, pinned, plan, want):
    from frenzy_slurm.render.script import sharding

    spec = script_spec(framework=framework)
    spec = spec.model_copy(update={"parallel": spec.parallel.model_copy(update={"sharding": pinned})})
    assert sharding(spec, plan) == want


def test_hf_trainer_fsdp_flags_replace_deepspeed():
    pytest.importorskip("transformers")
    from transformers import HfArgumentParser, TrainingArguments

    env = {
        "FRENZY_FRAMEWORK": "hf-trainer",
        "FRENZY_MICRO_BATCH": "1",
        "FRENZY_GRAD_ACCUM": "8",
        "FRENZY_LEARNING_RATE": "0.0001",
        "FRENZY_STEPS": "10",
        "FRENZY_WARMUP_STEPS": "2",
        "FRENZY_SEED": "7",
        "FRENZY_CHECKPOINT_DIR": "/tmp/unused-ckpt",
        "FRENZY_PRECISION": "fp32",
        "FRENZY_RECOMPUTE": "full",
        "FRENZY_CHECKPOINT_INTERVAL": "5",
        "FRENZY_SHARDING": "full-shard",
        "FRENZY_OFFLOAD_PARAMS": "1",
        "FRENZY_DS_CONFIG": "/j/ds_config.json",
    }
    argv = framework_args(env)
    assert "--deepspeed" not in argv
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv + ["--use_cpu", "True"])
    assert args.fsdp is True and args.fsdp_config["cpu_offload"] is True
    assert args.fsdp_config["reshard_after_forward"] is True  # FULL_SHARD in FSDP2 (the default version)
    assert args.gradient_checkpointing and args.save_steps == 5 and args.warmup_steps == 2
    assert argv[argv.index("--fsdp") + 1] == "full_shard auto_wrap offload"
    grad_op = framework_args({**env, "FRENZY_SHARDING": "shard-grad-op", "FRENZY_OFFLOAD_PARAMS": "0"})
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(grad_op + ["--use_cpu", "True"])
    assert args.fsdp_config["reshard_after_forward"] is False and not args.fsdp_config.get("cpu_offload")
    hybrid = framework_args({**env, "FRENZY_SHARDING": "hybrid-shard", "FRENZY_OFFLOAD_PARAMS": "0"})
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(hybrid + ["--use_cpu", "True"])
    assert args.fsdp_config["version"] == 1 and args.fsdp_config["reshard_after_forward"] == "hybrid_shard"
    assert "--deepspeed" in framework_args({**env, "FRENZY_SHARDING": "zero3"})
