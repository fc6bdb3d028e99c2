"""One planning path: `planning.plan_job` returns the frozen, final request; `fsbatch --dry-run`
prints exactly it, `submit` takes only it, and the simulator's decision is the same step of the same function."""

from __future__ import annotations

import dataclasses
import getpass
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from frenzy_slurm import planning
from frenzy_slurm.has import Requirements
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.slurm.cli import sbatch_argv
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit

from .helpers import EXAMPLES, LOCAL, make_spec, planned, snapshot


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """fsbatch against one FakeSlurm (plans and submits in-process); the requests plan_job returned and
    those submit was given, in order."""
    view = synthetic(LOCAL)
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(synthetic_site(LOCAL).model_dump(mode="json")))
    slurm = FakeSlurm(view, user=getpass.getuser())
    monkeypatch.setattr("frenzy_slurm.slurm.open_backend", lambda name, snap=None: slurm)
    seen: dict[str, list] = {"planned": [], "submitted": []}
    real_plan, real_submit = planning.plan_job, submit

    def plan_job(*args, **kw):
        seen["planned"].append(real_plan(*args, **kw))
        return seen["planned"][-1]

    def submit_(req, backend, **kw):
        seen["submitted"].append(req)
        return real_submit(req, backend, **kw)

    monkeypatch.setattr(planning, "plan_job", plan_job)
    monkeypatch.setattr("frenzy_slurm.submission.submit", submit_)
    return site, seen


def fsbatch(site: Path, *args: str) -> dict:
    from frenzy_slurm.cli.fsbatch import main

    res = CliRunner().invoke(main, [str(EXAMPLES / "tiny-cpu.yaml"), "--site", str(site), "--json", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def test_dry_run_prints_exactly_the_request_and_submit_gets_that_request(cluster, tmp_path):
    site, seen = cluster
    shown = fsbatch(site, "--dry-run", "--job-dir", str(tmp_path / "jobs" / "j"))
    (req,) = seen["planned"]
    assert shown == {**req.as_json(), "dry_run": True}
    assert shown["calibration"] == json.loads(req.files["calibration.json"])  # rendered with the rest
    assert not seen["submitted"]
    done = fsbatch(site, "--job-dir", str(tmp_path / "jobs" / "j"))
    submitted = seen["planned"][-1]
    assert seen["submitted"] == [submitted]  # the very object plan_job returned
    assert done == {
        **{k: v for k, v in submitted.as_json().items() if k != "script"},
        "dry_run": False,
        "job_id": done["job_id"],
    }
    # the dry run showed what was then submitted: same directory, submission, command and choice
    for key in ("job_dir", "submission", "sbatch_argv", "calibration"):
        assert shown[key] == done[key]
    moments = ("start", "completion")  # "now" is each run's clock
    assert {k: v for k, v in shown["decision"]["chosen"].items() if k not in moments} == {
        k: v for k, v in done["decision"]["chosen"].items() if k not in moments
    }


def test_dry_run_force_previews_the_directory_force_submits(cluster, tmp_path):
    """Before: `--dry-run --force` showed jobs/j (the earlier job's) while `--force` submitted into jobs/j.2."""
    site, _ = cluster
    j = tmp_path / "jobs" / "j"
    first = fsbatch(site, "--job-dir", str(j))
    assert first["job_dir"] == str(j)
    preview = fsbatch(site, "--dry-run", "--force", "--job-dir", str(j))
    assert (preview["job_dir"], preview["earlier_job_dir"]) == (f"{j}.2", str(j))
    assert f"cd {j}.2" in preview["script"] or f"{j}.2/" in preview["script"]
    assert not Path(f"{j}.2").exists()  # a dry run writes nothing
    forced = fsbatch(site, "--force", "--job-dir", str(j))
    assert (forced["job_dir"], forced["earlier_job_dir"]) == (preview["job_dir"], preview["earlier_job_dir"])
    assert forced["job_id"] != first["job_id"]


def test_submit_takes_only_a_job_request(tmp_path):
    from frenzy_slurm.render import render_job

    view = synthetic(LOCAL)
    spec = make_spec()
    req = planned(spec, view, tmp_path / "jobs" / "a")
    slurm = FakeSlurm(view, user=getpass.getuser())
    rendered = render_job(
        spec, Path("/home/u/model.yaml"), resolve_model(spec, "."), req.decision, spec.slurm, tmp_path / "jobs" / "b"
    )
    with pytest.raises(TypeError, match="takes the JobRequest of frenzy_slurm.planning.plan_job, not Rendered"):
        submit(rendered, slurm)
    with pytest.raises(TypeError):
        submit(req, slurm, force=True)  # --force is part of the request, not an argument
    assert not (tmp_path / "jobs" / "b").exists()
    assert submit(req, slurm).job_dir == req.job_dir


def test_request_is_final(tmp_path):
    req = planned(make_spec(), synthetic(LOCAL), tmp_path / "jobs" / "a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.job_dir = tmp_path / "elsewhere"  # type: ignore[misc]
    with pytest.raises(TypeError):
        req.files["calibration.json"] = "{}"  # type: ignore[index]
    assert list(req.files) == ["job.sbatch", "ds_config.json", "plan.json", "model.yaml", "calibration.json"]
    # one sbatch command line, recorded in plan.json as the backend runs it
    assert (
        req.plan.sbatch_argv
        == sbatch_argv(req.job_dir / "job.sbatch")
        == ["sbatch", "--parsable", str(req.job_dir / "job.sbatch")]
    )
    written = submit(req, FakeSlurm(synthetic(LOCAL), user=getpass.getuser()))
    assert "FRENZY_JOB_DIR_INODE=unset" in req.script and "FRENZY_JOB_DIR_INODE=unset" not in written.script


def test_entry_script_is_a_field_of_the_request(tmp_path):
    spec = make_spec(entry={"trainer": "script", "script": "train.py"})
    req = planned(spec, synthetic(LOCAL), tmp_path / "jobs" / "a", spec_path=tmp_path / "model.yaml")
    assert req.entry_script == tmp_path / "train.py"
    assert planned(make_spec(), synthetic(LOCAL), tmp_path / "jobs" / "b").entry_script is None


def test_the_simulators_decision_is_plan_jobs_decision_step():
    view = synthetic(LOCAL)
    spec = make_spec()
    req = planned(spec, view)
    site = synthetic_site(LOCAL)
    alone = planning.decide_job(
        Requirements.from_spec(spec),
        workload_from_spec(spec, resolve_model(spec, ".")),
        search_space_from_spec(spec),
        view,
        site,
        None,
        view.taken_at,
    )
    assert alone.chosen == req.decision.chosen and alone.alternatives == req.decision.alternatives


def test_a_snapshot_gives_no_start_estimates_a_live_backend_does():
    view = synthetic(LOCAL)
    live = FakeSlurm(view, user="u")
    assert planning.start_estimator(snapshot(view)) is None
    assert planning.start_estimator(live) is live
    assert planning.start_estimator(None) is None
