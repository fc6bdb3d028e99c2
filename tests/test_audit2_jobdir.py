"""Issue 19, job directories (items 1, 10, 11, 12 and parts of 14, 15): the directories above a job directory
are checked as OpenSSH's StrictModes checks them, the job trusts only the directory and files its submission
made, `--job-dir .` never overwrites the user's files, DeepSpeed's shared-memory segments are the job's own,
and the rendezvous port is a free one."""

from __future__ import annotations

import getpass
import os
import stat
from pathlib import Path

import pytest

from frenzy_slurm.core import inputfile
from frenzy_slurm.core.errors import EXIT_BAD_INPUT, FrenzyError
from frenzy_slurm.jobdir import safety as jobdir
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.submission import submit

from .helpers import LOCAL, deepspeed_rank_env, make_spec, plan, planned

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory to another user")


@pytest.fixture(autouse=True)
def private_lock_dir(tmp_path, monkeypatch):
    lock = tmp_path / "locks"
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(lock))
    return lock


@pytest.fixture(scope="module")
def world():
    view = synthetic(LOCAL)
    spec = make_spec()
    return view, spec, plan(spec, view)


def request(world, job_dir: Path, **spec_over):
    """The request fsbatch would submit (planning.plan_job) into `job_dir`."""
    view, spec, _ = world
    if spec_over:
        spec = make_spec(**spec_over)
    return planned(spec, view, job_dir)


def fake(view) -> FakeSlurm:
    return FakeSlurm(view, user=getpass.getuser())


def _refusal(fn, *args, **kw) -> tuple[int, str]:
    with pytest.raises(FrenzyError) as exc:
        fn(*args, **kw)
    return exc.value.exit_code, exc.value.message


# --- item 1: every directory above the jobs directory ------------------------------------------------------------


def test_group_writable_directory_above_the_jobs_directory_is_refused(world, tmp_path, monkeypatch):
    """A shared project directory (group-writable, not sticky): its members could rename the job directory away."""
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)  # a project group with other members
    project = tmp_path / "project"
    project.mkdir()
    project.chmod(0o2775)
    req = request(world, project / "alice" / "jobs" / "a")
    code, msg = _refusal(submit, req, fake(world[0]))
    assert code == EXIT_BAD_INPUT
    assert f"the directory {project} above it is writable by its group (mode 2775)" in msg and "FRENZY_JOBS_DIR" in msg
    assert not (project / "alice" / "jobs" / "a").exists()


