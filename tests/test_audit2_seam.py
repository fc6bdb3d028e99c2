"""Issue 19, the Slurm seam: another user's non-UTF-8 job name (item 3), hostile Slurm answers (item 16), every way
sbatch can end without a job id (item 9), a full disk and signals during sbatch (item 15).

Slurm's answers come from stand-in tools on PATH that print the answers the real Slurm 22.05 gave
(tests/data/slurm-22.05/), with one hostile job or line spliced in; the submission paths run against FakeSlurm
(a controller that creates the job and then fails cannot be produced on demand). The live counterparts are in
test_audit2_seam_live.py.
"""

from __future__ import annotations

import errno
import getpass
import json
import os
import signal
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from frenzy_slurm.core.errors import (
    EXIT_ALREADY_SUBMITTED,
    EXIT_FAILURE,
    EXIT_SLURM_UNAVAILABLE,
    EXIT_SLURM_UNEXPECTED,
    FrenzyError,
)
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm import run as run_mod
from frenzy_slurm.slurm.cli import SlurmCliBackend, json_list, parse_sacct, parse_version, partitions_from_scontrol
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.parse import SlurmUnexpected, num, parse_parsable
from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable, run
from frenzy_slurm.slurm.view import Job
from frenzy_slurm.submission import submit

from .helpers import LOCAL, ROOT, make_spec, plan, planned, run_cli

DATA = ROOT / "tests" / "data" / "slurm-22.05"
NAME = b"caf\xe9"  # Latin-1 bytes, as `sbatch -J $'caf\xe9'` stores them
SHOWN = "caf\ufffd"


def _tool(bindir: Path, name: str, body: str) -> None:
    f = bindir / name
    f.write_text(f"#!/bin/sh\n{body}\n")
    f.chmod(0o755)


