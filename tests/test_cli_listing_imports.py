"""What the plain `fsqueue` and `fsinfo` listings import (start-up time is most of their wall time, see
benchmarks/fsbatch_latency.py --listing): no planning stage, no site-file models where there is no site file,
no jinja2, PyYAML's templates or torch, and no table library; importing `fsqueue`'s entry point builds no
pydantic model. The table they print is laid out as tabulate's "plain" format did."""

from __future__ import annotations

import getpass
import json
import random
import subprocess
import sys

import pytest

from frenzy_slurm.cli.common import table
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, ROOT

# never imported by a plain listing (fsinfo without a site file, fsqueue without a job id)
HEAVY = (
    "torch",
    "deepspeed",
    "jinja2",
    "tabulate",
    "frenzy_slurm.jobspec",
    "frenzy_slurm.marp",
    "frenzy_slurm.has",
    "frenzy_slurm.render",
    "frenzy_slurm.planning",
    "frenzy_slurm.site.config",
    "frenzy_slurm.api",
)


def imported_by(code: str, tmp_path, *argv: str, path: str = "/usr/bin:/bin") -> tuple[list[str], str]:
    """Run `code` (which imports and runs an entry point) in a fresh interpreter; the top-level packages and
    frenzy_slurm modules it imported, and its stdout."""
    code += (
        "\nimport json, sys\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} | "
        "{m for m in sys.modules if m.startswith('frenzy_slurm')})))"
    )
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": path, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    res = subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )
    assert res.returncode == 0, res.stderr
    *out, modules = res.stdout.splitlines()
    return json.loads(modules), "\n".join(out)


def run_main(module: str) -> str:
    return f"from frenzy_slurm.cli.{module} import main\ntry:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]


def test_importing_fsqueue_builds_no_pydantic_model(tmp_path):
    modules, _ = imported_by("from frenzy_slurm.cli.fsqueue import main", tmp_path)
    assert "pydantic" not in modules and "frenzy_slurm.slurm.view" not in modules
    assert heavy(modules) == []


def test_the_plain_fsqueue_listing_imports_nothing_heavy(tmp_path):
    """The listing against a stand-in `squeue` (an empty JSON queue) and `sinfo --version`, as Slurm answers."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool, body in {"sinfo": "echo 'slurm 22.05.8'", "squeue": "echo '{\"jobs\": []}'"}.items():
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    modules, out = imported_by(run_main("fsqueue"), tmp_path, "--backend", "cli", path=f"{bindir}:/usr/bin:/bin")
    assert out.split() == ["JOBID", "NAME", "STATE", "GPUS", "ELAPSED", "REMAINING(pred)", "JOBDIR"]
    assert heavy(modules) == [] and "yaml" not in modules


SQUEUE_ONE_JOB = {
    "jobs": [
        {
            "job_id": 41,
            "job_state": "RUNNING",
            "name": "caf\u00e9",
            "user_name": getpass.getuser(),  # fsqueue asks for the caller's jobs
            "partition": "a100",
            "nodes": "a100-[1-2]",
            "node_count": 2,
            "tres_per_node": "gres:gpu:a100:4",
            "start_time": 1700000000,
            "time_limit": 60,
        }
    ]
}


def test_the_plain_fsqueue_listing_imports_no_pydantic(tmp_path):
    """Slurm's answer is read into the seam's `Job` records, and the queue cache written and read back, without
    pydantic (importing and building its validators was half of a listing's time): two listings in a row, the
    second from the cache, whose file holds the job as squeue listed it."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    answer = json.dumps(SQUEUE_ONE_JOB)
    for tool, body in {"sinfo": "echo 'slurm 22.05.8'", "squeue": f"cat <<'EOF'\n{answer}\nEOF"}.items():
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    twice = run_main("fsqueue") + run_main("fsqueue").replace("from frenzy_slurm.cli.fsqueue import main\n", "")
    modules, out = imported_by(twice, tmp_path, "--backend", "cli", path=f"{bindir}:/usr/bin:/bin")
    assert "pydantic" not in modules and "frenzy_slurm.slurm.view" not in modules
    assert out.split() == ["JOBID", "NAME", "STATE", "GPUS", "ELAPSED", "REMAINING(pred)", "JOBDIR"] * 2
    (cache,) = (tmp_path / "cache" / "frenzy-slurm").glob("jobs-*.json")
    (job,) = json.loads(cache.read_text())["jobs"]
    assert (job["job_id"], job["name"], job["nodes"], job["gpu_type"], job["gpus_per_node"]) == (
        41,
        "caf\u00e9",
        ["a100-1", "a100-2"],
        "a100",
        4,
    )


def test_fsinfo_without_a_site_file_imports_no_planning_stage(tmp_path):
    snap = tmp_path / "snap.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    modules, out = imported_by(run_main("fsinfo"), tmp_path, "--backend", "static", "--snapshot", str(snap))
    assert heavy(modules) == []
    rows = [line.split() for line in out.splitlines()[1:] if line and not line.startswith("~")]
    assert sorted(r[0] for r in rows) == ["a100", "t4", "v100"]
    assert {r[0]: r[4] for r in rows} == {"a100": "8/8/0", "v100": "16/16/0", "t4": "16/16/0"}


@pytest.mark.parametrize("seed", range(4))
def test_the_table_is_laid_out_as_tabulate_plain(seed):
    """The formatter that replaced tabulate prints what tabulate printed for the tables the commands make (one
    cell per header, a first column never empty): random cells, numeric and not, padded, escaped."""
    tabulate = pytest.importorskip("tabulate").tabulate
    rnd = random.Random(seed)
    words = ["", " ", "a", "bb", "12", "3.5", "-", "7%", "x y", " pad ", "-4", "1-2", "café", "\x1b[1m", "1.2.3", "\t"]
    for _ in range(500):
        header = [rnd.choice(["A", "JOBID", "PARTITION", "", "long header"]) for _ in range(rnd.randint(1, 6))]
        rows = [[rnd.choice(["1", "job"])] + [rnd.choice(words) for _ in header[1:]] for _ in range(rnd.randint(0, 5))]
        cells = [[printable_cell(c) for c in r] for r in rows]
        cols = list(zip(*cells, strict=True)) if cells else [()] * len(header)
        align = ["right" if col and all(_numeric(c) for c in col) else "left" for col in cols]
        text = tabulate(cells, headers=header, tablefmt="plain", disable_numparse=True, colalign=align)
        assert table(rows, header) == "\n".join(line.rstrip() for line in text.splitlines())


def printable_cell(c: str) -> str:
    from frenzy_slurm.cli.common import printable

    return printable(c)


def _numeric(cell: str) -> bool:
    return cell.replace(".", "", 1).replace("%", "").replace("-", "", 1).isdigit()
