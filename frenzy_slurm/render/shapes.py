"""A job's pre-planned shapes: the allocations a pending job may be changed to in place, and which one it got.

`scontrol update` can change a pending job's partition, GPUs per node and node count and keep its place in the
queue (`SlurmBackend.update_pending`), but the job's script and plan were written for one allocation. So fsbatch
records in plan.json, beside the chosen allocation, a few others HAS also found (`shapes_from`): each with its
plan and rendered DeepSpeed config. Once the job starts, the runtime reads from Slurm's environment what it got
(`SLURM_JOB_PARTITION`, `SLURM_JOB_NUM_NODES`, `SLURM_GPUS_ON_NODE`) and runs the matching shape (`pick`),
refusing clearly where none matches.

Kept to homogeneous single-component jobs of the chosen allocation's GPU type: Slurm 22.05 merges a job's GRES
update with the GRES it asked at submission, so a job changed to another GPU type asks for both and is never
runnable (BadConstraints, measured: tests/test_seam_pending_update.py and docs/has.md, "Re-planning waiting jobs").
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.has.model import Allocation, Decision
from frenzy_slurm.jobdir.planfile import PlanFile, Shape
from frenzy_slurm.jobspec import JobSpec
from frenzy_slurm.marp.plan import ParallelPlan

MAX_SHAPES = 3  # the chosen allocation and up to two others: each is a DeepSpeed config the job carries
# srun in a job that may have been changed: the shape it got, not SLURM_NTASKS, which Slurm leaves as sbatch set it
# at submission (measured on 22.05: tests/test_seam_pending_update.py)
SRUN_AS_GIVEN = (
    '--nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node="$SLURM_GPUS_ON_NODE" '
    '--ntasks="$((SLURM_JOB_NUM_NODES * SLURM_GPUS_ON_NODE))" '
)


def gpus_per_process(plan: ParallelPlan) -> int:
    """GPUs one process of the job drives: one, except under naive model parallelism (`parallel.schedule:
    sequential`), where one process holds all `pp` stages (Hugging Face's device_map over the GPUs it sees)."""
    return plan.pp if plan.schedule == "sequential" else 1


def tasks_per_node(gpus_per_node: int, per_process: int) -> int:
    """srun tasks per node: one per `per_process` GPUs; InputError where a node's GPUs do not divide into them."""
    if gpus_per_node % per_process:
        raise InputError(
            f"naive model parallelism puts {per_process} pipeline stages in one process, on one node, but a node "
            f"of this allocation has {gpus_per_node} GPUs; use a pp that divides the GPUs per node "
            "(limits.max_gpus, parallel.pp)"
        )
    return gpus_per_node // per_process


def srun_as_given(per_process: int = 1) -> str:
    """SRUN_AS_GIVEN with `per_process` GPUs to a task."""
    if per_process == 1:
        return SRUN_AS_GIVEN
    tasks = f"$((SLURM_GPUS_ON_NODE / {per_process}))"
    return (
        f'--nodes="$SLURM_JOB_NUM_NODES" --ntasks-per-node="{tasks}" '
        f'--ntasks="$((SLURM_JOB_NUM_NODES * SLURM_GPUS_ON_NODE / {per_process}))" '
    )


def _same_kind(a: Allocation, chosen: Allocation) -> bool:
    if a.kind != "homogeneous" or len(a.components) != 1:
        return False
    return a.components[0].gpu_type == chosen.components[0].gpu_type and a.time_min <= chosen.time_min


def shape_allocations(decision: Decision, limit: int = MAX_SHAPES) -> list[Allocation]:
    """The chosen allocation, then up to `limit - 1` of HAS's alternatives of the same GPU type and no longer
    time limit (Slurm lets a user shorten a pending job's limit but not lengthen it), one per (partition, nodes,
    GPUs per node): first the soonest in each other partition, then the soonest of the rest. Partitions first:
    what frees up while the job waits is another partition's GPUs as often as its own, and a shape there is what
    lets it follow them. Empty for a heterogeneous job."""
    chosen = decision.chosen
    if chosen.kind != "homogeneous" or len(chosen.components) != 1:
        return []
    others = sorted(
        (a.allocation for a in decision.alternatives if a.allocation is not None and _same_kind(a.allocation, chosen)),
        key=lambda x: x.completion,
    )
    out, seen = [chosen], {_key(chosen)}
    partitions = {chosen.components[0].partition}
    for spread in (True, False):
        for a in others:
            part = a.components[0].partition
            if len(out) >= limit or _key(a) in seen or (spread and part in partitions):
                continue
            out.append(a)
            seen.add(_key(a))
            partitions.add(part)
    return out


def _key(a: Allocation) -> tuple[str, int, int]:
    c = a.components[0]
    return (c.partition, c.nodes, c.gpus_per_node)


def shape(a: Allocation, ds_config: dict[str, Any]) -> Shape:
    c = a.components[0]
    return Shape(
        partition=c.partition,
        gpu_type=c.gpu_type,
        nodes=c.nodes,
        gpus_per_node=c.gpus_per_node,
        allocation=a,
        ds_config=ds_config,
    )


def pick(shapes: list[Shape], env: Mapping[str, str]) -> Shape:
    """The shape the job got, from Slurm's environment in the job. FrenzyError where none matches (the job was
    changed by hand to a shape fsbatch did not plan) or the environment does not say."""
    try:
        got = (env["SLURM_JOB_PARTITION"], int(env["SLURM_JOB_NUM_NODES"]), int(env["SLURM_GPUS_ON_NODE"]))
    except (KeyError, ValueError) as exc:
        raise FrenzyError(
            f"frenzy-slurm: the job's allocation is unknown ({exc} missing or not a number in the job's environment); "
            "plan.json's shapes are picked by SLURM_JOB_PARTITION, SLURM_JOB_NUM_NODES and SLURM_GPUS_ON_NODE."
        ) from None
    for s in shapes:
        if s.key() == got:
            return s
    planned = ", ".join(f"{p} {n}x{g}" for p, n, g in (s.key() for s in shapes))
    raise FrenzyError(
        f"frenzy-slurm: the job got partition {got[0]} with {got[1]} node(s) x {got[2]} GPU(s), which plan.json does "
        f"not plan for (planned: {planned}). Was it changed with scontrol update by hand? Change it back to one of "
        "those, or resubmit it with fsbatch."
    )


def job_shapes(spec: JobSpec, decision: Decision) -> list[Shape]:
    """slurm.replan's shapes for plan.json, each with its DeepSpeed config; empty for a heterogeneous job. Only
    the built-in trainer runs the shape it got (a script reads the FRENZY_* of the chosen plan)."""
    from frenzy_slurm.render.ds_config import ds_config

    if spec.entry.trainer != "builtin":
        raise InputError(
            "model.yaml slurm.replan: only jobs of the built-in trainer (entry.trainer: builtin) run whichever "
            "planned shape Slurm gives them; drop slurm.replan for this job."
        )
    return [shape(a, ds_config(spec, a.plan)) for a in shape_allocations(decision)]


def runs_as(pf: PlanFile, env: Mapping[str, str]) -> tuple[PlanFile, dict[str, Any] | None]:
    """plan.json as this run runs it: with shapes, the one Slurm gave the job as the chosen allocation, and its
    DeepSpeed config; without, as written (None: ds_config.json)."""
    if not pf.shapes:
        return pf, None
    s = pick(pf.shapes, env)
    return pf.model_copy(update={"decision": pf.decision.model_copy(update={"chosen": s.allocation})}), s.ds_config
