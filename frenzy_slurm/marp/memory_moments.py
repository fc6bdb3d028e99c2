"""The moments of a training step a stage's peak can fall on, each the sum of what is alive then.

`StageTerms` is what one stage holds, term by term (model states, buffers, activations, the loss's tensors);
`moments` writes each moment once as a `Moment`, whose parts are the breakdown reported and whose sum is the
allocated bytes; `peak_moment` is the largest.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.marp.memory_buffers import Buffers
from frenzy_slurm.marp.memory_states import States


@dataclass(frozen=True)
class ActivationTerms:
    """A stage's activations at its peak (bytes per rank)."""

    saved: float  # saved for backward, every micro-batch in flight (and the head's saved inputs on the last stage)
    recomputed: float  # one block recomputed during its backward
    work: float  # one block's backward working set
    block: float  # one block's saved tensors (alive in the first block's backward)


@dataclass(frozen=True)
class LossTerms:
    """The logits and loss tensors on the last stage, and what the loop keeps from the previous step."""

    logits: float = 0.0  # logits and loss tensors while the loss runs
    loss_grads: float = 0.0  # gradients the loss phase adds
    out16: float = 0.0  # this step's output at the end of its forward (or the loss's forward tensors)
    prev_logits: float = 0.0  # the previous step's output, still bound
    prev_inputs: float = 0.0  # what the previous graph's custom functions hold
    fwd_grads: float = 0.0  # the previous step's gradients, alive through the forward (zero_grad after it)

    @property
    def at_forward_end(self) -> bool:
        """Whether the end of the forward is a moment of its own (something of the previous step is alive)."""
        return bool(self.prev_logits or self.prev_inputs or self.fwd_grads)


@dataclass(frozen=True)
class StageTerms:
    """What one pipeline stage's rank holds, term by term, from which each moment of the step is summed."""

    st: States
    b: Buffers
    persistent: bool  # gradients are alive through the forward
    fb_buffers: float  # buffers alive from forward through backward (with the pipeline's)
    step_buffers: float  # the optimizer step's temporaries
    acts: ActivationTerms
    loss: LossTerms

    @property
    def grads(self) -> float:
        """Gradients alive when backward starts."""
        return self.st.grads_all if self.persistent else 0.0


@dataclass(frozen=True)
class Moment:
    """One instant of the step: what is alive then, by component (marp.memory.COMPONENTS, less the overhead)."""

    phase: str
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    buffers: float

    @property
    def allocated(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.buffers

    def parts(self) -> dict[str, float]:
        return {
            "weights": self.weights,
            "gradients": self.gradients,
            "optimizer": self.optimizer,
            "activations": self.activations,
            "logits": self.logits,
            "buffers": self.buffers,
        }


def moments(t: StageTerms) -> list[Moment]:
    """The step's moments, in the order that breaks ties: backward-start as the end of a forward beside the
    previous step's output or gradients (where there is one), as the loss's backward (logits and their gradients
    alive) and as the last block's backward (logits freed, the head's gradients and the block's working set
    alive); backward-end (the first block's backward: every other gradient exists, its own saved tensors are
    still alive); the optimizer step."""
    st, b, a, loss = t.st, t.b, t.acts, t.loss
    fb = t.fb_buffers

    def moment(phase: str, gradients: float, activations: float, logits: float, buffers: float) -> Moment:
        return Moment(phase, st.weights, gradients, st.optimizer, activations, logits, buffers)

    found = []
    if loss.at_forward_end:
        found.append(
            moment(
                "backward-start",
                t.grads or loss.fwd_grads,
                a.saved + loss.prev_inputs,
                loss.out16 + loss.prev_logits,
                fb + b.resident,
            )
        )
    found.append(
        moment(
            "backward-start",
            t.grads + loss.loss_grads,
            a.saved,
            loss.logits,
            fb - b.released_at_loss + b.bucket + b.resident,
        )
    )
    last_block_grads = st.grads_all if t.persistent else st.head_grads
    found.append(
        moment(
            "backward-start",
            last_block_grads,
            a.saved + a.recomputed + a.work,
            0.0,
            fb + b.unit_grads * b.grad_share + b.bucket + b.resident,
        )
    )
    end_acts = a.work + a.block
    tail = end_acts + b.bucket >= b.flat  # the block's tensors and the buckets, or DeepSpeed's flat gradients
    end_buffers = fb + b.unit_grads + b.resident + (b.bucket if tail else b.flat)
    found.append(moment("backward-end", st.grads_all, end_acts if tail else 0.0, 0.0, end_buffers))
    found.append(moment("optimizer-step", st.grads_all, 0.0, 0.0, t.step_buffers + b.resident))
    return found


def peak_moment(t: StageTerms) -> Moment:
    """The largest of the step's moments (the first of equals, in `moments`' order)."""
    return max(moments(t), key=lambda m: m.allocated)
