"""The test-only hook of the out-of-memory recovery's live test (the records themselves: jobdir/oom.py).

CUDA's allocator cannot fail on the CPU, so the live test of the recovery makes a rank
whose planned peak is above `FRENZY_TEST_GPU_MEMORY_GIB` raise a real `torch.OutOfMemoryError` once it has
trained `FRENZY_TEST_OOM_FROM_STEP` steps (default 0): a device of that size, where the plan needs more. Only
the tests set these names; nothing in frenzy-slurm or its docs tells a user to, and the runtime says so in
the job's output when the hook fires.
"""

from __future__ import annotations

import os

TEST_CAPACITY_ENV = "FRENZY_TEST_GPU_MEMORY_GIB"
TEST_FROM_STEP_ENV = "FRENZY_TEST_OOM_FROM_STEP"


def test_capacity_exceeded(step: int, planned_gib: float | None) -> None:
    """The test-only hook (module docstring): raise torch's OutOfMemoryError where the plan needs more than the
    test's device has, from the step the test names on."""
    cap = os.environ.get(TEST_CAPACITY_ENV)
    if not cap or planned_gib is None or step < int(os.environ.get(TEST_FROM_STEP_ENV) or 0):
        return
    if planned_gib <= float(cap):
        return
    import torch

    print(f"frenzy-slurm: test hook {TEST_CAPACITY_ENV}={cap}: this rank's plan needs more", flush=True)
    raise torch.OutOfMemoryError(
        f"CUDA out of memory. Tried to allocate {(planned_gib - float(cap)) * 1024:.2f} MiB. GPU 0 has a total "
        f"capacity of {float(cap):.6f} GiB (frenzy-slurm's test hook {TEST_CAPACITY_ENV})"
    )
