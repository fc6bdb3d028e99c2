"""Loading YAML files into pydantic models with errors that name file, field and line.

PyYAML's composed node tree keeps start marks, so each validation error can be
pointed at the line the user must edit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from frenzy_slurm.errors import InputError

M = TypeVar("M", bound=BaseModel)

Loc = tuple[str | int, ...]


def _line_index(node: yaml.Node, path: Loc, out: dict[Loc, int]) -> None:
    """Record the line of every key (and list item); a mapping's errors point at its key's line."""
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            out[path + (str(key.value),)] = key.start_mark.line + 1
            _line_index(value, path + (str(key.value),), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _line_index(item, path + (i,), out)


def read_yaml(path: Path) -> tuple[Any, dict[Loc, int]]:
    """Parse a YAML file, returning the data and a field-path -> line map."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise InputError(f"{path}: cannot read file ({exc.strerror}).") from None
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{path}{where}: not valid YAML: {problem}.") from None
    lines: dict[Loc, int] = {}
    if node is not None:
        _line_index(node, (), lines)
    return data, lines


def format_validation_error(source: str, exc: ValidationError, lines: dict[Loc, int] | None = None) -> str:
    """One readable block per problem: `file:line: field.path: message`."""
    lines = lines or {}
    out = []
    for err in exc.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # pydantic appends union-member tags (e.g. 'preset') to loc; keep the longest known prefix for the line.
        line = None
        for n in range(len(loc), -1, -1):
            if loc[:n] in lines:
                line = lines[loc[:n]]
                break
        field = ".".join(str(p) for p in loc) or "(top level)"
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field; remove it or check its spelling (see the reference in docs/)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        where = f"{source}:{line}" if line else source
        out.append(f"{where}: {field}: {msg}")
    return "\n".join(out)


def load_model_file(path: Path, model: type[M]) -> M:
    """Read and validate a YAML file as `model`; InputError with every problem on failure."""
    data, lines = read_yaml(path)
    if data is None:
        raise InputError(f"{path}: the file is empty; see examples/ for a starting point.")
    if not isinstance(data, dict):
        raise InputError(f"{path}: the top level must be a mapping of fields, not {type(data).__name__}.")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InputError(format_validation_error(str(path), exc, lines)) from None
