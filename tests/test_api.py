"""The Python API (frenzy_slurm.api) without Slurm: a static snapshot for planning, the in-memory fake Slurm for
submitting, following and waiting; and --dependency's syntax and checks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from frenzy_slurm.core.errors import InputError

from .helpers import EXAMPLES, ROOT

OFFLINE = ["--backend", "static", "--snapshot", str(EXAMPLES / "offline" / "cluster.json")]
SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = EXAMPLES / "tiny-cpu.yaml"


@pytest.fixture
def private(tmp_path, monkeypatch):
    """Jobs, locks and the queue cache in this test's directory."""
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


@pytest.fixture
def fake(private, monkeypatch):
    """The offline example's cluster as an in-memory Slurm whose clock moves when the API sleeps."""
    import getpass

    from frenzy_slurm import api
    from frenzy_slurm.slurm.fake import FakeSlurm
    from frenzy_slurm.slurm.view import ClusterView

    view = ClusterView.model_validate_json((EXAMPLES / "offline" / "cluster.json").read_text())
    slurm = FakeSlurm(view, user=getpass.getuser())
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        slurm.advance(seconds)

    monkeypatch.setattr(api, "_sleep", sleep)
    slurm.slept = slept  # type: ignore[attr-defined]  # the waits the API asked for, for the tests
    return slurm


def test_import_is_cheap_and_lazy():
    code = (
        "import sys, frenzy_slurm as fs; before = sorted(m for m in sys.modules if m.startswith('frenzy_slurm.')); "
        "fs.plan; print(before, 'frenzy_slurm.api' in sys.modules, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    # only the version (a literal in core/version.py, which the root re-exports) before the API is used
    assert out.split() == ["['frenzy_slurm.core',", "'frenzy_slurm.core.version']", "True", "False"]


def test_plan_applies_overrides_and_summarises(private):
    import frenzy_slurm as fs

    plan = fs.plan(
        TINY, {"training.learning_rate": 1e-4, "training.steps": 3}, site=SITE, backend=OFFLINE[1], snapshot=OFFLINE[3]
    )
    spec = plan.request.plan.spec
    assert spec.training.learning_rate == 1e-4 and spec.training.steps == 3 and spec.name == "tiny-cpu"
    assert plan.gpus == sum(c.nodes * c.gpus_per_node for c in plan.request.decision.chosen.components) >= 1
    assert all(0 < p < 1 for p in plan.predicted_peak_gib) and plan.predicted_run_time_s > 0
    assert str(plan).startswith("tiny-cpu: ") and "per GPU" in str(plan)
    assert repr(plan) == f"<Plan {plan.summary} job_dir={str(plan.job_dir)!r}>"
    assert not plan.job_dir.exists()  # planning writes nothing
    # the same file without overrides is another submission: another job directory
    assert fs.plan(TINY, site=SITE, backend="static", snapshot=OFFLINE[3]).job_dir != plan.job_dir


def test_plan_refuses_a_bad_override_naming_it(private):
    import frenzy_slurm as fs

    with pytest.raises(InputError) as bad:
        fs.plan(TINY, {"training.learning_rat": 1e-4}, site=SITE, backend="static", snapshot=OFFLINE[3])
    assert bad.value.exit_code == 2 and "--set training.learning_rat=0.0001: training.learning_rat: unknown" in str(
        bad.value
    )
    with pytest.raises(InputError, match=r"--set training.steps=-1: training.steps: Input should be greater"):
        fs.plan(TINY, {"training.steps": -1}, site=SITE, backend="static", snapshot=OFFLINE[3])


def test_submit_wait_state_exit_code_metrics(fake):
    import frenzy_slurm as fs

    plan = fs.plan(TINY, site=SITE, backend=fake)
    job = fs.submit(plan)
    assert job.job_id == 1000 and (job.job_dir / "submission.json").exists()
    assert job.state == "RUNNING" and not job.done()  # the idle cluster starts it at once
    assert job.metrics() is None  # nothing recorded before the job ends
    fake.set_run_time(job.job_id, 30)
    assert job.wait(poll=8) == "COMPLETED"
    assert fake.slept[:3] == [2.0, 4.0, 8.0] and set(fake.slept[3:]) <= {8.0}  # sbatch's back-off, capped by poll
    assert sum(fake.slept) >= 30 and job.exit_code == 0 and job.wait_exit_code("COMPLETED") == 0
    record = {
        "step": 6,
        "total_steps": 6,
        "step_time_s": 0.5,
        "tokens_per_s": 1024.0,
        "loss": [[1, 5.5], [6, 4.0]],
        "ranks": [{"rank": 0, "peak_gib": 0.01}, {"rank": 1, "peak_gib": 0.02}],
    }
    (job.job_dir / "metrics.json").write_text(json.dumps(record))
    m = job.metrics()
    assert (m.step, m.total_steps, m.step_time_s, m.loss, m.peak_gib) == (6, 6, 0.5, ((1, 5.5), (6, 4.0)), 0.02)


def test_exit_code_comes_from_the_job_directory_then_accounting(fake):
    import frenzy_slurm as fs

    job = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    fake.set_run_time(job.job_id, 5)
    fake.advance(10)
    fake.fake_jobs[job.job_id].state = "FAILED"
    (job.job_dir / "finished.json").write_text(json.dumps({"job_id": str(job.job_id), "exit_code": 3}))
    assert job.wait() == "FAILED" and job.exit_code == 3 and job.wait_exit_code("FAILED") == 3


def test_cancel_and_a_cancelled_job_never_exits_0(fake):
    import frenzy_slurm as fs

    job = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    done = job.cancel()
    assert (done.job_id, done.state, done.outcome, done.job_dir) == (job.job_id, "RUNNING", "cancelled", job.job_dir)
    assert job.wait() == "CANCELLED" and job.job_dir.is_dir()
    assert job.cancel().outcome == "ended"  # nothing left to cancel
    assert job.wait_exit_code("CANCELLED") == 1  # accounting says 0:0 for a job cancelled before its script ran


def test_wait_timeout_leaves_the_job_running(fake):
    import frenzy_slurm as fs

    job = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    with pytest.raises(fs.WaitTimeout, match=r"still RUNNING after 0 s; it keeps running"):
        job.wait(timeout=0)
    assert fake.fake_jobs[job.job_id].state == "RUNNING"
    with pytest.raises(InputError, match="poll must be > 0"):
        job.wait(poll=0)


def test_a_job_slurm_forgot_is_unknown_not_waited_for_forever(fake):
    import frenzy_slurm as fs

    fake.accounting_enabled = False
    job = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    del fake.fake_jobs[job.job_id]  # gone from the queue, no accounting, no record in the job directory
    assert job.wait() == "UNKNOWN" and len(fake.slept) == 2  # three looks


def test_job_reattaches_from_its_directory(fake):
    import frenzy_slurm as fs

    job = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    again = fs.job(job.job_dir, backend=fake)
    assert again.job_id == job.job_id and again.state == "RUNNING"


def test_resubmitting_the_same_plan_is_refused(fake):
    import frenzy_slurm as fs
    from frenzy_slurm.submission import AlreadySubmitted

    fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    with pytest.raises(AlreadySubmitted) as again:
        fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    assert again.value.exit_code == 7


def test_submit_takes_only_plans(fake):
    import frenzy_slurm as fs

    with pytest.raises(InputError, match="takes the Plan of fs.plan"):
        fs.submit("model.yaml")  # type: ignore[arg-type]  # the mistake under test


# -- --dependency ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ids", "any_of"),
    [
        ("afterok:20:21,afterany:23", (20, 21, 23), False),
        ("afterok:20?afternotok:21", (20, 21), True),
        ("after:20+5", (20,), False),
        ("singleton", (), False),
        ("AfterOK:7,singleton", (7,), False),
        ("aftercorr:12_3:12_*", (12,), False),
        ("20,21", (20, 21), False),
    ],
)
def test_dependency_lists_slurm_accepts(text, ids, any_of):
    from frenzy_slurm.slurm.dependency import parse_dependency

    dep = parse_dependency(text)
    assert dep.job_ids == ids and dep.any_of is any_of


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("afterok", "names no job"),
        ("afterok:", "empty job id"),
        ("afterok:abc", "'abc' is not a job id"),
        ("afterok:0", "'0' is not a job id"),
        ("afterok:1,afterany:2?after:3", "not both"),
        ("afterok:1+5", "for after:JOBID+MINUTES only"),
        ("after:1+0", "at least 1 minute"),
        ("afterwards:1", "'afterwards' is not a dependency type"),
        ("afterok:1,,afterok:2", "an empty term"),
        ("afterok:1 ", "without spaces"),
        ("afterok:1;x", "'1;x' is not a job id"),
    ],
)
def test_malformed_dependencies_are_refused(text, why):
    from frenzy_slurm.slurm.dependency import DependencyError, parse_dependency

    with pytest.raises(DependencyError, match=re.escape(why)):
        parse_dependency(text)


