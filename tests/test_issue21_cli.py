"""Issue 21 (sections 3 and 4): --parsable, errors as JSON in --json mode, the offline example, shell completion."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from tests.helpers import EXAMPLES, LOCAL


@pytest.fixture
def offline_cluster(tmp_path):
    """The dev cluster's shape as a static snapshot plus its site file: fsbatch without Slurm."""
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site(LOCAL).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(snap), "--site", str(site)]


def _fake_submit(cluster):
    """A stand-in for frenzy_slurm.submission.submit: the static backend cannot run sbatch."""
    from frenzy_slurm.submission import Submitted

    def submit(req, backend, **_):
        return Submitted(job_id=4242, cluster=cluster, job_dir=req.job_dir)

    return submit


@pytest.mark.parametrize(("cluster", "expected"), [(None, "4242\n"), ("dev", "4242;dev\n")])
def test_fsbatch_parsable_prints_only_the_job_id(offline_cluster, tmp_path, monkeypatch, cluster, expected):
    from frenzy_slurm.cli.fsbatch import main

    monkeypatch.setattr("frenzy_slurm.submission.submit", _fake_submit(cluster))
    args = [str(EXAMPLES / "llama2-7b.yaml"), "--parsable", *offline_cluster, "--job-dir", str(tmp_path / "j")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.stderr
    assert res.stdout == expected
    assert "llama2-7b" in res.stderr  # the summary is on stderr


def test_fsbatch_parsable_dry_run_prints_nothing_on_stdout(offline_cluster, tmp_path):
    from frenzy_slurm.cli.fsbatch import main

    args = [str(EXAMPLES / "llama2-7b.yaml"), "--parsable", "--dry-run", *offline_cluster]
    res = CliRunner().invoke(main, [*args, "--job-dir", str(tmp_path / "j")])
    assert res.exit_code == 0, res.stderr
    assert res.stdout == ""
    assert "nothing submitted" in res.stderr


def test_fsbatch_parsable_refuses_json(offline_cluster):
    from frenzy_slurm.cli.fsbatch import main

    res = CliRunner().invoke(main, [str(EXAMPLES / "llama2-7b.yaml"), "--parsable", "--json", *offline_cluster])
    assert res.exit_code == 2
    assert "--parsable" in res.stderr and "--json" in res.stderr


def _json_error(res) -> dict:
    """The one JSON object a failed --json run prints on stdout."""
    return json.loads(res.stdout)["error"]


def test_fsbatch_json_error_is_json(offline_cluster, tmp_path):
    from frenzy_slurm.cli.fsbatch import main

    missing = tmp_path / "nope.yaml"
    res = CliRunner().invoke(main, [str(missing), "--json", "--dry-run", *offline_cluster])
    assert res.exit_code == 2
    err = _json_error(res)
    assert err["exit_code"] == 2 and str(missing) in err["message"]
    assert res.stderr.startswith("fsbatch: error: ")


def test_fsqueue_json_error_is_json(tmp_path):
    from frenzy_slurm.cli.fsqueue import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(main, ["--json", "--backend", "static", "--snapshot", str(bad)])
    err = _json_error(res)
    assert res.exit_code == err["exit_code"] == 2
    assert str(bad) in err["message"] and res.stderr.startswith("fsqueue: error: ")


def test_fsinfo_json_error_is_json(tmp_path):
    from frenzy_slurm.cli.fsinfo import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(main, ["--json", "--backend", "static", "--snapshot", str(bad)])
    err = _json_error(res)
    assert res.exit_code == err["exit_code"] == 2
    assert str(bad) in err["message"] and res.stderr.startswith("fsinfo: error: ")


def test_errors_without_json_keep_stdout_empty(tmp_path):
    from frenzy_slurm.cli.fsinfo import main

    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    res = CliRunner().invoke(main, ["--backend", "static", "--snapshot", str(bad)])
    assert res.exit_code == 2 and res.stdout == ""


def _readme_line(prefix: str) -> list[str]:
    """The README line that starts with `prefix`, as argv."""
    import shlex

    from tests.helpers import ROOT

    lines = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines() if ln.strip().startswith(prefix)]
    assert len(lines) == 1, f"README.md should have one line starting {prefix!r}"
    return shlex.split(lines[0])


def test_readme_offline_quick_start_runs(monkeypatch):
    """The README's offline line, exactly as written, from the checkout's root: exit 0 and a plan."""
    from frenzy_slurm.cli.fsbatch import main
    from tests.helpers import ROOT

    argv = _readme_line("fsbatch examples/llama2-7b.yaml --dry-run --backend static --snapshot examples/offline/")
    assert argv[0] == "fsbatch"
    monkeypatch.chdir(ROOT)
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    res = CliRunner().invoke(main, argv[1:])
    assert res.exit_code == 0, res.stderr
    assert "llama2-7b" in res.stdout and "(not submitted)" in res.stdout


def test_offline_snapshot_matches_the_dev_cluster_shape():
    """examples/offline/cluster.json loads as a static snapshot and is the dev cluster's shape (regenerate it as
    examples/offline/README.md says if the snapshot format changes)."""
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.slurm import open_backend
    from tests.helpers import ROOT

    view = open_backend("static", ROOT / "examples/offline/cluster.json").load()
    expected = synthetic(LOCAL, gres_types={p: p for p, *_ in LOCAL}).model_copy(update={"cluster": "frenzydev"})
    assert view.model_dump() == expected.model_dump()


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
