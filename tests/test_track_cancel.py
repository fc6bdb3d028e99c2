"""fscancel: your frenzy-slurm jobs by id, name or all of them, a heterogeneous job as one
job, job directories kept, an outage exit 4. Against FakeSlurm (an outage and another user's job on demand);
tests/test_track_cancel_and_log_live.py cancels real jobs."""

from __future__ import annotations

import getpass
import json

import pytest
from click.testing import CliRunner

import frenzy_slurm.slurm as seam
from frenzy_slurm.cli.fscancel import main, signal_name
from frenzy_slurm.core.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_SLURM_UNAVAILABLE, InputError
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import BatchJob, ComponentRequest, SlurmCommandError
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.track.jobs import cancel_jobs, parse_job_ref

from .helpers import LOCAL

ME = getpass.getuser()


def comp(partition: str, gpu: str) -> ComponentRequest:
    return ComponentRequest(partition=partition, gpu_type=gpu, nodes=1, gpus_per_node=1, time_min=60)


@pytest.fixture
def slurm(tmp_path):
    return FakeSlurm(synthetic(LOCAL), user=ME)


def job(slurm, tmp_path, name: str, comps=None, comment: str | None = None, user: str | None = None) -> int:
    slurm.user = user or ME
    d = tmp_path / f"{name}-{len(slurm.fake_jobs)}"
    d.mkdir()
    (d / "plan.json").write_text("{}")
    done = slurm.submit(
        BatchJob(
            script=d / "job.sbatch",
            workdir=d,
            components=comps or [comp("a100", "a100_40gb")],
            name=name,
            comment=comment if comment is not None else f"frenzy:{name}",
        )
    )
    slurm.user = ME
    if comment is None:  # what fsbatch records of the job it submitted (track.recorded_by_fsbatch)
        (d / "submission.json").write_text(json.dumps({"job_id": done.job_id, "submission": name}))
    return done.job_id


def fscancel(slurm, monkeypatch, *args: str):
    monkeypatch.setattr(seam, "open_backend", lambda backend, snapshot=None: slurm)
    return CliRunner().invoke(main, list(args))


def test_cancel_by_id_keeps_the_job_directory(slurm, tmp_path, monkeypatch):
    jid = job(slurm, tmp_path, "one")
    res = fscancel(slurm, monkeypatch, str(jid), "--json")
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.output)["jobs"]
    assert out["job_id"] == jid and out["outcome"] == "cancelled" and out["state"] == "RUNNING"
    assert slurm.fake_jobs[jid].state == "CANCELLED"
    assert (tmp_path / "one-0" / "plan.json").exists()
    again = fscancel(slurm, monkeypatch, str(jid))  # a second time: nothing to do, said plainly
    assert again.exit_code == 0 and f"job {jid} one: had already ended (CANCELLED)" in again.output


@pytest.mark.parametrize("ref", ["{lead}", "{lead}+1", "{second}"])
def test_heterogeneous_job_is_cancelled_as_one_job(slurm, tmp_path, monkeypatch, ref):
    lead = job(slurm, tmp_path, "het", [comp("a100", "a100_40gb"), comp("v100", "v100_32gb")])
    text = ref.format(lead=lead, second=lead + 1)  # 1001 is the second component's own job id
    res = fscancel(slurm, monkeypatch, text)
    assert res.exit_code == 0, res.output
    assert f"job {lead} het (heterogeneous, 2 components): cancelled" in res.output
    assert slurm.fake_jobs[lead].state == "CANCELLED"
    assert {j.state for j in slurm.jobs(job_ids=[lead])} == {"CANCELLED"}


def test_name_and_mine_take_only_your_own_live_frenzy_jobs(slurm, tmp_path, monkeypatch):
    a = job(slurm, tmp_path, "sweep")
    b = job(slurm, tmp_path, "sweep")
    other = job(slurm, tmp_path, "sweep", user="someone-else")
    plain = job(slurm, tmp_path, "sweep", comment="not ours")
    keep = job(slurm, tmp_path, "keep")
    res = fscancel(slurm, monkeypatch, "--name", "sweep", "--json")
    assert res.exit_code == 0, res.output
    assert sorted(j["job_id"] for j in json.loads(res.output)["jobs"]) == [a, b]
    assert [slurm.fake_jobs[i].state for i in (a, b)] == ["CANCELLED", "CANCELLED"]
    assert slurm.fake_jobs[other].state != "CANCELLED" and slurm.fake_jobs[plain].state != "CANCELLED"
    assert slurm.fake_jobs[keep].state != "CANCELLED"
    res = fscancel(slurm, monkeypatch, "--mine", "--json")  # the ended ones are not listed again
    assert [j["job_id"] for j in json.loads(res.output)["jobs"]] == [keep]
    assert fscancel(slurm, monkeypatch, "--mine").output.startswith("no pending or running frenzy-slurm job")