def test_dependency_reaches_the_script_once_its_job_exists(fake):
    import frenzy_slurm as fs

    first = fs.submit(fs.plan(TINY, site=SITE, backend=fake))
    plan = fs.plan(
        TINY, {"training.steps": 2}, site=SITE, backend=fake, slurm={"dependency": f"afterok:{first.job_id}"}
    )
    assert f"#SBATCH --dependency=afterok:{first.job_id}\n" in plan.script
    with pytest.raises(InputError) as missing:
        fs.plan(TINY, site=SITE, backend=fake, slurm={"dependency": f"afterok:{first.job_id}:99999"})
    assert "Slurm knows no job 99999" in str(missing.value) and "squeue -j 99999" in str(missing.value)


def test_fsbatch_dependency_flag_is_checked_and_the_sbatch_path_closed(private):
    from frenzy_slurm.cli.fsbatch import main

    args = [str(TINY), "--dry-run", "--site", str(SITE), *OFFLINE]
    bad = CliRunner().invoke(main, [*args, "-d", "afterok:x"])
    assert bad.exit_code == 2 and "--dependency: 'afterok:x': 'x' is not a job id" in bad.stderr
    closed = CliRunner().invoke(main, [*args, "--sbatch=--dependency=afterok:1"])
    assert closed.exit_code == 2 and "use fsbatch -d or slurm.dependency" in closed.stderr
    short = CliRunner().invoke(main, [*args, "--sbatch=-dafterok:1"])
    assert short.exit_code == 2 and "sbatch reads -d as --dependency" in short.stderr
    # a saved snapshot cannot say which jobs exist: the syntax is checked, the ids are not
    ok = CliRunner().invoke(main, [*args, "-d", "afterok:123?singleton"])
    assert ok.exit_code == 0, ok.stderr
    assert "#SBATCH --dependency=afterok:123?singleton\n" in ok.stdout


def test_fsbatch_wait_needs_a_submission(private):
    from frenzy_slurm.cli.fsbatch import main

    res = CliRunner().invoke(main, [str(TINY), "--dry-run", "--wait", "--site", str(SITE), *OFFLINE])
    assert res.exit_code == 2 and "--wait waits for a submitted job" in res.stderr
