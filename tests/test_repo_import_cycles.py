"""The package layout docs/code-layout.md describes: no import cycle between any two modules (imports inside
functions and under TYPE_CHECKING count: a lazy import is still a cycle to the reader), and nothing at the
package root but the public API and in_job. The stage layers themselves are `lint-imports`' contracts
([tool.importlinter] in pyproject.toml, run by ./frenzy-dev lint)."""

from __future__ import annotations

from pathlib import Path

import pytest

grimp = pytest.importorskip("grimp", reason="grimp comes with import-linter (the dev extra)")

PKG = Path(__file__).resolve().parent.parent / "frenzy_slurm"


def cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.find_modules_directly_imported_by(nxt)))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_two_modules_import_each_other_at_any_depth():
    graph = grimp.build_graph("frenzy_slurm", exclude_type_checking_imports=False, cache_dir=None)
    assert cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check above would pass on a finder that finds nothing: a small graph with one cycle."""
    graph = grimp.ImportGraph()
    for a, b in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d")]:
        graph.add_import(importer=a, imported=b)
    assert cycles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_package_root_holds_only_the_api_and_in_job():
    assert sorted(p.name for p in PKG.glob("*.py")) == ["__init__.py", "api.py", "in_job.py"]
