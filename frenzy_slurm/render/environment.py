"""The job's software environment (entry.environment): what job.sbatch loads, and fsbatch's check of it.

job.sbatch loads `modules` and activates the venv or conda environment before srun (templates/_launch.j2),
and exports `FRENZY_JOB_PYTHON`, the interpreter the runtime execs the script with. The runtime itself runs
in frenzy-slurm's own Python (the one that ran fsbatch), as does the built-in trainer.

The plan-time check (`check_environment`) asks the job's Python whether it can find the framework's
packages, without importing them: `PYTHON -P -c` with `importlib.util.find_spec` in a subprocess with a
timeout, in an empty private directory (so nothing in the working directory shadows a package), with the
environment sbatch passes to the job (PYTHONPATH and the user's site-packages count, so not `-I`). fsbatch
never imports torch itself. Where modules are named, the login node may not have them (or they set
PYTHONPATH), so what the check misses there is only a note: the modules may provide it on the compute
node. Elsewhere a missing Python or package refuses the submission (exit 2; `fsbatch --no-env-check`
skips the check) and is a note under --dry-run.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.render.container import check_container

CHECK_TIMEOUT_S = 30.0  # a cold interpreter on a network file system starts slowly; torch's find_spec does not load it
EnvCheck = Literal["refuse", "note", "off"]

# What each framework's script (or the built-in trainer) cannot start without; `megatron.core` is found by
# importing only the `megatron` namespace package, never torch.
FRAMEWORK_PACKAGES: dict[str, tuple[str, ...]] = {
    "frenzy": ("torch", "deepspeed"),
    "deepspeed": ("torch", "deepspeed"),
    "hf-trainer": ("torch", "transformers", "accelerate"),
    "unsloth": ("torch", "unsloth", "transformers"),
    "torchtune": ("torch", "torchtune"),
    "torchtitan": ("torch", "torchtitan"),
    "litgpt": ("torch", "litgpt"),
    "lightning": ("torch", "lightning|pytorch_lightning"),
    "megatron": ("torch", "megatron.core"),
    "torch": ("torch",),
    "llm.c": (),  # its compiled train_gpt2cu: the job's Python runs only frenzy-slurm's runtime, which execs it
}

# find_spec of each name given (a|b: either); a missing parent package is "not found", never an exception
_PROBE = """
import importlib.util, json, sys
def found(name):
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False
print(json.dumps({n: any(found(a) for a in n.split("|")) for n in sys.argv[1:]}))
"""


@dataclass(frozen=True)
class JobPython:
    """How the job gets its Python: `path` where it is known at plan time (None for a conda environment that
    could not be located here), `modules` to load, and the template's activation values."""

    path: Path | None
    source: str  # what named it, for messages
    modules: tuple[str, ...]
    venv: str | None = None
    conda: str | None = None
    python: str | None = None  # FRENZY_JOB_PYTHON for entry.environment.python / venv

    def template_context(self) -> dict[str, object]:
        return {"modules": list(self.modules), "venv": self.venv, "conda": self.conda, "python": self.python}


def _absolute(value: str, spec_dir: Path) -> Path:
    p = Path(value).expanduser()
    return p if p.is_absolute() else (spec_dir / p).absolute()


def _conda_prefix(name: str) -> Path | None:
    """The prefix of conda environment `name` on this machine, from conda's own variables; None if not found."""
    if "/" in name or name.startswith("~"):
        return Path(name).expanduser().absolute()
    roots: list[Path] = []
    if os.environ.get("CONDA_EXE"):
        roots.append(Path(os.environ["CONDA_EXE"]).parents[1])  # ROOT/bin/conda
    if os.environ.get("CONDA_PREFIX"):
        prefix = Path(os.environ["CONDA_PREFIX"])
        roots.append(prefix.parents[1] if prefix.parent.name == "envs" else prefix)
    for root in roots:
        if name == "base" and (root / "bin" / "python").exists():
            return root
        if (root / "envs" / name).is_dir():
            return root / "envs" / name
    home_env = Path("~/.conda/envs").expanduser() / name
    return home_env if home_env.is_dir() else None


