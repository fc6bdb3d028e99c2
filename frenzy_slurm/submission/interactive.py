"""An interactive allocation of a planned job (`frenzy-slurm salloc`): the job directory written as for a batch
job, and the salloc command line of the planned shape, which the CLI hands the terminal to.

Inside the allocation `bash JOBDIR/job.sbatch` is the launcher: its #SBATCH lines are comments to bash, and
its srun starts the planned tasks in the allocation salloc holds (salloc sets the SLURM_* variables the
script and srun read, the nodes of each hetjob component among them). Nothing is recorded as a submission:
fsqueue lists batch jobs; the allocation is salloc's, ending when its command or shell does.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobdir import safety as jobdir
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.render import component_flags
from frenzy_slurm.slurm.commands import AllocComponent, salloc_argv

if TYPE_CHECKING:  # as in submit/__init__.py: planning imports jobdir
    from frenzy_slurm.planning import JobRequest


def salloc_command(req: JobRequest, command: list[str]) -> list[str]:
    """salloc with the planned partition, nodes, tasks, GRES and CPUs per component, the plan's time limit and
    the user's options (account, QOS, constraint, --exclusive, ...), then `command` (none: the user's shell)."""
    options = req.plan.slurm or SlurmOptions()  # plan_job always records them; an old plan.json may not
    per_component = component_flags(options)
    parts = [
        AllocComponent(c.partition, c.nodes, c.gpus_per_node, c.gpu_type, c.cpus_per_task)
        for c in req.decision.chosen.components
    ]
    flags = [f for f in options.flags() if f not in per_component]
    return salloc_argv(parts, req.plan.time_min, req.name, flags, per_component, command)


def write_for_allocation(req: JobRequest) -> Path:
    """The job directory written as fsbatch writes it (private, job.sbatch bound to its inode and digests);
    the launcher's path."""
    script = req.entry_script
    if script is not None and not script.is_file():
        raise InputError(
            f"{req.plan.spec_path}: entry.script {script} does not exist; fix the path (relative "
            "paths are taken from model.yaml's directory)."
        )
    jobdir.check_private_dir(jobdir.make_private_dir(req.job_dir.parent, "jobs directory"), "jobs directory")
    jobdir.create_job_dir(req.job_dir, req.group_readable, submission=req.submission)
    jobdir.write_files(req.job_dir, req.files, req.group_readable)
    return req.job_dir / "job.sbatch"
