"""Shared CLI wiring: error reporting without tracebacks, exit codes, JSON output, table printing."""

from __future__ import annotations

import errno
import functools
import json
import os
import sys
import unicodedata
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click

from frenzy_slurm.core.errors import EXIT_FAILURE, FrenzyError

F = TypeVar("F", bound=Callable[..., Any])


# What to do when a file cannot be written, by errno (the rest get the system's own words).
_OS_FIXES = {
    errno.ENOSPC: "the file system is full: free space there (or point FRENZY_JOBS_DIR / --job-dir elsewhere) "
    "and run the command again",
    errno.EDQUOT: "your disk quota is exceeded there: free space (`quota -s` shows it) or use another directory, "
    "and run the command again",
    errno.EROFS: "that file system is mounted read-only: use a writable directory (FRENZY_JOBS_DIR, --job-dir, "
    "XDG_CACHE_HOME) and run the command again",
    errno.EACCES: "permission denied: check the owner and mode of the file and the directories above it",
}


def os_error_message(exc: OSError) -> str:
    """An OSError as one line: the file, the system's words, and the fix where there is a usual one."""
    where = f" {exc.filename}" if exc.filename else ""
    fix = _OS_FIXES.get(exc.errno or 0)
    return f"cannot read or write{where}: {exc.strerror or exc}" + (f"; {fix}." if fix else ".")


def safe_output() -> None:
    """Printing never fails on text another user put in Slurm (a job name with U+FFFD or odd characters):
    characters the terminal's encoding lacks are replaced instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass  # a closed or detached stream


def json_error(exit_code: int, message: str) -> None:
    """The error of a `--json` run as one JSON object on stdout, so a script reading stdout sees why it failed."""
    click.echo(json.dumps({"error": {"exit_code": exit_code, "message": message}}))


def reports_errors(prog: str, *, json_errors: bool = False) -> Callable[[F], F]:
    """Turn FrenzyError into `prog: error: ...` on stderr and its exit code; an OSError (disk full, quota,
    read-only file system) into one message and exit 1, never a traceback.

    With json_errors, a run given `--json` (the command's `as_json` parameter) also prints the error as
    `{"error": {"exit_code": N, "message": "..."}}` on stdout, with the same exit code."""

    def wrap(fn: F) -> F:
        @functools.wraps(fn)
        def inner(*args: Any, **kwargs: Any) -> Any:
            safe_output()
            as_json = json_errors and bool(kwargs.get("as_json"))
            try:
                return fn(*args, **kwargs)
            except FrenzyError as exc:
                for i, line in enumerate(exc.message.split("\n")):  # a \r inside a line is escaped, not a break
                    echo(f"{prog}: error: {line}" if i == 0 else f"  {line}", err=True)
                if as_json:
                    json_error(exc.exit_code, exc.message)
                sys.exit(exc.exit_code)
            except KeyboardInterrupt:
                click.echo(f"{prog}: interrupted", err=True)
                sys.exit(130)
            except BrokenPipeError:  # `fsqueue | head`: the reader left; the command class ends it quietly
                raise
            except OSError as exc:
                echo(f"{prog}: error: {os_error_message(exc)}", err=True)
                if as_json:
                    json_error(EXIT_FAILURE, os_error_message(exc))
                sys.exit(EXIT_FAILURE)

        return inner  # type: ignore[return-value]  # wraps fn: same signature, as functools.wraps says

    return wrap


def _silence(stream: Any) -> None:
    """Point a stream's file descriptor at /dev/null, so that what is still buffered (and the flush at interpreter
    exit) goes nowhere instead of failing again: the recipe of the Python docs' "Note on SIGPIPE"."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a real file (click's test runner): nothing to redirect
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _flush_or_silence() -> None:
    """Flush stdout and stderr now, while a closed pipe can still be handled: at interpreter exit Python would
    print "Exception ignored ... BrokenPipeError" and exit 120."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            _silence(stream)
        except (AttributeError, OSError, ValueError):  # a closed or detached stream
            pass


@contextmanager
def _closed_pipe_ends_quietly() -> Iterator[None]:
    """`fsbatch ... | head -n 1`: when the reader of our output closes the pipe, the command ends at once, says
    nothing and exits 0, as `cat` or `grep` do for the shell (`set -o pipefail` scripts depend on it); a command
    that was already exiting with its own code (a failure) keeps it."""
    try:
        try:
            yield
        finally:
            _flush_or_silence()
    except BrokenPipeError:
        _silence(sys.stdout)
        _flush_or_silence()
        raise click.exceptions.Exit(0) from None


class QuietPipeCommand(click.Command):
    """Every frenzy-slurm console command's class (`@click.command(cls=QuietPipeCommand)`): a closed output pipe
    ends the command quietly with exit 0 (`_closed_pipe_ends_quietly`), in --help as in the command itself. Click's
    own handler would exit 1."""

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        with _closed_pipe_ends_quietly():  # --help and --version print while the arguments are parsed
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx: click.Context) -> Any:
        with _closed_pipe_ends_quietly():
            return super().invoke(ctx)


class QuietPipeGroup(QuietPipeCommand, click.Group):
    """QuietPipeCommand for a command group (`frenzy-slurm`): its subcommands run inside the group's invoke."""


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def _numeric(cell: str) -> bool:
    return cell.replace(".", "", 1).replace("%", "").replace("-", "", 1).isdigit()


