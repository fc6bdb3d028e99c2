"""Loading YAML files into pydantic models with errors that name file, field and line.

PyYAML's composed node tree keeps start marks, so each validation error can be
pointed at the line the user must edit.
"""

from __future__ import annotations

import copy
import re
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.inputfile import line_of, read_config_text

M = TypeVar("M", bound=BaseModel)

Loc = tuple[str | int, ...]

# The package's own data files (data/presets.yaml, data/gpus.yaml) are trusted and plain: libyaml's parser reads
# them 6-8x faster than the pure-Python one, which was a tenth of `fsbatch --dry-run`'s time, into the same data
# (tests/test_cli_latency.py compares). Users' files keep the Python loader: read_yaml's node checks and error
# lines are written against it.
SHIPPED_DATA_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


# A real model.yaml or site file has tens to thousands of values; anchors and aliases that expand past
# this are an "alias bomb" (a 1 KB file that grows to gigabytes once expanded and validated).
MAX_NODES = 100_000
MAX_DEPTH = 64


def _check_size(root: yaml.Node, source: Path) -> None:
    """Refuse documents whose aliases expand past MAX_NODES values, nest past MAX_DEPTH levels once expanded,
    or refer to themselves (`&a [*a]`, which PyYAML composes into a cycle).

    Sizes and depths are computed once per distinct node (aliases share nodes), children before parents,
    so this is linear in the file however large the expansion would be, and iterative (no recursion).
    """
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    in_progress: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, expanded = stack.pop()
        key = id(node)
        if expanded:  # every child is done: fold them into this node
            in_progress.discard(key)
            kids = _children(node)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            height[key] = 1 + max((height[id(k)] for k in kids), default=0)
            if size[key] > MAX_NODES:
                raise InputError(
                    f"{source}:{node.start_mark.line + 1}: anchors and aliases here expand to more "
                    f"than {MAX_NODES} values; write the values out or use fewer nested aliases."
                )
            if height[key] > MAX_DEPTH:
                raise InputError(
                    f"{source}:{node.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep "
                    "(aliases expanded); a configuration file never needs that. Flatten it."
                )
            continue
        if key in size:
            continue
        in_progress.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in in_progress:
                raise InputError(
                    f"{source}:{child.start_mark.line + 1}: an alias refers to the anchor it is inside "
                    "(a recursive structure); a configuration file cannot use one."
                )
            if id(child) not in size:
                stack.append((child, False))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


_FLOAT_TAG = "tag:yaml.org,2002:float"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_keys_and_numbers(loader: yaml.SafeLoader, root: yaml.Node, source: Path) -> None:
    """Refuse a key written twice in one mapping (YAML keeps the last silently, so an edit to the first copy
    would do nothing) and a float that is not finite (`.inf`, `.nan`, `1.0e999`: a learning rate of infinity
    is stored as null in JSON and the job dies at its start; an infinite memory size breaks the planner).

    Runs on the node tree before construction, so each refusal names file, line and field. _check_size has
    bounded the tree (aliases expanded) and refused cycles, so walking it with paths is bounded too.
    """
    import math

    stack: list[tuple[yaml.Node, Loc]] = [(root, ())]
    while stack:
        node, path = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            if node.tag == _FLOAT_TAG:
                value = loader.construct_yaml_float(node)
                if not math.isfinite(value):
                    field = ".".join(str(p) for p in path) or "(top level)"
                    raise InputError(
                        f"{source}:{node.start_mark.line + 1}: {field}: {node.value} is not a finite "
                        "number; write a number (infinity and NaN are refused)"
                    )
        elif isinstance(node, yaml.MappingNode):
            first: dict[object, int] = {}
            for key, value in node.value:
                if key.tag == _MERGE_TAG:  # `<<: *base`: later keys override merged ones, as intended
                    stack.append((value, path))
                    continue
                name = key.value if isinstance(key, yaml.ScalarNode) else None
                if name is not None:
                    if name in first:
                        field = ".".join(str(p) for p in (*path, name))
                        raise InputError(
                            f"{source}:{key.start_mark.line + 1}: {field}: the key '{name}' is given "
                            f"twice (first on line {first[name]}); YAML would keep only the last one. "
                            "Remove one of them."
                        )
                    first[name] = key.start_mark.line + 1
                stack.append((value, (*path, str(name))))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((item, (*path, i)) for i, item in enumerate(node.value))


def _bad_scalar(loader: yaml.SafeLoader, root: yaml.Node) -> str:
    """`:line` of the first scalar that fails to construct (the constructor does not say which one did)."""
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node)
            except (ValueError, OverflowError, yaml.YAMLError):
                return f":{node.start_mark.line + 1}"
        stack.extend(reversed(_children(node)))
    return ""


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
    """Parse a YAML file once, returning the data and a field-path -> line map.

    The file must be a small regular UTF-8 file (see inputfile); its node tree is checked for alias
    expansion and depth before anything walks or constructs it.
    """
    text = read_config_text(path, "file")
    loader = None
    try:
        loader = yaml.SafeLoader(text)  # the reader already rejects non-printable characters here
        node = loader.get_single_node()
        if node is None:
            return None, {}
        _check_size(node, path)
        _check_keys_and_numbers(loader, node, path)
        data = loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f":{mark.line + 1}"
        elif isinstance(exc, yaml.reader.ReaderError):  # bad characters: the reader knows only an offset
            where = f":{line_of(text, exc.position)}"
        else:
            where = ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise InputError(f"{path}{where}: not valid YAML: {problem}.") from None
    except (ValueError, OverflowError) as exc:  # e.g. a date like 2026-13-45, or an integer of 5,000 digits
        where = _bad_scalar(loader, node) if loader is not None and node is not None else ""  # both set by then
        raise InputError(
            f"{path}{where}: a value cannot be read: {exc}. Quote it if it is meant as a string."
        ) from None
    except RecursionError:
        raise InputError(f"{path}: nested too deeply to parse (more than {MAX_DEPTH} levels); flatten it.") from None
    finally:
        if loader is not None:
            loader.dispose()
    lines: dict[Loc, int] = {}
    _line_index(node, (), lines)
    return data, lines


