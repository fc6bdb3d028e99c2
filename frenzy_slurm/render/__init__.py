"""Stage 5, render: the job directory's files (job.sbatch, ds_config.json, plan.json, model.yaml).

Templates live in `templates/` (shipped as package data) and may be overridden per file by a directory
of the user's or admin's (`--templates DIR` or $FRENZY_TEMPLATES). Jinja runs with StrictUndefined, and
every value that reaches a shell passes the `shquote` filter. `render_job` returns the rendered files,
which `frenzy_slurm.planning.plan_job` turns into the JobRequest that both `--dry-run` prints and
submission writes and submits: what you see is what runs.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jinja2
import jinja2.sandbox
import yaml

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import check_trusted
from frenzy_slurm.core.version import __version__
from frenzy_slurm.has.model import Allocation, Decision
from frenzy_slurm.jobdir.paths import default_job_dir
from frenzy_slurm.jobdir.planfile import MovedFrom, PlanFile
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.job import SIGNAL_LEAD_S, SlurmOptions
from frenzy_slurm.jobspec.sbatch_flags import ARRAYS, asks_for_array
from frenzy_slurm.render.container import ContainerLaunch, launch, runtime_argv
from frenzy_slurm.render.ds_config import ds_config
from frenzy_slurm.render.environment import job_python
from frenzy_slurm.render.script import check_script_entry, plan_env
from frenzy_slurm.render.shapes import gpus_per_process, job_shapes, srun_as_given, tasks_per_node
from frenzy_slurm.slurm.cli import sbatch_argv
from frenzy_slurm.slurm.view import pool_label

SIGNAL_SECONDS = SIGNAL_LEAD_S  # USR2 this long before the time limit: the runtime checkpoints (NCCL owns USR1)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # a newline in a path would end a comment line and run as a command
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,-]+\Z")  # #SBATCH lines are not shell-parsed: keep paths plain


@dataclass(frozen=True)
class Rendered:
    """The job directory's files for one decision (planning.JobRequest adds what submitting needs)."""

    job_dir: Path
    submission: str
    files: dict[str, str]
    plan: PlanFile
    kind: str
    name: str
    entry_script: Path | None  # entry.script, absolute, for trainer: script

    @property
    def script(self) -> str:
        return self.files["job.sbatch"]


