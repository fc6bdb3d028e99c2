"""How the runtime starts its own Python children (the universal-checkpoint converter, the NVML sampler).

Each runs frenzy-slurm's or DeepSpeed's module, never one found where the job runs: `python -P -m ...` keeps the
working directory (the job directory, `#SBATCH --chdir`) off sys.path, the child starts in "/", and PYTHONPATH
loses its empty and relative entries, which -P leaves in place ('' means the working directory). A user's own
script is exec'd as given and is not concerned.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def safe_pythonpath(value: str | None) -> str | None:
    """PYTHONPATH without its empty and relative entries; None when nothing is left."""
    kept = [p for p in (value or "").split(os.pathsep) if p and os.path.isabs(p)]
    return os.pathsep.join(kept) or None


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child: this one, with PYTHONPATH made safe as above."""
    out = dict(os.environ if env is None else env)
    path = safe_pythonpath(out.pop("PYTHONPATH", None))
    if path is not None:
        out["PYTHONPATH"] = path
    return out
