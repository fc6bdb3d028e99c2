"""Sweeps: `fsbatch --set KEY=V1,V2`, and fs.sweep, planned offline (the static example cluster)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from frenzy_slurm.core.errors import InputError

from .helpers import EXAMPLES, ROOT

OFFLINE = ["--backend", "static", "--snapshot", str(EXAMPLES / "offline" / "cluster.json")]
SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = EXAMPLES / "tiny-cpu.yaml"


@pytest.fixture(autouse=True)
def jobs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    return tmp_path / "jobs"


def fsbatch(*args: str):
    from frenzy_slurm.cli.fsbatch import main

    return CliRunner().invoke(main, [str(TINY), "--site", str(SITE), *OFFLINE, *args])


def test_combinations_are_the_cartesian_product_in_flag_order():
    from frenzy_slurm.jobspec.sweeps import combinations, parse_set

    combos = combinations(parse_set(["training.learning_rate=1e-4,3e-4", "training.seq_len=32, 64"]))
    assert [c.overrides for c in combos] == [
        {"training.learning_rate": "1e-4", "training.seq_len": 32},
        {"training.learning_rate": "1e-4", "training.seq_len": 64},
        {"training.learning_rate": "3e-4", "training.seq_len": 32},
        {"training.learning_rate": "3e-4", "training.seq_len": 64},
    ]
    assert [c.name("tiny") for c in combos] == ["tiny_1e-4_32", "tiny_1e-4_64", "tiny_3e-4_32", "tiny_3e-4_64"]
    assert combos[1].label() == "training.learning_rate=1e-4 training.seq_len=64"
    (single,) = combinations(parse_set(["training.steps=3"]))
    assert single.name("tiny") is None  # one value overrides; the name stays the file's


def test_names_stay_valid_job_names():
    from frenzy_slurm.jobspec.job import JobSpec
    from frenzy_slurm.jobspec.sweeps import combinations, parse_set

    pattern = JobSpec.model_fields["name"].metadata[0].pattern
    combos = combinations(parse_set(["slurm.constraint=a/b c,x" + "y" * 80]))
    names = [c.name("tiny-cpu") for c in combos]
    assert names[0] == "tiny-cpu_a-b-c" and names[1] == "tiny-cpu_1" and len(set(names)) == 2
    import re

    assert all(re.fullmatch(pattern, n) for n in names)


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (["training.steps"], "write KEY=VALUE"),
        (["training.steps=1,,2"], "an empty value"),
        (["training.steps=1,1"], "a value is given twice"),
        (["training.steps=1", "training.steps=2"], "is given twice"),
        (
            [f"training.steps={','.join(map(str, range(1, 17)))}", f"training.seq_len={','.join(map(str, range(17)))}"],
            "16 (training.steps) x 17 (training.seq_len) = 272 combinations, more than 256",
        ),
    ],
)
def test_bad_set_flags_are_refused(flags, why):
    from frenzy_slurm.jobspec.sweeps import combinations, parse_set

    with pytest.raises(InputError, match=why.replace("(", r"\(").replace(")", r"\)")):
        combinations(parse_set(flags))


def test_fsbatch_sweep_dry_run_json_lists_every_combination(jobs_dir):
    res = fsbatch("--set", "training.learning_rate=1e-4,3e-4", "--set", "training.seq_len=32,64", "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert [o["job"] for o in out] == ["tiny-cpu_1e-4_32", "tiny-cpu_1e-4_64", "tiny-cpu_3e-4_32", "tiny-cpu_3e-4_64"]
    assert len({o["job_dir"] for o in out}) == 4 and len({o["submission"] for o in out}) == 4
    assert out[3]["overrides"] == {"training.learning_rate": "3e-4", "training.seq_len": 64}
    assert all(o["dry_run"] and "#SBATCH --job-name=" in o["script"] for o in out)
    assert "--job-name=tiny-cpu_3e-4_64\n" in out[3]["script"]
    assert not jobs_dir.exists()


def test_fsbatch_sweep_dry_run_prints_each_plan(jobs_dir):
    res = fsbatch("--set", "training.steps=3,4", "--dry-run")
    assert res.exit_code == 0, res.stderr
    assert res.stdout.count("=== tiny-cpu_") == 2 and "=== tiny-cpu_4: training.steps=4" in res.stdout
    assert res.stdout.count("(not submitted) ---") == 2


def test_fsbatch_single_set_overrides_without_renaming(jobs_dir):
    res = fsbatch("--set", "training.steps=3", "--dry-run", "--json")
    assert res.exit_code == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["job"] == "tiny-cpu" and out["overrides"] == {"training.steps": 3}


@pytest.mark.parametrize(
    ("flag", "why"),
    [
        ("training.learning_rat=1e-4", "--set training.learning_rat=1e-4: training.learning_rat: unknown field"),
        ("training.learning_rate=fast", "--set training.learning_rate=fast: training.learning_rate: Input should be"),
        ("training.learning_rate=inf", "--set training.learning_rate=inf: training.learning_rate:"),
        ("name.first=x", "has a value, not a section, at name"),
        ("training.$x=1", "not a field path"),
    ],
)
def test_fsbatch_bad_set_exits_2_naming_it(flag, why):
    res = fsbatch("--set", flag, "--dry-run")
    assert res.exit_code == 2 and why in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


def test_sweep_refuses_a_job_dir(tmp_path):
    res = fsbatch("--set", "training.steps=3,4", "--dry-run", "--job-dir", str(tmp_path / "one"))
    assert res.exit_code == 2 and "--job-dir names one job's directory" in res.stderr


def test_api_sweep_plans_each_combination():
    import frenzy_slurm as fs

    plans = fs.sweep(TINY, {"training.seq_len": [32, 64]}, site=SITE, backend="static", snapshot=OFFLINE[3])
    assert [p.name for p in plans] == ["tiny-cpu_32", "tiny-cpu_64"]
    assert [p.request.plan.spec.training.seq_len for p in plans] == [32, 64]
    assert plans[1].label == "training.seq_len=64" and plans[0].job_dir != plans[1].job_dir
    with pytest.raises(InputError, match="give a non-empty list"):
        fs.sweep(TINY, {"training.seq_len": 32}, site=SITE, backend="static", snapshot=OFFLINE[3])
