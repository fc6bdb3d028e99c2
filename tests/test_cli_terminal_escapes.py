"""What reaches a terminal cannot drive it: job names, comments, paths, records and error messages that hold ESC
sequences, carriage returns, BEL or bytes that are not UTF-8 are printed escaped (`\\x1b`), printable UTF-8 as it
is, and `--json` stays exact, valid JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.cli.common import echo, printable
from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL, ROOT

FSQUEUE = "import sys; from frenzy_slurm.cli.fsqueue import main; sys.argv[0] = 'fsqueue'; main()"
FSBATCH = "import sys; from frenzy_slurm.cli.fsbatch import main; sys.argv[0] = 'fsbatch'; main()"
HOSTILE = "x\x1b]0;owned\x07\x1b[2J\rY\u202eZ"  # set the title, ring, clear the screen, rewrite the line, reverse


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("a\x1b[31mred", r"a\x1b[31mred"),
        ("over\rwrite", r"over\rwrite"),
        ("bell\x07", r"bell\x07"),
        ("two\nlines\ttab", r"two\nlines\ttab"),
        ("caf" + b"\xe9".decode("utf-8", "surrogateescape"), r"caf\xe9"),  # a file name that is not UTF-8
        ("rtl\u202eoverride", r"rtl\u202eoverride"),
        ("\x9b31m", r"\x9b31m"),  # the one-byte CSI of C1 controls
        ("café 日本語 ünï\u00a0ok", "café 日本語 ünï\u00a0ok"),  # printable UTF-8 and spaces as they are
    ],
)
def test_printable_escapes_what_is_not_printable(text, shown):
    assert printable(text) == shown


def test_echo_keeps_line_breaks_and_tabs(capsys):
    echo("one\x1b[2J\ntwo\tthree\r")
    assert capsys.readouterr().out == "one\\x1b[2J\ntwo\tthree\\r\n"


def _run(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env
    )


def test_error_messages_are_escaped(tmp_path):
    missing = tmp_path / f"model{HOSTILE}.yaml"
    res = _run(FSBATCH, str(missing), "--dry-run", env=dict(os.environ))
    assert res.returncode == 2, res.stderr
    assert "\x1b" not in res.stderr and "\r" not in res.stderr and "\x07" not in res.stderr
    assert r"x\x1b]0;owned\x07\x1b[2J\rY\u202eZ" in res.stderr


def _snapshot(path: Path, jobs: list[Job]) -> Path:
    from frenzy_slurm.sim.synthetic import synthetic

    path.write_text(synthetic(LOCAL).model_copy(update={"jobs": jobs}).model_dump_json())
    return path


def test_fsqueue_job_detail_escapes_name_reason_paths_and_records(tmp_path):
    jobs = tmp_path / "jobs"
    job_dir = jobs / f"run-{HOSTILE}"
    job_dir.mkdir(parents=True, mode=0o700)
    (job_dir / "submission.json").write_text(json.dumps({"job_id": 42, "submission": "abc"}))
    (job_dir / "moved.json").write_text(json.dumps({"moved_to_job": "43", "to": HOSTILE}))
    job = Job(
        job_id=42,
        state="PENDING",
        reason=f"Resources{HOSTILE}",
        comment="frenzy:abc",
        user=_me(),
        workdir=str(job_dir),
        name=f"name{HOSTILE}",
        partition="a100",
        gpus_per_node=1,
        node_count=1,
    )
    snap = _snapshot(tmp_path / "snap.json", [job])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FRENZY_JOBS_DIR": str(jobs)}
    for args in (["42"], []):
        res = _run(FSQUEUE, *args, "--backend", "static", "--snapshot", str(snap), env=env)
        assert res.returncode == 0, res.stderr
        for raw in ("\x1b", "\r", "\x07", "\u202e"):
            assert raw not in res.stdout, (raw, res.stdout)
        assert r"namex\x1b]0;owned\x07\x1b[2J\rY\u202eZ" in res.stdout
    detail = _run(FSQUEUE, "42", "--backend", "static", "--snapshot", str(snap), env=env).stdout
    assert r"run-x\x1b]0;owned\x07\x1b[2J\rY\u202eZ" in detail  # the job directory
    assert r"reason=Resourcesx\x1b]0;owned" in detail and r"(x\x1b]0;owned\x07" in detail  # Slurm's, moved.json's
    exact = _run(FSQUEUE, "42", "--json", "--backend", "static", "--snapshot", str(snap), env=env)
    data = json.loads(exact.stdout)  # --json: valid JSON, the values exact
    assert data["name"] == f"name{HOSTILE}" and any(HOSTILE in n for n in data["notes"])


def test_a_job_directory_name_that_is_not_utf8_is_shown_by_its_bytes(tmp_path):
    """A job that has left the queue is found by its directory, whose name (read from the file system) may hold
    any bytes: shown as `\\xff`, never raw."""
    jobs = tmp_path / "jobs"
    job_dir = jobs / os.fsdecode(b"old-\xff\x1b[2J")
    job_dir.mkdir(parents=True, mode=0o700)
    (job_dir / "submission.json").write_text(json.dumps({"job_id": 77, "submission": "abc"}))
    snap = _snapshot(tmp_path / "snap.json", [])
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "FRENZY_JOBS_DIR": str(jobs)}
    res = _run(FSQUEUE, "77", "--backend", "static", "--snapshot", str(snap), env=env)
    assert res.returncode == 0, res.stderr
    assert r"old-\xff\x1b[2J" in res.stdout and "\x1b" not in res.stdout
    data = json.loads(_run(FSQUEUE, "77", "--json", "--backend", "static", "--snapshot", str(snap), env=env).stdout)
    assert data["job_dir"] == str(job_dir)


def _me() -> str:
    import pwd

    return pwd.getpwuid(os.geteuid()).pw_name


def test_table_cells_cannot_drive_the_terminal():
    from frenzy_slurm.cli.common import table

    text = table([["1", "a\x1b[2Jb\nc\td"]], ["ID", "NAME"])
    assert "\x1b" not in text and text.splitlines()[1].split() == ["1", r"a\x1b[2Jb\nc\td"]