def job_python(spec: JobSpec, spec_dir: Path) -> JobPython:
    """The job's Python as entry.environment names it (default: the Python running frenzy-slurm)."""
    env = spec.entry.environment
    modules = tuple(env.modules)
    if env.python is not None:
        if (
            "/" not in env.python
        ):  # a command name: the job finds it on its PATH (after the modules), fsbatch on its own
            found = shutil.which(env.python)
            return JobPython(Path(found) if found else None, "entry.environment.python", modules, python=env.python)
        path = _absolute(env.python, spec_dir)
        return JobPython(path, "entry.environment.python", modules, python=str(path))
    if env.venv is not None:
        venv = _absolute(env.venv, spec_dir)
        return JobPython(
            venv / "bin" / "python",
            "entry.environment.venv",
            modules,
            venv=str(venv),
            python=str(venv / "bin" / "python"),
        )
    if env.conda is not None:
        prefix = _conda_prefix(env.conda)
        return JobPython(
            prefix / "bin" / "python" if prefix else None, "entry.environment.conda", modules, conda=env.conda
        )
    return JobPython(Path(sys.executable), "the Python running fsbatch (no entry.environment)", modules)


def needed_packages(spec: JobSpec) -> tuple[str, ...]:
    """The packages the job's Python must find for this spec's framework (and DeepSpeed where the script is
    handed the DeepSpeed config)."""
    fw = spec.entry.runs_with
    need = list(FRAMEWORK_PACKAGES.get(fw, ("torch",)))
    if spec.entry.trainer == "script" and "deepspeed" not in need:
        if any("FRENZY_DS_CONFIG" in a or "FRENZY_FRAMEWORK_ARGS" in a for a in spec.entry.args) and fw == "hf-trainer":
            need.append("deepspeed")  # $FRENZY_FRAMEWORK_ARGS passes --deepspeed
    return tuple(need)


