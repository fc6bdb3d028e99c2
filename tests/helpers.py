"""Helpers shared by the test modules (fixtures live in conftest.py and slurm_fixture.py).

Test modules import from here, never from each other.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DEV_DATA = ROOT.parent / "shared" / "data" / "memory_measurements_dev.csv"

# The cluster shape of the local dev cluster, as synthetic pools: (partition, catalog GPU, nodes, GPUs/node)
LOCAL = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]

# Strings a hostile user might pass; none may ever be executed by a shell
HOSTILE = [
    "$(touch pwned-subst)",
    "`touch pwned-tick`",
    "a; touch pwned-semi",
    "two\nlines",
    'it\'s "quoted"',
    "$HOME",
    "*",
    "--",
    "-rf /",
]


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/NAME.py as a module (the benchmarks are scripts, not a package), registered in sys.modules under
    NAME so that its dataclasses and pickling resolve."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


DEV_SITE = ROOT / "site_configs" / "devcluster.yaml"  # the local dev cluster's site file
PAYLOAD = ROOT / "tests" / "payloads" / "record.py"  # a trivial `trainer: script` that records what it was given


def payload_spec_file(directory: Path, name: str = "rec", **training) -> Path:
    """A model.yaml (gpt2, 2 steps) whose job runs the recording payload instead of training; `training` overrides."""
    import yaml

    data = {
        "name": name,
        "model": {"preset": "gpt2"},
        "training": {"seq_len": 128, "global_batch": 8, "steps": 2, "precision": "fp32", **training},
        "entry": {"trainer": "script", "script": str(PAYLOAD)},
    }
    p = directory / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def deepspeed_rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    """The environment of one of `world` DeepSpeed ranks on this host (CPU, gloo, shm as its launcher sets)."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_SIZE": str(world),
        "DS_ACCELERATOR": "cpu",
    }


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run `python -m frenzy_slurm.cli <prog> ...` in a fresh interpreter (exit codes and stderr as users see them)."""
    prog, *rest = args
    module = {"fsbatch": "fsbatch", "fsqueue": "fsqueue", "fsinfo": "fsinfo", "frenzy-slurm": "admin"}[prog]
    code = f"import sys; from frenzy_slurm.cli.{module} import main; sys.argv[0] = {prog!r}; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *rest], capture_output=True, text=True, cwd=cwd or ROOT, timeout=300
    )


def make_spec(**over):
    """A small gpt2-medium JobSpec; `section__field=value` or `section={...}` override parts of it."""
    from frenzy_slurm.jobspec import JobSpec

    base = {
        "name": "t",
        "model": {"preset": "gpt2-medium"},
        "training": {"seq_len": 1024, "global_batch": 64, "steps": 100, "precision": "bf16-mixed"},
    }
    for key, value in over.items():
        section, _, field = key.partition("__")
        if field:
            base.setdefault(section, {})[field] = value
        else:
            base[section] = value
    return JobSpec.model_validate(base)


def plan(spec, view, site=None, backend=None, time=None):
    """HAS's decision for `spec` on `view` (the site defaults to the LOCAL shape): plan_job's decision step."""
    from frenzy_slurm.has import Requirements
    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
    from frenzy_slurm.planning import decide_job
    from frenzy_slurm.sim.synthetic import synthetic_site

    model = resolve_model(spec, ".")
    return decide_job(
        Requirements.from_spec(spec, time=time),
        workload_from_spec(spec, model),
        search_space_from_spec(spec),
        view,
        site or synthetic_site(LOCAL),
        backend,
        view.taken_at,
    )


def snapshot(view):
    """`--backend static` serving `view` from memory (HAS asks a snapshot for no start estimates)."""
    from frenzy_slurm.slurm.static import StaticBackend

    backend = StaticBackend(Path("<memory>"))
    backend._view = view
    return backend


def planned(
    spec, view, job_dir=None, site=None, options=None, spec_path=Path("/home/u/model.yaml"), model=None, **plan_options
):
    """planning.plan_job's request for `spec` on `view` (the site defaults to the LOCAL shape, without a file;
    the decision's "now" is the view's time); `plan_options` are further PlanOptions fields (force, templates)."""
    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import JobFile, PlanOptions, SiteFile, plan_job
    from frenzy_slurm.sim.synthetic import synthetic_site

    if not isinstance(site, SiteFile):
        site = SiteFile(site or synthetic_site(LOCAL))
    job = JobFile(spec_path, spec, model or resolve_model(spec, "."))
    opts = PlanOptions(slurm=options or SlurmOptions(), job_dir=job_dir, now=view.taken_at, **plan_options)
    return plan_job(job, site, snapshot(view), opts)


def fill(view, partition: str, keep_free: dict[str, int] | None = None, minutes: int = 60):
    """Hold every GPU of a partition (except keep_free[node]) with a running job ending in `minutes`."""
    from frenzy_slurm.slurm.view import Job

    keep_free = keep_free or {}
    jobs = list(view.jobs)
    nodes = []
    for n in view.nodes:
        if partition in n.partitions:
            used = n.gpus_total - keep_free.get(n.name, 0)
            n = n.model_copy(update={"gpus_used": used, "state": "mixed" if used else "idle"})
            jobs.append(
                Job(
                    job_id=1000 + len(jobs),
                    state="RUNNING",
                    partition=partition,
                    nodes=[n.name],
                    node_count=1,
                    gpu_type=n.gpu_type,
                    gpus_per_node=used,
                    start_time=int(view.taken_at - 60),
                    end_time=int(view.taken_at + minutes * 60),
                )
            )
        nodes.append(n)
    return view.model_copy(update={"nodes": nodes, "jobs": jobs})


def fsbatch_json(*args: str) -> dict:
    """fsbatch ARGS --json, which must succeed."""
    res = run_cli("fsbatch", *args, "--json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def wait_done(job_id: int, timeout: float = 90) -> dict:
    """fsqueue JOBID --json once the job has ended."""
    from .slurm_fixture import wait_for

    def done():
        r = run_cli("fsqueue", str(job_id), "--json")
        if r.returncode == 0:
            data = json.loads(r.stdout)
            if data["state"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
                return data
        return None

    return wait_for(done, timeout=timeout, interval=1.0, what=f"job {job_id} to finish")
