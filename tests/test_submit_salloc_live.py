"""`frenzy-slurm salloc` on the local Slurm cluster: the allocation has the planned shape (partition, tasks,
GPUs per node), and the job directory's launcher trains the planned job inside it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import EXAMPLES, ROOT

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
SHAPE = (
    'echo "shape $SLURM_PROCID $SLURM_JOB_PARTITION $SLURM_GPUS_ON_NODE ${CUDA_VISIBLE_DEVICES:-none} $SLURM_NTASKS"'
)


@pytest.fixture(autouse=True)
def built_ops_cache(monkeypatch):
    """live_jobs_dir points XDG_CACHE_HOME at the test's directory, where torch would build DeepSpeed's
    shared-memory op again (minutes on a loaded machine): keep the user's build cache, which the job inherits."""
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))


def salloc(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`frenzy-slurm salloc ARGS` in a fresh interpreter, stdin from /dev/null (salloc runs in the background)."""
    code = "import sys; from frenzy_slurm.cli.admin import main; sys.argv[0] = 'frenzy-slurm'; main()"
    return subprocess.run(
        [sys.executable, "-c", code, "salloc", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def planned_shape(spec: Path) -> dict[str, str]:
    """The first component's options in `--dry-run`'s salloc line."""
    res = salloc(str(spec), "--site", str(CPU_SITE), "--dry-run")
    assert res.returncode == 0, res.stderr
    argv = shlex.split(res.stdout)
    assert argv[0] == "salloc" and ":" not in argv, argv
    return dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)


def test_allocation_has_the_planned_shape(live_jobs_dir):
    shape = planned_shape(EXAMPLES / "tiny-cpu.yaml")
    res = salloc(str(EXAMPLES / "tiny-cpu.yaml"), "--site", str(CPU_SITE), "--", "srun", "bash", "-c", SHAPE)
    assert res.returncode == 0, res.stderr
    lines = sorted(ln.split()[1:] for ln in res.stdout.splitlines() if ln.startswith("shape "))
    tasks = int(shape["nodes"]) * int(shape["ntasks-per-node"])
    assert len(lines) == tasks, res.stdout
    gpus = shape["gres"].rsplit(":", 1)[1]
    for rank, (procid, partition, gpus_on_node, visible, ntasks) in enumerate(lines):
        assert (int(procid), partition, gpus_on_node, ntasks) == (rank, shape["partition"], gpus, str(tasks))
        assert len(visible.split(",")) == int(gpus), visible
    assert "in the allocation run the job with `bash " in res.stderr


def test_launcher_trains_inside_the_allocation(live_jobs_dir):
    pytest.importorskip("deepspeed", reason="training needs the train extra")
    res = salloc(
        str(EXAMPLES / "tiny-cpu.yaml"),
        "--site",
        str(CPU_SITE),
        "--",
        "bash",
        "-c",
        'bash "$FRENZY_JOB_DIR/job.sbatch"',
    )
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (job_dir,) = [p for p in live_jobs_dir.iterdir() if p.name.startswith("tiny-cpu-")]
    assert json.loads((job_dir / "finished.json").read_text())["exit_code"] == 0
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["step"] == metrics["total_steps"] == 6
    assert os.environ.get("SLURM_JOB_ID") is None  # the allocation was salloc's, released when its command ended
