"""Slurm commands frenzy-slurm runs outside a backend: which options `srun` has (the pyxis SPANK plugin adds
`--container-image`), and `salloc`, the interactive allocation `frenzy-slurm salloc` hands the terminal to.

Both go through argument lists, never a shell. `salloc_argv` spells a planned allocation as salloc's options,
as job.sbatch's `#SBATCH` lines spell it for sbatch (templates/_component.j2): per component the partition,
nodes, tasks per node (one per GPU), GRES and CPUs per task, and the node constraint and --exclusive, which
sbatch and salloc read per component; once, in the first component (Slurm propagates them to the others:
heterogeneous_jobs.html), the time limit, job name and the other options. A heterogeneous plan is salloc's
`OPTIONS(0) : OPTIONS(1) ...`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from frenzy_slurm.slurm.run import SlurmCommandError, SlurmUnavailable, run

SRUN_HELP_TIMEOUT_S = 10.0  # srun --help reads slurm.conf and loads the SPANK plugins, nothing more
PYXIS_FLAG = "--container-image"


def srun_has_option(flag: str, timeout: float = SRUN_HELP_TIMEOUT_S) -> bool | str:
    """Whether `srun --help` lists `flag` (True/False), or a string saying why srun could not be asked.

    SPANK plugins (pyxis) add their options to srun's help where plugstack.conf loads them on this node."""
    try:
        res = run(["srun", "--help"], timeout=timeout, check=False, max_bytes=1 << 20)
    except SlurmUnavailable as exc:  # srun missing, or did not answer
        return str(exc)
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["no message"])[-1]
        return f"`srun --help` failed (exit {res.returncode}: {last[:200]})"
    return any(word.split("=", 1)[0] == flag for word in (res.stdout + res.stderr).split())


@dataclass(frozen=True)
class AllocComponent:
    """One component of an allocation, as `_component.j2` writes it for sbatch."""

    partition: str
    nodes: int
    gpus_per_node: int
    gpu_type: str | None
    cpus_per_task: int


def component_options(partition: str, nodes: int, gpus_per_node: int, gpu_type: str | None, cpus: int) -> list[str]:
    """One component's shape as sbatch and salloc both read it: partition, nodes, GRES, one task per GPU and
    CPUs per task (`sbatch --test-only`'s estimate and `frenzy-slurm salloc` ask for the same allocation)."""
    gres = f"gpu:{gpu_type}:{gpus_per_node}" if gpu_type else f"gpu:{gpus_per_node}"
    return [
        f"--partition={partition}",
        f"--nodes={nodes}",
        f"--gres={gres}",
        f"--ntasks-per-node={gpus_per_node}",
        f"--cpus-per-task={cpus}",
    ]


def update_pending_argv(
    job_id: int,
    partition: str,
    nodes: int,
    gpus_per_node: int,
    gpu_type: str | None,
    cpus: int,
    restate_tasks: bool = True,
) -> list[str]:
    """`scontrol update` of a pending job to another shape, the one `component_options` submits: partition, exactly
    `nodes` nodes, one task per GPU, `cpus` CPUs per task, and GRES. Slurm 22.05 keeps the job's CPU counts as
    submitted unless told (NumCPUs, MinCPUsNode): fewer tasks per node than those counts need leave it never
    runnable (BadConstraints). `Gres=` rather than `TresPerNode=`: scontrol prefixes it with the TRES type its
    controller expects (`gres:` up to 23.02, `gres/` since 23.11). `restate_tasks=False` leaves out
    `TasksPerNode`, which slurmctld lets only operators change: it refuses a plain user's update that names it after
    applying the fields before it (measured on 22.05, docs/admin.md), so a plain user's update must not."""
    gres = f"gpu:{gpu_type}:{gpus_per_node}" if gpu_type else f"gpu:{gpus_per_node}"
    tasks = nodes * gpus_per_node
    return [
        "scontrol",
        "update",
        f"JobId={job_id}",
        f"Partition={partition}",
        f"NumNodes={nodes}-{nodes}",
        *([f"TasksPerNode={gpus_per_node}"] if restate_tasks else []),
        f"NumTasks={tasks}",
        f"NumCPUs={tasks * cpus}",
        f"MinCPUsNode={gpus_per_node * cpus}",
        f"CPUsPerTask={cpus}",
        f"Gres={gres}",
    ]


def salloc_argv(
    components: Sequence[AllocComponent],
    time_min: int,
    job_name: str,
    flags: Sequence[str] = (),
    component_flags: Sequence[str] = (),
    command: Sequence[str] = (),
) -> list[str]:
    """`salloc` for a planned allocation: `flags` (the job's options: account, QOS, ...) in the first component,
    `component_flags` (constraint, --exclusive) in each, then the command salloc runs (none: the user's shell)."""
    argv = ["salloc"]
    for i, c in enumerate(components):
        if i:
            argv.append(":")
        argv += component_options(c.partition, c.nodes, c.gpus_per_node, c.gpu_type, c.cpus_per_task)
        if i == 0:
            argv += [f"--time={time_min}", f"--job-name={job_name}", *flags]
        argv += list(component_flags)
    return argv + list(command)


def exec_salloc(argv: list[str], env: Mapping[str, str]) -> None:
    """Replace this process by salloc (the terminal, signals and exit status are salloc's); returns only if it
    could not be started, as SlurmUnavailable."""
    if argv[:1] != ["salloc"]:
        raise SlurmCommandError(argv, 1, "not a salloc command line")
    if shutil.which("salloc", path=env.get("PATH")) is None:
        raise SlurmUnavailable(
            "'salloc' was not found: the Slurm client commands are not installed or not on PATH "
            "(install slurm-client, or `module load slurm`)."
        )
    try:
        os.execvpe("salloc", argv, dict(env))
    except OSError as exc:
        raise SlurmUnavailable(f"salloc could not be started: {exc.strerror}") from None
