"""The progress line of `fsbatch --wait` (one per job of a sweep): its text from a job's state, elapsed time
and the trainer's progress.json; the trainer's record written at a bounded rate; the display redrawn in place
on a terminal (a pty) and silent elsewhere (a pipe, CliRunner's captured stderr)."""

from __future__ import annotations

import fcntl
import getpass
import io
import json
import os
import pty
import select
import struct
import termios
from functools import partial

import pytest
from click.testing import CliRunner

import frenzy_slurm.slurm as seam
from frenzy_slurm import api
from frenzy_slurm.cli.fsbatch import main as fsbatch
from frenzy_slurm.track import progress
from frenzy_slurm.track.progress import ProgressDisplay, ProgressRecorder, progress_line, read_progress

from .helpers import EXAMPLES, ROOT

SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
TINY = EXAMPLES / "tiny-cpu.yaml"


def test_the_line_says_state_elapsed_step_loss():
    running = {"step": 40, "total_steps": 100, "loss": 2.31415, "step_time_s": 1.2}
    assert (
        progress_line(1234, "tiny", "RUNNING", 65, running)
        == "1234 tiny RUNNING 00:01:05 step 40/100 loss 2.314 1.2 s/step"
    )
    assert progress_line(7, "x", "PENDING", None, None, "Resources") == "7 x PENDING (Resources)"
    assert progress_line(8, "x", "RUNNING", 90061, {"step": 3}) == "8 x RUNNING 1-01:01:01 step 3"
    assert progress_line(9, "a\x1b[2Jb", "RUNNING", 0, {"loss": True}) == "9 a?[2Jb RUNNING 00:00:00"


def test_the_trainer_records_progress_at_a_bounded_rate(tmp_path):
    now = [0.0]
    rec = ProgressRecorder(tmp_path, total_steps=10, every_s=30, clock=lambda: now[0])
    wrote = []
    for step in range(1, 11):
        if rec.step(step, 10.0 / step, 10.0):
            wrote.append(step)
        now[0] += 10
    assert wrote == [1, 4, 7, 10]  # the first step, every 30 s, the last
    record = json.loads((tmp_path / "progress.json").read_text())
    assert (record["step"], record["total_steps"], record["loss"], record["step_time_s"]) == (10, 10, 1.0, 10.0)
    assert [p.name for p in tmp_path.iterdir()] == ["progress.json"]  # renamed into place, no temporary left
    assert read_progress(tmp_path)["step"] == 10
    # the run's end: metrics.json, newer, is what is shown (its last loss)
    (tmp_path / "metrics.json").write_text(
        json.dumps({"step": 11, "total_steps": 11, "loss": [[11, 0.5]], "written_at": 2e9})
    )
    assert (read_progress(tmp_path)["step"], read_progress(tmp_path)["loss"]) == (11, 0.5)


def _pty(cols: int = 80, rows: int = 24):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    return master, open(slave, "w", encoding="utf-8", closefd=True)  # noqa: SIM115  # closed by the test


def _read(master: int) -> str:
    """Everything written to the terminal so far (until nothing more arrives for 0.2 s)."""
    out = b""
    while select.select([master], [], [], 0.2)[0]:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    return out.decode().replace("\r\n", "\n")  # the terminal's ONLCR: a newline arrives as CR LF


def test_on_a_terminal_lines_are_redrawn_in_place():
    master, stream = _pty()
    try:
        d = ProgressDisplay(stream)
        assert d.enabled
        d.show(["1 a RUNNING", "2 b PENDING"])
        d.show(["1 a RUNNING 00:00:01", "2 b RUNNING"])
        d.message("fsbatch: job 1 ended COMPLETED, exit code 0")
        d.close()
        assert _read(master) == (
            "1 a RUNNING\x1b[K\n2 b PENDING\x1b[K"
            "\r\x1b[1A\x1b[J1 a RUNNING 00:00:01\x1b[K\n2 b RUNNING\x1b[K"
            "\r\x1b[1A\x1b[Jfsbatch: job 1 ended COMPLETED, exit code 0\n"
            "1 a RUNNING 00:00:01\x1b[K\n2 b RUNNING\x1b[K"
            "\r\x1b[1A\x1b[J"
        )
    finally:
        stream.close()
        os.close(master)


def test_a_line_fits_the_terminal_and_a_block_its_height():
    master, stream = _pty(cols=20, rows=5)
    try:
        d = ProgressDisplay(stream)
        d.show([f"{i} job-with-a-long-name RUNNING" for i in range(10)])
        shown = _read(master).split("\n")
        assert shown == [
            "0 job-with-a-long-~\x1b[K",
            "1 job-with-a-long-~\x1b[K",
            "2 job-with-a-long-~\x1b[K",
            "... and 7 more jobs\x1b[K",
        ]
    finally:
        stream.close()
        os.close(master)