@functools.lru_cache(maxsize=32)
def probe(python: str, packages: tuple[str, ...], prefix: tuple[str, ...] = ()) -> dict[str, bool] | str:
    """{package: found} as `python` sees it, or a string saying why it could not be asked; `prefix` runs it
    elsewhere (`apptainer exec IMAGE`: the image's Python).

    With -P (nothing from the working directory on sys.path), and in an empty private directory besides, so
    that a Python older than 3.11, which refuses -P and is asked again without it, is as safe."""
    with tempfile.TemporaryDirectory(prefix="frenzy-envcheck-") as empty:
        for flags in (["-P"], []):
            try:
                res = subprocess.run(
                    [*prefix, python, *flags, "-c", _PROBE, *packages],
                    cwd=empty,
                    capture_output=True,
                    text=True,
                    timeout=CHECK_TIMEOUT_S,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired:
                return f"it did not answer within {CHECK_TIMEOUT_S:.0f} s"
            except OSError as exc:
                return f"it cannot be run ({exc.strerror})"
            if not (flags and res.returncode != 0 and "-P" in res.stderr):
                break
    try:
        answer = json.loads(res.stdout.strip().splitlines()[-1]) if res.returncode == 0 else None
    except (json.JSONDecodeError, IndexError):
        answer = None
    if not isinstance(answer, dict):
        tail = (res.stderr.strip().splitlines() or ["no output"])[-1]
        return f"it failed (exit {res.returncode}: {tail[:200]})"
    return {str(k): bool(v) for k, v in answer.items()}


def probe_here(packages: tuple[str, ...]) -> dict[str, bool] | None:
    """`probe`'s answer where the job's Python is the one running fsbatch, from this interpreter: the same
    find_spec over the same path less sys.path[0] (the script's directory, which the probe's -P leaves out),
    without starting another interpreter (a tenth of a dry run's time). None where only a child process may
    ask: a dotted name's find_spec imports its parent package (torch, say), which fsbatch never imports."""
    if any("." in name for n in packages for name in n.split("|")):
        return None
    import importlib.util

    def found(name: str) -> bool:
        if name in sys.modules:  # imported already, perhaps from sys.path[0]: the child process decides
            raise LookupError(name)
        try:
            return importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            return False

    saved = sys.path[:]
    try:
        if not sys.flags.safe_path and sys.path:
            del sys.path[0]
        return {n: any(found(name) for name in n.split("|")) for n in packages}
    except LookupError:
        return None
    finally:
        sys.path[:] = saved


def check_environment(spec: JobSpec, spec_dir: Path, mode: EnvCheck) -> list[str]:
    """Notes about the job's environment; InputError (exit 2) for what would kill the job, with mode "refuse"."""
    if mode == "off":
        return []
    if spec.entry.environment.container is not None:
        return check_container_environment(spec, spec_dir, mode)
    jp = job_python(spec, spec_dir)
    modules = jp.modules
    fix = (
        "install them there (e.g. `pip install torch deepspeed`), name the job's environment in model.yaml "
        "(entry.environment: python, venv or conda), or skip this check with --no-env-check"
    )
    need = needed_packages(spec)
    problem: str | None = None
    if jp.path is None and spec.entry.environment.conda is not None:
        return [
            f"{jp.source} {spec.entry.environment.conda!r} is not found on this machine; not checked that it "
            f"has {', '.join(need)}."
        ]
    if jp.path is None:
        problem = f"the job's Python {spec.entry.environment.python!r} ({jp.source}) is not on PATH"
    elif not jp.path.exists():
        problem = f"the job's Python {jp.path} ({jp.source}) does not exist"
    else:
        here = probe_here(need) if jp.path == Path(sys.executable) else None
        answer = here if here is not None else probe(str(jp.path), need)
        if isinstance(answer, str):
            problem = f"the job's Python {jp.path} ({jp.source}) could not be asked for {', '.join(need)}: {answer}"
        else:
            missing = [n.replace("|", " or ") for n, ok in answer.items() if not ok]
            if not missing:
                return []
            problem = (
                f"the job's Python {jp.path} ({jp.source}) cannot find {', '.join(missing)}, which framework "
                f"{spec.entry.runs_with} needs: the job would stop with ModuleNotFoundError"
            )
    if modules:
        return [
            f"{problem} on this login node, without entry.environment.modules ({', '.join(modules)}) loaded; "
            "the modules may provide it on the compute nodes (not checked there)."
        ]
    if mode == "note":
        return [f"{problem}. Submitting refuses this (exit 2); {fix}."]
    raise InputError(f"model.yaml: {problem}. To fix: {fix}.")


def check_container_environment(spec: JobSpec, spec_dir: Path, mode: EnvCheck) -> list[str]:
    """entry.environment.container's checks (render/container.py), and the image's Python asked for frenzy_slurm and
    the framework's packages where the login node can run it; refused or noted as the job's Python is."""
    c = spec.entry.environment.container
    assert c is not None
    found = check_container(c, spec_dir)
    notes, problem = list(found.notes), found.problem
    if problem is None and found.probe_prefix is not None:
        need = ("frenzy_slurm", *needed_packages(spec))
        answer = probe(c.python, need, found.probe_prefix)
        if isinstance(answer, str):
            notes.append(f"the image's Python ({c.python}) could not be asked for {', '.join(need)}: {answer}")
        elif missing := [n.replace("|", " or ") for n, ok in answer.items() if not ok]:
            problem = (
                f"the image's Python ({c.python} in {c.image}) cannot find {', '.join(missing)}, which the job needs "
                f"(framework {spec.entry.runs_with}): it would stop with ModuleNotFoundError"
            )
    if problem is None:
        return notes
    fix = 'fix entry.environment.container (docs/runtime.md, "Containers"), or skip this check with --no-env-check'
    if found.module_may_fix and spec.entry.environment.modules:
        return [
            *notes,
            f"{problem}, without entry.environment.modules loaded; the modules may provide it on the compute nodes "
            "(not checked there).",
        ]
    if mode == "note":
        return [*notes, f"{problem}. Submitting refuses this (exit 2); {fix}."]
    raise InputError(f"model.yaml: entry.environment.container: {problem}. To fix: {fix}.")
