"""The Slurm seam against hostile or broken answers: another user's job name that is not UTF-8 breaks no
reader (the CLI and pyslurm backends, fsqueue, fsinfo); malformed JSON, huge answers and numbers Slurm cannot
mean are an unexpected answer (exit 6) read in linear time, never a traceback; a GRES type with whitespace is
no GPU type.

Slurm's answers come from stand-in tools on PATH that print the answers the real Slurm 22.05 gave
(tests/data/slurm-22.05/), with one hostile job or line spliced in. The live counterpart is
test_seam_non_utf8_names_live.py."""

from __future__ import annotations

import getpass
import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import (
    EXIT_SLURM_UNEXPECTED,
)
from frenzy_slurm.slurm import run as run_mod
from frenzy_slurm.slurm.cli import SlurmCliBackend, json_list, parse_sacct, parse_version, partitions_from_scontrol
from frenzy_slurm.slurm.parse import SlurmUnexpected, num, parse_parsable
from frenzy_slurm.slurm.run import run
from frenzy_slurm.slurm.view import Job

from .helpers import ROOT, run_cli

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


# -- a job name that is not UTF-8 -------------------------------------------------------------------------


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
    asdict(job)  # the queue cache and `--json` write it


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
    assert asdict(job)["name"] == SHOWN


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


# -- hostile Slurm answers -------------------------------------------------------------------------------


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


def test_a_gres_type_with_a_newline_is_not_a_gpu_type():
    """A GRES type reaches `#SBATCH --gres=gpu:TYPE:N`: one with whitespace in it (a hostile or broken answer)
    is not read as a type (it would end the #SBATCH block), and `$` no longer accepts a trailing newline."""
    from frenzy_slurm.slurm.parse import parse_gpu_gres

    assert parse_gpu_gres("gpu:a100\n#SBATCH --wrap=x:4") == (None, 0)
    assert parse_gpu_gres("gpu:a100:4\n") == ("a100", 4)  # split_gres strips the item: an honest trailing newline
    assert parse_gpu_gres("gpu:a1 00:4") == (None, 0)
    assert parse_gpu_gres("gpu:a100:3(IDX:0-2),gpu:v100:1") == ("a100", 4)