def submission_hash(spec: JobSpec, model: ResolvedModel, options: SlurmOptions) -> str:
    """Same model.yaml content and flags -> same hash (the idempotency key).

    Only the fields the user set count (and the resolved architecture), so a frenzy-slurm upgrade that
    adds spec fields with defaults still recognises an earlier submission of the same file.
    """
    payload = json.dumps(
        {
            "spec": spec.model_dump(mode="json", exclude_unset=True),
            "arch": model.arch.model_dump(),
            "options": options.model_dump(mode="json", exclude_defaults=True),
        },
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def no_control_chars(what: str, value: str) -> str:
    """Refuse a value with control characters (newline, tab, escape...) before it reaches a generated file."""
    m = _CONTROL.search(value)
    if m:
        raise InputError(
            f"{what} {value!r} contains the control character {m.group()!r}; rename it (or move the "
            "file) to a path without control characters."
        )
    return value


class _Sandbox(jinja2.sandbox.ImmutableSandboxedEnvironment):
    """The immutable sandbox, also bounding `*` and `**`: `{{ 'x' * 10**9 }}` would fill the login node's memory
    (the sandbox already bounds `range()`)."""

    intercepted_binops = frozenset(["*", "**"])
    MAX_OUTPUT = 1 << 20  # a job script is a few KB

    def call_binop(self, context: jinja2.runtime.Context, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, (int, float)) and abs(right) > 64:
            raise jinja2.sandbox.SecurityError(f"exponent {right} is too large for a template")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > self.MAX_OUTPUT:
                    raise jinja2.sandbox.SecurityError("repetition larger than a job script needs")
        return super().call_binop(context, operator, left, right)


_TEMPLATE_RISK = "a template is shell that runs in your job"


class _TrustedLoader(jinja2.FileSystemLoader):
    """A user's or admin's template directory: each template (and include) is checked before it is read, as
    the directory was: yours or root's, writable by no one else (a planted template runs in the job)."""

    def get_source(
        self, environment: jinja2.Environment, template: str
    ) -> tuple[str, str, Callable[[], bool]]:  # FileSystemLoader's own
        from jinja2.loaders import split_template_path

        for base in self.searchpath:
            candidate = Path(base).joinpath(*split_template_path(template))
            if candidate.is_file():
                check_trusted(candidate, "template", _TEMPLATE_RISK)
                break
        return super().get_source(environment, template)


def environment(template_dir: Path | None = None) -> jinja2.Environment:
    """Jinja environment: the user's directory first (if any), then the shipped templates.

    Templates may come from a user's or admin's directory, so they render in Jinja's immutable sandbox:
    no attribute walks to Python internals (`''.__class__.__mro__`), no mutation of the context.
    """
    loaders: list[jinja2.BaseLoader] = []
    override = template_dir or (Path(os.environ["FRENZY_TEMPLATES"]) if os.environ.get("FRENZY_TEMPLATES") else None)
    if override is not None:
        if not override.is_dir():
            raise InputError(f"templates directory {override} does not exist")
        check_trusted(override, "templates directory", _TEMPLATE_RISK)
        loaders.append(_TrustedLoader(str(override)))
    loaders.append(jinja2.FileSystemLoader(str(resources.files("frenzy_slurm").joinpath("templates"))))
    env = _Sandbox(
        loader=jinja2.ChoiceLoader(loaders),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = lambda v: shlex.quote(str(v))
    return env


def entry_script(spec: JobSpec, spec_dir: Path) -> Path | None:
    """entry.script as an absolute path (relative ones are taken from model.yaml's directory), for
    trainer: script; None for the built-in trainer."""
    if spec.entry.trainer != "script":
        return None
    script = Path(spec.entry.script or "")
    script = script if script.is_absolute() else (spec_dir / script).absolute()
    no_control_chars("entry.script", str(script))
    return script


def runtime_command(spec: JobSpec, job_dir: Path, script: Path | None) -> list[str]:
    # -P: `python -m` would otherwise put the working directory (the job directory) first on sys.path,
    # so a module planted there (frenzy_slurm/, torch.py) would run as the job's owner.
    cmd = [sys.executable, "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(job_dir)]
    if (container := spec.entry.environment.container) is not None:  # the image's Python runs the runtime
        cmd = runtime_argv(container, job_dir)
    if script is not None:
        cmd += ["--script", str(script), "--", *spec.entry.args]
    return cmd


def oom_retry_command(options: SlurmOptions, job_dir: Path, in_container: bool) -> list[str] | None:
    """What job.sbatch runs after a failed step to submit a run that ran out of memory again (runtime/oom_retry.py);
    None where the user turned that off, or in a container (the host may have no frenzy-slurm)."""
    if not options.oom_retry or in_container:
        return None
    return [sys.executable, "-P", "-m", "frenzy_slurm.runtime.oom_retry", "--job-dir", str(job_dir)]


def component_flags(options: SlurmOptions) -> list[str]:
    """The #SBATCH lines every component of the job carries: sbatch reads the lines before the first
    `#SBATCH hetjob` as the first component's only, so a node constraint or --exclusive written once in the
    header would leave the other components on any node, shared."""
    out = [f"--constraint={options.constraint}"] if options.constraint is not None else []
    return out + (["--exclusive"] if options.exclusive else [])


def check_component_flags(script: str, flags: list[str], components: int, template: str) -> None:
    """Refuse a script that lost a per-component line: a --templates _component.j2 written before these lines
    moved out of the header would otherwise drop -C/--exclusive without a word."""
    for flag in flags:
        if script.count(f"#SBATCH {flag}\n") < components:
            raise InputError(
                f"template {template}: the script does not carry '#SBATCH {flag}' in each of its {components} "
                "component(s); a custom _component.j2 must write `component_flags` as the shipped one does"
            )


def check_container_launch(script: str, container: ContainerLaunch, template: str) -> None:
    """Refuse a script that does not run the container: a --templates _launch.j2 written before containers would
    otherwise run the job on the host, outside the image model.yaml names."""
    if not all(shlex.quote(w) in script for w in (*container.srun_flags, *container.prefix)):
        raise InputError(
            f"template {template}: the script does not launch entry.environment.container ({container.runtime} "
            f"{container.image}); a custom _launch.j2 must write `container` as the shipped one does"
        )


_SBATCH_LINE = re.compile(r"#SBATCH\s+(.*)")


def check_no_array(script: str, template: str) -> None:
    """Refuse a script whose #SBATCH lines ask for a job array (a --templates file may write any line): its
    tasks would run one plan in one job directory, writing over each other's records and checkpoints."""
    for line in script.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return  # sbatch reads #SBATCH lines up to the first command only
        if (m := _SBATCH_LINE.fullmatch(line.strip())) and (word := asks_for_array(m.group(1).split())):
            raise InputError(f"template {template}: '{line.strip()}' asks sbatch for a job array ({word}): {ARRAYS}")


def _render_script(
    template_dir: Path | None,
    ctx: dict,
    per_component: list[str],
    n_components: int,
    in_image: ContainerLaunch | None,
) -> str:
    """The batch script from the job's template (heterogeneous for several components), refused where the
    sandbox refuses it, where it drops the per-component flags or the container launch, or asks for an array."""
    env = environment(template_dir)
    template = "heterogeneous.sbatch.j2" if n_components > 1 else "homogeneous.sbatch.j2"
    try:
        script = env.get_template(template).render(**ctx)
    except jinja2.sandbox.SecurityError as exc:
        raise InputError(
            f"template {template}: refused by the template sandbox ({exc}); templates may only "
            "format the values they are given"
        ) from None
    except jinja2.TemplateError as exc:
        raise InputError(f"template {getattr(exc, 'name', None) or template}: {exc}") from None
    except RecursionError:
        raise InputError(f"template {template}: recursion too deep (a macro or include that calls itself)") from None
    check_component_flags(script, per_component, n_components, template)
    if in_image is not None:
        check_container_launch(script, in_image, template)
    check_no_array(script, template)
    return script


def _predicted(alloc: Allocation) -> dict:
    """plan.json's predictions: per pool (partition/GRES type: two partitions with the same GPU model are two
    entries) the GPU model, peak and capacity, and the step time."""
    predicted: dict = {
        pool_label(c.partition, c.gpu_type): {
            "gpu_model": c.gpu_model,
            "peak_gib": c.peak_gib,
            "capacity_gib": c.capacity_gib,
        }
        for c in alloc.components
    }
    return predicted | {"step_time_s": alloc.step_time_s}


def _script_context(
    spec: JobSpec,
    spec_path: Path,
    job_dir: Path,
    submission: str,
    alloc: Allocation,
    options: SlurmOptions,
    command: list[str],
    in_image: ContainerLaunch | None,
    group_readable: bool,
    shaped: bool = False,
) -> dict:
    """What the batch script's template is given: names, paths, the time limit, the sbatch flags (those every
    component takes apart), the components, the environment and the command."""
    per_process = gpus_per_process(alloc.plan)
    components = [
        c.model_dump() | {"tasks_per_node": tasks_per_node(c.gpus_per_node, per_process)} for c in alloc.components
    ]
    # (a process driving several GPUs gets their CPUs too)
    components = [c | {"cpus_per_task": c["cpus_per_task"] * per_process} for c in components]
    output = options.output or str(job_dir / "slurm-%j.out")
    groups = ",".join(str(i) for i in range(len(components)))
    umask = 0o027 if group_readable else 0o077
    per_component = component_flags(options)
    return dict(
        version=__version__,
        generated_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        name=options.job_name or spec.name,
        submission=submission,
        summary=f"{alloc.label()} | {alloc.plan.short()} | predicted {alloc.run_time_s / 3600:.2f} h",
        job_dir=str(job_dir),
        spec_path=str(spec_path.absolute()),
        output=output,
        error=options.error or output,
        time_min=alloc.time_min,  # HAS decided it (the user's --time, or the prediction with margin)
        signal_seconds=SIGNAL_SECONDS,
        sbatch_flags=[f for f in options.flags() if f not in per_component],
        component_flags=per_component,
        components=components,
        env=plan_env(spec, alloc.plan) | spec.entry.env,  # the plan's FRENZY_* for a script, then the user's
        job_env=job_python(spec, spec_path.parent).template_context(),
        umask=f"{umask:03o}",
        command=command,
        # a job of several shapes (slurm.replan): srun follows the shape Slurm gave it (render/shapes.py)
        srun_groups=f"--het-group={groups} " if len(components) > 1 else (srun_as_given(per_process) if shaped else ""),
        container=None if in_image is None else in_image.template_context(),
        oom_retry=oom_retry_command(options, job_dir, in_image is not None),
    )


def render_job(
    spec: JobSpec,
    spec_path: Path,
    model: ResolvedModel,
    decision: Decision,
    options: SlurmOptions,
    job_dir: Path | None = None,
    template_dir: Path | None = None,
    group_readable: bool = False,
    calibration: dict[str, Any] | None = None,
    moved_from: MovedFrom | None = None,
    user_options: SlurmOptions | None = None,
) -> Rendered:
    """Render the job directory's files for HAS's decision; `options` are the merged sbatch options,
    `calibration` the job's calibration.json (planning.plan_job's `job_record`; none: no file), `moved_from`
    the job this one continues (a move by `frenzy-slurm watch`), `user_options` the options as the user gave them
    (before a QOS HAS chose; default `options`)."""
    submission = submission_hash(spec, model, options)
    job_dir = (job_dir or default_job_dir(spec.name, submission)).absolute()
    if not _SAFE_PATH.match(str(job_dir)):
        raise InputError(f"job directory '{job_dir}' has spaces or shell characters; choose another --job-dir")
    alloc = decision.chosen
    name = options.job_name or spec.name
    no_control_chars("model.yaml path", str(spec_path.absolute()))
    check_script_entry(spec)  # entry.args' $FRENZY_* names, entry.env not shadowing the plan's variables
    script_path = entry_script(spec, spec_path.parent)
    command = runtime_command(spec, job_dir, script_path)
    container = spec.entry.environment.container
    in_image = None if container is None else launch(container, spec_path.parent, job_dir, script_path)
    per_component = component_flags(options)
    shapes = job_shapes(spec, decision) if options.replan else []
    ctx = _script_context(
        spec, spec_path, job_dir, submission, alloc, options, command, in_image, group_readable, bool(shapes)
    )
    script = _render_script(template_dir, ctx, per_component, len(alloc.components), in_image)
    plan = PlanFile(
        frenzy_version=__version__,
        submission=submission,
        created_at=time.time(),
        spec_path=str(spec_path.absolute()),
        spec=spec,
        arch=model.arch,
        model_name=model.name,
        exact_params=model.exact_params,
        decision=decision,
        time_min=alloc.time_min,
        sbatch_argv=sbatch_argv(job_dir / "job.sbatch"),
        command=command,
        predicted=_predicted(alloc),
        moved_from=moved_from,
        slurm=user_options if user_options is not None else options,
        shapes=shapes,
    )
    files = {
        "job.sbatch": script,
        "ds_config.json": json.dumps(ds_config(spec, alloc.plan), indent=2) + "\n",
        "plan.json": plan.model_dump_json(indent=2) + "\n",
        "model.yaml": yaml.safe_dump(spec.model_dump(mode="json", exclude_none=True), sort_keys=False),
    }
    if calibration is not None:
        files["calibration.json"] = json.dumps(calibration, indent=2) + "\n"  # fsqueue JOBID shows it
    return Rendered(
        job_dir=job_dir,
        submission=submission,
        files=files,
        plan=plan,
        kind=alloc.kind,
        name=name,
        entry_script=script_path,
    )