def test_world_writable_non_sticky_ancestor_is_refused(tmp_path):
    top = tmp_path / "open"
    (top / "jobs").mkdir(parents=True)
    top.chmod(0o777)
    (top / "jobs").chmod(0o700)
    code, msg = _refusal(jobdir.check_private_dir, top / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"{top} above it is writable by everyone (mode 777)" in msg


def test_sticky_directory_such_as_tmp_is_a_fine_ancestor_but_not_a_jobs_directory(tmp_path):
    sticky = tmp_path / "scratch"
    (sticky / "me").mkdir(parents=True)
    sticky.chmod(0o1777)
    (sticky / "me").chmod(0o700)
    jobdir.check_private_dir(sticky / "me", "jobs directory")  # like /scratch/$USER under a 1777 /scratch
    code, msg = _refusal(jobdir.check_private_dir, sticky, "jobs directory")
    assert code == EXIT_BAD_INPUT and "is writable by everyone" in msg


@needs_root
def test_ancestor_of_another_user_is_refused(tmp_path):
    """`/scratch/$USER` made by someone else first: its owner can swap anything below it."""
    theirs = tmp_path / "scratch-alice"
    (theirs / "jobs").mkdir(parents=True)
    os.chown(theirs, 4242, 4242)
    code, msg = _refusal(jobdir.check_private_dir, theirs / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {theirs} above it belongs to 4242" in msg


@needs_root
def test_symbolic_link_above_of_another_user_is_refused(tmp_path):
    """A link in a sticky directory can be replaced by its owner: it must be the user's or root's."""
    sticky = tmp_path / "tmp"
    real = tmp_path / "real"
    (real / "jobs").mkdir(parents=True)
    sticky.mkdir()
    sticky.chmod(0o1777)
    (sticky / "link").symlink_to(real)
    os.lchown(sticky / "link", 4242, 4242)
    code, msg = _refusal(jobdir.check_private_dir, sticky / "link" / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {sticky / 'link'} above it belongs to 4242" in msg


def test_resolved_path_is_checked_too(tmp_path, monkeypatch):
    """A private link pointing into a shared directory: the directories the kernel walks are checked."""
    monkeypatch.setattr(inputfile, "group_private_to", lambda gid, uid: False)
    shared = tmp_path / "shared"
    (shared / "jobs").mkdir(parents=True)
    shared.chmod(0o775)
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "mine" / "link").symlink_to(shared)
    code, msg = _refusal(jobdir.check_private_dir, tmp_path / "mine" / "link" / "jobs", "jobs directory")
    assert code == EXIT_BAD_INPUT and f"the directory {shared} above it is writable by its group" in msg


# --- item 14: the lock directory's parents --------------------------------------------------------------------


def test_lock_directory_under_a_shared_directory_is_refused(world, tmp_path, monkeypatch):
    """Removing the lock directory (and the registry beside it) used to allow a duplicate submission."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("FRENZY_LOCK_DIR", str(shared / "locks"))
    code, msg = _refusal(submit, request(world, tmp_path / "jobs" / "a"), fake(world[0]))
    assert code == EXIT_BAD_INPUT and "lock directory" in msg and f"{shared} above it is writable by everyone" in msg
    assert "FRENZY_LOCK_DIR" in msg


# --- item 10: an existing directory is reused only for this submission's own files ------------------------------


def test_job_dir_dot_never_overwrites_the_users_files(world, tmp_path):
    """`fsbatch model.yaml --job-dir .` used to replace the user's model.yaml (and ds_config.json, job.sbatch)."""
    here = tmp_path / "work"
    here.mkdir(mode=0o700)
    (here / "model.yaml").write_text("my own model.yaml\n")
    (here / "train.py").write_text("print('mine')\n")
    code, msg = _refusal(submit, request(world, here), fake(world[0]))
    assert code == EXIT_BAD_INPUT
    assert f"job directory {here} already holds files that are not this submission's (model.yaml, train.py)" in msg
    assert (here / "model.yaml").read_text() == "my own model.yaml\n"
    assert sorted(p.name for p in here.iterdir()) == ["model.yaml", "train.py"]


def test_another_submissions_rendering_is_not_overwritten(world, tmp_path):
    first = request(world, tmp_path / "jobs" / "a")
    jobdir.create_job_dir(first.job_dir, submission=first.submission)
    jobdir.write_files(first.job_dir, first.files)
    other = request(world, first.job_dir, training__steps=7)
    assert other.submission != first.submission
    code, msg = _refusal(submit, other, fake(world[0]))
    assert code == EXIT_BAD_INPUT and "not this submission's" in msg and "plan.json" in msg


def test_a_refused_submissions_directory_and_an_empty_one_are_reused(world, tmp_path):
    req = request(world, tmp_path / "jobs" / "a")
    jobdir.create_job_dir(req.job_dir, submission=req.submission)
    jobdir.write_files(req.job_dir, req.files)
    (req.job_dir / "rejected.json").write_text("{}")
    assert submit(request(world, req.job_dir), fake(world[0])).job_dir == req.job_dir
    empty = tmp_path / "jobs" / "empty"
    empty.mkdir(mode=0o700)
    assert submit(request(world, empty, training__steps=9), fake(world[0])).job_dir == empty


# --- item 1 in the job: the directory and files the submission recorded -----------------------------------------

ROOT = Path(__file__).resolve().parent.parent


def _job_env(script: str) -> dict[str, str]:
    """The FRENZY_* values job.sbatch exports (what Slurm's copy of the script gives the job)."""
    import shlex

    env: dict[str, str] = {}
    for line in script.splitlines():
        if line.startswith("export FRENZY_"):
            for word in shlex.split(line)[1:]:
                key, _, value = word.partition("=")
                env[key] = value
    return env


def written(world, job_dir: Path):
    """A job directory as fsbatch writes it (fake Slurm), and the environment its script gives the job."""
    req = request(world, job_dir)
    submit(req, fake(world[0]))
    return req, _job_env((job_dir / "job.sbatch").read_text())


def test_script_records_the_directory_and_the_plans_digest(world, tmp_path):
    import hashlib

    req = request(world, tmp_path / "jobs" / "a")
    done = submit(req, fake(world[0]))
    env = _job_env((req.job_dir / "job.sbatch").read_text())
    assert env["FRENZY_JOB_DIR_INODE"] == str(os.stat(req.job_dir).st_ino)
    assert env["FRENZY_PLAN_SHA256"] == hashlib.sha256((req.job_dir / "plan.json").read_bytes()).hexdigest()
    assert env["FRENZY_DS_CONFIG_SHA256"] == hashlib.sha256((req.job_dir / "ds_config.json").read_bytes()).hexdigest()
    assert done.script == (req.job_dir / "job.sbatch").read_text()  # what submit reports is what was written
    # ...which is the request's script with the directory's identity recorded, and nothing else changed
    assert done.script == jobdir.bind_identity(req.script, os.stat(req.job_dir).st_ino, req.files)


def test_job_refuses_a_directory_swapped_in_its_place(world, tmp_path):
    """The audit's attack: the victim's directory renamed away, a copy with a planted plan.json in its place."""
    import shutil

    from frenzy_slurm.runtime.trust import open_job_dir

    req, env = written(world, tmp_path / "jobs" / "a")
    open_job_dir(req.job_dir, env)  # the real one passes
    req.job_dir.rename(tmp_path / "jobs" / "moved")
    shutil.copytree(tmp_path / "jobs" / "moved", req.job_dir)  # same files, another directory
    os.chmod(req.job_dir, 0o700)
    code, msg = _refusal(open_job_dir, req.job_dir, env)
    assert code == EXIT_BAD_INPUT and "is not the one fsbatch wrote (inode" in msg


def test_job_refuses_a_changed_plan(world, tmp_path):
    from frenzy_slurm.runtime.trust import open_job_dir

    req, env = written(world, tmp_path / "jobs" / "a")
    plan = req.job_dir / "plan.json"
    plan.write_text(plan.read_text().replace('"steps": 100', '"steps": 101'))
    code, msg = _refusal(open_job_dir, req.job_dir, env)
    assert code == EXIT_BAD_INPUT and f"{plan} is not the file fsbatch wrote" in msg


def test_runtime_stops_with_one_message_before_reading_a_swapped_directory(world, tmp_path):
    """The runtime entry point: exit 2 and the reason on stderr, no traceback, nothing of the directory used."""
    import subprocess
    import sys

    req, env = written(world, tmp_path / "jobs" / "a")
    (req.job_dir / "plan.json").write_text("{}")
    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(req.job_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=req.job_dir,
        env={**os.environ, **env, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == EXIT_BAD_INPUT and "Traceback" not in res.stderr, res.stderr
    assert "plan.json is not the file fsbatch wrote" in res.stderr


# --- item 1 in the trainer: only the job's own checkpoints are loaded ------------------------------------------


def _tiny_job(tmp_path: Path, steps: int, interval: int):
    """tiny-cpu rendered for one CPU rank and written as fsbatch writes it; its script's environment."""
    from frenzy_slurm.jobspec import load_job_spec

    text = (
        (ROOT / "examples" / "tiny-cpu.yaml")
        .read_text()
        .replace("  steps: 6\n", f"  steps: {steps}\n  checkpoint_interval: {interval}\n")
    )
    (tmp_path / "tiny.yaml").write_text(text + "limits:\n  max_gpus: 1\n")  # one CPU rank
    spec = load_job_spec(tmp_path / "tiny.yaml")
    view = synthetic(LOCAL)
    job = planned(
        spec, view, tmp_path / "jobs" / "t", spec_path=tmp_path / "tiny.yaml", model=resolve_model(spec, tmp_path)
    )
    submit(job, fake(view))
    return job.job_dir, _job_env((job.job_dir / "job.sbatch").read_text())


def _train(job_dir: Path, env: dict[str, str]):
    import subprocess
    import sys

    from frenzy_slurm.runtime.dist import free_port

    run_env = {
        **os.environ,
        **env,
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "CUDA_VISIBLE_DEVICES": "",
    }
    for key in ("SLURM_PROCID", "SLURM_JOB_ID", "LOCAL_SIZE"):
        run_env.pop(key, None)
    return subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=job_dir,
        env=run_env,
    )


@pytest.mark.slow
def test_resume_loads_only_checkpoints_the_job_wrote(tmp_path):
    import json

    pytest.importorskip("deepspeed")
    from frenzy_slurm.runtime import checkpoints

    job_dir, env = _tiny_job(tmp_path, steps=4, interval=2)
    first = _train(job_dir, env)
    assert first.returncode == 0, first.stderr[-3000:]
    ckpt = job_dir / "checkpoints"
    manifest = json.loads((ckpt / "step4" / checkpoints.MANIFEST).read_text())
    assert manifest["files"] and all(len(v) == 64 for v in manifest["files"].values())
    # a longer run of the same directory (a requeue) resumes from its own checkpoint
    (ckpt / "latest").write_text("step2")
    plan = json.loads((job_dir / "plan.json").read_text())
    assert plan["spec"]["training"]["steps"] == 4
    again = _train(job_dir, env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((job_dir / "metrics.json").read_text())["resumed_from_step"] == 4
    # a pickle put in place of one of its files is refused before DeepSpeed loads (unpickles) it
    victim = next(n for n in manifest["files"] if n.endswith("model_states.pt"))
    (ckpt / "step4" / victim).write_bytes(b"planted pickle")
    bad = _train(job_dir, env)
    assert bad.returncode == EXIT_BAD_INPUT and "Traceback" not in bad.stderr, bad.stderr[-3000:]
    assert (
        f"checkpoint checkpoints/step4 is not what this job wrote ({job_dir}/checkpoints/step4/{victim} "
        "differs from what this job wrote" in bad.stderr
    )
    # so is a file added beside the job's own
    (ckpt / "step4" / victim).unlink()
    (ckpt / "step4" / "zz_extra_optim_states.pt").write_bytes(b"planted")
    bad = _train(job_dir, env)
    assert bad.returncode == EXIT_BAD_INPUT and "zz_extra_optim_states.pt was not written by this job" in bad.stderr


# --- item 12: the rendezvous port ---------------------------------------------------------------------------------


def test_script_picks_a_free_port_on_the_first_node(world, tmp_path):
    script = request(world, tmp_path / "jobs" / "a").script
    assert "20000 +" not in script and "SLURM_JOB_ID} % 20000" not in script
    assert "-P -m frenzy_slurm.runtime.dist free-port) ||" in script and "\nexport MASTER_PORT\n" in script


def test_free_port_skips_a_port_in_use_and_stays_below_the_ephemeral_range():
    import random
    import socket

    from frenzy_slurm.runtime import dist

    low, _ = dist.ephemeral_range()
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0 if low <= dist.PORT_FLOOR + 1 else random.randint(dist.PORT_FLOOR, low - 1)))
        busy.listen()
        taken = busy.getsockname()[1]

        class Picks(random.Random):
            seq = [taken, taken]

            def randint(self, a, b):
                return self.seq.pop(0) if self.seq else super().randint(a, b)

        port = dist.free_port(rng=Picks(7))
        assert port != taken
        assert dist.PORT_FLOOR <= port < low
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))  # it is free