def test_a_terminal_of_no_size_is_taken_as_80_columns():
    master, stream = _pty(cols=0, rows=0)  # as pty.openpty() leaves it, and `script` without a size
    try:
        ProgressDisplay(stream).show(["1 tiny-cpu RUNNING 00:00:01 step 2/6"])
        assert _read(master) == "1 tiny-cpu RUNNING 00:00:01 step 2/6\x1b[K"
    finally:
        stream.close()
        os.close(master)


def test_elsewhere_nothing_is_drawn():
    r, w = os.pipe()
    with open(w, "w") as pipe_end, open(r) as reader:
        d = ProgressDisplay(pipe_end)
        d.show(["1 a RUNNING"])
        d.message("fsbatch: job 1 ended COMPLETED, exit code 0")
        d.close()
        pipe_end.close()
        assert not d.enabled and reader.read() == "fsbatch: job 1 ended COMPLETED, exit code 0\n"
    buf = io.StringIO()
    ProgressDisplay(buf).show(["x"])
    assert buf.getvalue() == ""


@pytest.fixture
def sweep(tmp_path, monkeypatch):
    """fsbatch --wait of a two-job sweep on an in-memory Slurm whose clock moves when fsbatch sleeps; while
    they run, each job's trainer writes progress.json."""
    from frenzy_slurm.slurm.fake import FakeSlurm
    from frenzy_slurm.slurm.view import ClusterView

    monkeypatch.setenv("FRENZY_JOBS_DIR", str(tmp_path / "jobs"))
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    view = ClusterView.model_validate_json((EXAMPLES / "offline" / "cluster.json").read_text())
    slurm = FakeSlurm(view, user=getpass.getuser())
    monkeypatch.setattr(seam, "open_backend", lambda backend, snapshot=None: slurm)
    monkeypatch.setattr(progress, "READ_EVERY_S", 0.0)

    def sleep(seconds: float) -> None:
        for jid, j in slurm.fake_jobs.items():
            if j.run_s is None:
                slurm.set_run_time(jid, 20 * (jid - 999))  # 20 s and 40 s
            if j.state == "RUNNING":
                step = int((slurm.now - j.start) // 5) + 1
                rec = {"step": step, "total_steps": 6, "loss": 5.0 / step, "step_time_s": 5.0, "written_at": slurm.now}
                (tmp_path / "jobs").mkdir(exist_ok=True)
                job_dir = next(
                    d
                    for d in (tmp_path / "jobs").iterdir()
                    if (d / "submission.json").exists()
                    and json.loads((d / "submission.json").read_text())["job_id"] == jid
                )
                (job_dir / "progress.json").write_text(json.dumps(rec))
        slurm.advance(seconds)

    monkeypatch.setattr(api, "_sleep", sleep)
    return slurm


def run_wait(*extra: str):
    return CliRunner().invoke(
        fsbatch, [str(TINY), "--site", str(SITE), "--set", "training.steps=6,7", "--wait", *extra]
    )


def test_a_sweep_shows_one_line_per_job_on_a_terminal(sweep, monkeypatch):
    monkeypatch.setattr(progress, "ProgressDisplay", partial(ProgressDisplay, enabled=True))
    res = run_wait()
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "fsbatch: job 1000 ended COMPLETED, exit code 0" in res.stdout
    assert "fsbatch: job 1001 ended COMPLETED, exit code 0" in res.stdout
    frames = [f for f in res.stderr.split("\r\x1b[1A\x1b[J") if f]
    two = [f.split("\x1b[K\n") for f in frames if f.count("\x1b[K") == 2]
    assert two and all(
        a.startswith("1000 tiny-cpu_6 RUNNING") and b.startswith("1001 tiny-cpu_7 RUNNING") for a, b in two
    )
    assert any("step 2/6 loss 2.5 5 s/step" in a for a, _ in two)
    assert res.stderr.endswith("\r\x1b[J") or res.stderr.endswith("\x1b[J")  # cleared at the end


def test_not_on_a_terminal_only_the_ended_lines(sweep):
    res = run_wait("--json")
    assert res.exit_code == 0, res.stdout + res.stderr
    assert "\r" not in res.stderr and "\x1b" not in res.stderr
    assert [line for line in res.stderr.splitlines() if "ended" in line] == [
        "fsbatch: job 1000 ended COMPLETED, exit code 0",
        "fsbatch: job 1001 ended COMPLETED, exit code 0",
    ]
    assert [o["job_id"] for o in json.loads(res.stdout)] == [1000, 1001]
