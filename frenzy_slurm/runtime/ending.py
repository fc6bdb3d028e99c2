"""How a task of the built-in runtime ends: the process group taken down, then an exit no destructor can change.

A run that trained every step used to end FAILED now and then (about 1 in 4 tiny runs): at interpreter exit a
rank died in std::terminate ("terminate called without an active exception": a C++ std::thread still joinable
when its owner was destroyed; gloo's and the TCPStore's threads belong to objects that outlive
destroy_process_group while DeepSpeed's engine and groups still reference them). srun saw the signal,
--kill-on-bad-exit ended the step, and Slurm recorded FAILED although every checkpoint and metrics.json were
written. So:

- `close_process_group` takes the group down on every path: after a barrier at the normal end (every rank has
  written what it writes), without one after an error (a peer may never reach it); through DeepSpeed's comm
  when DeepSpeed started it, which also drops DeepSpeed's own references to its groups.
- `finish` then flushes stdout, stderr and logging and leaves with `os._exit(code)`: no atexit handler, C++
  static destructor or finaliser runs after the run's outcome is decided and written, so a finished run's
  task exits 0 whatever would go wrong in the interpreter's teardown. Nothing is lost: checkpoints and records
  are written and closed before this point (what the kernel holds for a file is kept by _exit), and the
  built-in runtime leaves no child behind (the converter is waited for).
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn


def close_process_group(barrier: bool) -> None:
    """Take torch.distributed's groups down (after a barrier if `barrier`); nothing where none was started."""
    if "torch" not in sys.modules:
        return  # stopped before torch was imported: nothing to take down
    import torch.distributed as td

    if not (td.is_available() and td.is_initialized()):
        return
    if barrier:
        td.barrier()
    comm = sys.modules.get("deepspeed.comm.comm")
    cdb = getattr(comm, "cdb", None)
    if comm is not None and cdb is not None and cdb.is_initialized():
        comm.destroy_process_group()  # also releases DeepSpeed's references to its groups
        setattr(comm, "cdb", None)  # noqa: B010 - DeepSpeed's module global: it started nothing now
    if td.is_initialized():
        td.destroy_process_group()


def finish(code: int) -> NoReturn:
    """Flush what the task printed and logged, then end the process with `code`, skipping the teardown."""
    import logging

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream: nothing left to flush there
    logging.shutdown()
    os._exit(code)
