"""A job whose tasks run in a container image (entry.environment.container): the launch line, and the plan-time
checks of what can be checked on the login node.

Apptainer/Singularity wraps the task's command: `srun ... apptainer exec [--nv] --bind JOBDIR[,MOUNTS]
--pwd WORKDIR [OPTIONS] IMAGE PYTHON -P -m frenzy_slurm.runtime ...`. Pyxis is a SPANK plugin of srun: srun
itself gets `--container-image=IMAGE --container-mounts=JOBDIR:JOBDIR[,MOUNTS] --container-workdir=WORKDIR`.
Either way the job directory is mounted at its own path (plan.json, ds_config.json, checkpoints and records
are read and written there by path, and its inode, which the runtime checks, is the host's through a bind
mount), and the image's Python runs frenzy-slurm's runtime. The rendezvous port is chosen on the batch node
by the same Python in the same image (`free_port`), so the host needs no frenzy-slurm either.

Checked before submitting (`check_container`): an image given as a file or directory exists and is readable;
a registry reference is not (the job pulls it). apptainer: the command is on the login node's PATH, and, for
an image file, the image's Python is asked (through `apptainer exec`) whether it finds frenzy_slurm and the
framework's packages. pyxis: `srun --help` lists `--container-image` (the plugin is loaded), through the
Slurm seam; the image's Python cannot be asked on the login node (pyxis starts containers only in a job
step), which a note says.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from frenzy_slurm.jobspec.job import Container
from frenzy_slurm.slurm.commands import PYXIS_FLAG, srun_has_option

RUNTIME_MODULE = ("-P", "-m", "frenzy_slurm.runtime")


def is_reference(c: Container) -> bool:
    """Whether the image is a registry reference (pulled by the job) rather than a file on a shared file system."""
    if c.runtime == "pyxis":  # pyxis reads a path only where it starts with / or . (enroot's rule)
        return not c.image.startswith(("/", "./", "../", "~"))
    return "://" in c.image


def image_path(c: Container, spec_dir: Path) -> Path | None:
    """The image file or directory as an absolute path (relative ones from model.yaml's directory); None for a
    registry reference."""
    if is_reference(c):
        return None
    p = Path(c.image).expanduser()
    return p if p.is_absolute() else (spec_dir / p).absolute()


@dataclass(frozen=True)
class ContainerLaunch:
    """What the template writes for a container: `srun_flags` after srun's own, `prefix` before the task's
    command, and `free_port`, the command that prints the rendezvous port on the batch node."""

    runtime: str
    image: str
    python: str
    srun_flags: tuple[str, ...]
    prefix: tuple[str, ...]
    free_port: tuple[str, ...]

    def template_context(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "image": self.image,
            "srun_flags": list(self.srun_flags),
            "prefix": list(self.prefix),
            "free_port": list(self.free_port),
        }


def launch(c: Container, spec_dir: Path, job_dir: Path, script: Path | None = None) -> ContainerLaunch:
    """The container's part of the srun line for a job in `job_dir`; `script` (trainer: script), whose directory
    is mounted at its own path too, so the runtime finds it by the path plan.json records."""
    path = image_path(c, spec_dir)
    image = str(path) if path is not None else c.image
    workdir = c.workdir or str(job_dir)
    own = [str(job_dir)] + ([str(script.parent)] if script is not None and script.parent != job_dir else [])
    mounts = ",".join([*(f"{d}:{d}" for d in own), *c.mounts])
    port = [c.python, "-P", "-m", "frenzy_slurm.runtime.dist", "free-port"]
    if c.runtime == "pyxis":
        flags: tuple[str, ...] = (
            f"--container-image={image}",
            f"--container-mounts={mounts}",
            f"--container-workdir={workdir}",
        )
        flags += tuple(c.options)
        # one task on the batch node (the first node of component 0), in the same image
        free = ("srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", *flags, *port)
        return ContainerLaunch(c.runtime, image, c.python, flags, (), free)
    binds = ",".join([*own, *c.mounts])
    common = (c.runtime, "exec", "--bind", binds, "--pwd", workdir, *c.options)
    prefix = (c.runtime, "exec", *(["--nv"] if c.gpus else []), *common[2:], image)
    return ContainerLaunch(c.runtime, image, c.python, (), prefix, (*common, image, *port))


def runtime_argv(c: Container, job_dir: Path) -> list[str]:
    """The runtime's command inside the container (the image's Python)."""
    return [c.python, *RUNTIME_MODULE, "--job-dir", str(job_dir)]


@dataclass(frozen=True)
class ContainerCheck:
    """What the login node could say about a container: `problem` (the job would fail), `notes` (not checked)."""

    problem: str | None
    notes: tuple[str, ...]
    probe_prefix: tuple[str, ...] | None  # how to run the image's Python here, where it can be asked
    module_may_fix: bool = False  # the runtime command is missing here: entry.environment.modules may provide it


def check_container(c: Container, spec_dir: Path) -> ContainerCheck:
    """The image, the runtime command or plugin; where the image's Python can be asked, how."""
    notes: list[str] = []
    path = image_path(c, spec_dir)
    if path is None:
        notes.append(f"container.image {c.image!r} is a registry reference: the job pulls it; not checked here.")
    elif not path.exists():
        return ContainerCheck(f"container.image {path} does not exist", (), None)
    elif not os.access(path, os.R_OK | (os.X_OK if path.is_dir() else 0)):
        return ContainerCheck(f"container.image {path} is not readable by you", (), None)
    if c.runtime == "pyxis":
        has = srun_has_option(PYXIS_FLAG)
        if has is False:
            return ContainerCheck(
                f"this Slurm's srun has no {PYXIS_FLAG} option: the pyxis SPANK plugin is not loaded (plugstack.conf)",
                tuple(notes),
                None,
            )
        if isinstance(has, str):
            notes.append(f"whether srun has pyxis ({PYXIS_FLAG}) was not checked: {has}")
        notes.append(
            f"the image's Python ({c.python}) is not asked for frenzy_slurm and the framework's packages: pyxis "
            "starts containers only inside a job step."
        )
        return ContainerCheck(None, tuple(notes), None)
    exe = shutil.which(c.runtime)
    if exe is None:
        missing = f"`{c.runtime}` (container.runtime) is not on this login node's PATH"
        return ContainerCheck(missing, tuple(notes), None, module_may_fix=True)
    if path is None:
        return ContainerCheck(None, tuple(notes), None)
    return ContainerCheck(None, tuple(notes), (exe, "exec", str(path)))
