"""The one helper that runs Slurm commands: argument lists, a timeout, a size cap, and errors that say what happened.

Used only inside the Slurm seam (`frenzy_slurm.slurm`).

Never uses a shell. Outage messages from any Slurm tool become SlurmUnavailable (exit 4). What a command
prints is read as bytes and decoded as UTF-8 with invalid bytes replaced (U+FFFD): a job name, comment or
directory of another user with non-UTF-8 bytes (`sbatch -J $'caf\\xe9'`) is Slurm's output too, and must not
stop anyone's `fsqueue`. Every answer is read up to a cap (`max_bytes`); a larger one is an unexpected answer
(exit 6), never memory exhausted.
"""

from __future__ import annotations

import os
import subprocess
import threading
from dataclasses import dataclass
from typing import IO

from frenzy_slurm.core.errors import EXIT_SLURM_UNAVAILABLE, FrenzyError
from frenzy_slurm.slurm.parse import SlurmUnexpected

_OUTAGE = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted or received",
    "slurm_load_",
    "munge",
    "authentication failure",
    "could not establish a configuration source",
    "unable to establish a configuration source",
)

# The largest answer read from one Slurm command. A 10,000-job `squeue --json` of Slurm 22.05-25.11 is
# 30-80 MB; 256 MiB is the bound of the records frenzy-slurm reads back (records.MAX_RECORD_BYTES).
MAX_ANSWER_BYTES = 256 << 20
_CHUNK = 1 << 16


class SlurmUnavailable(FrenzyError):
    """The controller cannot be reached or the Slurm commands are missing."""

    exit_code = EXIT_SLURM_UNAVAILABLE


class SlurmTimeout(SlurmUnavailable):
    """A command did not answer in time. It may still have acted (a submission can exist): callers that
    change state look the result up before reporting a failure."""


class SlurmCommandError(FrenzyError):
    """A Slurm command failed for a reason other than an outage; carries the command and its stderr."""

    def __init__(self, argv: list[str], returncode: int, stderr: str):
        self.argv, self.returncode, self.stderr = argv, returncode, stderr
        super().__init__(f"{' '.join(argv)} failed (exit {returncode}): {stderr.strip()[:2000] or 'no message'}")

    @property
    def not_permitted(self) -> bool:
        """Whether Slurm refused because the caller may not act on this job: another user's job changed without
        operator rights. slurmctld answers ESLURM_USER_ID_MISSING ("Invalid user id for job N", Slurm 22.05's
        `scontrol update` of another user's job, measured on the dev cluster) or ESLURM_ACCESS_DENIED
        ("Access/permission denied")."""
        text = self.stderr.lower()
        return "invalid user id" in text or "access/permission denied" in text


@dataclass(frozen=True)
class Result:
    argv: list[str]
    stdout: str
    stderr: str
    returncode: int


def decode(data: bytes) -> str:
    """Slurm's bytes as text: UTF-8, invalid bytes replaced by U+FFFD (never an exception, never a lone
    surrogate that would fail later when the text is printed or written as JSON)."""
    return data.decode("utf-8", errors="replace")


def _pump(stream: IO[bytes], buf: bytearray, cap: int, over: threading.Event, proc: subprocess.Popen) -> None:
    """Read `stream` into `buf` until EOF or `cap` bytes; past the cap, kill the command (its answer is refused)."""
    try:
        while True:
            chunk = stream.read1(_CHUNK)  # type: ignore[attr-defined]  # a pipe: a BufferedReader
            if not chunk:
                return
            if len(buf) + len(chunk) > cap:
                over.set()
                proc.kill()
                return
            buf += chunk
    except (OSError, ValueError):
        return  # the pipe was closed under us (the command was killed): what was read stays
    finally:
        stream.close()


def _feed(stream: IO[bytes], data: bytes) -> None:
    try:
        stream.write(data)
    except (BrokenPipeError, OSError, ValueError):
        pass  # the command exited without reading its input: its exit status says why
    finally:
        try:
            stream.close()
        except OSError:
            pass


def run(
    argv: list[str],
    timeout: float = 30.0,
    check: bool = True,
    input_text: str | None = None,
    env: dict[str, str] | None = None,
    umask: int = -1,
    max_bytes: int | None = None,
    own_process_group: bool = False,
) -> Result:
    """Run a Slurm command; raise SlurmUnavailable on outages, SlurmTimeout past `timeout`, SlurmUnexpected
    for an answer over `max_bytes` (default MAX_ANSWER_BYTES, stdout and stderr each) and SlurmCommandError
    on other failures.

    `umask` (not -1) is set in the child only: sbatch passes it on to the job it creates.
    `own_process_group` starts the command outside the terminal's foreground group: a Ctrl-C meant for
    frenzy-slurm does not also kill an `sbatch` halfway through a submission."""
    cap = MAX_ANSWER_BYTES if max_bytes is None else max_bytes
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env if env is not None else os.environ.copy(),
            umask=umask,
            process_group=0 if own_process_group else None,
        )
    except FileNotFoundError:
        raise SlurmUnavailable(
            f"'{argv[0]}' was not found: the Slurm client commands are not installed or not on PATH "
            "(install slurm-client, or `module load slurm`); plan without Slurm with --backend static."
        ) from None
    out, err, over = bytearray(), bytearray(), threading.Event()
    threads = [
        threading.Thread(target=_pump, args=(proc.stdout, out, cap, over, proc), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err, cap, over, proc), daemon=True),
    ]
    if input_text is not None:
        threads.append(threading.Thread(target=_feed, args=(proc.stdin, input_text.encode()), daemon=True))
    for t in threads:
        t.start()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise SlurmTimeout(
            f"'{' '.join(argv)}' did not answer within {timeout:.0f}s: slurmctld is overloaded or down."
        ) from None
    for t in threads:  # the pipes close when the command exits (a child it left behind may hold them a while)
        t.join(timeout=5.0)
    if over.is_set():
        raise SlurmUnexpected(
            f"unexpected Slurm output: '{' '.join(argv)}' printed more than {cap:,} bytes; "
            "frenzy-slurm reads no larger answer. Check the Slurm commands on PATH (`which "
            f"{argv[0]}`) and report it."
        )
    res = Result(argv, decode(bytes(out)), decode(bytes(err)), proc.returncode)
    if check:
        raise_for_status(res)
    return res


def raise_for_status(res: Result) -> None:
    """SlurmUnavailable for an outage, SlurmCommandError for any other failure, nothing on success."""
    if res.returncode == 0:
        return
    low = res.stderr.lower()
    if any(k in low for k in _OUTAGE):
        first = res.stderr.strip().splitlines()[0][:500] if res.stderr.strip() else res.argv[0]
        raise SlurmUnavailable(
            f"Slurm is unreachable: {first} (from '{' '.join(res.argv)}'). "
            "Check that slurmctld runs (`scontrol ping`) and SLURM_CONF."
        )
    raise SlurmCommandError(res.argv, res.returncode, res.stderr)
