"""`frenzy-slurm watch --all-users` on the real Slurm 22.05 dev cluster, with a second local user's job.

The second user (`fsaudit`, tests/users.py) cannot run this checkout's Python (it lives under /root), so its job is
planned here and submitted as that user with sbatch (the rendered script says everything, as fsbatch submits it),
and its directory handed to it (chown) before and after: Slurm and the watcher see fsaudit's job, in a directory
of fsaudit's. The watcher runs as root, which Slurm treats as an administrator (an operator and more). The job
waits as 1x4 T4 (every GPU held); once 2 T4s free up on one node, the watcher changes it in place to a shape that
starts there, and records that in its own state directory. Without operator rights Slurm 22.05 answers another
user's update with "Invalid user id for job N", which the seam recognises."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from frenzy_slurm.slurm.backend import SbatchAnswer
from frenzy_slurm.slurm.commands import update_pending_argv
from frenzy_slurm.slurm.run import SlurmCommandError

from .helpers import DEV_SITE, ROOT
from .slurm_fixture import occupy_gpus, sh, wait_for
from .users import LocalUser, as_user, other_user  # noqa: F401  (other_user is a fixture)

pytestmark = [pytest.mark.live]


def _chown(user: LocalUser, path: Path) -> None:
    subprocess.run(["chown", "-R", f"{user.uid}:{user.gid}", str(path)], check=True, timeout=60)


def _as_user(user: LocalUser, argv: list[str], base: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`argv` as `user`, with the copy of slurm.conf it can read (the cluster's own lies under pytest's 0700 tmp)."""
    return as_user(user, argv, cwd=cwd, env=dict(os.environ, SLURM_CONF=str(base / "etc" / "slurm.conf")))


def _submit_as(user: LocalUser, base: Path, name: str) -> tuple[int, Path]:
    """Plan a job marked slurm.replan into `base/jobs/name`, submitted by `user` with sbatch."""
    from frenzy_slurm.api import open_site
    from frenzy_slurm.jobspec import JobSpec, resolve_model
    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import JobFile, PlanOptions, plan_job
    from frenzy_slurm.slurm import open_backend
    from frenzy_slurm.submission import submit

    backend = open_backend("cli")

    def sbatch_as_user(job):  # type: ignore[no-untyped-def]
        _chown(user, base)
        res = _as_user(user, ["sbatch", "--parsable", str(job.script)], base, job.script.parent)
        assert res.returncode == 0, res.stderr
        return SbatchAnswer(job_id=int(res.stdout.strip().split(";")[0]), cluster=None, argv=["sbatch"])

    backend.submit = sbatch_as_user  # type: ignore[method-assign]
    raw = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    raw.update(name=name, slurm={"replan": True}, limits={"gpu_types": ["t4"], "max_gpus": 4})
    spec = JobSpec.model_validate(raw)
    job = JobFile(base / f"{name}.yaml", spec, resolve_model(spec, "."))
    opts = PlanOptions(slurm=SlurmOptions(replan=True), job_dir=base / "jobs" / name, env_check="off")
    done = submit(plan_job(job, open_site(DEV_SITE), backend, opts), backend)
    _chown(user, base)  # submission.json, written after sbatch answered
    return done.job_id, done.job_dir


def _watch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from frenzy_slurm.cli.admin import main; sys.argv[0] = 'frenzy-slurm'; main()"
    env_args = ["watch", "--all-users", "--once", "--json", "--site", str(DEV_SITE), "--backend", "cli", *args]
    return subprocess.run(
        [sys.executable, "-c", code, *env_args], capture_output=True, text=True, cwd=ROOT, timeout=300
    )


@pytest.fixture
def base(tmp_path_factory, other_user, live_jobs_dir, monkeypatch):  # noqa: F811
    """A root-owned, world-traversable directory for the other user's jobs (a pytest tmp directory is 0700)."""
    path = Path("/tmp") / f"frenzy-all-users-{tmp_path_factory.getbasetemp().name}"
    path.mkdir(mode=0o755, exist_ok=True)
    path.chmod(0o755)
    shutil.copytree(Path(os.environ["SLURM_CONF"]).parent, path / "etc", dirs_exist_ok=True)
    subprocess.run(["chmod", "-R", "a+rX", str(path / "etc")], check=True, timeout=60)
    monkeypatch.setenv("XDG_STATE_HOME", str(live_jobs_dir.parent / "state"))
    # the other user's Slurm commands reach munged's socket, inside the cluster's state directory: the directories
    # down to it are made traversable (not readable) for the test, and put back after it
    conf = Path(os.environ["SLURM_CONF"])
    found = re.search(r"socket=([^,\s]+)", conf.read_text())
    socket = Path(found.group(1)) if found else conf.parent.parent / "munge" / "munge.socket"
    modes = {d: d.stat().st_mode & 0o7777 for d in socket.parents if d != d.parent and str(d) not in ("/tmp", "/")}
    for d, mode in modes.items():
        d.chmod(mode | 0o001)
    yield path
    for d, mode in modes.items():
        d.chmod(mode)
    subprocess.run(["scancel", "--quiet", "-u", other_user.name], capture_output=True, timeout=60)
    subprocess.run(["rm", "-rf", str(path)], timeout=60)


