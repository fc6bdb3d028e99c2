"""Job arrays are refused everywhere they could reach sbatch: both tasks of `--sbatch=--array=0-1` ran the same plan
in one job directory and wrote over each other's metrics and checkpoints. A sweep (`--set`, `--max-running`) is
the way to run many jobs."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.jobspec.sbatch_env import check_sbatch_env
from frenzy_slurm.jobspec.sbatch_flags import refuse_sbatch_flag

from .helpers import EXAMPLES, ROOT

OFFLINE = ["--backend", "static", "--snapshot", str(EXAMPLES / "offline" / "cluster.json")]
SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = EXAMPLES / "tiny-cpu.yaml"


@pytest.mark.parametrize(
    ("flag", "spelled"),
    [
        ("--array=0-1", "--array is refused"),
        ("--array 0-3%2", "--array is refused"),
        ("--arr=0-1", "--arr (sbatch reads it as --array) is refused"),
        ("-a 0-1", "-a (sbatch reads -a as --array) is refused"),
        ("-a0-1", "-a0-1 (sbatch reads -a as --array) is refused"),
        ("-va1", "-va1 (sbatch reads -a as --array) is refused"),
        ("--reservation=big --array=1,2", "--array is refused"),
    ],
)
def test_every_spelling_of_array_is_refused_naming_the_sweep(flag, spelled):
    why = refuse_sbatch_flag(flag)
    assert why is not None and why.startswith(spelled), why
    assert "--set" in why and "--max-running" in why and "one job directory" in why


def test_slurm_extra_and_the_api_refuse_arrays():
    with pytest.raises(ValueError, match="--array is refused"):
        SlurmOptions(extra=["--array=0-7"])


@pytest.mark.parametrize("variable", ["SBATCH_ARRAY_INX", "SBATCH_ARRAY"])
def test_array_variables_are_refused(variable):
    with pytest.raises(InputError) as err:
        check_sbatch_env(SlurmOptions(), {variable: "0-1", "SBATCH_MEM_BIND": "local"})
    msg = err.value.message
    assert err.value.exit_code == EXIT_BAD_INPUT
    assert f"{variable}='0-1' asks sbatch for a job array" in msg and "--max-running" in msg
    assert f"`unset {variable}`" in msg and "SBATCH_MEM_BIND" not in msg


def fsbatch(tmp_path, monkeypatch, spec, *args: str, env: dict[str, str] | None = None):
    from frenzy_slurm.cli.fsbatch import main

    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    for name, value in (env or {}).items():
        monkeypatch.setenv(name, value)
    return CliRunner().invoke(main, [str(spec), "--site", str(SITE), *OFFLINE, "--dry-run", *args])


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["--sbatch=--array=0-1"], {}, "--array is refused"),
        (["--sbatch", "-a 0-1"], {}, "sbatch reads -a as --array"),
        ([], {"SBATCH_ARRAY_INX": "0-1"}, "SBATCH_ARRAY_INX='0-1' asks sbatch for a job array"),
        ([], {"SBATCH_ARRAY": "0-1"}, "SBATCH_ARRAY='0-1' asks sbatch for a job array"),
    ],
)
def test_fsbatch_exits_2_on_an_array(tmp_path, monkeypatch, args, env, said):
    res = fsbatch(tmp_path, monkeypatch, TINY, *args, env=env)
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    assert said in res.output and "--max-running" in res.output
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_model_yaml_slurm_extra_array_exits_2(tmp_path, monkeypatch):
    data = yaml.safe_load(TINY.read_text())
    data.setdefault("slurm", {})["extra"] = ["--array=0-1%1"]
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(data))
    res = fsbatch(tmp_path, monkeypatch, spec)
    assert res.exit_code == EXIT_BAD_INPUT, res.output
    assert "slurm.extra" in res.output and "--array is refused" in res.output


@pytest.mark.parametrize(
    ("words", "found"),
    [
        (["--array=0-3"], "--array=0-3"),
        (["--arr", "0-3"], "--arr"),
        (["-va1"], "-va1"),
        (["--partition", "-a"], None),  # -a is --partition's value here, as getopt reads it
        (["-p", "x", "-a", "1"], "-a"),
        (["--exclusive"], None),
        (["--nodes=1"], None),
    ],
)
def test_array_is_found_in_a_line_as_sbatch_reads_it(words, found):
    from frenzy_slurm.jobspec.sbatch_flags import asks_for_array

    assert asks_for_array(words) == found


def test_a_template_asking_for_an_array_is_refused(tmp_path):
    """A --templates file may write any #SBATCH line; the rendered script is read for arrays as sbatch reads it."""
    from frenzy_slurm.sim.synthetic import synthetic

    from .helpers import LOCAL, make_spec
    from .test_render import rendered

    templates = tmp_path / "templates"
    templates.mkdir()
    shipped = (ROOT / "templates" / "_component.j2").read_text()
    (templates / "_component.j2").write_text(shipped + "#SBATCH -a 0-1%1\n")
    with pytest.raises(InputError) as err:
        rendered(make_spec(), synthetic(LOCAL), template_dir=templates)
    assert "'#SBATCH -a 0-1%1' asks sbatch for a job array (-a)" in err.value.message
    assert "--max-running" in err.value.message
    # an entry.env value may hold newlines (shell-quoted after the #SBATCH block, where sbatch reads no options)
    spec = make_spec(entry={"env": {"NOTE": "a\n#SBATCH --array=0-1"}})
    req = rendered(spec, synthetic(LOCAL))
    assert "\n#SBATCH --array=0-1'" in req.script
