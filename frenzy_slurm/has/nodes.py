"""The nodes a job may use: the view HAS plans on, narrowed by the job's `-C/--constraint` and `--exclusive`.

    view, notes = nodes_for(req, view)      # decide() plans on this view; notes go to its skipped lines

sbatch hands both to Slurm for every component, but a plan made on every node would count GPUs the job can
never get: nodes without the features, or (with --exclusive) GPUs free on nodes another job is using.
- `-C`: a node whose available features do not satisfy the constraint (slurm/constraint.py, as slurmctld
  reads it) is left out of the view, so its GPUs are neither free nor waited for. What the constraint asks of
  the job's nodes together (a matching OR `[a|b]`, counts `a*2`) cannot be asked of one node: those parts are
  left to Slurm's own start estimate (`sbatch --test-only` is given the constraint) and said in a note.
- `--exclusive`: Slurm gives the job whole nodes (all their CPUs and GRES, sbatch(1)) and starts it only on
  nodes no other job uses. So a node any job uses (GPUs, CPUs or memory, a CPU-only job too) has no free GPU
  here and frees all of them only when the last job on it ends; the view's running jobs on such a node are
  replaced by one hold of all its GPUs until then. Candidates that leave GPUs of a node unused are weighed
  by `exclusive_nodes` in decide.py.
"""

from __future__ import annotations

from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.slurm.constraint import parse_constraint
from frenzy_slurm.slurm.releases import PENDING_DEFAULT_LIMIT_S
from frenzy_slurm.slurm.view import ClusterView, Job, Node, job_phase, pool_label


def nodes_for(req: Requirements, view: ClusterView) -> tuple[ClusterView, list[str]]:
    """The view as this job may use it, and a line for each GPU pool the constraint leaves without nodes (and
    for the parts of the constraint only Slurm can check). The view itself is returned where neither applies."""
    notes: list[str] = []
    if req.constraint is not None:
        view, notes = _with_features(view, req.constraint)
    if req.exclusive:
        view = _whole_nodes(view)
    return view, notes


def _with_features(view: ClusterView, text: str) -> tuple[ClusterView, list[str]]:
    constraint = parse_constraint(text)  # validated with the spec; parsed again here, it is cheap
    kept: list[Node] = []
    dropped: list[Node] = []
    for n in view.nodes:  # a node whose features the backend did not read is kept: Slurm will check it
        (kept if n.features is None or constraint.matches(n.features) else dropped).append(n)
    blind = sum(1 for n in view.nodes if n.gpus_total and n.features is None)
    unknown = [
        f"-C {text}: the features of {blind} GPU node(s) are not known here (Slurm's text format or an older "
        "snapshot): planned on as if they had them; Slurm checks them"
    ][: 1 if blind else 0]
    if not dropped:
        return view, unknown + _whole_job_notes(text, constraint.matching_or, constraint.counted)
    names = {n.name for n in kept}
    lost: dict[str, set[str]] = {}  # pool -> the features its nodes have
    for n in dropped:
        if n.gpus_total:
            for p in n.partitions:
                lost.setdefault(pool_label(p, n.gpu_type), set()).update(n.features or ())
    still = {pool_label(p, n.gpu_type) for n in kept if n.gpus_total for p in n.partitions}
    notes = [
        f"{pool}: no node has the features -C {text} asks for (its nodes have: {', '.join(sorted(have)) or 'none'})"
        for pool, have in sorted(lost.items())
        if pool not in still
    ]
    narrowed = view.model_copy(
        update={
            "nodes": kept,
            "partitions": [p.model_copy(update={"nodes": [x for x in p.nodes if x in names]}) for p in view.partitions],
        }
    )
    return narrowed, notes + unknown + _whole_job_notes(text, constraint.matching_or, constraint.counted)


def _whole_job_notes(text: str, matching_or: tuple[str, ...], counted: bool) -> list[str]:
    out = []
    if matching_or:
        out.append(
            f"-C {text}: planned on nodes with any of {' or '.join(matching_or)}; that all nodes of a component "
            "share one is left to Slurm (its --test-only estimate was asked)"
        )
    if counted:
        out.append(f"-C {text}: node counts (*N) are left to Slurm (its --test-only estimate was asked)")
    return out


def _whole_nodes(view: ClusterView) -> ClusterView:
    running = [j for j in view.jobs if job_phase(j.state) == "running"]
    ends: dict[str, Job] = {}  # node -> the running job on it that ends last
    for j in running:
        for name in j.nodes:
            if name not in ends or (j.end_time or 0) > (ends[name].end_time or 0):
                ends[name] = j
    busy = {n.name for n in view.nodes if n.in_use} | set(ends)
    nodes: list[Node] = [
        n.model_copy(update={"gpus_used": n.gpus_total}) if n.name in busy and n.gpus_total else n for n in view.nodes
    ]
    # one hold per busy node: all its GPUs until the last job on it ends (a node used by a job the view does not
    # list, such as another cluster's or one that just ended, is held for as long as a pending job without a limit)
    holds = []
    for n in view.nodes:
        if n.name not in busy or not n.gpus_total:
            continue
        last = ends.get(n.name)
        end = last.end_time if last is not None and last.end_time else int(view.taken_at + PENDING_DEFAULT_LIMIT_S)
        holds.append(
            Job(
                job_id=last.job_id if last is not None else 0,
                name="(in use: --exclusive waits for the node to empty)",
                state="RUNNING",
                partition=n.partitions[0] if n.partitions else "",
                nodes=[n.name],
                node_count=1,
                gpu_type=n.gpu_type,
                gpus_per_node=n.gpus_total,
                end_time=end,
            )
        )
    others = [j for j in view.jobs if job_phase(j.state) != "running"]
    return view.model_copy(update={"nodes": nodes, "jobs": holds + others})
