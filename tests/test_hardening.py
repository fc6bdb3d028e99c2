"""Issue 10's hostile-audit findings, one test each: files that never end, alias bombs, bad encodings,
user code on the login node, short time limits, control characters, the template sandbox.

Each test failed before its fix. docs/security.md states the trust model these tests hold.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec import load_job_spec, resolve_model
from frenzy_slurm.jobspec.hf import architecture_from_hf_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
GOOD = (EXAMPLES / "tiny-cpu.yaml").read_text()


def _input_error(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    return exc.value.message


# --- files that are not small regular UTF-8 files -------------------------------------------------------


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_as_model_yaml_is_refused_at_once(device):
    t0 = time.monotonic()
    msg = _input_error(load_job_spec, Path(device))
    assert time.monotonic() - t0 < 2
    assert device in msg and "not a regular file" in msg


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.yaml"
    os.mkfifo(fifo)  # no writer: a plain open() would block forever
    assert "FIFO" in _input_error(load_job_spec, fifo)


def test_oversized_file_is_refused(tmp_path):
    big = tmp_path / "model.yaml"
    big.write_text(GOOD + "#" * (2 << 20) + "\n")
    msg = _input_error(load_job_spec, big)
    assert str(big) in msg and "bytes" in msg


def test_alias_bomb_is_refused_fast(tmp_path):
    """Nine levels of nine aliases: 1 KB on disk, 387 million strings expanded."""
    text = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 10):
        text += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    bomb = tmp_path / "model.yaml"
    bomb.write_text(text)
    t0 = time.monotonic()
    msg = _input_error(load_job_spec, bomb)
    assert time.monotonic() - t0 < 2
    assert f"{bomb}:" in msg and "aliases" in msg


def test_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("name: &a [*a]\n")  # PyYAML composes this into a cycle
    assert "recursive structure" in _input_error(load_job_spec, path)


def test_alias_bomb_reached_from_later_siblings_is_counted(tmp_path):
    """Shared nodes are counted once per reference however the document orders them."""
    text = "x0: &x0 [" + ", ".join(["lol"] * 50) + "]\n"
    for i in range(1, 5):
        text += f"y{i}: [&x{i} [{', '.join([f'*x{i - 1}'] * 50)}], *x{i}]\n"
    path = tmp_path / "model.yaml"
    path.write_text(text)
    assert "expand to more than" in _input_error(load_job_spec, path)


def test_moderate_aliases_still_work(tmp_path):
    """Anchors for repeated blocks are legitimate YAML; only expansion beyond the cap is refused."""
    path = tmp_path / "model.yaml"
    path.write_text(GOOD.replace("training:\n", "training: &t\n") + "x-copy: *t\n".replace("x-copy", "#x"))
    assert load_job_spec(path).name == "tiny-cpu"


@pytest.mark.parametrize("depth,needle", [(100, "nested more than"), (5000, "nested too deeply")])
def test_deep_nesting_is_an_input_error(tmp_path, depth, needle):
    path = tmp_path / "model.yaml"
    path.write_text("name: " + "[" * depth + "]" * depth + "\n")
    assert needle in _input_error(load_job_spec, path)


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"name: caf\xe9\n", ":1: the file is not UTF-8"),
        (b"name: x\nmodel:\n  preset: a\x00b\n", ":3: the file contains a NUL byte"),
        (b"name: x\nlimits:\n  deadline: 2026-13-45\n", ":3: a value cannot be read"),
        (b"name: x\ntraining:\n  seq_len: " + b"9" * 5000 + b"\n", ":3: a value cannot be read"),
        (b"name: x\x01\n", ":1: not valid YAML"),
    ],
)
def test_unreadable_values_name_file_and_line(tmp_path, raw, needle):
    path = tmp_path / "model.yaml"
    path.write_bytes(raw)
    msg = _input_error(load_job_spec, path)
    assert f"{path}{needle}" in msg


# --- Hugging Face config.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ("[1, 2]", "is a JSON object, not list"),
        ('{"num_hidden_layers": "abc", "hidden_size": 64}', "num_hidden_layers: 'abc' is not a whole number"),
        ('{"num_hidden_layers": 2, "hidden_size": 64.5, "num_attention_heads": 4, "vocab_size": 8}', "hidden_size"),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 8, '
            '"resid_pdrop": "x"}',
            "resid_pdrop: 'x' is not a number",
        ),
        ('{"hidden_size": 64}', "no key for layers, heads, vocab"),
        ('{"n_layer": -1, "n_embd": 64, "n_head": 4, "vocab_size": 8}', "n_layer: Input should be greater than 0"),
        ("[" * 100000 + "]" * 100000, "not a usable JSON config"),
    ],
)
def test_bad_hf_config_is_an_input_error(tmp_path, cfg, needle):
    path = tmp_path / "config.json"
    path.write_text(cfg)
    assert needle in _input_error(architecture_from_hf_config, path)


def test_hf_config_device_is_refused(write_yaml):
    path = write_yaml(
        GOOD.replace("model:\n  arch:\n", "model:\n  hf_config: /dev/zero\n  x:\n").split("  x:")[0]
        + "training:"
        + GOOD.split("training:")[1]
    )
    spec = load_job_spec(path)
    assert "not a regular file" in _input_error(resolve_model, spec, path.parent)


# --- model.factory: user code on the login node ---------------------------------------------------------

FACTORY_YAML = """\
name: traced
model:
  factory: {factory}
  factory_kwargs: {kwargs}
  factory_arch: {{layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}}
