"""On the real local cluster: a job named with bytes that are not UTF-8 breaks no reader (fsqueue, fsinfo,
the Python API). The unit tests of the same rules are in test_seam_hostile_answers.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from frenzy_slurm.slurm.cli import SlurmCliBackend

from .helpers import payload_spec_file, run_cli
from .slurm_fixture import sh, wait_for

TAG = "frenzy:00000000deadbeef"


@pytest.fixture
def env(live_jobs_dir):
    return live_jobs_dir.parent


spec_file = payload_spec_file


def _sbatch_bytes(*args: bytes) -> int:
    """sbatch with raw byte arguments (as a shell's $'...' passes them); the job id."""
    res = subprocess.run(
        [b"sbatch", b"--parsable", b"-p", b"t4", b"-t", b"10", b"-o", b"/dev/null", *args, b"--wrap", b"sleep 300"],
        capture_output=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    return int(res.stdout.split(b";")[0])


def test_non_utf8_job_names_break_no_reader(env):
    """Another user's `sbatch -J $'caf\\xe9'` (and a name with a tab and an escape sequence) used to make every
    fsqueue, fsinfo and fsbatch die with UnicodeDecodeError until the job left the queue."""
    odd_dir, ctl_dir = env / "odd", env / "ctl"
    for d in (odd_dir, ctl_dir):
        d.mkdir(mode=0o700)
    odd = _sbatch_bytes(b"-J", b"caf\xe9", f"--comment={TAG}".encode(), b"-D", bytes(odd_dir))
    ctl = _sbatch_bytes(b"-J", b"a\tb\x1b[2J", b"--comment=frenzy:\xff\xfe", b"-D", bytes(ctl_dir))
    # fsbatch's records, as for its own jobs: this user's jobs count as frenzy-slurm's only with them
    for d, job, submission in ((odd_dir, odd, TAG.removeprefix("frenzy:")), (ctl_dir, ctl, "\ufffd\ufffd")):
        (d / "submission.json").write_text(json.dumps({"job_id": job, "submission": submission}))
    try:
        _check_readers(env, odd, ctl)
    finally:
        # the jobs stay listed for MinJobAge (300 s) after they end: renamed first, so that the later live tests
        # of this session (and their helpers, which decode strictly) see plain names
        for job in (odd, ctl):
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", "JobName=renamed", "Comment=renamed"],
                capture_output=True,
                timeout=60,
            )


def _check_readers(env: Path, odd: int, ctl: int) -> None:
    wait_for(lambda: len(sh("squeue", "-h", "-o", "%i").split()) == 2, what="both jobs queued")
    listed = {j.job_id: j for j in SlurmCliBackend().jobs()}
    assert listed[odd].name == "caf\ufffd" and listed[odd].comment == TAG
    text = {j.job_id: j for j in SlurmCliBackend(force_text=True).jobs()}  # squeue -o reads the same
    assert text[odd].name == "caf\ufffd"
    for argv in (
        ["fsqueue", "--all"],
        ["fsqueue", "--all", "--json"],
        ["fsinfo"],
        ["fsinfo", "--json"],
        ["fsbatch", str(spec_file(env, "dry")), "--dry-run"],
    ):
        res = run_cli(*argv)
        assert res.returncode == 0, (argv, res.stderr)
        assert "\x1b" not in res.stdout and "Traceback" not in res.stderr
    shown = run_cli("fsqueue", "--all", "--json")
    names = {j["job_id"]: j["name"] for j in json.loads(shown.stdout)}
    assert names[odd] == "caf\ufffd" and names[ctl].startswith("a")
    assert str(odd) in run_cli("fsqueue", "--all").stdout
