"""Rendering: golden scripts (FRENZY_UPDATE_GOLDEN=1 rewrites them), quoting of hostile values, overrides."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import HOSTILE, LOCAL, fill, make_spec, planned

GOLDEN = Path(__file__).parent / "golden"
JOB_DIR = Path("/scratch/jobs/demo-0001")


def normalize(text: str) -> str:
    text = re.sub(r"frenzy-slurm \S+ at \S+", "frenzy-slurm VERSION at TIME", text)
    text = re.sub(r"\b[0-9a-f]{16}\b", "SUBMISSION", text)  # the hash covers every spec field; tested elsewhere
    return text.replace(sys.executable, "PYTHON")


def rendered(spec, view, options=None, template_dir=None):
    """The request fsbatch would submit (planning.plan_job), in JOB_DIR."""
    return planned(spec, view, JOB_DIR, options=options, templates=template_dir)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("FRENZY_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with FRENZY_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed; if intended, rerun with FRENZY_UPDATE_GOLDEN=1"


def hetero_view():
    return fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})


HETERO_SPEC = dict(
    model={"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
    training={"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
)


def test_golden_homogeneous():
    req = rendered(
        make_spec(slurm={"account": "proj1", "qos": "normal", "extra": ["--reservation=big"]}), synthetic(LOCAL)
    )
    assert req.kind == "homogeneous"
    check_golden("homogeneous.sbatch", normalize(req.script))
    check_golden("homogeneous.ds_config.json", req.files["ds_config.json"])


def test_golden_heterogeneous():
    req = rendered(make_spec(**HETERO_SPEC), hetero_view())
    assert req.kind == "heterogeneous"
    script = normalize(req.script)
    check_golden("heterogeneous.sbatch", script)
    assert script.count("#SBATCH hetjob") == 1
    assert "srun --het-group=0,1 " in script
    assert re.findall(r"#SBATCH --partition=(\S+)", script) == ["v100", "t4"]


def test_ds_config_values():
    req = rendered(
        make_spec(
            training={
                "seq_len": 512,
                "global_batch": 64,
                "steps": 10,
                "precision": "bf16-mixed",
                "optimizer": "adamw",
                "micro_batch": 2,
            }
        ),
        synthetic(LOCAL),
    )
    ds = json.loads(req.files["ds_config.json"])
    plan = req.plan.decision.chosen.plan
    assert ds["train_batch_size"] == 64 == plan.micro_batch * plan.grad_accum * plan.dp
    assert ds["train_micro_batch_size_per_gpu"] == 2
    assert ds["zero_optimization"]["stage"] == plan.zero
    assert ds["bf16"]["enabled"] is True and ds["fp16"]["enabled"] is False
    assert ds["optimizer"]["type"] == "AdamW" and ds["optimizer"]["params"]["torch_adam"] is True
    sgd = rendered(
        make_spec(training={"seq_len": 512, "global_batch": 64, "steps": 10, "optimizer": "sgd"}), synthetic(LOCAL)
    )
    assert "optimizer" not in json.loads(sgd.files["ds_config.json"])  # the runtime builds it


def test_hostile_values_stay_inert(tmp_path):
    spec = make_spec(
        entry={
            "trainer": "script",
            "script": "train.py",
            "args": HOSTILE,
            "env": {"HOSTILE_A": HOSTILE[0], "HOSTILE_B": HOSTILE[3], "HOSTILE_C": HOSTILE[4]},
        }
    )
    req = rendered(spec, synthetic(LOCAL))
    launch = req.script.split("set -uo pipefail", 1)[1]
    # run the script's shell part with srun/scontrol replaced by recorders: what reaches argv must be verbatim
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "srun").write_text(
        "#!/usr/bin/env python3\nimport json, os, sys\n"
        "json.dump({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
        "if k.startswith('HOSTILE')}}, open(os.environ['OUT'], 'w'))\n"
    )
    (bindir / "scontrol").write_text("#!/bin/sh\necho node1\n")
    for f in bindir.iterdir():
        f.chmod(0o755)
    script = tmp_path / "launch.sh"
    script.write_text("#!/bin/bash\n" + launch.replace(str(JOB_DIR), str(tmp_path)))
    env = dict(
        os.environ,
        PATH=f"{bindir}:{os.environ['PATH']}",
        SLURM_JOB_ID="42",
        SLURM_JOB_NODELIST="node1",
        OUT=str(tmp_path / "out.json"),
    )
    res = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["argv"][-len(HOSTILE) :] == HOSTILE
    assert got["env"] == {"HOSTILE_A": HOSTILE[0], "HOSTILE_B": HOSTILE[3], "HOSTILE_C": HOSTILE[4]}
    assert not list(tmp_path.glob("pwned*")), "a hostile value was executed"


@pytest.mark.parametrize(
    "flags,needle",
    [
        ({"account": "a b"}, "--account: 'a b' may use only"),
        ({"qos": "x;y"}, "--qos: 'x;y' may use only"),
        ({"extra": ["--comment=x\n#SBATCH --uid=0"]}, "is not an sbatch flag"),
        ({"extra": ["reservation=x"]}, "must start with '-'"),
        ({"output": "/tmp/a b/%j.out"}, "--output: '/tmp/a b/%j.out' has spaces"),
        ({"job_name": "x$(id)"}, "--job-name: 'x$(id)' may use only"),
    ],
)
def test_sbatch_options_validated(flags, needle):
    """fsbatch's flags over model.yaml's slurm: block, checked before anything reaches a script."""
    with pytest.raises(InputError, match=re.escape(needle)):
        SlurmOptions().overridden(**flags)


def test_sbatch_flags_override_model_yaml():
    merged = SlurmOptions(account="a", qos="q", extra=["--reservation=r"]).overridden(account="b", extra=["--x=1"])
    assert (merged.account, merged.qos, merged.extra) == ("b", "q", ["--reservation=r", "--x=1"])
    assert merged.flags() == ["--account=b", "--qos=q", "--reservation=r", "--x=1"]


def test_template_override_and_strict_undefined(tmp_path):
    (tmp_path / "_header.j2").write_text("#!/bin/bash\n# site header for {{ name }}\n#SBATCH --job-name={{ name }}\n")
    req = rendered(make_spec(), synthetic(LOCAL), template_dir=tmp_path)
    assert req.script.startswith("#!/bin/bash\n# site header for t\n")
    (tmp_path / "_header.j2").write_text("#SBATCH --x={{ no_such_value }}\n")
    with pytest.raises(InputError, match="no_such_value"):
        rendered(make_spec(), synthetic(LOCAL), template_dir=tmp_path)


def test_submission_hash_identity():
    from frenzy_slurm.render import submission_hash

    spec = make_spec()
    model = resolve_model(spec, ".")
    same = submission_hash(spec, model, SlurmOptions())
    assert same == submission_hash(make_spec(), model, SlurmOptions())
    assert same != submission_hash(
        make_spec(training={"seq_len": 512, "global_batch": 64, "steps": 100}), model, SlurmOptions()
    )
    assert same != submission_hash(spec, model, SlurmOptions(account="other"))


def test_templates_ship_as_package_data():
    """Every template is a .j2 file that pyproject's package-data pattern puts into the wheel."""
    import tomllib

    root = Path(__file__).resolve().parent.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "frenzy_slurm"
    ]
    assert "templates/*.j2" in patterns
    names = [p.name for p in (root / "templates").iterdir()]
    assert names and all(n.endswith(".j2") for n in names)
    assert (root / "frenzy_slurm" / "templates").resolve() == (root / "templates").resolve()


def test_ds_config_zero3_states_what_marp_assumes():
    from frenzy_slurm.marp.plan import DeepSpeedBuckets, ParallelPlan
    from frenzy_slurm.render.ds_config import ds_config

    spec = make_spec(training={"seq_len": 512, "global_batch": 64, "steps": 10, "optimizer": "adamw"})
    zero = ds_config(spec, ParallelPlan(dp=2, zero=3, micro_batch=2, grad_accum=16))["zero_optimization"]
    b = DeepSpeedBuckets()
    assert (
        zero["stage3_prefetch_bucket_size"],
        zero["stage3_max_live_parameters"],
        zero["stage3_max_reuse_distance"],
    ) == (b.stage3_prefetch_bucket_size, b.stage3_max_live_parameters, b.stage3_max_reuse_distance)