def squeue_answer(job_name: bytes = NAME, extra: dict | None = None) -> bytes:
    """Slurm 22.05's recorded `squeue --json`, plus a job of this user named with raw bytes (as squeue prints
    them: Slurm does not re-encode names)."""
    payload = json.loads((DATA / "squeue.out").read_text())
    job = payload["jobs"][0] | {
        "job_id": 4242,
        "job_state": "PENDING",
        "user_name": getpass.getuser(),
        "name": "@@NAME@@",
        "comment": "frenzy:0123456789abcdef",
        "current_working_directory": "/nonexistent/jobdir",
        **(extra or {}),
    }
    payload["jobs"].append(job)
    return json.dumps(payload).encode().replace(b"@@NAME@@", job_name)


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """Stand-in sinfo/squeue/scontrol on PATH printing recorded 22.05 answers; `standin(squeue=bytes, ...)`
    replaces an answer."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=standin\n")
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))

    def make(squeue: bytes | None = None, partitions: bytes | None = None, nodes: bytes | None = None) -> Path:
        answers = {
            "squeue": squeue if squeue is not None else (DATA / "squeue.out").read_bytes(),
            "partitions": partitions
            if partitions is not None
            else (DATA / "scontrol-partitions-text.out").read_bytes(),
            "nodes": nodes if nodes is not None else (DATA / "sinfo.out").read_bytes(),
            "config": (DATA / "scontrol-config-text.out").read_bytes(),
        }
        for key, data in answers.items():
            (tmp_path / f"{key}.answer").write_bytes(data)
        _tool(
            bindir, "sinfo", f"case \"$1\" in --version) echo 'slurm 22.05.8';; *) cat {tmp_path}/nodes.answer;; esac"
        )
        _tool(bindir, "squeue", f"cat {tmp_path}/squeue.answer")
        _tool(
            bindir,
            "scontrol",
            f'case "$*" in *partition*) cat {tmp_path}/partitions.answer;; '
            f"*config*) cat {tmp_path}/config.answer;; *) exit 1;; esac",
        )
        return bindir

    return make


# -- item 3: a job name that is not UTF-8 -------------------------------------------------------------------------


def test_run_decodes_bytes_that_are_not_utf8(tmp_path):
    """It used to raise UnicodeDecodeError from inside subprocess.run (text=True, strict UTF-8)."""
    (tmp_path / "out").write_bytes(b"name=" + NAME + b"\xff\n")
    res = run(["cat", str(tmp_path / "out")])
    assert res.stdout == f"name={SHOWN}\ufffd\n"


def test_cli_backend_reads_a_queue_with_a_non_utf8_name(standin):
    standin(squeue=squeue_answer())
    jobs = SlurmCliBackend().jobs(user=getpass.getuser())
    (job,) = [j for j in jobs if j.job_id == 4242]
    assert job.name == SHOWN and job.comment == "frenzy:0123456789abcdef"
    json.loads(job.model_dump_json())  # the queue cache and `--json` write it


@pytest.mark.parametrize("args", [["--all"], ["--all", "--json"], []])
def test_fsqueue_lists_the_job_even_where_the_terminal_cannot_show_it(standin, monkeypatch, tmp_path, args):
    """A reader whose terminal cannot show U+FFFD (a Latin-1 locale) gets '?', not UnicodeEncodeError."""
    job_dir = tmp_path / "jobdir"  # the job is this user's: fsbatch's record makes it a frenzy-slurm job
    job_dir.mkdir(mode=0o700)
    (job_dir / "submission.json").write_text(json.dumps({"job_id": 4242, "submission": "0123456789abcdef"}))
    standin(squeue=squeue_answer(extra={"current_working_directory": str(job_dir)}))
    monkeypatch.setenv("PYTHONIOENCODING", "latin-1")
    res = run_cli("fsqueue", *args)
    assert res.returncode == 0, res.stderr
    if "--json" in args:
        (job,) = [j for j in json.loads(res.stdout) if j["job_id"] == 4242]
        assert job["name"] == SHOWN
    else:
        assert "4242" in res.stdout and "caf?" in res.stdout


def test_fsinfo_works_with_a_non_utf8_name_in_the_queue(standin):
    standin(squeue=squeue_answer())
    res = run_cli("fsinfo")
    assert res.returncode == 0, res.stderr
    assert "a100" in res.stdout
    res = run_cli("fsinfo", "--json")
    assert res.returncode == 0 and SHOWN in [j["name"] for j in json.loads(res.stdout)["jobs"]]


def test_job_model_replaces_lone_surrogates():
    """A surrogateescape'd name (pyslurm, a snapshot) would make model_dump_json raise."""
    job = Job(job_id=1, state="PENDING", name="caf\udce9", comment=b"frenzy:\xff", nodes=["n\udcff"])
    assert (job.name, job.comment, job.nodes) == (SHOWN, "frenzy:\ufffd", ["n\ufffd"])
    assert json.loads(job.model_dump_json())["name"] == SHOWN


def test_pyslurm_backend_reads_a_name_it_cannot_decode():
    """pyslurm decodes strictly when an attribute is read; the backend keeps the job, with U+FFFD."""
    from types import SimpleNamespace

    from frenzy_slurm.slurm import pyslurm_backend as pb

    class StrictJob(SimpleNamespace):
        @property
        def name(self):
            return NAME.decode("utf-8")  # raises UnicodeDecodeError, as pyslurm's to_unicode does

    j = StrictJob(
        id=7,
        state="PENDING",
        state_reason="None",
        partition="t4",
        allocated_nodes=None,
        num_nodes=1,
        gres_per_node={},
        gpus={},
        heterogeneous_id=None,
        heterogeneous_offset=None,
        user_name="u",
        start_time=0,
        end_time=0,
        time_limit=30,
        comment="frenzy:x",
        working_directory=b"/tmp/\xe9",
    )
    job = pb.PyslurmBackend._job(j)
    assert (job.name, job.workdir, job.comment) == (SHOWN, "/tmp/\ufffd", "frenzy:x")