def _inner_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds (itself, in a list, or `X | None`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _inner_model(arg)
        if found is not None:
            return found
    return None


def _bound(value: float) -> str:
    """A bound as a person writes it: whole numbers in full (2**30 as 1073741824, not 1.07374e+09)."""
    if float(value).is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:g}"


def allowed_range(model: type[BaseModel], loc: Loc) -> str | None:
    """`0 < value <= 16384 GiB`: the bounds (and unit, a field's json_schema_extra `unit`) of the numeric field
    at `loc`, for a message that says what to write; None where the field has no bounds."""
    current: type[BaseModel] | None = model
    info = None
    for part in loc:
        if isinstance(part, int):
            continue
        if current is None:
            break  # a union member's tag (`float`) after the field
        info = current.model_fields.get(part)
        if info is None:
            return None
        current = _inner_model(info.annotation)
    if info is None:
        return None
    low = high = ""
    for m in info.metadata:
        for attr, side in (("gt", "<"), ("ge", "<=")):
            if getattr(m, attr, None) is not None:
                low = f"{_bound(getattr(m, attr))} {side} "
        for attr, side in (("lt", "<"), ("le", "<=")):
            if getattr(m, attr, None) is not None:
                high = f" {side} {_bound(getattr(m, attr))}"
    if not (low or high):
        return None
    extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
    unit = f" {extra['unit']}" if extra.get("unit") else ""
    return f"{low}value{high}{unit}"


# errors of a number (out of bounds, or not a number of the field's kind) that its allowed range helps to fix
_BOUND_ERRORS = frozenset(
    {
        "less_than",
        "less_than_equal",
        "greater_than",
        "greater_than_equal",
        "finite_number",
        "int_parsing",
        "int_parsing_size",
        "int_from_float",
        "float_parsing",
    }
)


def format_validation_error(
    source: str, exc: ValidationError, lines: dict[Loc, int] | None = None, model: type[BaseModel] | None = None
) -> str:
    """One readable block per problem: `file:line: field.path: message`; with `model`, a number out of its
    bounds also gets the allowed range and unit."""
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
            msg = msg[len("Value error, ") :]
        if model is not None and err["type"] in _BOUND_ERRORS:
            allowed = allowed_range(model, loc)
            msg += f" (allowed: {allowed})" if allowed else ""
        where = f"{source}:{line}" if line else source
        out.append(f"{where}: {field}: {msg}")
    return "\n".join(out)


_KEY_PART = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def with_overrides(path: Path, data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with each dotted key (`training.learning_rate`) set to its value, the mappings on the way made
    where the file has none (`limits.max_gpus` in a file without `limits:`). The file's data is not changed."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        parts = key.split(".")
        if not all(_KEY_PART.fullmatch(p) for p in parts):
            raise InputError(
                f"--set {key}: not a field path; write the model.yaml keys joined by dots, e.g. "
                "training.learning_rate (docs/model-yaml.md lists them)."
            )
        node = out
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                where = ".".join(parts[: depth + 1])
                raise InputError(
                    f"--set {key}: {path} has a value, not a section, at {where}; set {where} itself instead."
                )
            node = child
        node[parts[-1]] = value
    return out


def load_model_file(path: Path, model: type[M], overrides: Mapping[str, Any] | None = None) -> M:
    """Read and validate a YAML file as `model`, with `overrides` (dotted key -> value, fsbatch --set) applied
    first; InputError with every problem on failure, a problem in an overridden field named by its --set."""
    data, lines = read_yaml(path)
    if data is None:
        raise InputError(f"{path}: the file is empty; see examples/ for a starting point.")
    if not isinstance(data, dict):
        raise InputError(f"{path}: the top level must be a mapping of fields, not {type(data).__name__}.")
    if overrides:
        data = with_overrides(path, data, overrides)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = format_validation_error(str(path), exc, lines, model)
        if overrides:
            message = _name_overrides(message, overrides)
        raise InputError(message) from None


def _name_overrides(message: str, overrides: Mapping[str, Any]) -> str:
    """Each `file[:line]: field: why` line about an overridden field (or one inside it) said as `--set KEY=VALUE`,
    since the value that failed is the flag's, not the file's."""
    out = []
    for line in message.splitlines():
        for key, value in overrides.items():
            m = re.match(r"(.*?): (" + re.escape(key) + r"(?:\.\S*)?): (.*)", line)
            if m is not None:
                line = f"--set {key}={value}: {m.group(2)}: {m.group(3)}"
                break
        out.append(line)
    return "\n".join(out)
