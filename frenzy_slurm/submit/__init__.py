"""Stage 6, submit: write the job directory atomically and hand the script to Slurm, exactly once.

Idempotency: the submission hash is in the job comment (`frenzy:<hash>`) and the job directory records
`submission.json`. A second `fsbatch` of the same model.yaml and flags is refused while either shows a
job, unless --force. A lock file serialises concurrent fsbatch runs in the same jobs directory.
Slurm's refusals are explained and recorded in `rejected.json`. Slurm is reached only through the
backend (`frenzy_slurm.slurm`): one queue query for the duplicate check, one submission.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from frenzy_slurm.errors import EXIT_ALREADY_SUBMITTED, EXIT_SLURM_REJECTED, FrenzyError, InputError
from frenzy_slurm.records import read_json_or_none, write_json
from frenzy_slurm.render import JobRequest
from frenzy_slurm.slurm import BatchJob, ComponentRequest, SlurmBackend, SlurmCommandError


class AlreadySubmitted(FrenzyError):
    exit_code = EXIT_ALREADY_SUBMITTED


class SlurmRejected(FrenzyError):
    exit_code = EXIT_SLURM_REJECTED


# Slurm's refusal messages, and what to do about each.
_EXPLAIN = [
    ("invalid account", "the account is not valid for this partition or user; list yours with "
                        "`sacctmgr show assoc user=$USER format=account,partition,qos`"),
    ("invalid qos", "the QOS does not exist or is not allowed for your account (`sacctmgr show assoc user=$USER`)"),
    ("invalid partition", "the partition does not exist; see `fsinfo` and check the site file"),
    ("requested node configuration is not available", "the partition cannot provide these nodes/GPUs (GRES type "
                                                        "or count): compare `fsinfo` with `frenzy-slurm site validate`"),
    ("invalid generic resource", "the GRES request is not valid on this cluster: check gres_type in the site file"),
    ("time limit", "the requested --time exceeds the partition or QOS limit: lower slurm.time or use another partition"),
    ("qos", "the job violates a QOS or association limit (GPUs, jobs or time): check `sacctmgr show qos`"),
    ("node count specification invalid", "more nodes than the partition allows (MaxNodes)"),
    ("partition", "the partition refuses this job (down, drained or restricted): check `sinfo -p <partition>`"),
]


def explain(stderr: str) -> str:
    low = stderr.lower()
    return next((why for key, why in _EXPLAIN if key in low), "see Slurm's message above")


@dataclass(frozen=True)
class Submitted:
    job_id: int
    cluster: str | None
    job_dir: Path


@contextmanager
def _locked(directory: Path):
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".frenzy.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def write_job_dir(req: JobRequest) -> None:
    """All files appear at once: written to a sibling temporary directory, then renamed into place."""
    final = req.job_dir
    tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        for name, text in req.files.items():
            (tmp / name).write_text(text)
        (tmp / "job.sbatch").chmod(0o755)
        if final.exists():  # an earlier dry-run or refused submission of the same hash
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            final.rename(old)
            tmp.rename(final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def existing_job(req: JobRequest, backend: SlurmBackend | None) -> str | None:
    """Why this submission already has a job, or None (one queue query for the user's jobs)."""
    record = req.job_dir / "submission.json"
    if record.exists():
        job = (read_json_or_none(record) or {}).get("job_id", "?")
        return f"job {job} was already submitted from {req.job_dir}"
    if backend is not None:
        for j in backend.jobs(user=getpass.getuser()):
            if j.comment == f"frenzy:{req.submission}" and j.phase in ("pending", "running", "suspended"):
                return f"job {j.het_job_id or j.job_id} with the same submission ({req.submission}) is {j.state}"
    return None


def batch_job(req: JobRequest) -> BatchJob:
    """The request as the Slurm seam takes it: the script, and its components in structured form."""
    alloc = req.plan.decision.chosen
    comps = [ComponentRequest(partition=c.partition, gpu_type=c.gpu_type, nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                              time_min=req.plan.time_min, cpus_per_gpu=c.cpus_per_task) for c in alloc.components]
    return BatchJob(script=req.job_dir / "job.sbatch", workdir=req.job_dir, components=comps,
                    name=req.name, comment=f"frenzy:{req.submission}")


def submit(req: JobRequest, backend: SlurmBackend, force: bool = False) -> Submitted:
    if "--script" in req.plan.command:
        script = Path(req.plan.command[req.plan.command.index("--script") + 1])
        if not script.is_file():
            raise InputError(f"{req.plan.spec_path}: entry.script {script} does not exist; fix the path (relative "
                             "paths are taken from model.yaml's directory).")
    with _locked(req.job_dir.parent):
        why = existing_job(req, backend)
        if why and not force:
            raise AlreadySubmitted(f"{why}; not submitting it again. Use --force for another job, "
                                   f"or `fsqueue` to follow the existing one.")
        if force and (req.job_dir / "submission.json").exists():
            prior = req.job_dir / "submission.json"
            prior.rename(req.job_dir.with_name(req.job_dir.name + f".submission-{int(time.time())}.json"))
        write_job_dir(req)
        job = batch_job(req)
        argv = ["sbatch", "--parsable", str(job.script)]
        try:
            done = backend.submit(job)
        except SlurmCommandError as exc:
            why = explain(exc.stderr)
            write_json(req.job_dir / "rejected.json",
                       {"argv": argv, "stderr": exc.stderr, "explanation": why, "at": time.time()})
            raise SlurmRejected(f"Slurm refused the job: {exc.stderr.strip()}\n{why}.\n"
                                f"The rendered files are in {req.job_dir} (rejected.json records this).") from None
        write_json(req.job_dir / "submission.json",
                   {"job_id": done.job_id, "cluster": done.cluster, "submission": req.submission,
                    "argv": done.argv or argv, "backend": backend.name, "submitted_at": time.time()})
        return Submitted(done.job_id, done.cluster, req.job_dir)