def test_ids_that_are_not_yours_or_not_frenzy_or_unknown_are_refused(slurm, tmp_path, monkeypatch):
    other = job(slurm, tmp_path, "x", user="someone-else")
    plain = job(slurm, tmp_path, "y", comment="")
    for jid, said in [(other, "someone-else's job"), (plain, f"scancel {plain}"), (4242, "not in Slurm's queue")]:
        res = fscancel(slurm, monkeypatch, str(jid))
        assert res.exit_code == EXIT_BAD_INPUT and said in res.output, res.output
    assert slurm.fake_jobs[other].state == "RUNNING" and slurm.fake_jobs[plain].state == "RUNNING"


@pytest.mark.parametrize("args", [[], ["1", "--mine"], ["--name", "a", "--mine"], ["12x"], ["--mine", "-s", "NOPE"]])
def test_bad_selectors_exit_2(slurm, monkeypatch, args):
    res = fscancel(slurm, monkeypatch, *args, "--json")
    assert res.exit_code == EXIT_BAD_INPUT
    assert json.loads(res.output.splitlines()[-1])["error"]["exit_code"] == EXIT_BAD_INPUT


def test_outage_says_so_and_exits_4(slurm, tmp_path, monkeypatch):
    jid = job(slurm, tmp_path, "one")
    slurm.down = True
    res = fscancel(slurm, monkeypatch, str(jid))
    assert res.exit_code == EXIT_SLURM_UNAVAILABLE and "unreachable" in res.output.lower(), res.output


def test_static_backend_refuses_naming_what_to_use(tmp_path, monkeypatch):
    from frenzy_slurm.slurm.static import StaticBackend

    snap = tmp_path / "view.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    with pytest.raises(seam.SlurmUnavailable) as exc:
        StaticBackend(snap).cancel(1)
    assert "--backend cli" in exc.value.message and exc.value.exit_code == EXIT_SLURM_UNAVAILABLE


def test_signal_goes_to_running_jobs_only(slurm, tmp_path, monkeypatch):
    run = job(slurm, tmp_path, "s", [ComponentRequest("a100", "a100_40gb", 2, 4, 60)])
    wait = job(slurm, tmp_path, "s", [ComponentRequest("a100", "a100_40gb", 2, 4, 60)])  # the partition is full
    assert (slurm.fake_jobs[run].state, slurm.fake_jobs[wait].state) == ("RUNNING", "PENDING")
    res = fscancel(slurm, monkeypatch, "--name", "s", "--signal", "sigusr2", "--json")
    out = {j["job_id"]: j["outcome"] for j in json.loads(res.output)["jobs"]}
    assert res.exit_code == 0 and out == {run: "signalled", wait: "not running"}
    assert slurm.signals == [(run, "USR2")] and slurm.fake_jobs[run].state == "RUNNING"


def test_a_refused_scancel_exits_1_and_names_the_job(slurm, tmp_path, monkeypatch):
    jid = job(slurm, tmp_path, "one")

    def refuse(job_id, signal=None):
        raise SlurmCommandError(["scancel", str(job_id)], 1, "scancel: error: Access/permission denied")

    monkeypatch.setattr(slurm, "cancel", refuse)
    res = fscancel(slurm, monkeypatch, str(jid))
    assert res.exit_code == EXIT_FAILURE and f"job {jid} one: could not be cancelled" in res.output
    assert "permission denied" in res.output


def test_library_calls_and_parsers():
    assert parse_job_ref("1234+2") == 1234 and parse_job_ref(" 77 ") == 77
    assert signal_name("12") == "USR2" and signal_name("term") == "TERM"
    with pytest.raises(InputError):
        parse_job_ref("1234_5")
    with pytest.raises(InputError):
        cancel_jobs(FakeSlurm(synthetic(LOCAL)), [1], mine=True)
