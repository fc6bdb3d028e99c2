"""Time to load the orchestrator view from the running local cluster.

    export SLURM_CONF=$(contrib/devcluster/devcluster up | cut -d= -f2)
    python benchmarks/cluster_view.py [--repeat 30] [--json OUT]

Goal (issue #3): under 0.3 s per view on the local cluster.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.slurm.cli import SlurmCliBackend  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name, factory in (
        ("cli-json", lambda: SlurmCliBackend()),
        ("cli-text", lambda: SlurmCliBackend(force_text=True)),
    ):
        times = []
        for _ in range(args.repeat):
            backend = factory()  # fresh: includes the version probe, as each command invocation does
            t0 = time.perf_counter()
            view = backend.load()
            times.append(time.perf_counter() - t0)
        results[name] = {
            "median_s": statistics.median(times),
            "max_s": max(times),
            "nodes": len(view.nodes),
            "jobs": len(view.jobs),
        }
    print(f"{'backend':10} {'median s':>9} {'max s':>7} {'nodes':>6} {'jobs':>5}")
    for name, r in results.items():
        print(f"{name:10} {r['median_s']:9.4f} {r['max_s']:7.4f} {r['nodes']:6} {r['jobs']:5}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
