"""Wall time of the everyday commands, interpreter start-up included, as ratios measured in the same run.

    python benchmarks/fsbatch_latency.py [--repeat 10] [--live] [--json OUT]    # fsbatch --dry-run per example
    python benchmarks/fsbatch_latency.py --listing [--repeat 20] [--json OUT]   # fsqueue/fsinfo vs squeue/sinfo
    python benchmarks/fsbatch_latency.py --readme-only --baseline ../main        # and another checkout's, in turn

Default: `fsbatch --dry-run` of every example against a static snapshot of the dev cluster's shape (no Slurm
needed), and of the README's offline example, each beside a bare `python -c pass` of the same interpreter
(goal, issue #28: the offline example within 0.3 s on a quiet machine). --live: the examples against the
running local cluster (SLURM_CONF must point at it). --listing: the plain `fsqueue` and `fsinfo` beside
`squeue` and `sinfo` on the live cluster (goal: fsqueue within 5x of squeue). The commands take turns, so a
busy machine slows them alike; each figure is the median of --repeat runs after one warm-up run each (which
also writes the bytecode caches a real installation has: PYTHONDONTWRITEBYTECODE is dropped). --baseline DIR
runs each frenzy-slurm command a second time with DIR (another checkout) first on PYTHONPATH, in the same turns:
before and after a change, measured alike. --readme-only: only the README's offline example.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from frenzy_slurm.sim.synthetic import synthetic  # noqa: E402

LOCAL = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]
BIN = Path(sys.executable).parent
# the README's offline example (README.md, "Quick start"), exactly as written there
README_OFFLINE = [
    "examples/llama2-7b.yaml",
    "--dry-run",
    "--backend",
    "static",
    "--snapshot",
    "examples/offline/cluster.json",
    "--site",
    "site_configs/devcluster.yaml",
]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def timed(
    commands: dict[str, list[str]], repeat: int, caches: Path | None = None, baseline: Path | None = None
) -> dict[str, list[float]]:
    """Each command `repeat` times, taking turns (one warm-up run each first); its wall times. With `caches`,
    each run gets an empty XDG_CACHE_HOME under it: fsqueue's queue cache never answers, Slurm always does. A
    command that fails (other than fsbatch's 3, fits nowhere) stops the benchmark with its stderr."""
    runs = [(k, argv, {}) for k, argv in commands.items()]
    if baseline is not None:  # the frenzy-slurm commands again, importing the other checkout's package
        runs += [(f"{k} @baseline", argv, {"PYTHONPATH": str(baseline)}) for k, argv in commands.items() if _ours(argv)]
    times: dict[str, list[float]] = {k: [] for k, _, _ in runs}
    for warm in [True] + [False] * repeat:
        for key, argv, extra in runs:
            env = _env() | extra | ({"XDG_CACHE_HOME": tempfile.mkdtemp(dir=caches)} if caches else {})
            t0 = time.perf_counter()
            res = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env)
            took = time.perf_counter() - t0
            if res.returncode not in (0, 3):
                sys.exit(f"{' '.join(argv)}: exit {res.returncode}\n{res.stderr}")
            if not warm:
                times[key].append(took)
    return times


def _ours(argv: list[str]) -> bool:
    return Path(argv[0]).parent == BIN and Path(argv[0]).name in ("fsbatch", "fsqueue", "fsinfo")


def report(times: dict[str, list[float]], ratios: dict[str, str]) -> dict[str, dict[str, float]]:
    out = {}
    print(f"{'command':36} {'median s':>9} {'max s':>7} {'ratio':>16}")
    for key, ts in times.items():
        med = statistics.median(ts)
        out[key] = {"median_s": med, "max_s": max(ts)}
        ratio = ""
        if key in ratios:
            out[key]["ratio"] = med / statistics.median(times[ratios[key]])
            ratio = f"{out[key]['ratio']:.1f}x {ratios[key]}"
        print(f"{key:36} {med:9.3f} {max(ts):7.3f} {ratio:>16}")
    return out


def dry_runs(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    site = ROOT / "site_configs" / "devcluster.yaml"
    with tempfile.TemporaryDirectory() as tmp:
        snap = Path(tmp) / "snap.json"
        view = synthetic(LOCAL)
        # the dev cluster's GRES names, so the shipped site file matches
        view = view.model_copy(
            update={"nodes": [n.model_copy(update={"gpu_type": n.partitions[0]}) for n in view.nodes]}
        )
        snap.write_text(view.model_dump_json())
        backend = [] if args.live else ["--backend", "static", "--snapshot", str(snap)]
        commands = {"python -c pass": [sys.executable, "-c", "pass"]}
        commands["README offline example"] = [str(BIN / "fsbatch"), *README_OFFLINE]
        for example in [] if args.readme_only else sorted((ROOT / "examples").glob("*.yaml")):
            commands[example.stem] = [str(BIN / "fsbatch"), str(example), "--dry-run", "--site", str(site), *backend]
        times = timed(commands, args.repeat, baseline=args.baseline)
    return report(times, {k: "python -c pass" for k in times if k != "python -c pass"})


def listings(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    if not os.environ.get("SLURM_CONF"):
        sys.exit("--listing needs the live cluster: export SLURM_CONF (contrib/devcluster/devcluster up prints it)")
    commands = {
        "squeue": ["squeue"],
        "fsqueue": [str(BIN / "fsqueue")],
        "sinfo": ["sinfo"],
        "fsinfo": [str(BIN / "fsinfo")],
        "python -c pass": [sys.executable, "-c", "pass"],
    }
    with tempfile.TemporaryDirectory() as caches:
        times = timed(commands, args.repeat, Path(caches), args.baseline)
    ratios = {k: "squeue" if k.startswith("fsqueue") else "sinfo" for k in times if k.startswith(("fsqueue", "fsinfo"))}
    return report(times, ratios | {"squeue": "python -c pass"})


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--listing", action="store_true")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--baseline", type=Path, help="another checkout, measured in the same turns")
    ap.add_argument("--readme-only", action="store_true")
    args = ap.parse_args()
    results = listings(args) if args.listing else dry_runs(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
