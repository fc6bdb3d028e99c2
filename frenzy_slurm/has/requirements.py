"""What HAS needs to know about a job, and nothing more: batch, length, the user's limits and time.

`decide()` takes this instead of the whole JobSpec, so a reader sees what the decision rests on, and
the simulator can describe a job without writing a model.yaml. The `--time` request (model.yaml's
`slurm.time`, overridden by `fsbatch -t`) is here because HAS owns the time limit: it checks it
against each partition's MaxTime and returns the one it chose in the Allocation.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.jobspec.job import JobSpec, SlurmOptions
from frenzy_slurm.marp import eager_module_loading
from frenzy_slurm.slurm.timefmt import parse_slurm_time

# --time when the user gives none: the prediction with this margin (run time is a prediction)
TIME_MARGIN = 1.25
TIME_SLACK_S = 600.0


@dataclass(frozen=True)
class Requirements:
    name: str
    global_batch: int
    steps: int
    max_gpus: int | None = None
    min_gpus: int | None = None
    gpu_types: tuple[str, ...] | None = None  # GRES type, catalog model or partition names, lower case
    time_limit_s: float | None = None  # longest acceptable predicted run time
    deadline: float | None = None  # epoch seconds the predicted completion must precede
    requested_time_min: int | None = None  # sbatch --time the user asked for; None: HAS chooses
    constraint: str | None = None  # sbatch -C: only nodes with these features (has/nodes.py)
    exclusive: bool = False  # sbatch --exclusive: whole nodes, none another job uses
    eager_module_loading: bool = False  # the job's CUDA context is the eager one (marp.eager_module_loading)
    # seconds a start that resumes a checkpoint spends reading it before its first step, beyond the start-up that
    # TIME_SLACK_S covers (frenzy-slurm watch's successors on a site with preemption.checkpoint_gbs; else 0)
    resume_s: float = 0.0

    @classmethod
    def from_spec(cls, spec: JobSpec, time: str | int | None = None, slurm: SlurmOptions | None = None) -> Requirements:
        """From model.yaml, with `time` (fsbatch -t) overriding `slurm.time`, and `slurm` (model.yaml's slurm: block
        with fsbatch's flags on top) giving -t, -C and --exclusive where passed."""
        lim = spec.limits
        opts = slurm if slurm is not None else spec.slurm
        want = time if time is not None else opts.time
        return cls(
            name=spec.name,
            global_batch=spec.training.global_batch,
            steps=spec.training.total_steps,
            max_gpus=lim.max_gpus,
            min_gpus=lim.min_gpus,
            gpu_types=tuple(t.lower() for t in lim.gpu_types) if lim.gpu_types else None,
            time_limit_s=parse_slurm_time(lim.time_limit) * 60.0 if lim.time_limit else None,
            deadline=lim.deadline.timestamp() if lim.deadline else None,
            requested_time_min=parse_slurm_time(want) if want is not None else None,
            constraint=opts.constraint,
            exclusive=opts.exclusive,
            eager_module_loading=eager_module_loading(spec),
        )

    def time_min(self, run_time_s: float) -> int:
        """sbatch --time for a predicted run time: the user's, else the prediction plus margin and the checkpoint's
        read where the start resumes one (`resume_s`)."""
        if self.requested_time_min is not None:
            return self.requested_time_min
        return int(-(-(run_time_s * TIME_MARGIN + self.resume_s + TIME_SLACK_S) // 60))
