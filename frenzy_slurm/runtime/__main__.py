"""What each task of the rendered srun step runs.

    python -m frenzy_slurm.runtime --job-dir DIR [--script train.py -- ARGS...]

Sets RANK/WORLD_SIZE/LOCAL_RANK/MASTER_* from Slurm's variables and the device, checks the job directory
(runtime/trust.py: the directory and files fsbatch recorded, else the job stops before reading them), then
runs the built-in trainer, or execs the user's script with FRENZY_DS_CONFIG / FRENZY_PLAN / FRENZY_JOB_DIR /
FRENZY_CHECKPOINT_DIR set (beside the plan's FRENZY_* variables job.sbatch exports), its arguments' `$FRENZY_*`
expanded from them (frenzy_slurm/jobdir/scriptenv.py), with the job's Python ($FRENZY_JOB_PYTHON, from
entry.environment; default this one).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from frenzy_slurm.runtime import signals

signals.install()  # first: an early USR2/TERM must be recorded, not kill the job (see runtime/signals.py)

from frenzy_slurm.core.errors import FrenzyError, InputError  # noqa: E402
from frenzy_slurm.jobdir.planfile import read_plan  # noqa: E402
from frenzy_slurm.jobdir.safety import check_private_dir  # noqa: E402
from frenzy_slurm.jobdir.scriptenv import ArgsError, expand_args  # noqa: E402
from frenzy_slurm.runtime import ending  # noqa: E402
from frenzy_slurm.runtime.dist import from_environ  # noqa: E402
from frenzy_slurm.runtime.framework_argv import framework_args  # noqa: E402
from frenzy_slurm.runtime.trust import open_job_dir  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    """Run one task; a refusal (FrenzyError) is one message on stderr and its exit code, never a traceback."""
    try:
        return _run(argv)
    except FrenzyError as exc:
        print(f"frenzy-slurm: error: {exc.message}", file=sys.stderr, flush=True)
        return exc.exit_code


def _run(argv: list[str] | None) -> int:

    signals.install()  # also when main() is called directly
    ap = argparse.ArgumentParser(prog="frenzy_slurm.runtime", description=__doc__.split("\n\n")[0])
    ap.add_argument("--job-dir", type=Path, required=True)
    ap.add_argument("--script", type=Path)
    ap.add_argument("args", nargs=argparse.REMAINDER)
    ns = ap.parse_args(argv)
    drop_inherited()
    dist = from_environ()
    dist.export()
    trusted = open_job_dir(ns.job_dir)  # before anything there is read
    job_dir = trusted.path
    os.environ.update(
        FRENZY_JOB_DIR=str(job_dir),
        FRENZY_DS_CONFIG=str(job_dir / "ds_config.json"),
        FRENZY_PLAN=str(job_dir / "plan.json"),
        FRENZY_CHECKPOINT_DIR=str(job_dir / "checkpoints"),
    )
    if dist.gpu_index is not None:
        os.environ["FRENZY_GPU"] = dist.gpu_index
    if ns.script is not None:
        moved = moved_checkpoints(trusted.via_fd)
        if moved is not None:  # in_job.latest_checkpoint() looks there while this job has saved none
            os.environ["FRENZY_RESUME_DIR"] = str(moved)

        args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
        if signals.pending():  # tell the script a stop was already requested
            os.environ["FRENZY_STOP_SIGNAL"] = signals.pending() or ""
        try:
            args = expand_args(args, os.environ, framework_args(os.environ))
        except ArgsError as exc:
            raise InputError(f"{exc} (job.sbatch was edited, or rendered by another frenzy-slurm)") from None
        python = os.environ.get("FRENZY_JOB_PYTHON") or sys.executable
        if dist.local_rank == 0 and os.environ.get("FRENZY_NVML_SAMPLER", "1") != "0":
            # one per node: the script's GPU memory and utilisation -> nvml-<host>.json, metrics.json
            from frenzy_slurm.runtime.nvml_sampler import start_beside

            start_beside(job_dir)
        signals.prepare_exec()
        if os.environ.get("FRENZY_FRAMEWORK") == "llm.c":
            # llm.c's train_gpt2cu is a compiled program: it runs itself, one per task srun started (its MPI
            # initialises from Slurm's PMI); no Python between it and the GPU
            try:
                os.execv(str(ns.script), [str(ns.script), *args])
            except OSError as exc:
                raise InputError(
                    f"cannot run llm.c's program {ns.script} ({exc.strerror}); build it (make "
                    "train_gpt2cu) and make it executable"
                ) from None
        try:
            os.execvp(python, [python, str(ns.script), *args])  # a bare name (entry.environment.python): on PATH
        except OSError as exc:
            raise InputError(f"cannot run the job's Python {python} ({exc.strerror}); see entry.environment") from None
    # imports torch: the built-in trainer only, after the signal handlers
    from frenzy_slurm.runtime.trainer import run_training

    return run_training(trusted.via_fd, dist)  # through the directory checked, whatever its path names later


# What the runtime alone tells the job: sbatch exports the submitter's environment (--export=ALL), so a value left in
# the login shell (an earlier job's, or one set on purpose) would otherwise reach a job it was never meant for.
RUNTIME_SET = ("FRENZY_RESUME_DIR", "FRENZY_STOP_SIGNAL")


def drop_inherited() -> None:
    """Forget RUNTIME_SET as inherited; the runtime sets each again only from what it checked itself."""
    for key in RUNTIME_SET:
        os.environ.pop(key, None)


def moved_checkpoints(job_dir: Path) -> Path | None:
    """The checkpoints/ of the job `frenzy-slurm watch` moved to this one (plan.json's `moved_from`), once that
    directory is checked to be the user's and writable by no one else; None for a job that was not moved."""
    if not (job_dir / "plan.json").exists():
        return None  # a runtime started by hand on a directory without a plan
    moved = read_plan(job_dir / "plan.json").moved_from
    if moved is None:
        return None
    check_private_dir(Path(moved.job_dir), "the job directory this job was moved from")
    return Path(moved.job_dir) / "checkpoints"


def run_and_finish(argv: list[str] | None = None) -> NoReturn:
    """main(), then end as runtime/ending.py says: the process group down on every path, and an exit status
    decided here, never by the interpreter's teardown (std::terminate in a C++ destructor turned finished runs
    into FAILED ones). An unexpected exception prints its traceback and exits 1; the group is down by then."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's --help and usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if not isinstance(exc.code, int | None):
            print(exc.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - reported, then the exit below
        import traceback

        traceback.print_exc()
        code = 1
    try:
        ending.close_process_group(barrier=False)  # the trainer closed it already where it could wait for peers
    except Exception as exc:  # noqa: BLE001 - the outcome is decided: report and go on to the exit
        print(f"frenzy-slurm: closing the process group: {exc}", file=sys.stderr)
    ending.finish(code)


if __name__ == "__main__":
    run_and_finish()
