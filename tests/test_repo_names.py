"""Names that say where things are (which module owns what, one definition of each)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

PKG = ROOT / "frenzy_slurm"


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (absolute names), at any depth of the file."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _modules_after_import(module: str) -> set[str]:
    """The frenzy_slurm modules a fresh interpreter holds after importing `module`."""
    code = f"import sys, {module}; print(' '.join(m for m in sys.modules if m.startswith('frenzy_slurm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return set(out.stdout.split())


# --- 1. Slurm's time format lives in the seam ---------------------------------------------------------------


def test_time_format_module_imports_no_other_stage():
    own = {m for m in _imports(PKG / "slurm" / "timefmt.py") if m.startswith("frenzy_slurm")}
    assert own == set()


def test_slurm_seam_does_not_import_the_user_spec():
    for path in sorted((PKG / "slurm").glob("*.py")):
        spec_imports = {m for m in _imports(path) if m.startswith("frenzy_slurm.jobspec")}
        assert spec_imports == set(), f"{path.name} imports {spec_imports}"
    assert not any(m.startswith("frenzy_slurm.jobspec") for m in _modules_after_import("frenzy_slurm.slurm.parse"))


@pytest.mark.parametrize(
    "text,minutes", [("30", 30), ("1:30", 2), ("2:00:00", 120), ("1-00", 1440), ("1-2:30:00", 1590), (45, 45), ("0", 0)]
)
def test_seam_parses_slurm_times(text, minutes):
    from frenzy_slurm.slurm.timefmt import parse_slurm_time

    assert parse_slurm_time(text, allow_zero=True) == minutes


@pytest.mark.parametrize(
    "seconds,text", [(0, "00:00:00"), (59.6, "00:01:00"), (3661, "01:01:01"), (93784, "1-02:03:04")]
)
def test_seam_formats_durations_as_slurm_does(seconds, text):
    from frenzy_slurm.slurm.timefmt import format_slurm_time, parse_slurm_time

    assert format_slurm_time(seconds) == text
    assert parse_slurm_time(text, allow_zero=True) == -(-round(seconds) // 60)


def test_spec_validates_time_with_the_seams_parser():
    from frenzy_slurm.jobspec import job, parse_slurm_time
    from frenzy_slurm.slurm import parse, timefmt

    assert job.parse_slurm_time is timefmt.parse_slurm_time
    assert parse_slurm_time is timefmt.parse_slurm_time
    assert parse.parse_time_minutes("1-00:00:00") == 1440
    with pytest.raises(ValueError, match="not a Slurm time"):
        job.SlurmOptions(time="1:00\n")
    with pytest.raises(ValueError, match="longer than Slurm can represent"):
        job.Limits(time_limit=timefmt.SLURM_INFINITE_MIN)


# --- 2. One class per name ------------------------------------------------------------------------------------


def _classes_named(name: str) -> list[str]:
    """Every module of the package that defines a class `name`."""
    return sorted(
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if any(isinstance(n, ast.ClassDef) and n.name == name for n in ast.walk(ast.parse(p.read_text())))
    )


def test_limits_is_only_model_yamls_section():
    from frenzy_slurm.calibration import CalibrationFile, FitBounds

    assert _classes_named("Limits") == ["jobspec/job.py"]
    assert CalibrationFile.model_fields["limits"].annotation is FitBounds  # calibration.json's key is unchanged
    assert FitBounds().min_jobs == 3


def test_submitted_is_only_the_submit_stages_result():
    from frenzy_slurm.slurm import SbatchAnswer
    from frenzy_slurm.slurm.fake import FakeSlurm

    assert _classes_named("Submitted") == ["submission/__init__.py"]
    assert _classes_named("SbatchAnswer") == ["slurm/backend.py"]
    assert SbatchAnswer.__dataclass_fields__.keys() == {"job_id", "cluster", "argv"}
    assert FakeSlurm.submit.__annotations__["return"] in ("SbatchAnswer", SbatchAnswer)


# --- 3. A file argument's type says what click checks --------------------------------------------------------


def test_unchecked_file_says_click_does_not_check_existence():
    from frenzy_slurm.cli import common

    assert common.unchecked_file.exists is False and common.unchecked_file.dir_okay is False
    assert not hasattr(common, "existing_file")


@pytest.mark.parametrize("argv", [("fsbatch", "--dry-run"), ("frenzy-slurm", "memory")])
def test_missing_model_yaml_is_refused_by_the_projects_reader(argv, tmp_path):
    from .helpers import run_cli

    missing = tmp_path / "nope.yaml"
    res = run_cli(*argv, str(missing))
    assert res.returncode == 2
    assert f"{missing}: cannot read file (No such file or directory)" in res.stderr
    assert "Traceback" not in res.stderr


# --- 4. GiB is written once ---------------------------------------------------------------------------------


def _gib_definitions(root: Path) -> list[str]:
    """Where a module of `root` assigns a constant GiB (or GIB), or writes 2**30 as `1 << 30` / `2**30`
    outside frenzy_slurm/core/units.py in a byte computation (divides by it or multiplies a size by it)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, (ast.AnnAssign, ast.AugAssign))
                else []
            )
            if any(isinstance(t, ast.Name) and t.id in ("GiB", "GIB", "GIB_BYTES") for t in targets):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.Mult)):
                for side in (node.left, node.right):
                    if ast.unparse(side) in ("1 << 30", "2 ** 30", "1024 ** 3"):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} ({ast.unparse(node)})")
    return found


