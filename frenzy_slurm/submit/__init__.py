"""Stage 6, submit: write the job directory atomically and hand the script to Slurm, exactly once.

Idempotency: the submission hash is in the job comment (`frenzy:<hash>`) and the job directory records
`submission.json`. A second `fsbatch` of the same model.yaml and flags is refused while either shows a
job, from whichever directory, unless --force (which plans into a new job directory). A lock in the
user's private directory serialises concurrent fsbatch runs of one submission (see jobdir.py for the
job directory's safety: ownership, modes, no symlink following, nothing of an earlier job overwritten).
When sbatch times out, the job is looked up in the queue by its tag and recorded if it exists.
Slurm's refusals are explained and recorded in `rejected.json`. Slurm is reached only through the
backend (`frenzy_slurm.slurm`): one queue query for the duplicate check, one submission.
"""

from __future__ import annotations

import getpass
import time
from dataclasses import dataclass
from pathlib import Path

from frenzy_slurm.errors import EXIT_ALREADY_SUBMITTED, EXIT_SLURM_REJECTED, FrenzyError, InputError
from frenzy_slurm.records import read_json_or_none, write_json
from frenzy_slurm.render import JobRequest
from frenzy_slurm.slurm import BatchJob, ComponentRequest, Job, SlurmBackend, SlurmCommandError
from frenzy_slurm.slurm.run import SlurmTimeout, SlurmUnavailable
from frenzy_slurm.submit import jobdir


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


def tagged_jobs(req: JobRequest, backend: SlurmBackend | None) -> list[Job]:
    """This user's queued jobs carrying this submission's tag, whatever their directory (one queue query)."""
    if backend is None:
        return []
    tag = f"frenzy:{req.submission}"
    return [j for j in backend.jobs(user=getpass.getuser()) if j.comment == tag]


def existing_job(req: JobRequest, tagged: list[Job], earlier: list[dict] | None = None) -> str | None:
    """Why this submission already has a job, or None: its directory's record, the user's registry of this
    submission's directories (`jobdir.registered`), or a live job with its tag in the queue."""
    record = req.job_dir / "submission.json"
    if record.exists():
        job = (read_json_or_none(record) or {}).get("job_id", "?")
        return f"job {job} was already submitted from {req.job_dir}"
    for e in earlier or []:
        return f"job {e['job_id']} with the same submission ({req.submission}) was already submitted from {e['job_dir']}"
    for j in tagged:
        if j.phase in ("pending", "running", "suspended"):
            where = f" (job directory {j.workdir})" if j.workdir else ""
            return f"job {j.het_job_id or j.job_id} with the same submission ({req.submission}) is {j.state}{where}"
    return None


def _record(req: JobRequest, job_id: int, cluster: str | None, argv: list[str], backend: str, **extra) -> None:
    write_json(req.job_dir / "submission.json",
               {"job_id": job_id, "cluster": cluster, "submission": req.submission, "argv": argv, "backend": backend,
                "submitted_at": time.time(), **extra})
    jobdir.register(req.submission, job_id, req.job_dir)


def _adopt(req: JobRequest, tagged: list[Job], backend: SlurmBackend) -> None:
    """A live job of this submission in this very directory without its record (an earlier fsbatch lost the
    answer to a timeout): record it now, so fsqueue and later checks see it."""
    if (req.job_dir / "submission.json").exists():
        return
    for j in tagged:
        if j.workdir and Path(j.workdir) == req.job_dir and j.phase in ("pending", "running", "suspended"):
            _record(req, j.het_job_id or j.job_id, None, [], backend.name, recovered="found in the queue by its tag")
            return


def find_after_timeout(req: JobRequest, backend: SlurmBackend, known: set[int],
                       waits: tuple[float, ...] = (2.0, 5.0, 10.0)) -> Job | None:
    """After sbatch timed out, the job may exist all the same: look for a new job with this submission's tag."""
    for wait in waits:
        time.sleep(wait)
        try:
            found = [j for j in tagged_jobs(req, backend) if (j.het_job_id or j.job_id) not in known]
        except SlurmUnavailable:
            continue  # the controller is still not answering: wait longer
        if found:
            return min(found, key=lambda j: j.het_job_id or j.job_id)
    return None


def batch_job(req: JobRequest) -> BatchJob:
    """The request as the Slurm seam takes it: the script, its components in structured form, and the umask
    of the files Slurm creates for it (as private as the job directory)."""
    alloc = req.plan.decision.chosen
    comps = [ComponentRequest(partition=c.partition, gpu_type=c.gpu_type, nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                              time_min=req.plan.time_min, cpus_per_gpu=c.cpus_per_task) for c in alloc.components]
    return BatchJob(script=req.job_dir / "job.sbatch", workdir=req.job_dir, components=comps,
                    name=req.name, comment=f"frenzy:{req.submission}", umask=req.umask)


def submit(req: JobRequest, backend: SlurmBackend, force: bool = False,
           timeout_waits: tuple[float, ...] = (2.0, 5.0, 10.0), group_readable: bool = False) -> Submitted:
    """Submit once per submission and user: refuse a duplicate (any directory) unless `force`.

    With `force` the caller has planned into a fresh directory (`jobdir.next_free_dir`): nothing an
    earlier job wrote is touched. A timeout from sbatch is answered by looking the job up by its tag.
    """
    if "--script" in req.plan.command:
        script = Path(req.plan.command[req.plan.command.index("--script") + 1])
        if not script.is_file():
            raise InputError(f"{req.plan.spec_path}: entry.script {script} does not exist; fix the path (relative "
                             "paths are taken from model.yaml's directory).")
    jobdir.check_private_dir(jobdir.make_private_dir(req.job_dir.parent, "jobs directory"), "jobs directory")
    with jobdir.user_lock(req.submission):
        tagged = tagged_jobs(req, backend)
        _adopt(req, tagged, backend)
        why = existing_job(req, tagged, jobdir.registered(req.submission))
        if why and not force:
            raise AlreadySubmitted(f"{why}; not submitting it again. Use --force for another job (in a new job "
                                   f"directory), or `fsqueue` to follow the existing one.")
        jobdir.create_job_dir(req.job_dir, group_readable, submission=req.submission)
        jobdir.write_files(req.job_dir, req.files, group_readable)
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
        except SlurmTimeout as exc:
            found = find_after_timeout(req, backend, {j.het_job_id or j.job_id for j in tagged}, timeout_waits)
            if found is None:
                raise SlurmUnavailable(
                    f"{exc.message} The job may still have been created: once Slurm answers, `fsqueue` shows it "
                    f"(tag frenzy:{req.submission}), and running the same fsbatch again finds it instead of "
                    "submitting twice.") from None
            job_id = found.het_job_id or found.job_id
            _record(req, job_id, None, argv, backend.name, recovered="sbatch timed out; found in the queue by its tag")
            return Submitted(job_id, None, req.job_dir)
        _record(req, done.job_id, done.cluster, done.argv or argv, backend.name)
        return Submitted(done.job_id, done.cluster, req.job_dir)