def test_the_operators_watcher_changes_another_users_waiting_job_in_place(base, other_user, tmp_path):  # noqa: F811
    occupy_gpus({})  # every GPU held: the job waits
    jid, job_dir = _submit_as(other_user, base, "shared")
    wait_for(lambda: sh("squeue", "-h", "-j", str(jid), "-o", "%u %T") == f"{other_user.name} PENDING", what="pending")
    # it waits as 1x4 T4 (changed as an administrator may; its plan has 1x1, 1x2 and 1x4 T4 shapes)
    sh("scontrol", "hold", str(jid))
    sh(*update_pending_argv(jid, "t4", 1, 4, "t4", 4))
    sh("scancel", *sh("squeue", "-h", "-w", "t4-1", "-t", "R", "-o", "%i").split())
    sh("sbatch", "-p", "t4", "-w", "t4-1", "--gres=gpu:t4:2", "-t", "30", "-o", "/dev/null", "--wrap", "sleep 600")
    wait_for(lambda: sh("squeue", "-h", "-w", "t4-1", "-t", "R", "-o", "%b") == "gres:gpu:t4:2", what="2 T4s free")
    sh("scontrol", "release", str(jid))
    submitted = sh("squeue", "-h", "-j", str(jid), "-o", "%V")
    res = _watch(tmp_path)
    assert res.returncode == 0, res.stderr
    record = json.loads(res.stdout)
    assert record["skipped"] == []
    (change,) = record["reshaped"]
    assert (change["job_id"], change["user"], change["applied"]) == (jid, other_user.name, True)
    assert change["from_shape"] == "1x4 t4(t4)" and change["to_shape"] in ("1x2 t4(t4)", "1x1 t4(t4)")
    gpus = change["to_shape"][2]
    assert (
        sh("squeue", "-h", "-t", "all", "-j", str(jid), "-o", "%V %b") == f"{submitted} gres:gpu:t4:{gpus}"
    )  # its place kept
    kept = json.loads((tmp_path / "state" / "frenzy-slurm" / "replanned" / f"{jid}.json").read_text())
    assert (kept["user"], kept["job_dir"], kept["changes"][0]["to"]) == (
        other_user.name,
        str(job_dir),
        change["to_shape"],
    )
    assert not (job_dir / "replanned.json").exists()  # nothing written in the user's directory


def test_a_job_directory_anyone_can_write_is_skipped(base, other_user, tmp_path):  # noqa: F811
    occupy_gpus({})
    jid, job_dir = _submit_as(other_user, base, "open")
    job_dir.chmod(0o777)
    res = _watch(tmp_path, "--dry-run")
    assert res.returncode == 0, res.stderr
    (skip,) = json.loads(res.stdout)["skipped"]
    assert (skip["job_id"], skip["user"]) == (jid, other_user.name)
    assert skip["reason"] == f"job directory {job_dir} is writable by everyone (mode 777)"


def test_slurm_refuses_another_users_update_to_a_non_operator_in_words_the_seam_knows(base, other_user):  # noqa: F811
    occupy_gpus({})
    jid = int(sh("sbatch", "--parsable", "-p", "t4", "--gres=gpu:t4:1", "-t", "5", "-o", "/dev/null", "--wrap", "true"))
    argv = update_pending_argv(jid, "t4", 1, 2, "t4", 4)
    res = _as_user(other_user, argv, base, Path("/"))
    assert res.returncode != 0
    err = SlurmCommandError(argv, res.returncode, res.stderr)
    assert err.not_permitted, res.stderr
    assert res.stderr.strip() == f"Invalid user id for job {jid}"


def test_a_plain_users_own_update_leaves_the_tasks_per_node_out(base, other_user):  # noqa: F811
    # slurmctld lets only operators change TasksPerNode: the plain user's update that names it is refused, the one
    # without it (what the per-user watcher sends for a plain user) is taken and the job keeps its id and place
    occupy_gpus({})  # every GPU held: the job waits
    submit = ["sbatch", "--parsable", "-p", "t4", "-N", "1", "--ntasks-per-node=4", "--cpus-per-task=1"]
    res = _as_user(other_user, [*submit, "--gres=gpu:t4:4", "-t", "5", "-o", "/dev/null", "--wrap", "true"], base, base)
    assert res.returncode == 0, res.stderr
    jid = int(res.stdout.strip().split(";")[0])
    submitted = sh("squeue", "-h", "-j", str(jid), "-o", "%V")
    refused = _as_user(other_user, update_pending_argv(jid, "t4", 1, 2, "t4", 1), base, Path("/"))
    assert refused.returncode != 0 and "Access/permission denied" in refused.stderr, refused.stderr
    sh("scontrol", "update", f"JobId={jid}", "NumTasks=4", "NumCPUs=4", "MinCPUsNode=4", "Gres=gpu:t4:4")  # undo
    taken = _as_user(other_user, update_pending_argv(jid, "t4", 1, 2, "t4", 1, restate_tasks=False), base, Path("/"))
    assert taken.returncode == 0, taken.stderr
    assert sh("squeue", "-h", "-j", str(jid), "-o", "%V %b %T") == f"{submitted} gres:gpu:t4:2 PENDING"
