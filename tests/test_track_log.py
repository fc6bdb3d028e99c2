"""`fsqueue JOBID --log`: the job's output per component and rank (srun --label marks each
rank's lines), the batch script's own lines first, --tail/--rank/--component, --json bounded, and only regular
files of the user's own job directory read. Against FakeSlurm with output files written as srun writes them;
tests/test_track_cancel_and_log_live.py reads a real job's."""

from __future__ import annotations

import getpass
import json
import os

import pytest
from click.testing import CliRunner

import frenzy_slurm.slurm as seam
from frenzy_slurm.cli.fsqueue import main
from frenzy_slurm.core.errors import EXIT_BAD_INPUT
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import job_logs

from .helpers import LOCAL, fill, make_spec, planned

HETERO_SPEC = dict(
    model={"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
    training={"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
)


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(tmp_path / "locks"))


@pytest.fixture
def het(tmp_path):
    """A submitted two-component job (v100 ranks 0-1, t4 ranks 2-3) and its output file, as srun --label wrote it."""
    view = fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    req = planned(make_spec(**HETERO_SPEC), view, tmp_path / "jobs" / "h")
    assert [c.gpus for c in req.decision.chosen.components] == [2, 2]
    slurm = FakeSlurm(view, user=getpass.getuser())
    done = submit(req, slurm)
    assert "--label" in (req.job_dir / "job.sbatch").read_text()
    lines = ["frenzy-slurm: job 1 restart 0 on v100-1, master v100-1:29500"]
    for step in range(3):
        lines += [f"{r}: rank {r} step {step}" for r in (2, 0, 3, 1)]
    lines += ["0: Traceback:\twith a tab", "srun: error: t4-4: task 3: Exited with exit code 1"]
    (req.job_dir / f"slurm-{done.job_id}.out").write_text("\n".join(lines) + "\n")
    return slurm, done


def fsqueue(slurm, monkeypatch, *args: str):
    monkeypatch.setattr(seam, "open_backend", lambda backend, snapshot=None: slurm)
    return CliRunner().invoke(main, list(args))


def test_log_groups_lines_per_component_and_rank(het, monkeypatch):
    slurm, done = het
    res = fsqueue(slurm, monkeypatch, str(done.job_id), "--log")
    assert res.exit_code == 0, res.stdout + res.stderr
    headers = [line for line in res.stdout.splitlines() if line.startswith("==> ")]
    assert headers == [
        "==> batch script and srun <==",
        "==> component 0 (v100) rank 0 <==",
        "==> component 0 (v100) rank 1 <==",
        "==> component 1 (t4) rank 2 <==",
        "==> component 1 (t4) rank 3 <==",
    ]
    body = res.stdout.split("==> component 0 (v100) rank 0 <==\n")[1].split("==>")[0].splitlines()
    assert body == ["rank 0 step 0", "rank 0 step 1", "rank 0 step 2", "Traceback:    with a tab"]
    batch = res.stdout.split("==> batch script and srun <==\n")[1].split("==>")[0]
    assert "frenzy-slurm: job 1 restart 0" in batch and "srun: error: t4-4: task 3" in batch


def test_tail_rank_and_component(het, monkeypatch):
    slurm, done = het
    res = fsqueue(slurm, monkeypatch, str(done.job_id), "--log", "--tail", "1", "--component", "1", "--json")
    out = json.loads(res.stdout)
    assert [(s["rank"], s["component"], s["partition"], s["lines"]) for s in out["sections"]] == [
        (2, 1, "t4", ["rank 2 step 2"]),
        (3, 1, "t4", ["rank 3 step 2"]),
    ]
    assert out["files"] == [str(done.job_dir / f"slurm-{done.job_id}.out")] and out["truncated"] is False
    res = fsqueue(slurm, monkeypatch, str(done.job_id), "--log", "--rank", "1")
    assert res.stdout.count("==> ") == 1 and "rank 1 step 2" in res.stdout and "rank 0" not in res.stdout


@pytest.mark.parametrize(
    "args,said",
    [
        (["--log", "--rank", "9"], "ranks 0..3"),
        (["--log", "--component", "2"], "components 0..1"),
        (["--log", "--rank", "0", "--component", "1"], "is in component 0"),
        (["--tail", "3"], "go with --log"),
    ],
)
def test_bad_selections_exit_2(het, monkeypatch, args, said):
    slurm, done = het
    res = fsqueue(slurm, monkeypatch, str(done.job_id), *args)
    assert res.exit_code == EXIT_BAD_INPUT and said in res.stderr, res.stderr


def test_log_needs_a_job(het, monkeypatch):
    res = fsqueue(het[0], monkeypatch, "--log")
    assert res.exit_code == EXIT_BAD_INPUT and "fsqueue JOBID --log" in res.stderr


def test_reads_are_bounded_and_never_through_a_link(het, tmp_path):
    slurm, done = het
    out = done.job_dir / f"slurm-{done.job_id}.out"
    with out.open("a") as f:
        f.writelines(f"1: filler {i}\n" for i in range(5000))
    logs = job_logs(done.job_dir, done.job_id, max_bytes=4096)
    assert logs.truncated and any("only the last" in n for n in logs.notes)
    assert logs.sections[2].lines[-1] == "filler 4999" and len(logs.sections[2].lines) < 400
    secret = tmp_path / "secret"
    secret.write_text("0: not the job's\n")
    out.unlink()
    os.symlink(secret, out)
    with pytest.raises(Exception) as exc:
        job_logs(done.job_dir, done.job_id)
    assert "symbolic link" in str(exc.value)


def test_job_not_started_yet_says_so(het, monkeypatch):
    slurm, done = het
    (done.job_dir / f"slurm-{done.job_id}.out").unlink()
    res = fsqueue(slurm, monkeypatch, str(done.job_id), "--log", "--json")
    out = json.loads(res.stdout)
    assert res.exit_code == 0 and out["files"] == [] and "does not exist yet" in out["notes"][0]
    assert [s["lines"] for s in out["sections"]] == [[], [], [], [], []]
