"""Converting a measurements CSV into case files (eval/cases.py): one model.yaml-with-measurement per row it can
read, and `unreadable.yaml` listing every other row with the reason, so the benchmark counts it as a failure.

    python -m frenzy_slurm.eval.convert ../shared/data/memory_measurements_dev.csv OUTDIR

Exit codes: 0 written (unreadable rows included), 2 the CSV cannot be read or OUTDIR cannot be written.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from frenzy_slurm.core.records import write_atomic
from frenzy_slurm.eval.cases import UNREADABLE, Unreadable, UnreadableList
from frenzy_slurm.eval.dataset import MeasuredRow, RowError, read_measurements, to_case


def _unreadable(row: MeasuredRow, reason: str) -> Unreadable:
    cat = row.category.lower()
    conf = row.confidence.split()[0] if row.confidence.split() else ""
    return Unreadable(
        case=row.row_id,
        reason=reason,
        method="qlora" if "qlora" in cat else ("lora" if "lora" in cat else "full"),
        confidence=conf if conf in ("high", "medium", "low") else "low",  # type: ignore[arg-type]  # checked
        category=row.category,
        value_gib=row.measured_gib if row.measured_gib == row.measured_gib else None,  # NaN: not a number
    )


def convert(csv_path: Path, out: Path) -> tuple[int, list[Unreadable]]:
    """Write OUT/<row_id>.yaml for each row that reads as a model.yaml, and OUT/unreadable.yaml for the rest;
    returns (cases written, unreadable rows). ValueError/OSError when the CSV cannot be read."""
    rows = read_measurements(csv_path)
    out.mkdir(parents=True, exist_ok=True)
    written, failed = 0, []
    for row in rows:
        try:
            data = to_case(row)
        except RowError as exc:
            failed.append(_unreadable(row, str(exc)))
            continue
        name = "".join(c if c.isalnum() or c in "._-" else "-" for c in row.row_id) or "row"
        write_atomic(
            out / f"{name}.yaml",
            f"# {row.row_id} of {csv_path.name}, written by python -m frenzy_slurm.eval.convert\n"
            + yaml.safe_dump(data, sort_keys=False),
            mode=0o644,
        )
        written += 1
    doc = UnreadableList(unreadable=failed).model_dump(mode="json", exclude_none=True)
    write_atomic(out / UNREADABLE, yaml.safe_dump(doc, sort_keys=False), mode=0o644)
    return written, failed


@click.command()
@click.argument("csv_path", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("out", type=click.Path(file_okay=False, path_type=Path))
def main(csv_path: Path, out: Path) -> None:
    """Write the case files of CSV_PATH's rows into OUT (one per row; unreadable rows in OUT/unreadable.yaml)."""
    try:
        written, failed = convert(csv_path, out)
    except (OSError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(f"{written} case files and {len(failed)} unreadable rows written to {out}")


if __name__ == "__main__":
    main()