def test_free_port_command_prints_one_port(tmp_path):
    import subprocess
    import sys

    res = subprocess.run(
        [sys.executable, "-P", "-m", "frenzy_slurm.runtime.dist", "free-port"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert res.returncode == 0 and 1024 < int(res.stdout) < 65536, res.stderr


# --- item 11: DeepSpeed's shared-memory segments are the job's own --------------------------------------------------


@pytest.fixture
def shm_env():
    import random

    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(random.randint(40000, 60000))}
    from frenzy_slurm.runtime.shm import segment_path

    yield env
    for rank in range(2):
        segment_path(rank, env).unlink(missing_ok=True)


def test_segment_is_created_private_and_exclusive(shm_env):
    from frenzy_slurm.runtime.shm import claim_allreduce_segment

    path = claim_allreduce_segment(0, shm_env)
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.geteuid()


def test_an_existing_segment_name_is_never_reused(shm_env):
    """Names carry a random token now (runtime/shm.py): a name that exists is a collision, left alone."""
    from frenzy_slurm.runtime.shm import claim_allreduce_segment, segment_path

    old = segment_path(1, shm_env)
    old.write_bytes(b"old run")
    assert claim_allreduce_segment(1, shm_env) is None and old.read_bytes() == b"old run"


def test_a_segment_planted_by_another_user_is_never_used(shm_env, other_user):
    """The audit's attack: a world-writable segment made first under the job's name. It is not used (the job
    draws another name, test_shm_private_names.py) and left to its owner, never written."""
    import sys

    from frenzy_slurm.runtime.shm import claim_allreduce_segment, segment_path

    from .users import as_user

    planted = segment_path(0, shm_env)
    code = (
        f"import os; os.close(os.open({str(planted)!r}, os.O_CREAT | os.O_RDWR, 0o666)); "
        f"os.chmod({str(planted)!r}, 0o666)"
    )
    res = as_user(other_user, [sys.executable, "-c", code], cwd=Path("/"))
    assert res.returncode == 0, res.stderr
    assert os.stat(planted).st_uid == other_user.uid
    assert claim_allreduce_segment(0, shm_env) is None
    assert os.stat(planted).st_uid == other_user.uid and os.stat(planted).st_size == 0


def test_shm_is_used_only_where_local_size_says_so():
    from frenzy_slurm.runtime.shm import uses_shm_allreduce

    assert (
        uses_shm_allreduce(2, {"LOCAL_SIZE": "2"})
        and not uses_shm_allreduce(2, {})
        and not uses_shm_allreduce(4, {"LOCAL_SIZE": "2"})
    )


def _claiming_rank(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(deepspeed_rank_env(rank, world, port))
    import deepspeed
    import torch

    from frenzy_slurm.runtime.shm import segment_path, start_deepspeed_comm

    seen = {}

    def start() -> None:  # as the trainer does: the names claimed, DeepSpeed's comm started on them
        deepspeed.init_distributed(dist_backend="gloo")
        seen["st"] = os.stat(segment_path(rank))

    used = start_deepspeed_comm(rank, world, start)
    st = seen["st"]
    assert used is not None and not used.exists()
    t = torch.full((4,), float(rank + 1))
    deepspeed.comm.all_reduce(t)
    Path(out, f"{rank}").write_text(f"{stat.S_IMODE(st.st_mode):o} {st.st_size > 0} {t[0].item()}")
    torch.distributed.barrier()  # then the group down, joining gloo's threads (else the exit may abort)
    torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_deepspeed_runs_on_segments_the_ranks_claimed(tmp_path):
    """DeepSpeed opens (O_CREAT without O_EXCL) and fills the empty 0600 segments the ranks made first."""
    pytest.importorskip("deepspeed")
    import torch.multiprocessing as mp

    from frenzy_slurm.runtime.dist import free_port
    from frenzy_slurm.runtime.shm import segment_path

    port = free_port()
    mp.spawn(_claiming_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    assert [(tmp_path / str(r)).read_text() for r in (0, 1)] == ["600 True 3.0"] * 2
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    assert not any(segment_path(r, env).exists() for r in (0, 1))