def test_gib_is_defined_once_in_units():
    from frenzy_slurm.core.units import GiB

    assert GiB == 1073741824.0
    assert _gib_definitions(PKG) == ["frenzy_slurm/core/units.py:8"]
    assert _gib_definitions(ROOT / "tests") == [] and _gib_definitions(ROOT / "benchmarks") == []


def test_units_imports_nothing_and_the_sampler_stays_light():
    assert _imports(PKG / "core" / "units.py") == set()
    loaded = _modules_after_import("frenzy_slurm.runtime.nvml_sampler")
    assert loaded == {
        "frenzy_slurm",
        "frenzy_slurm.runtime",
        "frenzy_slurm.runtime.nvml_sampler",
        "frenzy_slurm.core",
        "frenzy_slurm.core.units",
        "frenzy_slurm.core.version",
    }


# --- 5. No import cycle in the simulator ----------------------------------------------------------------------


def _cycles(package: str) -> list[list[str]]:
    """Import cycles among `package`'s modules, counting imports at any depth (a lazy import is still a cycle
    to the reader). Each cycle once, as the path that closes it."""
    root = PKG.parent
    graph = {}
    for path in sorted((root / package.replace(".", "/")).glob("*.py")):
        name = f"{package}.{path.stem}" if path.stem != "__init__" else package
        graph[name] = {m for m in _imports(path) if m.startswith(package + ".") and m != name}
    cycles, seen = [], set()

    def walk(node: str, trail: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in trail:
                cycle = trail[trail.index(nxt) :]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    cycles.append([*cycle, nxt])
            else:
                walk(nxt, [*trail, nxt])

    for start in graph:
        walk(start, [start])
    return cycles


def test_simulator_modules_import_no_cycle():
    assert _cycles("frenzy_slurm.sim") == []
    from frenzy_slurm.sim import ilp, policies
    from frenzy_slurm.sim.context import Context

    assert ilp.Context is Context and policies.Context is Context


# --- 6. HAS's numbers have names ----------------------------------------------------------------------------


def test_has_decide_uses_named_constants_only():
    """Inside decide.py's functions only counting (0, 1, 2 pools), unit conversions (60 s, 3600 s, 1e3 ms) and
    the commented division guard (1e-9) stay literal; every other number is a named, commented constant."""
    import importlib

    from frenzy_slurm.has import hetero
    from frenzy_slurm.jobspec import presets

    decide = importlib.import_module("frenzy_slurm.has.decide")  # the module; the package exports its function

    literals = set()
    for fn in ast.parse((PKG / "has" / "decide.py").read_text()).body:
        if isinstance(fn, ast.FunctionDef):
            literals |= {
                n.value
                for n in ast.walk(fn)
                if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool)
            }
    assert literals <= {0, 1, 2, 60, 3600, 1e3, 1e-9}, literals
    assert (decide.MAX_STAGES_PER_POOL, decide.DP_DEGREES, decide.REFINE_WITH_TEST_ONLY) == (8, (1, 2, 4, 8), 3)
    assert (decide.TIE_SECONDS, decide.TIE_FRACTION, decide.MIN_MARGINAL_EFFICIENCY) == (60.0, 0.01, 0.5)
    assert (
        decide.NO_FIT_PROBE_GPUS,
        decide.ALTERNATIVES_SHOWN,
        decide.REFUSED_ALTERNATIVES_SHOWN,
        decide.NO_FIT_REASONS_SHOWN,
        decide.EXPLAIN_RESOLUTION_S,
    ) == (4096, 5, 2, 3, 1.0)
    arch = presets()["llama-2-7b"].arch
    assert hetero.head_in_blocks(arch) == arch.vocab / (12.0 * arch.hidden) == 32000 / (12.0 * 4096)
