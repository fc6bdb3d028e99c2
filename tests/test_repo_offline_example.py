"""README's offline quick start runs as written from the checkout's root, and examples/offline/cluster.json is
the dev cluster's shape."""

from __future__ import annotations

from click.testing import CliRunner

from tests.helpers import LOCAL


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
