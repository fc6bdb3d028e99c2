"""sbatch's `--dependency` syntax, read as slurmctld reads it, so a malformed one is refused before sbatch.

    afterok:20:21,afterany:23      all must hold (`,`)
    afterok:20?afternotok:21       any one is enough (`?`); one kind of separator per list
    after:20+5                     20 started (or was cancelled) 5 minutes ago
    singleton                      after this user's earlier jobs of the same name
    20,21                          the old form: bare job ids, as afterany

Job ids are `ID` or an array task `ID_TASK` / `ID_*`. The grammar is `_parse_dependency_str` in
src/slurmctld/job_scheduler.c (Slurm 25.11.7, shared/vendor/slurm) with the man page's restriction that a
`+minutes` delay belongs to `after` only (slurmctld accepts it on every type, and ignores it but for
`after`). This module reads Slurm's format and imports no other stage.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# the types sbatch(1) documents; slurmctld also reads `expand:`, which is not a dependency one submits
TYPES = ("after", "afterany", "afterburstbuffer", "aftercorr", "afternotok", "afterok")
MAX_LENGTH = 4096  # a dependency list is a line of ids; anything longer is not one
_JOB = re.compile(r"(?P<id>[0-9]{1,10})(?:_(?P<task>\*|[0-9]{1,10}))?(?:\+(?P<minutes>[0-9]{1,9}))?")


@dataclass(frozen=True)
class Condition:
    """One `type:id[:id...]` term (or `singleton`, with no job ids)."""

    kind: str
    job_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Dependency:
    """A parsed dependency list: its terms, whether any one (`?`) or all (`,`) must hold, and the text."""

    text: str
    conditions: tuple[Condition, ...]
    any_of: bool = False

    @property
    def job_ids(self) -> tuple[int, ...]:
        """Every job id named (array tasks by their array's id), in order, once each."""
        return tuple(dict.fromkeys(i for c in self.conditions for i in c.job_ids))


class DependencyError(ValueError):
    """A dependency list sbatch would refuse; the message says which part and the form to use."""


_FORM = "use TYPE:JOBID[:JOBID...] (TYPE one of " + ", ".join(TYPES) + "), or singleton, joined by ',' or '?'"


def _job(word: str, kind: str, text: str) -> int:
    m = _JOB.fullmatch(word)
    if m is None or int(m["id"]) == 0:
        raise DependencyError(
            f"{text!r}: '{word}' is not a job id (a number such as 1234, or an array task 1234_7 or 1234_*)"
        )
    if m["minutes"] is not None:
        if kind != "after":
            raise DependencyError(f"{text!r}: '+{m['minutes']}' (a delay in minutes) is for after:JOBID+MINUTES only")
        if int(m["minutes"]) == 0:
            raise DependencyError(f"{text!r}: the delay after '+' must be at least 1 minute")
    return int(m["id"])


def parse_dependency(text: str) -> Dependency:
    """The dependency list `text` as slurmctld would read it; DependencyError saying what is wrong otherwise."""
    if not text or len(text) > MAX_LENGTH or not text.isascii() or not text.isprintable() or " " in text:
        raise DependencyError(f"{text[:80]!r} is not a dependency list: {_FORM}, without spaces")
    if "," in text and "?" in text:
        raise DependencyError(f"{text!r}: use either ',' (all must hold) or '?' (any one), not both")
    any_of = "?" in text
    conditions = []
    for term in text.split("?" if any_of else ","):
        if not term:
            raise DependencyError(f"{text!r}: an empty term between separators; {_FORM}")
        kind, colon, rest = term.partition(":")
        low = kind.lower()  # slurmctld compares the type case-insensitively
        if not colon:
            if low == "singleton":
                conditions.append(Condition("singleton"))
                continue
            if kind.isdigit() and not any_of:  # the old form: a bare job id means afterany
                conditions.append(Condition("afterany", (_job(kind, "afterany", text),)))
                continue
            raise DependencyError(f"{text!r}: '{term}' names no job; {_FORM}")
        if low not in TYPES:
            raise DependencyError(f"{text!r}: '{kind}' is not a dependency type; {_FORM}")
        words = rest.split(":")
        if not all(words):
            raise DependencyError(f"{text!r}: '{term}' has an empty job id; write {low}:1234[:1235...]")
        conditions.append(Condition(low, tuple(_job(w, low, text) for w in words)))
    return Dependency(text=text, conditions=tuple(conditions), any_of=any_of)
