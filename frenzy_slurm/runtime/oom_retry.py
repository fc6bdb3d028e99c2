"""A run that ran out of memory is submitted again once, on the fallback plan fsbatch chose for it.

job.sbatch runs `python -P -m frenzy_slurm.runtime.oom_retry --job-dir DIR --job-id ID --status N` after its training
step ends with a non-zero status, unless the user turned this off (model.yaml's `slurm.oom_retry: false`,
`fsbatch --no-oom-retry`). It is the job's own epilogue, on the batch node: no daemon has to run for it. It

1. decides whether the run ran out of memory: a rank's record (jobdir/oom.py: torch's `OutOfMemoryError` in
   the built-in runtime, or in a script that imports `frenzy_slurm.in_job`), else torch's message in the
   job's output (a script that only printed it), else slurmstepd's "Detected N oom_kill event" (Slurm's
   OUT_OF_MEMORY: the step's cgroup ran out of host memory);
2. picks the fallback (`Decision.oom_fallbacks`, has/fallback.py): one that loads the run's checkpoint where
   it saved one, planned for at least the error measured (the records' peak over the plan's);
3. renders it into a sibling job directory (`NAME.2`, ...) whose plan.json names this job (`moved_from`,
   `reason: out of memory`), and submits it with `--dependency=afterany:ID`, so it starts once this job has
   ended and resumes its newest checkpoint as a moved job does (docs/runtime.md, "Moved jobs").

Never twice: `oom.json` in this job's directory is written, under the submission's lock, before sbatch is
asked, and a directory that has one is not retried again (a requeued run of this job included); a job that is
itself such a retry is not retried (at most one per run that fsbatch submitted). The outcome, and why a run
was not retried, goes to `oom.json` and the job's output; fsqueue shows it.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from frenzy_slurm.core.errors import FrenzyError
from frenzy_slurm.core.records import read_job_record_or_none, write_json
from frenzy_slurm.has.fallback import pick
from frenzy_slurm.has.model import Decision, Fallback
from frenzy_slurm.jobdir.oom import TORCH_MESSAGE, read_records
from frenzy_slurm.jobdir.planfile import MovedFrom, PlanFile, read_plan
from frenzy_slurm.jobdir.safety import next_free_dir, user_lock
from frenzy_slurm.jobspec import ResolvedModel
from frenzy_slurm.planning import request_of
from frenzy_slurm.render import render_job
from frenzy_slurm.runtime.checkpoints import latest_step
from frenzy_slurm.runtime.trust import open_job_dir
from frenzy_slurm.slurm import open_backend
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.submission import submit
from frenzy_slurm.track.jobs import output_files, read_tail

RECORD = "oom.json"
MAX_OUTPUT_READ = 4 << 20  # the end of the job's output: a traceback is its last lines
# slurmstepd's line when the step's memory cgroup killed a task: "Detected 1 oom_kill event in StepId=5.0. Some
# of the step tasks have been OOM Killed." (src/plugins/task/cgroup/task_cgroup_memory.c, 23.11; "oom-kill" in
# older releases); srun prints it in the job's error stream
HOST_MESSAGE = re.compile(r"Detected \d+ oom[-_]kill event")
CUDA_NAME = re.compile(r"torch\.(?:cuda\.)?OutOfMemoryError")
# what the batch environment carries that must not reach the successor: sbatch passes the submitter's whole
# environment, and this job's allocation (SLURM_JOB_NODELIST_HET_GROUP_0, SLURM_NTASKS...) or GPUs would be read
# by the successor's script and srun as its own
_ALLOCATION_PREFIXES = ("SLURM_", "SLURMD_")
_KEPT = ("SLURM_CONF",)
_DEVICES = ("CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "ROCR_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class Evidence:
    """How the run ran out of memory: CUDA's allocator or the host's cgroup, seen how, with the peak measured."""

    kind: Literal["cuda", "host"]
    seen: str
    error: float | None = None  # measured peak over the plan's, on the rank that recorded the most


def detect(job_dir: Path, pf: PlanFile, job_id: int, since: float, output: str) -> Evidence | None:
    """Whether this run (started at `since`) of job `job_id` ran out of memory, from the ranks' records, else
    the job's `output` (the end of its output and error files)."""
    records = [r for r in read_records(job_dir) if str(r.get("job_id")) == str(job_id) and _at(r) >= since]
    if records:
        return Evidence("cuda", f"{len(records)} rank(s) recorded torch.OutOfMemoryError", _error(records, pf))
    if CUDA_NAME.search(output) or TORCH_MESSAGE.search(output):
        return Evidence("cuda", "torch's out-of-memory message in the job's output")
    if HOST_MESSAGE.search(output):
        return Evidence("host", "Slurm's oom_kill event (OUT_OF_MEMORY) in the job's output")
    return None