training: {{seq_len: 64, global_batch: 4, steps: 1}}
entry: {{trainer: script, script: train.py}}
"""


@pytest.mark.parametrize("factory", ["subprocess:getoutput", "os:system", "builtins:eval", "os.path:join"])
def test_stdlib_factory_is_refused_in_the_spec(write_yaml, factory):
    path = write_yaml(FACTORY_YAML.format(factory=factory, kwargs="{cmd: touch /tmp/pwned}"))
    msg = _input_error(load_job_spec, path)
    assert f"{path}:3: model.factory:" in msg and "standard library" in msg


@pytest.fixture
def user_package(tmp_path, monkeypatch):
    """A package whose import leaves a marker file: proof of whether user code ran."""
    pkg = tmp_path / "pkg" / "usermodels"
    pkg.mkdir(parents=True)
    marker = tmp_path / "imported"
    (pkg / "__init__.py").write_text(f"""\
import pathlib
pathlib.Path({str(marker)!r}).write_text("ran")
from os import system as build_system
from tests.tiny_factory import build

def broken(layers=2):
    raise RuntimeError("no weights here")
""")
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    return marker


def test_factory_is_not_run_without_opt_in(write_yaml, user_package):
    from frenzy_slurm.cli.plan_view import factory_note, load

    path = write_yaml(FACTORY_YAML.format(factory="usermodels:build", kwargs="{layers: 2}"))
    spec, model = load(path)
    assert not user_package.exists(), "planning imported model.factory without --trace-factory"
    assert model.exact_params is None
    assert "was not run" in factory_note(spec, model)


@pytest.mark.slow
def test_factory_runs_with_opt_in_and_says_so(write_yaml, user_package):
    pytest.importorskip("torch")
    from frenzy_slurm.cli.plan_view import factory_note, load

    path = write_yaml(FACTORY_YAML.format(factory="usermodels:build", kwargs="{layers: 2}"))
    spec, model = load(path, trace=True)
    assert user_package.exists() and model.exact_params and model.exact_params > 0
    assert factory_note(spec, model).startswith("user code ran")


@pytest.mark.parametrize(
    "factory,kwargs,needle",
    [
        ("usermodels:build", "{cmd: ls}", "model.factory_kwargs: got an unexpected keyword argument 'cmd'"),
        ("usermodels:broken", "{}", "raised RuntimeError: no weights here"),
        ("usermodels:build_system", "{}", "posix.build_system"),
        ("usermodels:missing", "{}", "cannot import"),
    ],
)
def test_factory_problems_are_input_errors(write_yaml, user_package, factory, kwargs, needle):
    pytest.importorskip("torch")
    from frenzy_slurm.cli.plan_view import load

    path = write_yaml(FACTORY_YAML.format(factory=factory, kwargs=kwargs))
    assert needle in _input_error(load, path, True)


# --- time limits shorter than the checkpoint signal -----------------------------------------------------


@pytest.mark.parametrize(
    "value,needle",
    [
        ("1", "too short"),
        ("6", "too short"),
        ("0:30", "too short"),
        ("soon", "not a Slurm time"),
        ("-5", "not a Slurm time"),
        ("1-99999999999999999999", "longer than Slurm can represent"),
        ("٣٠", "not a Slurm time"),
    ],
)
def test_short_or_invalid_time_is_refused(write_yaml, value, needle):
    path = write_yaml(GOOD + f"slurm:\n  time: '{value}'\n")
    msg = _input_error(load_job_spec, path)
    assert "slurm.time" in msg and needle in msg


def test_time_at_the_minimum_is_accepted(write_yaml):
    from frenzy_slurm.jobspec.job import MIN_TIME_MIN, SIGNAL_LEAD_S, STARTUP_S

    assert MIN_TIME_MIN * 60 >= SIGNAL_LEAD_S + STARTUP_S
    assert load_job_spec(write_yaml(GOOD + f"slurm:\n  time: {MIN_TIME_MIN}\n")).slurm.time == MIN_TIME_MIN


def _run(prog: str, *args: str, env: dict | None = None):
    import subprocess
    import sys

    module = {"fsbatch": "fsbatch", "fsqueue": "fsqueue", "frenzy-slurm": "admin"}[prog]
    code = f"import sys; from frenzy_slurm.cli.{module} import main; sys.argv[0] = {prog!r}; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A synthetic cluster as a static snapshot plus its site file: fsbatch without Slurm."""
    import yaml

    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    pools = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]
    d = tmp_path_factory.mktemp("offline")
    (d / "snap.json").write_text(synthetic(pools).model_dump_json())
    (d / "site.yaml").write_text(yaml.safe_dump(synthetic_site(pools).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(d / "snap.json"), "--site", str(d / "site.yaml")]


def test_fsbatch_explain_says_factory_did_not_run(write_yaml, user_package, offline, tmp_path):
    path = write_yaml(FACTORY_YAML.format(factory="usermodels:build", kwargs="{layers: 2}"))
    res = _run(
        "fsbatch",
        str(path),
        "--dry-run",
        "--explain",
        *offline,
        "--job-dir",
        str(tmp_path / "job"),
        env={"PYTHONPATH": f"{user_package.parent / 'pkg'}:{ROOT}"},
    )
    assert res.returncode == 0, res.stderr
    assert "model.factory usermodels:build was not run" in res.stdout
    assert not user_package.exists()


def test_memory_trace_factory_wrong_kwargs_is_exit_2(write_yaml, user_package):
    pytest.importorskip("torch")
    path = write_yaml(FACTORY_YAML.format(factory="usermodels:build", kwargs="{cmd: id}"))
    res = _run(
        "frenzy-slurm",
        "memory",
        str(path),
        "--plan",
        "dp=1",
        "--trace-factory",
        env={"PYTHONPATH": f"{user_package.parent / 'pkg'}:{ROOT}"},
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "model.factory_kwargs: got an unexpected keyword argument 'cmd'" in res.stderr
    assert user_package.exists(), "with --trace-factory the module is imported (and says so)"


def test_memory_says_factory_was_not_run(write_yaml, user_package):
    path = write_yaml(FACTORY_YAML.format(factory="usermodels:build", kwargs="{layers: 2}"))
    res = _run(
        "frenzy-slurm",
        "memory",
        str(path),
        "--plan",
        "dp=1",
        env={"PYTHONPATH": f"{user_package.parent / 'pkg'}:{ROOT}"},
    )
    assert res.returncode == 0, res.stderr
    assert "model.factory usermodels:build was not run" in res.stderr and not user_package.exists()


@pytest.mark.parametrize("value", ["1", "abc", "0", "-3", "99999999999999999999999"])
def test_fsbatch_bad_time_flag_is_exit_2(offline, value, tmp_path):
    res = _run(
        "fsbatch",
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--dry-run",
        *offline,
        "-t",
        value,
        "--job-dir",
        str(tmp_path / "job"),
    )
    assert res.returncode == 2 and "Traceback" not in res.stderr and "--time" in res.stderr, res.stderr


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


@pytest.mark.parametrize("which", ["--site", "--snapshot"])
def test_device_as_site_file_or_snapshot_is_refused(offline, tmp_path, which):
    args = list(offline)
    args[args.index(which) + 1] = "/dev/zero"
    res = _run("fsbatch", str(EXAMPLES / "tiny-cpu.yaml"), "--dry-run", *args, "--job-dir", str(tmp_path / "job"))
    assert res.returncode == 2 and "/dev/zero" in res.stderr and "not a regular file" in res.stderr, res.stderr
