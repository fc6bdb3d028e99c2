"""`--trace-factory` imports only the user's own code or the site's trusted_factories: a factory from installed
software (torch.hub:load runs what it is given), one re-exported from it, or one in a directory other users can
write or own is refused before it is imported; the help says the flag runs arbitrary code."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import yaml

from .test_spec_no_newlines import dry, offline  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

# ---- --trace-factory runs only the user's own code or the site's trusted_factories -------------------


def _module(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text("import pathlib\npathlib.Path(__file__).with_name(__name__ + '-RAN').write_text('ran')\n" + body)
    return directory / f"{name}-RAN"


@pytest.fixture(autouse=True)
def _fresh_modules(monkeypatch):
    """Each test imports its own copies of these test modules (an earlier test's are in other directories)."""
    for name in ("hubby", "mymodels", "sharedmodels", "theirmodels", "projmodels"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("hubby", "mymodels", "sharedmodels", "theirmodels", "projmodels"):
        sys.modules.pop(name, None)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A directory that counts as installed software (a site-packages), holding `hubby.load`, which runs what
    it is given (as torch.hub.load does), and a user's directory with a module re-exporting it."""
    from frenzy_slurm.marp import trace

    site_dir = tmp_path / "site-packages"
    marker = _module(site_dir, "hubby", "def load(repo_or_dir='.', **kw):\n    return repo_or_dir\n")
    real = trace._installed_dirs
    monkeypatch.setattr(trace, "_installed_dirs", lambda: [*real(), site_dir.resolve()])
    monkeypatch.syspath_prepend(str(site_dir))
    return marker


def test_factory_from_installed_software_is_refused_before_import(installed):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    with pytest.raises(InputError) as err:
        load_factory("hubby:load", {"repo_or_dir": "/tmp/evil"})
    assert "is installed software" in str(err.value) and "trusted_factories" in str(err.value)
    assert not installed.exists(), "the module was imported before it was refused"


def test_a_users_module_re_exporting_installed_code_is_refused(installed, tmp_path, monkeypatch):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    mine = tmp_path / "mine"
    _module(mine, "mymodels", "from hubby import load as build\n")
    monkeypatch.syspath_prepend(str(mine))
    with pytest.raises(InputError, match=r"model.factory 'mymodels:build': .*hubby.py is installed software"):
        load_factory("mymodels:build", {})


def test_site_allow_list_admits_an_installed_factory(installed):
    from frenzy_slurm.marp.trace import load_factory

    assert load_factory("hubby:load", {}, allowed=["hubby:load"])() == "."
    assert installed.exists()
    assert load_factory("hubby:load", {}, allowed=["hubby"]) is not None
    from frenzy_slurm.core.errors import InputError

    with pytest.raises(InputError):
        load_factory("hubby:load", {}, allowed=["hubby:other", "hubbyx"])


def test_factory_in_a_world_writable_directory_is_refused(tmp_path, monkeypatch):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    shared = tmp_path / "shared"
    marker = _module(shared, "sharedmodels", "def build():\n    return None\n")
    shared.chmod(0o777)
    monkeypatch.syspath_prepend(str(shared))
    with pytest.raises(InputError, match="is writable by other users"):
        load_factory("sharedmodels:build", {})
    assert not marker.exists()


def test_factory_owned_by_another_user_is_refused(tmp_path, monkeypatch, other_user):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    theirs = tmp_path / "theirs"
    marker = _module(theirs, "theirmodels", "def build():\n    return None\n")
    os.chown(theirs / "theirmodels.py", other_user.uid, other_user.gid)
    monkeypatch.syspath_prepend(str(theirs))
    with pytest.raises(InputError, match=f"belongs to uid {other_user.uid}, not to you"):
        load_factory("theirmodels:build", {})
    assert not marker.exists()


def test_users_own_factory_still_works(tmp_path, monkeypatch):
    """The user's own files (the repository's tests/tiny_factory.py, a module beside model.yaml) are traced."""
    pytest.importorskip("torch")
    from frenzy_slurm.cli.plan_view import load
    from frenzy_slurm.marp.trace import count_factory_parameters

    assert count_factory_parameters("tests.tiny_factory:build", {"layers": 2}) > 0
    project = tmp_path / "project"
    _module(project, "projmodels", "from tests.tiny_factory import build\n")
    (project / "model.yaml").write_text("""\
name: traced
model:
  factory: projmodels:build
  factory_kwargs: {layers: 2}
  factory_arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    _, model = load(project / "model.yaml", trace=True)
    assert model.exact_params and model.exact_params > 0


def test_torch_hub_is_refused_and_the_site_can_allow_it(tmp_path, offline):
    """The audit's case: model.factory torch.hub:load with --trace-factory; then the same with the site's
    allow-list (it passes the check and fails later, in torch.hub itself, as an input error)."""
    pytest.importorskip("torch")
    model = tmp_path / "model.yaml"
    model.write_text("""\
name: hub
model:
  factory: torch.hub:load
  factory_kwargs: {repo_or_dir: /tmp/nowhere, model: x, source: local}
  factory_arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    (tmp_path / "train.py").write_text("")
    code, out, _ = dry(offline, "--trace-factory", model=model)
    assert code == 2 and "torch.hub:load" in out and "installed software" in out, out
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["trusted_factories"] = ["torch.hub:load"]
    allowing = tmp_path / "site.yaml"
    allowing.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, "--trace-factory", model=model, site=allowing)
    assert code == 2 and "installed software" not in out and "model.factory" in out, out


def test_trace_factory_help_says_it_runs_arbitrary_code():
    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main as admin
    from frenzy_slurm.cli.fsbatch import main as fsbatch

    for command, args in ((fsbatch, ["--help"]), (admin, ["memory", "--help"])):
        text = " ".join(CliRunner().invoke(command, args).output.split())
        assert "RUNS ARBITRARY CODE" in text, text
