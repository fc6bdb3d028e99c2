"""model.factory is user code: planning never runs it unless asked (`--trace-factory`), says so when it did not
or did, refuses a standard-library callable in the spec, and turns the factory's own failures into input errors
(exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec import load_job_spec

from .test_core_input_files import _run, offline  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent


def _input_error(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    return exc.value.message


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
