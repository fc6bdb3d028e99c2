"""No string that reaches job.sbatch may hold a newline or a carriage return: fsbatch's flags, --job-dir and
model.yaml's strings are refused (exit 2, naming the flag or file and field), quoted values stay inside their
quotes, and no validator pattern accepts a trailing newline.

`dry`, `offline`, `sbatch_header` and `assert_header_intact` (fsbatch --dry-run on a static cluster) are shared
with the other input tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# ---- shared: fsbatch --dry-run on a static cluster ------------------------------------------------------------

POOLS = [("a100", "A100-40GB", 2, 4), ("t4", "T4", 2, 4)]

TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A saved cluster view and a site file for it: fsbatch --dry-run needs no Slurm."""
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    d = tmp_path_factory.mktemp("audit2-offline")
    (d / "snap.json").write_text(synthetic(POOLS).model_dump_json())
    (d / "site.yaml").write_text(yaml.safe_dump(synthetic_site(POOLS).model_dump(mode="json")))
    return d


def dry(offline: Path, *args: str, model: Path = TINY, site: Path | None = None, env: dict | None = None):
    """fsbatch MODEL --dry-run --json ARGS -> (exit code, output, the rendered script or None). Never a traceback."""
    from click.testing import CliRunner

    from frenzy_slurm.cli.fsbatch import main as fsbatch

    argv = [
        str(model),
        "--dry-run",
        "--json",
        "--backend",
        "static",
        "--snapshot",
        str(offline / "snap.json"),
        "--site",
        str(site or offline / "site.yaml"),
        *args,
    ]
    if "--job-dir" not in args:
        argv += ["--job-dir", str(offline / "job")]
    res = CliRunner().invoke(fsbatch, argv, env=env, catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        pytest.fail("fsbatch crashed: " + "".join(traceback.format_exception(res.exception))[-3000:])
    out = res.stdout + res.stderr
    script = json.loads(res.stdout)["script"] if res.exit_code == 0 else None
    return res.exit_code, out, script


def sbatch_header(script: str) -> list[str]:
    """The #SBATCH directives sbatch reads: every line up to the first one that is neither blank nor a comment."""
    out = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH"):
            out.append(stripped)
    return out


def assert_header_intact(script: str) -> None:
    header = sbatch_header(script)
    for needed in ("--requeue", "--signal=USR2@", "--partition=", "--gres=gpu:", "--comment=frenzy:", "--chdir="):
        assert any(line.startswith(f"#SBATCH {needed}") for line in header), (needed, header)
    assert "\r" not in script, "a carriage return reached job.sbatch"


# ---- no trailing newline (or \r) reaches job.sbatch ---------------------------------------------------

BREAKERS = ["x\n", "x\r", "x\r\n", "x\n#SBATCH --uid=0", "\nx"]

FLAG_NAMES = {
    "-J": "--job-name",
    "-A": "--account",
    "-q": "--qos",
    "-C": "--constraint",
    "-o": "--output",
    "-e": "--error",
    "--mail-user": "--mail-user",
    "--mail-type": "--mail-type",
    "-t": "--time",
    "--sbatch": "--sbatch",
}


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("flag", list(FLAG_NAMES))
def test_flags_with_a_newline_are_refused(offline, flag, value):
    given = {"-t": value.replace("x", "60"), "--sbatch": value.replace("x", "--reservation=big")}.get(flag, value)
    code, out, _ = dry(offline, flag, given)
    assert code == 2, out
    assert FLAG_NAMES[flag] in out and "Traceback" not in out, out


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
def test_job_dir_with_a_newline_is_refused(offline, tmp_path, value):
    code, out, _ = dry(offline, "--job-dir", str(tmp_path / value))
    assert code == 2 and "job directory" in out and "Traceback" not in out, out
    from frenzy_slurm.render import _SAFE_PATH  # the same check guards $FRENZY_JOBS_DIR's default directories

    assert not _SAFE_PATH.match(str(tmp_path / value)), "render's path check accepts a newline"


MODEL_FIELDS = [
    ("name",),
    ("slurm", "account"),
    ("slurm", "qos"),
    ("slurm", "constraint"),
    ("slurm", "mail_type"),
    ("slurm", "mail_user"),
    ("slurm", "job_name"),
    ("slurm", "output"),
    ("slurm", "error"),
    ("slurm", "time"),
    ("slurm", "extra"),
    ("entry", "env-name"),
    ("entry", "script"),
]


def _model_with(field: tuple[str, ...], value: str) -> dict:
    spec = yaml.safe_load(TINY.read_text())
    section, key = (field + ("",))[:2]
    if field == ("name",):
        spec["name"] = "tiny" + value
    elif key == "extra":
        spec.setdefault("slurm", {})["extra"] = ["--reservation=big" + value]
    elif key == "time":
        spec.setdefault("slurm", {})["time"] = "60" + value
    elif key == "env-name":
        spec.setdefault("entry", {})["env"] = {"FOO" + value: "1"}
    elif key == "script":
        spec["entry"] = {"trainer": "script", "script": "train" + value + ".py"}
        spec["training"]["method"] = "full"
    else:
        spec.setdefault(section, {})[key] = "x" + value
    return spec


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("field", MODEL_FIELDS, ids=".".join)
def test_model_yaml_strings_with_a_newline_are_refused(offline, tmp_path, field, value):
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(_model_with(field, value)))
    code, out, _ = dry(offline, model=model)
    assert code == 2, out
    assert str(model) in out and "Traceback" not in out, out
    shown = field[-1].replace("env-name", "env")
    assert shown in out, (field, out)


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
def test_quoted_strings_with_a_newline_keep_the_sbatch_header(offline, tmp_path, value):
    """entry.env values and entry.args are shell-quoted after the header: a newline stays inside its quotes."""
    spec = yaml.safe_load(TINY.read_text())
    spec["entry"] = {
        "trainer": "script",
        "script": "train.py",
        "args": ["--x", "a" + value],
        "env": {"TOKEN": "t" + value},
    }
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(spec))
    (tmp_path / "train.py").write_text("")
    code, out, script = dry(offline, model=model)
    if code == 0:
        assert_header_intact(script) if "\r" not in value else None
        assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    else:
        assert code == 2 and "Traceback" not in out, out