def _at(record: dict[str, Any]) -> float:
    at = record.get("at")
    return float(at) if isinstance(at, int | float) else 0.0


def _error(records: list[dict[str, Any]], pf: PlanFile) -> float | None:
    """The measured peak over the planned one, the largest of the ranks that measured one."""
    planned = max(c.peak_gib for c in pf.decision.chosen.components)
    peaks = [float(r["peak_gib"]) for r in records if isinstance(r.get("peak_gib"), int | float)]
    return max(peaks) / planned if peaks and planned > 0 else None


def choose(pf: PlanFile, has_checkpoint: bool, evidence: Evidence) -> Fallback | str:
    """The fallback to submit, or why there is none."""
    if pf.slurm is not None and not pf.slurm.oom_retry:
        return "not submitted again: slurm.oom_retry is off for this job (fsbatch --no-oom-retry)"
    if pf.moved_from is not None and pf.moved_from.reason == "out of memory":
        return f"not submitted again: this job is already the retry of job {pf.moved_from.job_id}"
    if not pf.decision.oom_fallbacks:
        return "not submitted again: fsbatch found no plan with more memory headroom for it"
    found = pick(pf.decision.oom_fallbacks, has_checkpoint, evidence.error)
    if found is None:
        return "not submitted again: no plan with more memory headroom can load its checkpoint"
    return found


