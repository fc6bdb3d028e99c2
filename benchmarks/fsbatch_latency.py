"""`fsbatch --dry-run` wall time on the examples, interpreter start-up included.

    python benchmarks/fsbatch_latency.py [--repeat 10] [--live] [--json OUT]

Default: against a static snapshot of the dev cluster's shape (no Slurm needed). --live: against the
running local cluster (SLURM_CONF must point at it). Goal (issue #4): under 1 s.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--live", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    fsbatch = Path(sys.executable).parent / "fsbatch"
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
        results = {}
        print(f"{'example':24} {'median s':>9} {'max s':>7}")
        for example in sorted((ROOT / "examples").glob("*.yaml")):
            times = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                res = subprocess.run(
                    [str(fsbatch), str(example), "--dry-run", "--site", str(site), *backend],
                    capture_output=True,
                    text=True,
                )
                times.append(time.perf_counter() - t0)
                if res.returncode not in (0, 3):
                    print(res.stderr, file=sys.stderr)
                    return 1
            results[example.stem] = {"median_s": statistics.median(times), "max_s": max(times)}
            print(f"{example.stem:24} {statistics.median(times):9.3f} {max(times):7.3f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
