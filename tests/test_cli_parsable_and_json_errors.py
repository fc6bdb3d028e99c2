"""Output for scripts: `fsbatch --parsable` prints only the job id (nothing on a dry run, refused with
--json), and a failed --json run prints its error as one JSON object on stdout (stdout empty without --json)."""

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
