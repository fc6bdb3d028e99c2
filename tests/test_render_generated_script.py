"""What reaches job.sbatch: the model.yaml path quoted (refused when it holds a newline), override templates
rendered in jinja2's sandbox (exit 2, never code run), the sbatch flags frenzy-slurm sets never overridden and
the others passed through."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .test_core_input_files import _run, offline  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = ROOT / "examples"

GOOD = (EXAMPLES / "tiny-cpu.yaml").read_text()

# --- generated files: control characters, the template sandbox, the job's tag ---------------------------


def test_newline_in_model_yaml_path_is_refused(tmp_path, offline):
    d = tmp_path / "evil\ntouch pwned\n#"
    d.mkdir()
    path = d / "model.yaml"
    path.write_text(GOOD)
    res = _run("fsbatch", str(path), "--dry-run", *offline, "--job-dir", str(tmp_path / "job"))
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "model.yaml path" in res.stderr and "control character '\\n'" in res.stderr


def test_generated_script_quotes_the_model_yaml_path(tmp_path, offline):
    d = tmp_path / "my models"
    d.mkdir()
    (d / "model.yaml").write_text(GOOD)
    res = _run("fsbatch", str(d / "model.yaml"), "--dry-run", "--json", *offline, "--job-dir", str(tmp_path / "job"))
    assert res.returncode == 0, res.stderr
    script = json.loads(res.stdout)["script"]
    assert f"fsbatch '{d / 'model.yaml'}' --force" in script
    assert "-P -m frenzy_slurm.runtime" in script


@pytest.mark.parametrize(
    "payload",
    [
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{% set x = components.append(1) %}",
        "{{ 'x' * 1000000000 }}",
        "{{ 10 ** 100000000 }}",
        "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
    ],
)
def test_override_templates_render_in_the_sandbox(tmp_path, offline, payload):
    tdir = tmp_path / "templates"
    tdir.mkdir()
    (tdir / "homogeneous.sbatch.j2").write_text("#!/bin/bash\n" + payload + "\n")
    res = _run(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        *offline,
        "--job-dir",
        str(tmp_path / "job"),
        "--templates",
        str(tdir),
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert "template" in res.stderr and "uid=" not in res.stdout


@pytest.mark.parametrize(
    "flag", ["--comment=mine", "--comm=mine", "--chdir=/tmp", "-p a100", "--time=1", "--signal=USR1@10", "--no-requeue"]
)
def test_flags_frenzy_sets_cannot_be_overridden(tmp_path, offline, flag):
    res = _run(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        *offline,
        "--job-dir",
        str(tmp_path / "job"),
        f"--sbatch={flag}",
    )
    assert res.returncode == 2 and "frenzy-slurm sets this itself" in res.stderr, res.stderr


def test_other_flags_pass_through(tmp_path, offline):
    res = _run(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        "--json",
        *offline,
        "--job-dir",
        str(tmp_path / "job"),
        "--sbatch=--reservation=big",
        "--sbatch=--gres-flags=enforce-binding",
    )
    assert res.returncode == 0, res.stderr
    assert "#SBATCH --reservation=big" in json.loads(res.stdout)["script"]
