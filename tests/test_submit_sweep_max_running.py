"""A sweep with a cap on its running jobs (`fsbatch --set ... --max-running N`, `fs.sweep(..., max_running=N)`,
as submitit's slurm_array_parallelism): job i waits (afterany) for job i-N, N chains that Slurm runs with nothing
left waiting on the login node. Planned offline and submitted to the in-memory fake Slurm; the live test is
tests/test_submit_sweep_max_running_live.py."""

from __future__ import annotations

import getpass
import json

import pytest
from click.testing import CliRunner

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError

from .helpers import EXAMPLES, ROOT

OFFLINE = ["--backend", "static", "--snapshot", str(EXAMPLES / "offline" / "cluster.json")]
SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = EXAMPLES / "tiny-cpu.yaml"
STEPS = {"training.steps": [3, 4, 5, 6, 7]}


@pytest.fixture(autouse=True)
def private(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path


def fsbatch(*args: str):
    from frenzy_slurm.cli.fsbatch import main

    return CliRunner().invoke(main, [str(TINY), "--site", str(SITE), *OFFLINE, *args])


def test_dry_run_json_shows_the_chains():
    res = fsbatch("--set", "training.steps=3,4,5,6", "--max-running", "2", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    plans = json.loads(res.output)
    names = [p["job"] for p in plans]
    assert [p["max_running"] for p in plans] == [2, 2, 2, 2]
    assert [p["waits_for"] and p["waits_for"]["name"] for p in plans] == [None, None, names[0], names[1]]
    assert plans[2]["waits_for"]["job_dir"] == plans[0]["job_dir"]


def test_dry_run_text_says_which_job_each_waits_for():
    res = fsbatch("--set", "training.steps=3,4,5", "--max-running", "1", "--dry-run")
    assert res.exit_code == 0, res.output
    assert "--max-running 1: starts after job tiny-cpu_3 ends (sbatch --dependency=afterany:" in res.output
    assert "--max-running 1: starts after job tiny-cpu_4 ends" in res.output
    without = fsbatch("--set", "training.steps=3,4,5", "--dry-run")
    assert "--max-running" not in without.output  # nothing changes without the flag


@pytest.mark.parametrize(
    ("args", "why"),
    [
        (
            ["--set", "training.steps=3,4", "--max-running", "0"],
            "--max-running 0: give a whole number of jobs, at least 1",
        ),
        (["--set", "training.steps=3,4", "--max-running", "-2"], "--max-running -2: give a whole number"),
        (["--max-running", "2"], "this is one job"),
        (["--set", "training.steps=3,4", "--max-running", "1", "-d", "afterok:1?afterok:2"], "cannot mix ','"),
    ],
)
def test_bad_max_running_exits_2(args, why):
    res = fsbatch(*args, "--dry-run")
    assert res.exit_code == EXIT_BAD_INPUT and why in res.output, res.output


def fake_slurm():
    from frenzy_slurm.slurm.fake import FakeSlurm
    from frenzy_slurm.slurm.view import ClusterView

    view = ClusterView.model_validate_json((EXAMPLES / "offline" / "cluster.json").read_text())
    return FakeSlurm(view, user=getpass.getuser())


def test_api_sweep_runs_at_most_n_at_once_on_the_fake():
    import frenzy_slurm as fs

    slurm = fake_slurm()
    plans = fs.sweep(TINY, STEPS, site=SITE, backend=slurm, max_running=2)
    jobs = [fs.submit(p) for p in plans]
    ids = [j.job_id for j in jobs]
    assert [slurm.fake_jobs[i].after for i in ids] == [[], [], [ids[0]], [ids[1]], [ids[2]]]
    recorded = [json.loads((j.job_dir / "submission.json").read_text()) for j in jobs]
    assert [r.get("dependency") for r in recorded] == [
        None,
        None,
        f"afterany:{ids[0]}",
        f"afterany:{ids[1]}",
        f"afterany:{ids[2]}",
    ]
    assert f"--dependency=afterany:{ids[0]}" in recorded[2]["argv"]
    for i in ids:
        slurm.set_run_time(i, 60)
    seen_running = []
    for _ in range(8):
        running = [i for i in ids if slurm.fake_jobs[i].state == "RUNNING"]
        seen_running.append(len(running))
        slurm.advance(30)
    assert max(seen_running) == 2 and all(slurm.fake_jobs[i].state == "COMPLETED" for i in ids)
    starts = [slurm.fake_jobs[i].start for i in ids]
    ends = [slurm.fake_jobs[i].end for i in ids]
    assert all(starts[k] >= ends[k - 2] for k in range(2, 5)), (starts, ends)


def test_a_chained_plan_submitted_before_its_predecessor_is_refused():
    import frenzy_slurm as fs

    plans = fs.sweep(TINY, STEPS, site=SITE, backend=fake_slurm(), max_running=1)
    with pytest.raises(InputError, match="submit a sweep's plans in order"):
        fs.submit(plans[1])


def test_user_dependency_is_kept_in_the_chain():
    import frenzy_slurm as fs

    slurm = fake_slurm()
    first = fs.submit(fs.plan(TINY, site=SITE, backend=slurm))
    plans = fs.sweep(
        TINY, STEPS, site=SITE, backend=slurm, max_running=3, slurm={"dependency": f"afterany:{first.job_id}"}
    )
    jobs = [fs.submit(p) for p in plans]
    assert slurm.fake_jobs[jobs[3].job_id].after == [jobs[0].job_id, first.job_id]
    assert f"#SBATCH --dependency=afterany:{first.job_id}\n" in plans[0].script  # the first N: the plan's own line
    assert slurm.fake_jobs[jobs[0].job_id].after == []  # (which the fake, reading no script, does not see)
