"""A user's SBATCH_* environment against the plan: which variables would override it, which are honoured.

sbatch reads its input environment variables (src/sbatch/opt.c, `env_vars`) after the script's #SBATCH lines
and gives them precedence, so SBATCH_PARTITION=debug in a login shell would put a job planned for 8 A100s on
another partition without a word. fsbatch hands sbatch its own environment (slurm/run.py: `os.environ`), so
planning reads the same one: a variable that sets what the plan sets is refused, any other one is honoured and
named in the plan's notes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.jobspec.sbatch_flags import ARRAYS

# sbatch's variables that set what every plan sets (the rendered #SBATCH lines, _header.j2 and _component.j2),
# or that change what fsbatch submits to: variable -> (the option it sets, what of the plan it would override).
PLANNED: dict[str, tuple[str, str]] = {
    "SBATCH_PARTITION": ("--partition", "the planned partition of each component"),
    "SBATCH_GRES": ("--gres", "the planned GPUs per node (--gres=gpu:TYPE:N)"),
    "SBATCH_GPUS": ("--gpus", "the planned GPUs per node (--gres=gpu:TYPE:N)"),
    "SBATCH_GPUS_PER_NODE": ("--gpus-per-node", "the planned GPUs per node (--gres=gpu:TYPE:N)"),
    "SBATCH_GPUS_PER_TASK": ("--gpus-per-task", "the planned GPUs per node (--gres=gpu:TYPE:N)"),
    "SBATCH_GPUS_PER_SOCKET": ("--gpus-per-socket", "the planned GPUs per node (--gres=gpu:TYPE:N)"),
    "SBATCH_CPUS_PER_GPU": ("--cpus-per-gpu", "the planned --cpus-per-task"),
    "SBATCH_TRES_PER_TASK": ("--tres-per-task", "the planned --cpus-per-task and GPUs"),
    "SBATCH_OVERCOMMIT": ("--overcommit", "the planned tasks and CPUs per node"),
    "SBATCH_TIMELIMIT": ("--time", "the planned --time; pass -t/--time to fsbatch instead"),
    "SBATCH_JOB_NAME": ("--job-name", "the job's --job-name; pass -J/--job-name to fsbatch instead"),
    "SBATCH_OUTPUT": ("--output", "the job's --output in its job directory; pass -o/--output to fsbatch instead"),
    "SBATCH_ERROR": ("--error", "the job's --error in its job directory; pass -e/--error to fsbatch instead"),
    "SBATCH_OPEN_MODE": ("--open-mode", "--open-mode=append, which keeps the log across requeues"),
    "SBATCH_REQUEUE": ("--requeue", "the planned --requeue"),
    "SBATCH_NO_REQUEUE": ("--no-requeue", "the planned --requeue (resuming at the time limit)"),
    "SBATCH_SIGNAL": ("--signal", "the planned --signal=USR2@..., which checkpoints before the time limit"),
    "SBATCH_CONSTRAINT": ("--constraint", "the nodes HAS planned on; pass -C/--constraint to fsbatch instead"),
    "SBATCH_EXCLUSIVE": ("--exclusive", "the node sharing HAS planned with; pass --exclusive to fsbatch instead"),
    "SBATCH_CLUSTERS": ("--clusters", "the cluster the plan was made for"),
    "SBATCH_CLUSTER_CONSTRAINT": ("--cluster-constraint", "the cluster the plan was made for"),
    "SBATCH_WAIT": ("--wait", "fsbatch's submission (sbatch would not return until the job ends)"),
}

# Variables asking for a job array: SBATCH_ARRAY_INX is the one sbatch reads (as --array); SBATCH_ARRAY, which
# sbatch ignores, is how users (and other tools' docs) spell it, so it is refused too rather than noted as honoured.
ARRAY_VARIABLES = ("SBATCH_ARRAY_INX", "SBATCH_ARRAY")

# Honoured variables that set an option the plan may set (model.yaml's slurm: block or fsbatch's flags):
# refused only when the plan sets it too.
OPTIONAL: dict[str, str] = {
    "SBATCH_ACCOUNT": "--account",
    "SBATCH_QOS": "--qos",
    "SBATCH_RESERVATION": "--reservation",
    "SBATCH_WCKEY": "--wckey",
    "SBATCH_MEM_PER_CPU": "--mem-per-cpu",
    "SBATCH_MEM_PER_GPU": "--mem-per-gpu",
    "SBATCH_MEM_PER_NODE": "--mem",
}


def sbatch_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The SBATCH_* variables of `environ`, sorted by name (sbatch reads each one it knows)."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("SBATCH_")}


def _plan_sets(option: str, flags: list[str]) -> str | None:
    """The plan's #SBATCH flag that sets `option` (model.yaml's slurm: block, fsbatch's flags), if any."""
    return next((f for f in flags if f == option or f.startswith(option + "=")), None)


def check_sbatch_env(options: SlurmOptions, environ: Mapping[str, str] | None = None) -> list[str]:
    """Refuse (InputError, exit 2) the SBATCH_* variables of `environ` (default: fsbatch's own environment,
    which sbatch inherits) that would override the plan, naming each and the fix; the notes for the others."""
    env = sbatch_variables(os.environ if environ is None else environ)
    # --preemptible sets the QOS too (the site's preemptible one), once the plan is made
    flags = options.flags() + (["--qos=(the site's preemptible QOS)"] if options.preemptible else [])
    refused: list[str] = []
    why: list[str] = []
    notes: list[str] = []
    for name, value in env.items():
        if name in ARRAY_VARIABLES:
            refused.append(name)
            why.append(f"{name}={value!r} asks sbatch for a job array (--array), which frenzy-slurm refuses: {ARRAYS}")
        elif name in PLANNED:
            option, what = PLANNED[name]
            refused.append(name)
            why.append(f"{name}={value!r} would set sbatch {option} over {what}")
        elif name in OPTIONAL and (planned := _plan_sets(OPTIONAL[name], flags)) is not None:
            refused.append(name)
            why.append(f"{name}={value!r} would set sbatch {OPTIONAL[name]} over the plan's {planned}")
        else:
            notes.append(f"environment: {name}={value!r} is passed to sbatch and honoured (it is not part of the plan)")
    if refused:
        raise InputError(
            "sbatch gives SBATCH_* environment variables precedence over the job script's #SBATCH lines, so: "
            + "; ".join(why)
            + f". Unset {'it' if len(refused) == 1 else 'them'} (`unset {' '.join(refused)}`) and say what "
            "you need in model.yaml's slurm: block or fsbatch's flags"
        )
    return notes