_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    """One non-printable character as Python writes it in a string: `\\x1b`, `\\r`, `\\u200e`; a byte that
    was not UTF-8 (a file name read with surrogateescape, U+DC80..U+DCFF) as the byte, `\\xff`."""
    code = ord(c)
    if c in _ESCAPES:
        return _ESCAPES[c]
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str, keep: str = "") -> str:
    """Text as the terminal should see it: every character that is not printable (a control character such as
    ESC, `\\r` or BEL, a format character, a byte that was not UTF-8) escaped as Python writes it (`\\x1b`),
    so another user's job name, comment or path, or Slurm's answer, cannot move the cursor, rewrite a line or
    drive the terminal. Printable UTF-8 (and spaces) stays as it is; `keep` lists characters left as they are
    (a tab in a line). A table cell keeps none: it stays one line."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep or unicodedata.category(c) == "Zs" else _escaped(c) for c in text)


def echo(text: str = "", *, err: bool = False, nl: bool = True) -> None:
    """click.echo for text that may hold what others wrote (Slurm's answers, job names, paths, records, error
    messages): each line through `printable` (tabs kept), the line breaks kept. JSON is printed by
    `print_json`, whose output json.dumps escapes itself."""
    click.echo("\n".join(printable(line, keep="\t") for line in text.split("\n")), err=err, nl=nl)


def table(rows: list[list[str]], header: list[str]) -> str:
    """Text columns like sinfo's: numeric columns right-aligned, the rest left-aligned.

    The layout is tabulate's "plain" format (which this replaced, for start-up time: the same text, see
    tests/test_cli_latency.py): each cell stripped of surrounding spaces, a column as wide as its widest
    cell or its header plus 2, columns two spaces apart, a short row filled with empty cells. Values print
    exactly as the caller formatted them. Cells pass through `printable`.
    """
    cells = [[printable(str(c)).strip() for c in r] for r in rows]
    cols = list(zip(*cells, strict=False)) if cells else [()] * len(header)  # a short row ends the columns read
    ncols = max(map(len, cells)) if cells else len(header)
    right = [bool(col) and all(_numeric(c) for c in col) for col in cols][:ncols]
    right += [False] * (ncols - len(right))
    header = ([""] * (ncols - len(header)) + header)[:ncols]  # as tabulate: headers fill from the right
    cells = [r + [""] * (ncols - len(r)) for r in cells]
    widths = [max([len(h) + 2] + [len(r[i]) for r in cells]) for i, h in enumerate(header)]

    def line(row: list[str]) -> str:
        return "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right, strict=True))

    return "\n".join(line(row).rstrip() for row in [header, *cells]).rstrip("\n")


# A file argument click does not check (it may or may not exist): every user is a model.yaml, and the project's own
# reader (yamlfile.load_model_file) refuses a missing or unreadable one with a message naming the file, exit 2.
unchecked_file = click.Path(exists=False, dir_okay=False, path_type=Path)


def backend_options(fn: F) -> F:
    """--backend/--snapshot: which Slurm backend a command talks to."""
    from frenzy_slurm.slurm import BACKENDS

    fn = click.option(
        "--snapshot",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="ClusterView JSON for --backend static (as written by `fsinfo --json`).",
    )(fn)
    fn = click.option(
        "--backend",
        type=click.Choice(list(BACKENDS)),
        default="auto",
        show_default=True,
        help="How to reach Slurm: pyslurm if it matches Slurm, else the CLI tools.",
    )(fn)
    return fn


def cluster_options(fn: F) -> F:
    """--backend/--snapshot/--site, shared by every command that plans against the cluster."""
    fn = click.option(
        "--site",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help="Site file describing partitions' GPUs (default: $FRENZY_SITE, /etc/frenzy-slurm/site.yaml).",
    )(fn)
    return backend_options(fn)
