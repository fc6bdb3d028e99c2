"""A user's SBATCH_* environment against the plan (sbatch gives it precedence over the script's #SBATCH
lines): a variable that sets what the plan sets is refused naming the fix (all conflicts in one message, exit 2
from fsbatch), any other is honoured as a note."""

from __future__ import annotations

import os

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, make_spec, run_cli
from .test_render import rendered

# --- a user's SBATCH_* environment (sbatch gives it precedence over the script's #SBATCH lines) ---


@pytest.fixture
def clean_env(monkeypatch):
    """No SBATCH_* variable of the shell running the tests leaks into these."""
    for name in [k for k in os.environ if k.startswith("SBATCH_")]:
        monkeypatch.delenv(name)
    return monkeypatch


def test_sbatch_partition_is_refused_naming_the_fix(clean_env):
    clean_env.setenv("SBATCH_PARTITION", "debug")
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL))
    msg = err.value.message
    assert err.value.exit_code == 2
    assert "SBATCH_PARTITION='debug' would set sbatch --partition over the planned partition" in msg
    assert "`unset SBATCH_PARTITION`" in msg


@pytest.mark.parametrize(
    "name, option",
    [
        ("SBATCH_GRES", "--gres"),
        ("SBATCH_GPUS_PER_NODE", "--gpus-per-node"),
        ("SBATCH_TIMELIMIT", "--time"),
        ("SBATCH_JOB_NAME", "--job-name"),
        ("SBATCH_OUTPUT", "--output"),
        ("SBATCH_ERROR", "--error"),
        ("SBATCH_SIGNAL", "--signal"),
        ("SBATCH_NO_REQUEUE", "--no-requeue"),
        ("SBATCH_OPEN_MODE", "--open-mode"),
        ("SBATCH_CPUS_PER_GPU", "--cpus-per-gpu"),
        ("SBATCH_CONSTRAINT", "--constraint"),
        ("SBATCH_EXCLUSIVE", "--exclusive"),
    ],
)
def test_variables_that_set_what_the_plan_sets_are_refused(clean_env, name, option):
    clean_env.setenv(name, "1")
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL))
    assert f"{name}='1' would set sbatch {option} over" in err.value.message
    assert f"`unset {name}`" in err.value.message


def test_all_conflicts_named_in_one_message(clean_env):
    clean_env.setenv("SBATCH_PARTITION", "debug")
    clean_env.setenv("SBATCH_TIMELIMIT", "10")
    clean_env.setenv("SBATCH_QOS", "high")  # honoured: the plan sets no --qos
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL))
    assert "Unset them (`unset SBATCH_PARTITION SBATCH_TIMELIMIT`)" in err.value.message
    assert "SBATCH_QOS" not in err.value.message


def test_other_variables_are_honoured_as_notes(clean_env):
    clean_env.setenv("SBATCH_ACCOUNT", "proj9")
    clean_env.setenv("SBATCH_QOS", "high")
    clean_env.setenv("SBATCH_MEM_BIND", "local")
    req = rendered(make_spec(), synthetic(LOCAL))
    env_notes = [n for n in req.notes if n.startswith("environment: ")]
    assert env_notes == [
        f"environment: {name}={value!r} is passed to sbatch and honoured (it is not part of the plan)"
        for name, value in [("SBATCH_ACCOUNT", "proj9"), ("SBATCH_MEM_BIND", "local"), ("SBATCH_QOS", "high")]
    ]
    assert req.as_json()["notes"][-3:] == env_notes


def test_account_refused_when_the_plan_sets_one(clean_env):
    clean_env.setenv("SBATCH_ACCOUNT", "proj9")
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL), options=SlurmOptions(account="proj1"))
    assert "SBATCH_ACCOUNT='proj9' would set sbatch --account over the plan's --account=proj1" in err.value.message


def test_no_sbatch_variables_no_notes(clean_env):
    req = rendered(make_spec(), synthetic(LOCAL))
    assert not [n for n in req.notes if n.startswith("environment: ")]


def test_fsbatch_refuses_with_exit_2_and_no_traceback(clean_env, tmp_path):
    """As a user sees it: fsbatch --dry-run (offline snapshot) in a shell with SBATCH_PARTITION set."""
    clean_env.setenv("SBATCH_PARTITION", "debug")
    res = run_cli(
        "fsbatch",
        "examples/llama2-7b.yaml",
        "--dry-run",
        "--backend",
        "static",
        "--snapshot",
        "examples/offline/cluster.json",
        "--site",
        "site_configs/devcluster.yaml",
        "--job-dir",
        str(tmp_path / "job"),
    )
    assert res.returncode == 2, res.stderr
    assert "SBATCH_PARTITION='debug' would set sbatch --partition" in res.stderr
    assert "`unset SBATCH_PARTITION`" in res.stderr
    assert "Traceback" not in res.stderr