def test_pyslurm_load_that_fails_to_decode_is_read_by_the_cli_backend():
    from types import SimpleNamespace

    from frenzy_slurm.slurm import pyslurm_backend as pb

    def strict_load():
        return NAME.decode("utf-8")

    module = SimpleNamespace(Jobs=SimpleNamespace(load=strict_load))
    backend = pb.PyslurmBackend(module)
    answer = [Job(job_id=1, state="PENDING", name=SHOWN)]
    backend._cli = SimpleNamespace(jobs=lambda job_ids=None, user=None: answer)
    assert backend.jobs(user="u") == answer


def test_table_cells_cannot_drive_the_terminal():
    from frenzy_slurm.cli.common import table

    text = table([["1", "a\x1b[2Jb\nc\td"]], ["ID", "NAME"])
    assert "\x1b" not in text and text.splitlines()[1].split() == ["1", r"a\x1b[2Jb\nc\td"]


# -- item 16: hostile Slurm answers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        b'{"jobs": [1]}',
        b'{"jobs": ["x", {}]}',
        b'{"jobs": "abc"}',
        b"[1, 2]",
        b'{"jobs": [{"job_id": {"number": [1]}, "name": 5}]}',
        b'{"nojobs": []}',
        b"[" * 100_000,
        b'{"jobs": [{"job_id": 1e999, "time_limit": "1:x"}]}',
    ],
)
def test_malformed_json_is_an_unexpected_answer(standin, answer):
    """A list item that is not an object used to give an AttributeError traceback; deep nesting a RecursionError."""
    standin(squeue=answer)
    with pytest.raises(SlurmUnexpected) as exc:
        SlurmCliBackend().jobs()
    assert exc.value.exit_code == EXIT_SLURM_UNEXPECTED and "unexpected Slurm output" in exc.value.message


def test_fsqueue_on_a_hostile_answer_exits_6_without_a_traceback(standin):
    standin(squeue=b'{"jobs": [1]}')
    res = run_cli("fsqueue")
    assert res.returncode == EXIT_SLURM_UNEXPECTED and "unexpected Slurm output" in res.stderr
    assert "Traceback" not in res.stderr


def test_json_list_names_the_bad_item():
    with pytest.raises(SlurmUnexpected, match="with int '1' where an object was expected"):
        json_list('{"jobs": [{}, 1]}', "jobs", ["squeue", "--json"])
    assert json_list('{"jobs": [{"name": "a\tb"}]}', "jobs", ["squeue"]) == [{"name": "a\tb"}]  # raw control chars


def test_a_4mb_scontrol_line_is_read_in_linear_time():
    """`(\\w+)=(\\S*)` over a 4 MB run of word characters took over 150 s."""
    line = "PartitionName=p Nodes=n1 MaxTime=UNLIMITED Comment=" + "a" * 4_000_000 + " " + "b" * 4_000_000
    start = time.perf_counter()
    (part,) = partitions_from_scontrol(line)
    assert time.perf_counter() - start < 2.0
    assert (part.name, part.nodes, part.max_time_min) == ("p", ["n1"], None)


def test_a_long_version_string_is_read_in_linear_time():
    start = time.perf_counter()
    with pytest.raises(SlurmUnexpected):
        parse_version("1" * 1_000_000)
    assert parse_version("slurm " + "9" * 100_000 + " 22.05.8") == (22, 5)
    assert time.perf_counter() - start < 2.0


def test_an_answer_over_the_cap_is_refused_without_reading_it_all(monkeypatch, standin):
    """`cat /dev/zero` as squeue: read up to the cap, the command killed, exit 6 (it used to read forever)."""
    bindir = standin()
    _tool(bindir, "squeue", "exec cat /dev/zero")
    monkeypatch.setattr(run_mod, "MAX_ANSWER_BYTES", 4 << 20)
    start = time.perf_counter()
    with pytest.raises(SlurmUnexpected, match="more than 4,194,304 bytes") as exc:
        SlurmCliBackend().jobs()
    assert exc.value.exit_code == EXIT_SLURM_UNEXPECTED and time.perf_counter() - start < 10


