"""What MARP predicts for measured FSDP1 rows with facts of their run that the rows do not state: the wrap's
broadcast from rank 0 (`sync_module_states=True`) and the peft release (adapters in the base's dtype before 0.12).
An experiment for docs/accuracy.md ("Why F03/F04 do not grow with tokens"), not a product path: the product
predicts each row as written (benchmarks/marp_accuracy.py).

    python benchmarks/fsdp1_unstated_facts.py --data ../shared/data/memory_measurements_dev2.csv F01 F02 F03 F04

Each row is converted as marp_accuracy.py converts it (its case file), predicted on its pinned plan as written,
then with the broadcast, then with the broadcast and `training.lora.peft_version` PEFT (default 0.10.0); each
column is reserved / allocated GiB at the measured world size.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.eval.cases import load_case  # noqa: E402
from frenzy_slurm.eval.convert import convert  # noqa: E402
from frenzy_slurm.jobspec import resolve_model  # noqa: E402
from frenzy_slurm.marp import predict_pinned  # noqa: E402
from frenzy_slurm.marp.memory import estimate_memory  # noqa: E402


def predict(path: Path, broadcast: bool | None) -> tuple[float, float]:
    """(reserved, allocated) GiB of the case at `path` on its pinned plan; with `broadcast` not None, the wrap's
    broadcast from rank 0 set to it (otherwise the framework's, as the product reads the file)."""
    case = load_case(path)
    world = case.measurement.world_size
    w, plan, _ = predict_pinned(case, resolve_model(case, path.parent), world, "reserved")
    if broadcast is not None:
        w = replace(w, comm=replace(w.comm, fsdp1_sync=broadcast))
    return estimate_memory(w, plan, "reserved").peak / GiB, estimate_memory(w, plan, "allocated").peak / GiB


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="measurements CSV")
    ap.add_argument("--peft", default="0.10.0", help="peft release of the third column")
    ap.add_argument("rows", nargs="+", help="row ids")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        convert(args.data, out)
        print("row  measured   as written     + broadcast    + broadcast, peft " + args.peft)
        for row in args.rows:
            path = out / f"{row}.yaml"
            data = yaml.safe_load(path.read_text())
            as_written = predict(path, None)
            broadcast = predict(path, True)
            data["training"].setdefault("lora", {})["peft_version"] = args.peft
            era = out / f"{row}-peft.yaml"
            era.write_text(yaml.safe_dump(data))
            old_peft = predict(era, True)
            cells = " ".join(f"{r:6.2f} / {a:5.2f}" for r, a in (as_written, broadcast, old_peft))
            print(f"{row:4s} {data['measurement']['value_gib']:8.2f}   {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
