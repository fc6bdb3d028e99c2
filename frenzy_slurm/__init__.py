"""frenzy-slurm: memory-aware, heterogeneity-aware LLM training on Slurm.

Pipeline, in data-flow order: spec -> marp -> cluster -> has -> render -> submit -> track.

The Python API (`frenzy_slurm.api`, docs/python-api.md) is reachable from here and imported on first use,
so `import frenzy_slurm` stays cheap (no planning stages, never torch):

    import frenzy_slurm as fs
    job = fs.submit(fs.plan("model.yaml"))
    job.wait()
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.version import __version__

# name -> the module that defines it; loaded by __getattr__ on first access
_API = ("Job", "Metrics", "Plan", "WaitTimeout", "job", "plan", "submit", "sweep", "wait_all")

if TYPE_CHECKING:
    from frenzy_slurm.api import Job, Metrics, Plan, WaitTimeout, job, plan, submit, sweep, wait_all

__all__ = ["Job", "Metrics", "Plan", "WaitTimeout", "__version__", "job", "plan", "submit", "sweep", "wait_all"]


def __getattr__(name: str) -> Any:
    if name in _API:
        # the API on first use: `import frenzy_slurm` stays cheap (no planning stages, never torch)
        from frenzy_slurm import api

        return getattr(api, name)
    raise AttributeError(f"module 'frenzy_slurm' has no attribute {name!r}")
