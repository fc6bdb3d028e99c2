"""Slurm's node-feature constraints (`sbatch -C/--constraint`): read as slurmctld reads them, asked per node.

    c = parse_constraint("[rack1|rack2]&nvme")
    c.matches({"rack2", "nvme"})        # True: this node may be in the job
    c.matching_or                       # ("rack1", "rack2"): all of a component's nodes share one of them

The grammar is slurmctld's (`_feature_string2list` in src/slurmctld/job_scheduler.c of 25.11, and the sbatch
man page): feature names joined by `&` (AND) and `|` (OR), evaluated strictly left to right (`a|b&c` is
`(a|b)&c`); `,` is taken for `&` ("a common error", slurmctld says, and rewrites it); one level of
parentheses groups; one set of square brackets holds a matching OR (`[a|b]`: every node of the job has the
same one) or counts (`[a*2&b*4]`); `name*N` asks for at least N nodes with that feature (outside brackets
only as the whole constraint). A constraint slurmctld would refuse is refused here first, naming what is
wrong, before anything reaches sbatch.

What a plan can ask of one node: `matches` says whether a node with these features may be part of the
job. A counted feature is not required of every node (only N of them need it), so it counts as met here;
the counts themselves are left to Slurm, which the plan's `sbatch --test-only` estimate asks. This module
belongs to the Slurm seam (it knows Slurm's syntax, nothing of the stages).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A feature name: what slurm.conf's Features= may hold without meaning an operator here. Control characters,
# spaces and shell characters never reach an #SBATCH line (jobspec's rule for every sbatch value).
_NAME = re.compile(r"[A-Za-z0-9_.@+=:-]+")
_OPERATORS = "&|()[]*"
MAX_CONSTRAINT_CHARS = 1024  # slurmctld has no smaller limit; a plan needs no longer one, and parsing stays cheap


class ConstraintError(ValueError):
    """A constraint slurmctld would refuse; the message says where and why."""


@dataclass(frozen=True)
class Term:
    """One feature, or one parenthesised group, and the operator that joins it to what came before."""

    op: str  # "&" or "|"; the first term's is "&" (joined to "everything matches")
    name: str | None = None  # a feature, or None for a group
    group: tuple[Term, ...] = ()
    count: int | None = None  # `name*N`: at least N nodes need it; not asked of each node

    def matches(self, features: frozenset[str]) -> bool:
        if self.count is not None:
            return True  # only `count` of the job's nodes need it; Slurm chooses which
        if self.name is not None:
            return self.name in features
        return _fold(self.group, features)


def _fold(terms: tuple[Term, ...], features: frozenset[str]) -> bool:
    """Left to right, as slurmctld evaluates: no precedence between & and |."""
    result = True
    for i, t in enumerate(terms):
        value = t.matches(features)
        result = value if i == 0 else (result and value) if t.op == "&" else (result or value)
    return result


@dataclass(frozen=True)
class Constraint:
    """A parsed `--constraint`: `matches(features)` per node; `matching_or` the alternatives of a `[a|b]`."""

    text: str
    terms: tuple[Term, ...]
    matching_or: tuple[str, ...] = ()  # the alternatives of a matching OR, each as written
    counted: bool = False  # some feature carries a node count (`a*2`)

    def matches(self, features: frozenset[str] | set[str] | list[str]) -> bool:
        """Whether a node with these (available) features may be one of the job's nodes."""
        return _fold(self.terms, frozenset(features))


def _tokens(text: str) -> list[str]:
    out, i = [], 0
    while i < len(text):
        ch = text[i]
        if ch in _OPERATORS:
            out.append(ch)
            i += 1
            continue
        m = _NAME.match(text, i)
        if m is None:
            raise ConstraintError(
                f"{text!r}: {ch!r} at position {i + 1} is neither a feature name (letters, digits and _.@+=:-) "
                f"nor an operator (& | ( ) [ ] *)"
            )
        out.append(m.group())
        i = m.end()
    return out


