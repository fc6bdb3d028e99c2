"""For your own training script (entry.trainer: script): the stop signal, the checkpoint directory, requeue.

    from frenzy_slurm import in_job  # first: importing it installs the USR2/TERM handler
    ...
    resume = in_job.latest_checkpoint()  # None on the first run; else resume from it
    for step in range(...):
        train_step()
        if in_job.stop_requested():  # USR2 300 s before the time limit, or TERM (scancel, preemption)
            save(in_job.checkpoint_dir() / f"step{step}")
            in_job.exit_for_requeue()  # rank 0 requeues after USR2; every rank exits 0
    in_job.finish()  # the process group down after a barrier, then exit 0 without the interpreter's teardown

The contract (docs/runtime.md "User scripts"): Slurm sends SIGUSR2 300 s before the time limit
(`--signal=USR2@300`; NCCL owns USR1) and SIGTERM on scancel, preemption or `scontrol requeue`. The runtime
starts the script with USR2 ignored: a USR2 between the script's start and this import does not kill the
job but is missed (import this module first); one that came before the script started is passed on as
`FRENZY_STOP_SIGNAL`, which `stop_requested()` reads. After USR2 the job is put back in the queue
(`requeue()`, rank 0 only: one request per job) and the next run finds its checkpoint with
`latest_checkpoint()`. After TERM it is not: Slurm requeues a preempted job itself, and scancel means stop.

An uncaught `torch.OutOfMemoryError` is recorded for the job's epilogue (`record_out_of_memory`), which
submits the run again with more memory headroom (docs/runtime.md, "Out of memory").

Only the standard library is imported here, and frenzy-slurm's checkpoint reader (jobdir.checkpoints, itself
standard library only); its Slurm seam when requeueing, its directory checks when resuming from a moved job's
checkpoints, and `runtime.ending` (standard library; it reaches a torch the script already imported) in
`finish()` and `exit_for_requeue()`; never torch itself:
import it first, before the seconds-long imports a signal could otherwise interrupt.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import NoReturn

from frenzy_slurm.jobdir.checkpoints import latest_tag  # standard library only, as this module

_STOP: dict[str, str | None] = {"signal": os.environ.get("FRENZY_STOP_SIGNAL") or None}
_STEP_NAME = re.compile(r"(\d+)$")  # step500, checkpoint-500, global_step500: the number at the end


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    if _STOP["signal"] is None:
        _STOP["signal"] = signal.Signals(signum).name


def install() -> None:
    """Record USR2 and TERM instead of dying (done on import; call again if something replaced the handlers)."""
    if threading.current_thread() is threading.main_thread():  # signal.signal works only there
        for sig in (signal.SIGUSR2, signal.SIGTERM):
            signal.signal(sig, _on_signal)


install()


def record_out_of_memory(exc: BaseException) -> bool:
    """Record torch's out-of-memory error `exc` for the job's epilogue, which then submits the run again once
    with more memory headroom (docs/runtime.md, "Out of memory"); False where `exc` is not one or no job
    directory is set. Done for you where it ends the script (an uncaught exception); call it where you catch it."""
    job_dir = os.environ.get("FRENZY_JOB_DIR")
    if not job_dir:
        return False
    from frenzy_slurm.jobdir import oom  # standard library only (lint-imports checks it)

    if not oom.is_cuda_oom(exc):
        return False
    try:
        oom.record(Path(job_dir), exc)
    except OSError:
        return False
    return True


def _excepthook(kind: type[BaseException], exc: BaseException, tb: object) -> None:
    record_out_of_memory(exc)
    _previous_hook(kind, exc, tb)  # type: ignore[arg-type]  # sys.excepthook's own arguments


_previous_hook = sys.excepthook
if os.environ.get("FRENZY_JOB_DIR"):  # in a job: an uncaught out-of-memory error is recorded as it ends the script
    sys.excepthook = _excepthook


def stop_signal() -> str | None:
    """SIGUSR2 or SIGTERM once one has arrived (or arrived before the script started), else None."""
    return _STOP["signal"]


def stop_requested() -> bool:
    """True once the job should save a checkpoint and stop: poll it at step boundaries."""
    return _STOP["signal"] is not None


def rank() -> int:
    """This task's global rank (RANK, set by the runtime from SLURM_PROCID); 0 outside a job."""
    return int(os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or 0)


def checkpoint_dir() -> Path:
    """JOBDIR/checkpoints ($FRENZY_CHECKPOINT_DIR; ./checkpoints outside a job), created private if missing."""
    path = Path(os.environ.get("FRENZY_CHECKPOINT_DIR") or "checkpoints")
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def latest_checkpoint() -> Path | None:
    """The checkpoint a resumed run continues from: the tag DeepSpeed's `latest` file names, else the
    subdirectory of checkpoint_dir() whose name ends in the highest number (step500, checkpoint-500); None
    when there is none. A job `frenzy-slurm watch` moved here continues from the moved job's checkpoints
    ($FRENZY_RESUME_DIR) until it has saved one of its own; saves still go to checkpoint_dir()."""
    own = _latest_in(checkpoint_dir())
    moved = os.environ.get("FRENZY_RESUME_DIR")
    if own is None and moved and _private_checkpoints(Path(moved)):
        return _latest_in(Path(moved))
    return own


