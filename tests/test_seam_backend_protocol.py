"""Every backend class implements the whole `SlurmBackend` protocol: by name and signature, and for a type checker.

The backends: the CLI, pyslurm, static snapshot, in-memory fake and the simulator's controller, and `OneView`, which
wraps any of them. A method the protocol gains must be added to all of them (those that cannot do it refuse it, as
the read-only ones do); what a backend can do is said by its attributes (`snapshot`), never asked by its type.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.oneview import OneView
from frenzy_slurm.slurm.pyslurm_backend import PyslurmBackend
from frenzy_slurm.slurm.static import StaticBackend

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = [SlurmCliBackend, PyslurmBackend, StaticBackend, FakeSlurm, SimSlurm, OneView]


def protocol_methods() -> list[str]:
    """The protocol's methods, as declared in its class body."""
    return [n for n, v in vars(SlurmBackend).items() if inspect.isfunction(v) and not n.startswith("_")]


def test_the_protocol_is_what_the_backends_are_checked_against():
    assert protocol_methods() == [
        "load",
        "expected_start",
        "submit",
        "jobs",
        "cancel",
        "requeue",
        "hold",
        "release",
        "update_pending",
        "is_operator",
        "preempted",
        "accounting",
        "gpu_memory_peaks",
        "qos_limits",
        "run_step",
    ]
    assert SlurmBackend.__annotations__ == {"name": "str", "snapshot": "Path | None"}


def _params(fn) -> list[tuple[str, object, object]]:
    """A method's parameters after self: name, kind and default (the types are the type checker's)."""
    return [(p.name, p.kind, p.default) for p in list(inspect.signature(fn).parameters.values())[1:]]


@pytest.mark.parametrize("cls", BACKENDS, ids=lambda c: c.__name__)
def test_every_method_of_the_protocol_with_its_signature(cls):
    for name in protocol_methods():
        impl = getattr(cls, name, None)
        assert inspect.isfunction(impl), f"{cls.__name__} lacks {name}()"
        assert _params(impl) == _params(getattr(SlurmBackend, name)), f"{cls.__name__}.{name}{inspect.signature(impl)}"
    assert cls is OneView or (isinstance(cls.name, str) and cls.name)  # (a OneView is named as what it wraps)


def test_what_a_backend_can_do_is_an_attribute_of_it_and_of_its_one_view(tmp_path):
    """A saved snapshot says so (`snapshot`: its file), the backends that ask a controller say None, and a
    OneView says what the backend it wraps says."""
    from frenzy_slurm.sim.synthetic import synthetic

    view = synthetic([("a100", "A100-40GB", 1, 4)])
    path = tmp_path / "snap.json"
    static = StaticBackend(path)
    assert static.snapshot == path and OneView(static).snapshot == path
    for live in (SlurmCliBackend(), FakeSlurm(view)):
        assert live.snapshot is None and OneView(live).snapshot is None
    assert SimSlurm.snapshot is None and PyslurmBackend.snapshot is None


CHECK = """\
from frenzy_slurm.sim.slurm import SimSlurm
from frenzy_slurm.slurm.backend import SlurmBackend
from frenzy_slurm.slurm.cli import SlurmCliBackend
from frenzy_slurm.slurm.fake import FakeSlurm
from frenzy_slurm.slurm.oneview import OneView
from frenzy_slurm.slurm.pyslurm_backend import PyslurmBackend
from frenzy_slurm.slurm.static import StaticBackend


class Incomplete:  # the control: what a backend lacking methods looks like to the checker
    name = "incomplete"


def check(cli: SlurmCliBackend, pyslurm: PyslurmBackend, static: StaticBackend, fake: FakeSlurm, sim: SimSlurm,
          incomplete: Incomplete, one: OneView) -> None:
    a: SlurmBackend = cli
    b: SlurmBackend = pyslurm
    c: SlurmBackend = static
    d: SlurmBackend = fake
    e: SlurmBackend = sim
    f: SlurmBackend = incomplete  # line 21
    g: SlurmBackend = one
"""


def test_a_type_checker_accepts_every_backend_as_a_slurm_backend(tmp_path):
    """mypy on a module that assigns each backend to a `SlurmBackend` variable: only the control is refused."""
    mypy = shutil.which("mypy", path=str(Path(sys.executable).parent)) or shutil.which("mypy")
    if mypy is None:
        pytest.skip("mypy is not installed (pip install -e '.[dev]')")
    (tmp_path / "check_backends.py").write_text(CHECK)
    # the package is read, not checked (--follow-imports=silent), and without the project's configuration
    # (--config-file=): only this module's assignments are judged
    argv = [
        mypy,
        "--config-file=",
        "--follow-imports=silent",
        "--cache-dir",
        str(tmp_path / "cache"),
        "--no-error-summary",
        "--hide-error-context",
        "--no-pretty",
        "check_backends.py",
    ]
    out = subprocess.run(
        argv,
        cwd=tmp_path,
        env={"MYPYPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    errors = [line for line in out.stdout.splitlines() if ": error:" in line]
    assert errors and all(line.startswith("check_backends.py:21:") for line in errors), out.stdout + out.stderr
    assert 'Incompatible types in assignment (expression has type "Incomplete"' in errors[0]
