"""No public function or method of the package takes or returns a bare container: `dict`, `list`, `set`, `tuple`
(or typing's `Dict`, `List`, ...) without type parameters says nothing of what it holds, so the type checker
checks nothing about it. A signature names what it holds (`dict[str, Any]` only where the value truly is any
JSON). Public: a module-level function or a method of a module-level class, neither named with a leading `_`.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "frenzy_slurm"

BARE = {"dict", "list", "set", "frozenset", "tuple", "Dict", "List", "Set", "FrozenSet", "Tuple"}


def bare_containers(annotation: ast.expr | None) -> list[str]:
    """The container names used without type parameters anywhere in an annotation (`list[dict]`: `dict`)."""
    match annotation:
        case ast.Constant(value=str(text)):
            return bare_containers(ast.parse(text, mode="eval").body)  # a quoted annotation
        case ast.Name(id=name) | ast.Attribute(attr=name):
            return [name] if name in BARE else []
        case ast.Subscript(value=ast.Name(id="Literal") | ast.Attribute(attr="Literal")):
            return []  # Literal["dict"] holds values, not types
        case ast.Subscript(
            value=ast.Name(id="Annotated") | ast.Attribute(attr="Annotated"), slice=ast.Tuple(elts=elts)
        ):
            return bare_containers(elts[0])  # the rest is metadata (a Field, a note)
        case ast.Subscript(slice=ast.Tuple(elts=items)) | ast.Tuple(elts=items) | ast.List(elts=items):
            return [bare for item in items for bare in bare_containers(item)]
        case ast.Subscript(slice=item):
            return bare_containers(item)
        case ast.BinOp(left=left, right=right):  # X | Y
            return bare_containers(left) + bare_containers(right)
    return []


def public_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """(qualified name, definition) of each module-level function and method of a module-level class."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def offenders(source: str, where: str) -> list[str]:
    found = []
    for name, fn in public_functions(ast.parse(source)):
        a = fn.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
        for arg in params:
            for bare in bare_containers(arg.annotation):
                found.append(f"{where}:{fn.lineno}: {name}({arg.arg}: ...{bare}...)")
        for bare in bare_containers(fn.returns):
            found.append(f"{where}:{fn.lineno}: {name}(...) -> ...{bare}...")
    return found


def test_the_check_finds_bare_containers_and_passes_parameterised_ones():
    source = """
def a(x: dict, y: list[dict] | None) -> tuple: ...
def b(x: dict[str, int], y: "list[str]") -> tuple[int, ...]: ...
def _private(x: dict) -> list: ...
class C:
    def m(self, x: "set") -> typing.List: ...
    def _n(self, x: dict) -> None: ...
class _Hidden:
    def m(self, x: dict) -> None: ...
def d(x: Annotated[dict, "a note"], y: Callable[[int], list]) -> Literal["dict"]: ...
"""
    assert offenders(source, "x.py") == [
        "x.py:2: a(x: ...dict...)",
        "x.py:2: a(y: ...dict...)",
        "x.py:2: a(...) -> ...tuple...",
        "x.py:6: C.m(x: ...set...)",
        "x.py:6: C.m(...) -> ...List...",
        "x.py:10: d(x: ...dict...)",
        "x.py:10: d(y: ...list...)",
    ]


def test_no_public_signature_uses_a_bare_container():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offenders(path.read_text(), str(path.relative_to(ROOT)))
    assert found == [], "\n".join(found)
