"""Shell completion: each command prints its completion script as README says, bash completes an option, and
README documents it."""

from __future__ import annotations

import pytest
from click.testing import CliRunner


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
@pytest.mark.parametrize(
    ("prog", "module"),
    [("fsbatch", "fsbatch"), ("fsqueue", "fsqueue"), ("fsinfo", "fsinfo"), ("frenzy-slurm", "admin")],
)
def test_shell_completion_source_is_produced(prog, module, shell):
    """README's `eval "$(_FSBATCH_COMPLETE=bash_source fsbatch)"`: click prints the shell's completion script."""
    import importlib

    main = importlib.import_module(f"frenzy_slurm.cli.{module}").main
    var = f"_{prog.replace('-', '_').upper()}_COMPLETE"
    res = CliRunner().invoke(main, [], prog_name=prog, env={var: f"{shell}_source"})
    assert res.exit_code == 0, res.output
    assert f"_{prog.replace('-', '_')}_completion" in res.stdout and var in res.stdout


def test_bash_completion_completes_an_option():
    from frenzy_slurm.cli.fsbatch import main

    env = {"_FSBATCH_COMPLETE": "bash_complete", "COMP_WORDS": "fsbatch --parsa", "COMP_CWORD": "1"}
    res = CliRunner().invoke(main, [], prog_name="fsbatch", env=env)
    assert res.exit_code == 0
    assert "plain,--parsable" in res.stdout.splitlines()


def test_readme_documents_completion():
    from tests.helpers import ROOT

    readme = (ROOT / "README.md").read_text()
    assert "### Shell completion" in readme
    for shell in ("bash", "zsh", "fish"):
        assert f"_FSBATCH_COMPLETE={shell}_source fsbatch" in readme
