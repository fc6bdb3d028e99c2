"""What torchtitan's eager loss leaves reserved beyond its allocated peak, replayed through the caching allocator.

    python benchmarks/titan_loss_replay.py      # instant

torchtitan 9dec370's loss phase at one rank's 32768 tokens x 128256 vocabulary (dev2 A04's shapes), in the order
train.py runs it: the model's 16-bit logits, their fp32 upcast, the saved log-softmax output; the upcast freed
after the forward, `del pred`; in backward nll's fp32 gradient, log-softmax's fp32 gradient, the 16-bit gradient.
The freed 16-bit logits leave a hole no fp32 gradient fits, with or without expandable segments (docs/marp.md,
"Overheads by metric"). A 20 GiB block stands for what lives through the step.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.marp.allocator_replay import CachingAllocator  # noqa: E402

TOKENS, VOCAB = 32768, 128256


def replay(settings: str) -> tuple[float, float]:
    """(allocated peak, reserved peak) in GiB of the loss phase under these allocator settings."""
    a = CachingAllocator()
    if settings:
        a.set_settings(settings)
    b16, f32 = TOKENS * VOCAB * 2, TOKENS * VOCAB * 4
    a.malloc(20 * int(GiB))  # states and the saved block inputs, alive through the step
    pred = a.malloc(b16)  # the model's logits
    upcast = a.malloc(f32)  # pred.flatten(0, 1).float()
    saved = a.malloc(f32)  # log_softmax's output, saved for backward
    a.free(upcast)
    a.free(pred)  # del pred
    nll = a.malloc(f32)  # nll_loss backward: the gradient of the log-probabilities
    grad = a.malloc(f32)  # log_softmax backward: the fp32 logits' gradient
    a.free(nll)
    a.free(saved)
    a.malloc(b16)  # the upcast's backward: the 16-bit logits' gradient
    a.free(grad)
    return a.stat("allocated_bytes", kind="peak") / GiB, a.stat("reserved_bytes", kind="peak") / GiB


def main() -> None:
    for settings in ("", "expandable_segments:True"):
        allocated, reserved = replay(settings)
        name = settings or "default"
        print(f"{name:26s} allocated peak {allocated:6.2f} GiB, reserved peak {reserved:6.2f} GiB")


if __name__ == "__main__":
    main()