def parse_constraint(text: str) -> Constraint:
    """`text` as slurmctld reads it, or ConstraintError saying what it would refuse."""
    if not text:
        raise ConstraintError("the constraint is empty")
    if len(text) > MAX_CONSTRAINT_CHARS:
        raise ConstraintError(f"the constraint is {len(text)} characters long; at most {MAX_CONSTRAINT_CHARS}")
    tokens = _tokens(text.replace(",", "&"))
    # stack of term lists: the top level, then a bracket and/or one parenthesis level
    levels: list[list[Term]] = [[]]
    kinds: list[str] = []  # "[" or "(" per open level
    group_op: list[str] = []  # per open level, the operator that joins the group to what came before it
    op = "&"
    expect_operand = True
    brackets = 0
    bracket_ops: set[str] = set()
    bracket_alternatives: list[str] = []
    alternative_start = 0
    counted = False

    def fail(why: str) -> ConstraintError:
        return ConstraintError(f"{text!r}: {why}")

    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok in "&|":
            if expect_operand:
                raise fail(f"'{tok}' without a feature before it")
            op, expect_operand = tok, True
            if kinds and kinds[-1] == "[" and len(kinds) == 1:
                bracket_ops.add(tok)
                if tok == "|":
                    bracket_alternatives.append("".join(tokens[alternative_start:i]))
                    alternative_start = i + 1
        elif tok == "[":
            if not expect_operand or kinds:
                raise fail("imbalanced brackets: '[' inside another group or after a feature")
            brackets += 1
            if brackets > 1:
                raise fail("more than one set of brackets (Slurm allows one per job)")
            kinds.append("[")
            levels.append([])
            alternative_start = i + 1
        elif tok == "(":
            if not expect_operand or "(" in kinds:
                raise fail("imbalanced parentheses: Slurm allows one level, not after a feature")
            kinds.append("(")
            levels.append([])
        elif tok in ")]":
            want = "(" if tok == ")" else "["
            if expect_operand or not kinds or kinds[-1] != want:
                raise fail(f"imbalanced {'parentheses' if tok == ')' else 'brackets'} at '{tok}'")
            if tok == "]":
                bracket_alternatives.append("".join(tokens[alternative_start:i]))
            kinds.pop()
            group = tuple(levels.pop())
            outer_op = group_op.pop() if group_op else "&"
            levels[-1].append(Term(op=outer_op, group=group))
            expect_operand = False
        elif tok == "*":
            if expect_operand or "(" in kinds:
                raise fail("'*' must follow a feature or a closing parenthesis, outside parentheses")
            if i + 1 >= len(tokens) or not tokens[i + 1].isdigit() or int(tokens[i + 1]) <= 0:
                raise fail("'*' must be followed by a positive whole number of nodes")
            last = levels[-1].pop()
            levels[-1].append(Term(op=last.op, name=last.name, group=last.group, count=int(tokens[i + 1])))
            counted = True
            i += 1
        else:
            if not expect_operand:
                raise fail(f"feature {tok!r} follows another without '&' or '|' between them")
            levels[-1].append(Term(op=op, name=tok))
            expect_operand = False
        if tok in "[(":
            group_op.append(op)
            op = "&"
        i += 1
    if kinds:
        raise fail(f"imbalanced {'parentheses' if kinds[-1] == '(' else 'brackets'}: '{kinds[-1]}' is not closed")
    if expect_operand:
        raise fail("it ends with an operator")
    top_counts = [t for t in levels[0] if t.count is not None]
    if top_counts and len(levels[0]) > 1:
        raise fail("node counts with more than one feature need square brackets around them ('[a*2&b*4]')")
    if brackets and bracket_ops == {"&", "|"}:
        raise fail("square brackets hold either a matching OR ('[a|b]') or counts joined by '&' ('[a*2&b*4]')")
    if "&" in bracket_ops and not all(t.count is not None for g in levels[0] for t in g.group if g.name is None):
        raise fail("'&' inside square brackets needs a node count on each side ('[a*2&b*4]')")
    matching_or = tuple(bracket_alternatives) if brackets and "|" in bracket_ops else ()
    return Constraint(text=text, terms=tuple(levels[0]), matching_or=matching_or, counted=counted)