def test_answer_cap_also_bounds_stderr(tmp_path):
    with pytest.raises(SlurmUnexpected):
        run(["sh", "-c", "head -c 3000000 /dev/zero >&2"], max_bytes=1 << 20)


def test_numbers_slurm_cannot_mean():
    assert [num(x) for x in (float("nan"), float("inf"), "\u00b2", "12", {"set": True, "number": float("inf")})] == [
        None,
        None,
        None,
        12,
        None,
    ]
    with pytest.raises(SlurmUnexpected):
        parse_parsable("\u00b2\n")  # isdigit() but not a number int() reads
    assert parse_sacct("\u00b2|1|RUNNING|0:0|||5\n") == {}


# -- item 9: whatever ends sbatch, look the job up by its tag ------------------------------------------------------


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def world():
    view = synthetic(LOCAL)
    spec = make_spec()
    return view, spec, plan(spec, view)


def request(world, job_dir: Path):
    """The request fsbatch would submit (planning.plan_job) into `job_dir`."""
    view, spec, _ = world
    return planned(spec, view, job_dir)


def _created_then(slurm: FakeSlurm, error: Exception, signals: int = 0):
    """slurm.submit creates the job, optionally signals this process, then fails with `error` (or answers)."""
    orig = slurm.submit

    def submit_(job):
        done = orig(job)
        for _ in range(signals):
            os.kill(os.getpid(), signal.SIGTERM)
        if error is not None:
            raise error
        return done

    slurm.submit = submit_


@pytest.mark.parametrize(
    "error",
    [
        # sbatch's own MessageTimeout against a paused slurmctld: exit 1 with an outage message, not our timeout
        SlurmUnavailable(
            "Slurm is unreachable: sbatch: error: Batch job submission failed: Socket timed out on "
            "send/recv operation (from 'sbatch --parsable job.sbatch')."
        ),
        SlurmCommandError(["sbatch"], 1, "sbatch: error: Batch job submission failed: Unexpected message received"),
        SlurmCommandError(["sbatch"], -2, ""),  # killed by a signal after sending the job
        SlurmUnexpected("sbatch --parsable printed 'garbage', not a job id"),
    ],
    ids=["sbatch-own-timeout", "error-exit", "killed", "garbled-answer"],
)
def test_sbatch_ending_without_a_job_id_still_records_the_job(world, tmp_path, error):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, error)
    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, slurm, timeout_waits=(0.0,))
    assert list(slurm.fake_jobs) == [done.job_id]
    record = json.loads((req.job_dir / "submission.json").read_text())
    assert record["job_id"] == done.job_id and "found in the queue by its tag" in record["recovered"]


def test_sbatch_own_timeout_without_a_job_says_it_may_appear(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    slurm.submit = lambda job: (_ for _ in ()).throw(SlurmUnavailable("Slurm is unreachable: socket timed out."))
    req = request(world, tmp_path / "jobs" / "a")
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm, timeout_waits=(0.0,))
    assert exc.value.exit_code == EXIT_SLURM_UNAVAILABLE
    assert f"frenzy:{req.submission}" in exc.value.message and "may still have been created" in exc.value.message


# -- item 15: a full disk and signals during sbatch ----------------------------------------------------------------


