"""What every simulated policy is: the `Policy` protocol the runner drives, and the base classes per-job and
round-based policies start from. Its own module so that the round-based policies in `ilp` and `sia` need not
import `policies`, which names them all (and imports them lazily)."""

from __future__ import annotations

from typing import Protocol

from frenzy_slurm.sim.context import Context
from frenzy_slurm.sim.jobs import Attempt, Placement


class Policy(Protocol):
    name: str
    # its jobs run frenzy-slurm's runtime, which requeues a job at its time limit: the same request again
    requeues_at_time_limit: bool
    # it plans with MARP as fsbatch does: a calibrated site (Context.calibration) reaches it
    calibrates: bool

    def stop_now(self) -> list[int]:
        """Re-planning policies: sim job ids to checkpoint and stop this round, before `tick`'s placements."""
        ...

    def submitted(self, a: Attempt, p: Placement, job_id: int, ctx: Context) -> None:
        """The runner submitted `a` as `p` under sim job id `job_id`."""
        ...

    def stopped(self, old: Attempt, rest: Attempt) -> None:
        """A job this policy stopped was checkpointed; `rest` is what it has left to run."""
        ...

    def ended(self, a: Attempt) -> None:
        """A job of this policy ended by itself (completed, OOM, time limit)."""
        ...

    def wants_round(self) -> bool:
        """Round-based policies: whether another round is due (jobs held or running)."""
        ...

    @property
    def round_s(self) -> float | None:
        """Seconds between rounds of a round-based policy; None: it places each job when it arrives."""
        ...

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        """A placement to submit now, or None to hold the job (round-based policies) or give up (no fit)."""
        ...

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        """Round-based policies: what to submit this round."""
        ...


class BasePolicy:
    """Defaults for per-job policies: no rounds, no re-planning."""

    name = ""
    round_s: float | None = None
    # whether its jobs run frenzy-slurm's runtime, which requeues a job at its time limit (the same request)
    requeues_at_time_limit = False
    # whether it plans with MARP as fsbatch does, so that the site's calibration reaches it (`Context.site_for`);
    # the policies that stand for users who pick their own GPUs do not
    calibrates = False

    def tick(self, ctx: Context) -> list[tuple[Attempt, Placement]]:
        return []

    def stop_now(self) -> list[int]:
        return []

    def submitted(self, a: Attempt, p: Placement, job_id: int, ctx: Context) -> None:
        return None

    def stopped(self, old: Attempt, rest: Attempt) -> None:
        return None

    def ended(self, a: Attempt) -> None:
        return None

    def wants_round(self) -> bool:
        return False


class RoundPolicy(BasePolicy):
    """A policy deciding in rounds; it times each round that solved a program."""

    def __init__(self, round_s: float):
        self.round_s = round_s
        self.held: list[tuple[Attempt, float]] = []  # (attempt, when it arrived)
        self.round_ms: list[float] = []  # wall time of each round that solved an integer program
        self.solve_ms: list[float] = []  # of which HiGHS alone (the rest: MARP searches for new jobs, the view)
        self.round_vars: list[int] = []
        self.round_jobs: list[int] = []  # jobs in each timed round's program
        self.unplaceable: list[Attempt] = []  # no candidate on any pool, even with the cluster empty

    def place(self, a: Attempt, ctx: Context) -> Placement | None:
        self.held.append((a, ctx.sim.now))
        return None

    def wants_round(self) -> bool:
        return bool(self.held)