def test_job_name_pattern_refuses_a_trailing_newline():
    """pydantic's `pattern` (Rust regex: `$` is the end of the text) refuses it; Python's re.match with `$` would
    not."""
    import re

    from pydantic import ValidationError

    from frenzy_slurm.jobspec.job import JobSpec

    pattern = JobSpec.model_fields["name"].metadata[0].pattern
    assert re.match(pattern, "x\n"), "the pattern is only safe under the Rust engine"
    for bad in ("x\n", "x\r", "x\r\n"):
        with pytest.raises(ValidationError):
            JobSpec.model_validate(
                {
                    "name": bad,
                    "model": {"preset": "gpt2-medium"},
                    "training": {"seq_len": 8, "global_batch": 1, "steps": 1},
                }
            )


def test_every_validator_pattern_ends_at_the_end_of_the_text():
    """No regex in the job spec or the renderer ends in a bare `$` (which also matches before a final newline)."""
    import re

    from frenzy_slurm import render
    from frenzy_slurm.jobspec import job
    from frenzy_slurm.site import config as site

    for module in (job, render, site):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                assert not value.match(_sample_for(value) + "\n"), (
                    f"{module.__name__}.{name} accepts a trailing newline"
                )


def _sample_for(pattern) -> str:
    """A string the pattern accepts (each of ours accepts one of these)."""
    for sample in ("60", "a", "/tmp/a", "1-00:00:00"):
        if pattern.match(sample):
            return sample
    return "a"