def main(argv: list[str] | None = None) -> int:
    """The epilogue's step; prints what it did. Its exit status is 0 unless it failed (the job's own status is
    job.sbatch's)."""

    ap = argparse.ArgumentParser(prog="frenzy_slurm.runtime.oom_retry", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-dir", type=Path, required=True)
    ap.add_argument("--job-id", type=int, required=True)
    ap.add_argument("--status", type=int, required=True)
    ns = ap.parse_args(argv)
    _scrub_allocation(os.environ)  # this process submits the successor: none of this job's allocation may reach it
    try:
        line = retry(ns.job_dir, ns.job_id)
    except FrenzyError as exc:
        print(f"frenzy-slurm: out-of-memory retry failed: {exc.message}", file=sys.stderr, flush=True)
        return 1
    if line:
        print(f"frenzy-slurm: {line}", flush=True)
    return 0


def retry(job_dir: Path, job_id: int, backend: SlurmBackend | None = None) -> str | None:
    """Detect, choose and submit (module docstring); the line to print, None where the run did not run out of
    memory."""

    trusted = open_job_dir(job_dir)  # the directory and plan.json fsbatch wrote, or nothing is read
    job_dir = trusted.path
    pf = read_plan(trusted.via_fd / "plan.json")
    started = read_job_record_or_none(job_dir / "started.json")
    since = float(started.get("started_at", 0)) if isinstance(started, dict) else 0.0
    evidence = detect(job_dir, pf, job_id, since, _output_tail(job_dir, job_id))
    if evidence is None:
        return None
    what = "CUDA out of memory" if evidence.kind == "cuda" else "out of host memory (Slurm's OUT_OF_MEMORY)"
    with user_lock(f"{pf.submission}-force"):  # the lock fsbatch --force and the watcher's moves take
        if (earlier := read_job_record_or_none(job_dir / RECORD)) is not None:
            return f"job {job_id} ran {what}; already handled: {earlier}"
        saved = latest_step(job_dir / "checkpoints")
        choice = choose(pf, saved is not None, evidence)
        note: dict[str, Any] = {"job_id": job_id, "kind": evidence.kind, "seen": evidence.seen, "at": time.time()}
        note["error"] = evidence.error
        if isinstance(choice, str):
            write_json(job_dir / RECORD, note | {"note": choice})
            return f"job {job_id} ran {what}; {choice}"
        return _submit(job_dir, job_id, pf, choice, saved, note, what, backend)


def _submit(
    job_dir: Path,
    job_id: int,
    pf: PlanFile,
    fallback: Fallback,
    saved: int | None,
    note: dict[str, Any],
    what: str,
    backend: SlurmBackend | None,
) -> str:
    """Render and submit the fallback; oom.json says so before sbatch is asked, and then with the job id."""

    req = successor_request(job_dir, job_id, pf, fallback)
    alloc = fallback.allocation
    note |= {"to": alloc.label(), "plan": alloc.plan.short(), "retry_dir": str(req.job_dir), "from_step": saved}
    write_json(job_dir / RECORD, note | {"note": "submitting"})
    done = submit(req, backend or open_backend("cli"), after=job_id)
    write_json(job_dir / RECORD, note | {"retry_job": done.job_id, "note": "submitted"})
    start = f"from its checkpoint of step {saved}" if saved is not None else "from the start (it saved no checkpoint)"
    return (
        f"job {job_id} ran {what}; submitted again once as job {done.job_id} on {alloc.label()} "
        f"({alloc.plan.short()}), {start}, in {req.job_dir}"
    )


def successor_request(job_dir: Path, job_id: int, pf: PlanFile, fallback: Fallback) -> Any:
    """The fallback as a JobRequest in a fresh sibling directory, continuing this job (its `moved_from`)."""

    model = ResolvedModel(arch=pf.arch, name=pf.model_name, exact_params=pf.exact_params)
    user = pf.slurm if pf.slurm is not None else pf.spec.slurm
    slurm = user.model_copy(update={"qos": _qos_of(pf) or user.qos})  # the QOS it ran in (a preemptible one too)
    alloc = fallback.allocation
    decision = Decision(chosen=alloc, alternatives=[], decided_at=time.time(), decision_ms=0.0)
    calibration = read_job_record_or_none(job_dir / "calibration.json")
    if isinstance(calibration, dict):
        calibration = calibration | {"step_time_s": alloc.step_time_s, "raw_step_time_s": None}
    group_readable = bool(job_dir.stat().st_mode & 0o050)  # as the site said for this job (its umask)
    rendered = render_job(
        pf.spec,
        Path(pf.spec_path),
        model,
        decision,
        slurm,
        next_free_dir(job_dir),
        group_readable=group_readable,
        calibration=calibration if isinstance(calibration, dict) else None,
        moved_from=MovedFrom(job_id=job_id, job_dir=str(job_dir), plan=pf.decision.chosen.plan, reason="out of memory"),
        user_options=user,
    )
    return request_of(rendered, force=True, group_readable=group_readable)


def _qos_of(pf: PlanFile) -> str | None:
    """The --qos the job was submitted with (HAS may have chosen the site's preemptible one)."""
    for flag in pf.sbatch_argv:
        if flag.startswith("--qos="):
            return flag.split("=", 1)[1]
    return None


def _scrub_allocation(env: Any) -> None:
    """Drop this job's allocation from the environment sbatch hands the successor (see _ALLOCATION_PREFIXES)."""
    for key in list(env):
        if (key.startswith(_ALLOCATION_PREFIXES) and key not in _KEPT) or key in _DEVICES:
            del env[key]


def _output_tail(job_dir: Path, job_id: int) -> str:
    """The end of the job's output and error files, as job.sbatch names them ('' where none can be read)."""

    try:
        files, _ = output_files(job_dir, job_id)
    except FrenzyError:
        return ""
    text = []
    for f in files:
        try:
            text.append(read_tail(f, MAX_OUTPUT_READ)[0])
        except (FrenzyError, OSError):
            continue
    return "\n".join(text)


if __name__ == "__main__":
    sys.exit(main())
