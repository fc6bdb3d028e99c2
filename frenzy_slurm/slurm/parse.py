"""Parsers for the strings Slurm prints: GRES, host lists, times, and `sbatch --test-only` answers."""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterator
from contextlib import contextmanager

from frenzy_slurm.core.errors import EXIT_SLURM_UNEXPECTED, FrenzyError
from frenzy_slurm.slurm.timefmt import parse_slurm_time


class SlurmUnexpected(FrenzyError):
    """Slurm answered in a shape we do not understand."""

    exit_code = EXIT_SLURM_UNEXPECTED


# What reading a malformed answer raises: bad numbers and dates (ValueError, OverflowError), wrong JSON shapes
# (KeyError, TypeError, AttributeError, IndexError), JSON nested beyond Python's recursion limit (RecursionError)
# and pydantic's ValidationError (a ValueError).
_MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError, OverflowError, UnicodeError)


@contextmanager
def reading(what: str, version: str | None = None) -> Iterator[None]:
    """Turn any failure to read `what` (a Slurm answer) into SlurmUnexpected (exit 6): one message, no traceback."""
    try:
        yield
    except SlurmUnexpected as exc:
        if exc.message.startswith("unexpected Slurm output"):
            raise
        raise SlurmUnexpected(f"unexpected Slurm output from `{what}`: {exc.message}") from None
    except _MALFORMED as exc:
        detail = str(exc)
        detail = detail if len(detail) <= 300 else detail[:300] + "..."
        raise SlurmUnexpected(
            f"unexpected Slurm output: could not read Slurm's answer to `{what}` ({type(exc).__name__}: {detail}); "
            f"Slurm {version or '(version unknown)'}. Try --backend static, or report it with that command's "
            "output."
        ) from None


# \Z, not $: `$` also matches before a final newline; a GRES type with whitespace in it (a newline from a
# hostile answer) would reach `#SBATCH --gres=` (docs/security.md, "What goes into job.sbatch")
_GRES_ITEM = re.compile(r"^(?:gres[:/])?gpu(?::(?P<type>[^:(,\s]+))?(?::(?P<count>\d+))?(?:\((?P<extra>[^)]*)\))?\Z")


def split_gres(text: str | None) -> list[str]:
    """Split a GRES list on commas that are not inside parentheses (IDX:0,2-3)."""
    if not text or text in ("(null)", "N/A"):
        return []
    if "(" not in text:
        return [i.strip() for i in text.split(",") if i.strip()]
    items, depth, cur = [], 0, ""
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        items.append(cur)
    return [i.strip() for i in items if i.strip()]


def parse_gpu_gres(text: str | None) -> tuple[str | None, int]:
    """`gpu:a100:4`, `gpu:a100:3(IDX:0-2)`, `gres:gpu:a100:3`, `gres/gpu:v100=2`, `gpu:2` -> (type, count).

    Non-GPU GRES are ignored; several GPU entries add up (the type is the first typed one).
    """
    gtype, total = None, 0
    for item in split_gres(text):
        item = item.replace("=", ":")
        m = _GRES_ITEM.match(item)
        if not m:
            continue
        t, count = m.group("type"), m.group("count")
        if t is not None and t.isdigit() and count is None:  # gpu:2 (untyped)
            t, count = None, t
        gtype = gtype or t
        total += int(count) if count is not None else 1
    return gtype, total


def expand_hostlist(text: str | None) -> list[str]:
    """Slurm host list syntax (`a100-[1-2],t4-[1,3-4]`, `node[01-03]x`, plain names) as node names.

    python-hostlist (LLNL/NSC's, the same syntax Slurm's own `scontrol show hostnames` expands) does
    the expansion; Slurm's "no nodes" spellings give an empty list.
    """
    import hostlist

    if not text or text in ("(null)", "None", "N/A"):
        return []
    try:
        return hostlist.expand_hostlist(text)
    except hostlist.BadHostlist as exc:
        raise SlurmUnexpected(f"cannot read Slurm's host list '{text[:200]}': {exc}") from None


def parse_time_minutes(text: str | int | None) -> int | None:
    """A time Slurm printed (`5:00`, `1:00:00`, `2-00:00:00`, `30`) in minutes; UNLIMITED/INFINITE -> None."""
    if text is None:
        return None
    if isinstance(text, str) and text.strip().upper() in ("", "UNLIMITED", "INFINITE", "NONE", "N/A", "(NULL)"):
        return None
    try:
        return parse_slurm_time(text, allow_zero=True)
    except ValueError:
        raise SlurmUnexpected(f"cannot read Slurm time '{str(text)[:100]}'") from None