def _private_checkpoints(path: Path) -> bool:
    """Whether a moved job's checkpoints/ may be resumed from: it and its job directory are this user's and
    writable by no one else, as is every directory above (jobdir.safety.check_private_dir). Else a note on stderr
    and False: loading another user's files would run their code (torch.load unpickles)."""
    # not at import: in_job imports only the standard library (a user's script imports it first)
    from frenzy_slurm.core.errors import FrenzyError
    from frenzy_slurm.jobdir.safety import check_private_dir

    try:
        if not path.is_dir():
            return False
        check_private_dir(path, "FRENZY_RESUME_DIR")
    except FrenzyError as exc:
        print(f"frenzy-slurm: not resuming from {path}: {exc.message}", file=sys.stderr, flush=True)
        return False
    return True


def _latest_in(base: Path) -> Path | None:
    tag = latest_tag(base)
    if tag and "/" not in tag and (base / tag).is_dir():
        return base / tag
    numbered = [(int(m.group(1)), p) for p in base.iterdir() if p.is_dir() and (m := _STEP_NAME.search(p.name))]
    return max(numbered)[1] if numbered else None


def job_id() -> int | None:
    """The Slurm job to requeue: a heterogeneous job's leader, else the job; None outside Slurm."""
    value = os.environ.get("SLURM_HET_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    return int(value) if value and value.isdigit() else None


def preempted() -> bool:
    """Whether Slurm is preempting this job (its PreemptTime is set; `fsbatch --preemptible` jobs): the SIGTERM
    was a preemption, so the job requeues after its checkpoint. With PreemptMode=REQUEUE Slurm requeues it only
    if it is still running when the QOS's GraceTime ends; one that has saved and exited would end COMPLETED."""
    jid = job_id()
    if jid is None:
        return False
    # not at import: in_job imports only the standard library (a user's script imports it first)
    from frenzy_slurm.core.errors import FrenzyError
    from frenzy_slurm.slurm import open_backend

    try:
        return open_backend("cli").preempted(jid)
    except FrenzyError as exc:
        print(f"frenzy-slurm: could not ask whether job {jid} is preempted: {exc.message}", file=sys.stderr, flush=True)
        return False


def requeue_wanted() -> bool:
    """After a stop: requeue for the time-limit warning (USR2) and for a preemption (TERM with PreemptTime set);
    a scancel (TERM otherwise) stops the job."""
    signal = _STOP["signal"]
    return signal == "SIGUSR2" or (signal == "SIGTERM" and preempted())


def requeue() -> bool:
    """Put the job back in the queue (`scontrol requeue`, from rank 0 only); True where it was asked.

    Slurm then ends this run's tasks (TERM, then KILL after KillWait) and starts the job again with
    SLURM_RESTART_COUNT one higher. A failure is printed; the checkpoint stays for a manual resubmit.
    """
    jid = job_id()
    if rank() != 0 or jid is None:
        return False
    # not at import: in_job imports only the standard library (a user's script imports it first)
    from frenzy_slurm.core.errors import FrenzyError
    from frenzy_slurm.slurm import open_backend

    try:
        open_backend("cli").requeue(jid)
    except FrenzyError as exc:
        print(f"frenzy-slurm: could not requeue job {jid}: {exc.message}", file=sys.stderr, flush=True)
        return False
    print(f"frenzy-slurm: job {jid} requeued after {stop_signal()}", flush=True)
    return True


def exit_for_requeue() -> NoReturn:
    """After the stop checkpoint: requeue if the stop was the time-limit warning (USR2) or a preemption (rank 0
    asks), then exit 0 on every rank (a non-zero exit would make srun's --kill-on-bad-exit end the other ranks
    before they save). The process group comes down without a barrier: a rank that stopped elsewhere may
    never reach one."""
    if rank() == 0 and requeue_wanted():
        requeue()
    _end(0, barrier=False)


def finish(code: int = 0) -> NoReturn:
    """End this task once everything it writes is written: `in_job.finish(main())` where a script would end with
    `sys.exit(main())`. torch.distributed's process group comes down after a barrier (through DeepSpeed's comm where
    DeepSpeed started it), then the task exits with `code` skipping the interpreter's teardown: there, a rank
    whose training finished can die in std::terminate (gloo's and the TCPStore's threads outlive their group),
    srun's --kill-on-bad-exit ends the step and Slurm records FAILED. atexit handlers do not run: flush or
    close what they would (stdout, stderr and logging are flushed here)."""
    _end(code, barrier=True)


def _end(code: int, barrier: bool) -> NoReturn:
    # runtime.ending imports only the standard library; it reaches torch only where the script imported it
    from frenzy_slurm.runtime import ending

    ending.close_process_group(barrier=barrier)
    ending.finish(code)
