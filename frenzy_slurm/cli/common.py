"""Shared CLI wiring: error reporting without tracebacks, exit codes, JSON output, table printing."""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any, Callable, TypeVar

import click

from frenzy_slurm.errors import FrenzyError

F = TypeVar("F", bound=Callable[..., Any])


def reports_errors(prog: str) -> Callable[[F], F]:
    """Turn FrenzyError into `prog: error: ...` on stderr and its exit code."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except FrenzyError as exc:
                for i, line in enumerate(exc.message.splitlines()):
                    click.echo(f"{prog}: error: {line}" if i == 0 else f"  {line}", err=True)
                sys.exit(exc.exit_code)
            except KeyboardInterrupt:
                click.echo(f"{prog}: interrupted", err=True)
                sys.exit(130)

        return inner  # type: ignore[return-value]

    return wrap


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _numeric(cell: str) -> bool:
    return cell.replace(".", "", 1).replace("%", "").replace("-", "", 1).isdigit()


def table(rows: list[list[str]], header: list[str]) -> str:
    """Text columns like sinfo's: numeric columns right-aligned, the rest left-aligned.

    tabulate does the layout; number parsing is off so values print exactly as the caller formatted them.
    """
    from tabulate import tabulate

    cols = list(zip(*rows)) if rows else [()] * len(header)
    align = ["right" if col and all(_numeric(str(c)) for c in col) else "left" for col in cols]
    text = tabulate([[str(c) for c in r] for r in rows], headers=header, tablefmt="plain", disable_numparse=True,
                    colalign=align)
    return "\n".join(line.rstrip() for line in text.splitlines())


existing_file = click.Path(exists=False, dir_okay=False, path_type=Path)


def backend_options(fn: F) -> F:
    """--backend/--snapshot: which Slurm backend a command talks to."""
    from frenzy_slurm.slurm import BACKENDS

    fn = click.option("--snapshot", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      help="ClusterView JSON for --backend static (as written by `fsinfo --json`).")(fn)
    fn = click.option("--backend", type=click.Choice(list(BACKENDS)), default="auto",
                      show_default=True, help="How to reach Slurm: pyslurm if it matches Slurm, else the CLI tools.")(fn)
    return fn


def cluster_options(fn: F) -> F:
    """--backend/--snapshot/--site, shared by every command that plans against the cluster."""
    fn = click.option("--site", type=click.Path(dir_okay=False, path_type=Path), default=None,
                      help="Site file describing partitions' GPUs (default: $FRENZY_SITE, /etc/frenzy-slurm/site.yaml).")(fn)
    return backend_options(fn)