# Every form recorded in tests/data/slurm-*/test-only-*.err (src/api/allocate.c in each release):
#   22.05-24.11 single: "Job 7 to start at 2026-12-02T15:17:45 using 8 processors on nodes v100-1 in partition v100"
#   25.05+ single:      "Job 7 to start at 2026-12-02T15:17:45[ on cluster NAME] a using 8 processors on nodes ..."
#                       (a stray literal "a"; " on cluster NAME" when the answer names a cluster, e.g. with -M)
#   heterogeneous:      "Job 7 to start at 2026-12-02T15:17:45 using 5 processors on a100-1,v100-1" (no partition)
_TEST_ONLY = re.compile(
    r"Job (?P<job>\d+) to start at (?P<when>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})"
    r"(?: on cluster (?P<cluster>\S+))?(?: a)? using (?P<cpus>\d+) processors? "
    r"on (?:nodes? )?(?P<nodes>\S+)(?: in partition (?P<partition>\S+))?"
)


def parse_test_only(stderr: str) -> tuple[float, list[str], str | None]:
    """`sbatch --test-only` stderr -> (start epoch, nodes, partition). Times are local, without zone.

    The time is printed in SLURM_TIME_FORMAT; the CLI backend runs sbatch with SLURM_TIME_FORMAT=standard.
    """
    m = _TEST_ONLY.search(stderr)
    if not m:
        raise SlurmUnexpected(f"sbatch --test-only gave no start estimate: {stderr.strip()[:300]}")
    when = dt.datetime.strptime(m.group("when"), "%Y-%m-%dT%H:%M:%S").astimezone()  # local time zone
    return when.timestamp(), expand_hostlist(m.group("nodes")), m.group("partition")


def parse_parsable(stdout: str) -> tuple[int, str | None]:
    """`sbatch --parsable` prints `jobid` or `jobid;cluster` (after any warnings)."""
    first = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    job, _, cluster = first.partition(";")
    if not (job.strip().isascii() and job.strip().isdigit()):
        raise SlurmUnexpected(f"sbatch --parsable printed {stdout.strip()[:200]!r}, not a job id")
    return int(job), cluster.strip() or None


def num(value: object) -> int | None:
    """Slurm JSON numbers: plain ints (22.05) or {"set": bool, "infinite": bool, "number": n} (23.02+)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value) if math.isfinite(value) else None
    if isinstance(value, dict):
        if value.get("infinite") or not value.get("set", True):
            return None
        return num(value.get("number")) if not isinstance(value.get("number"), dict) else None
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    return None


# TRES strings as sacctmgr prints them: `cpu=100,gres/gpu=6,gres/gpu:a100=2` (no unit on GPU counts)
_TRES_GPU = re.compile(r"^gres/gpu(?::(?P<type>[^=:,\s]+))?=(?P<count>\d+)\Z")


def parse_tres_gpus(text: str | None) -> tuple[int | None, dict[str, int]]:
    """`cpu=4,gres/gpu=2,gres/gpu:a100=1` -> (2, {'a100': 1}): the GPU limits of a TRES string; other TRES,
    and GPU memory or utilisation (`gres/gpumem`), are not GPU counts and are left out."""
    total, by_type = None, {}
    for item in (text or "").split(","):
        m = _TRES_GPU.match(item.strip())
        if not m:
            continue
        if m.group("type"):
            by_type[m.group("type")] = int(m.group("count"))
        else:
            total = int(m.group("count"))
    return total, by_type


def parse_qos_rows(text: str) -> dict[str, tuple[str, str, str]]:
    """`sacctmgr -n -P show qos format=Name,MaxTRESPerJob,MaxTRESPerUser,GrpTRES` -> {name: (per job, per
    user, group)} TRES strings."""
    out = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        f = line.split("|")
        if len(f) < 4:
            raise SlurmUnexpected(f"sacctmgr show qos printed an unexpected line: {line[:200]}")
        out[f[0].strip()] = (f[1].strip(), f[2].strip(), f[3].strip())
    return out


def default_qos(text: str) -> str | None:
    """The QOS a job gets without --qos, from `sacctmgr -n -P show user USER withassoc
    format=DefaultAccount,Account,Partition,QOS,DefaultQOS`: the default account's association (the one
    without a partition first) gives its DefaultQOS; without one, its only QOS; else `normal`, as slurmctld
    decides (job_mgr.c). None where the user has no association."""
    rows = [line.split("|") for line in text.splitlines() if line.strip()]
    if any(len(r) < 5 for r in rows):
        raise SlurmUnexpected(f"sacctmgr show user withassoc printed an unexpected line: {text[:200]}")
    mine = [r for r in rows if r[1] == r[0]] or rows
    if not mine:
        return None
    row = min(mine, key=lambda r: r[2] != "")  # the account's own association before per-partition ones
    if row[4].strip():
        return row[4].strip()
    allowed = [q for q in row[3].split(",") if q.strip()]
    return allowed[0] if len(allowed) == 1 else "normal"
