"""The tiny job through a container runtime on the local Slurm cluster. Debian 12 ships neither apptainer nor
singularity-container (`apt-cache policy` has no candidate), so a stand-in `apptainer` (tests/payloads/apptainer)
is on PATH: it records each argv and runs the command after the image on the host. The test checks the exact
invocations job.sbatch made (the rendezvous port on the batch node, then one per task) and that the job
COMPLETES, trained. Pyxis is a SPANK plugin of srun and has no stand-in: its rendered line and checks are
tests/test_render_containers.py's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from .helpers import EXAMPLES, ROOT, fsbatch_json, wait_done

pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
STANDIN = ROOT / "tests" / "payloads" / "apptainer"


@pytest.fixture(autouse=True)
def built_ops_cache(monkeypatch):
    """live_jobs_dir points XDG_CACHE_HOME at the test's directory, where torch would build DeepSpeed's
    shared-memory op again (minutes on a loaded machine): keep the user's build cache, which the job inherits."""
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))


def test_tiny_job_completes_in_apptainer(live_jobs_dir, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")  # sbatch hands PATH to the job
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FRENZY_STANDIN_LOG", str(calls))
    image = tmp_path / "frenzy-train.sif"
    image.write_bytes(b"stand-in image")
    out = fsbatch_json(
        str(EXAMPLES / "tiny-apptainer.yaml"),
        "--site",
        str(CPU_SITE),
        "--set",
        f"entry.environment.container.image={image}",
        "--set",
        f"entry.environment.container.python={sys.executable}",  # the image's Python: this venv's, via the stand-in
    )
    job_dir = Path(out["job_dir"])
    done = wait_done(out["job_id"], timeout=600)
    log = (job_dir / f"slurm-{out['job_id']}.out").read_text()
    assert done["state"] == "COMPLETED", log[-3000:]
    assert json.loads((job_dir / "finished.json").read_text())["exit_code"] == 0
    metrics = json.loads((job_dir / "metrics.json").read_text())
    assert metrics["step"] == metrics["total_steps"] == 6 and metrics["loss"][-1][1] < metrics["loss"][0][1]
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    jd = str(job_dir)
    check, port, *tasks = seen
    assert check[:5] == ["exec", str(image), sys.executable, "-P", "-c"]  # fsbatch asked the image's Python
    assert port == ["exec", "--bind", jd, "--pwd", jd, str(image), sys.executable, "-P", "-m",
                    "frenzy_slurm.runtime.dist", "free-port"]  # fmt: skip
    gpus = sum(c["nodes"] * c["gpus_per_node"] for c in out["decision"]["chosen"]["components"])
    task = ["exec", "--nv", "--bind", jd, "--pwd", jd, str(image), sys.executable, "-P", "-m", "frenzy_slurm.runtime",
            "--job-dir", jd]  # fmt: skip
    assert tasks == [task] * gpus


def test_readme_container_line_runs_as_written(live_jobs_dir, monkeypatch):
    """README's quick-start container line, exactly as written, from the checkout's root, on the dev cluster: the
    plan's srun line runs the tasks in the image (apptainer is not installed here: a note, not a refusal)."""
    import shlex
    import subprocess

    (line,) = [
        ln.split("#")[0].strip()
        for ln in (ROOT / "README.md").read_text().splitlines()
        if ln.strip().startswith("fsbatch examples/tiny-apptainer.yaml")
    ]
    argv = shlex.split(line)
    fsbatch = Path(sys.executable).with_name("fsbatch")
    res = subprocess.run([str(fsbatch), *argv[1:]], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert res.returncode == 0, res.stderr
    srun = [ln for ln in res.stdout.splitlines() if ln.startswith("srun ")]
    assert len(srun) == 1 and " apptainer exec --nv --bind " in srun[0]
    assert srun[0].endswith(
        " /scratch/images/frenzy-train.sif python3 -P -m frenzy_slurm.runtime --job-dir " + shlex.split(srun[0])[-1]
    )