def test_disk_full_after_sbatch_names_the_job_and_a_rerun_records_it(world, tmp_path, monkeypatch):
    import frenzy_slurm.submission as sub

    slurm = FakeSlurm(world[0], user=getpass.getuser())
    req = request(world, tmp_path / "jobs" / "a")
    real = sub.write_json

    def full(path, data, mode=0o600):
        if path.name == "submission.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, data, mode)

    monkeypatch.setattr(sub, "write_json", full)
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    (job_id,) = slurm.fake_jobs
    assert exc.value.exit_code == EXIT_FAILURE
    msg = exc.value.message
    assert f"job {job_id} was submitted" in msg and "No space left on device" in msg
    assert str(req.job_dir / "submission.json") in msg and f"frenzy:{req.submission}" in msg
    monkeypatch.setattr(sub, "write_json", real)  # space again: the same fsbatch finds the job, submits nothing
    with pytest.raises(FrenzyError) as again:
        submit(request(world, req.job_dir), slurm)
    assert again.value.exit_code == EXIT_ALREADY_SUBMITTED and str(job_id) in again.value.message
    assert json.loads((req.job_dir / "submission.json").read_text())["job_id"] == job_id
    assert list(slurm.fake_jobs) == [job_id]


def test_sigterm_during_sbatch_records_the_job_before_stopping(world, tmp_path, capfd):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, None, signals=1)
    req = request(world, tmp_path / "jobs" / "a")
    before = signal.getsignal(signal.SIGTERM)  # another test (or the runtime's signals module) may have set one
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    (job_id,) = slurm.fake_jobs
    assert exc.value.exit_code == 128 + signal.SIGTERM
    assert f"job {job_id} was submitted and recorded" in exc.value.message
    assert json.loads((req.job_dir / "submission.json").read_text())["job_id"] == job_id
    assert "SIGTERM received: finishing the submission first" in capfd.readouterr().err
    assert signal.getsignal(signal.SIGTERM) is before  # handlers restored


def test_second_signal_stops_at_once_naming_the_tag(world, tmp_path):
    slurm = FakeSlurm(world[0], user=getpass.getuser())
    _created_then(slurm, None, signals=2)
    req = request(world, tmp_path / "jobs" / "a")
    with pytest.raises(FrenzyError) as exc:
        submit(req, slurm)
    assert exc.value.exit_code == 128 + signal.SIGTERM
    assert f"frenzy:{req.submission}" in exc.value.message and "a job may have been created" in exc.value.message
    assert not (req.job_dir / "submission.json").exists()
    with pytest.raises(FrenzyError) as again:  # the same fsbatch finds it by its tag
        submit(request(world, req.job_dir), slurm)
    assert again.value.exit_code == EXIT_ALREADY_SUBMITTED
    assert (req.job_dir / "submission.json").exists()


@pytest.mark.parametrize(
    "code,fix", [(errno.ENOSPC, "file system is full"), (errno.EDQUOT, "quota"), (errno.EROFS, "read-only")]
)
def test_os_errors_are_one_message_and_exit_1(code, fix):
    from frenzy_slurm.cli.common import reports_errors

    @click.command()
    @reports_errors("fsx")
    def cmd():
        raise OSError(code, os.strerror(code), "/jobs/x/plan.json")

    res = CliRunner().invoke(cmd, [])
    assert res.exit_code == EXIT_FAILURE and isinstance(res.exception, (SystemExit, type(None)))
    assert f"fsx: error: cannot read or write /jobs/x/plan.json: {os.strerror(code)}" in res.output
    assert fix in res.output and "Traceback" not in res.output


def test_a_gres_type_with_a_newline_is_not_a_gpu_type():
    """A GRES type reaches `#SBATCH --gres=gpu:TYPE:N`: one with whitespace in it (a hostile or broken answer)
    is not read as a type (it would end the #SBATCH block), and `$` no longer accepts a trailing newline."""
    from frenzy_slurm.slurm.parse import parse_gpu_gres

    assert parse_gpu_gres("gpu:a100\n#SBATCH --wrap=x:4") == (None, 0)
    assert parse_gpu_gres("gpu:a100:4\n") == ("a100", 4)  # split_gres strips the item: an honest trailing newline
    assert parse_gpu_gres("gpu:a1 00:4") == (None, 0)
    assert parse_gpu_gres("gpu:a100:3(IDX:0-2),gpu:v100:1") == ("a100", 4)
