"""The fuzz test of the Slurm seam: random bytes, huge answers and malformed JSON in place of what Slurm
prints. Whatever the answer: a result, or SlurmUnexpected (exit 6) with its one message; never another
exception, and never more than a time cap (the parsers are linear). Bounded: a fixed seed (derandomize), a few
dozen examples per kind, a deadline per example; the whole file runs in a few seconds.

Real answers are the starting point: the recorded Slurm 22.05 and 25.11 outputs in tests/data/, with one field
replaced by a hostile value, so the fuzzing reaches the field readers rather than stopping at the first brace.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz test needs hypothesis (pip install -e '.[dev]')")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from frenzy_slurm.core.errors import EXIT_SLURM_UNEXPECTED  # noqa: E402
from frenzy_slurm.slurm import cli as slurm_cli  # noqa: E402
from frenzy_slurm.slurm.cli import (  # noqa: E402
    FEATURES,
    SlurmCliBackend,
    cluster_name_from_config,
    nodes_from_text,
    parse_gpumem,
    parse_sacct,
    parse_version,
    partitions_from_scontrol,
)
from frenzy_slurm.slurm.parse import (  # noqa: E402
    SlurmUnexpected,
    expand_hostlist,
    parse_gpu_gres,
    parse_parsable,
    parse_test_only,
    reading,
)
from frenzy_slurm.slurm.run import decode, run  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
SETTINGS = settings(
    max_examples=30,
    deadline=dt.timedelta(seconds=3),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TIME_CAP_S = 3.0


def backend(json_version: tuple[int, int] | None) -> SlurmCliBackend:
    """A CLI backend that believes it talks to this Slurm version (None: the text formats)."""
    b = SlurmCliBackend(force_text=json_version is None)
    b._features = slurm_cli.features_for(json_version or (22, 5))
    b.version = "fuzz"
    return b


def within_seam(fn, *args):
    """Call a reader: its result, or None for SlurmUnexpected (exit 6); anything else fails the test. Timed."""
    start = time.perf_counter()
    try:
        return fn(*args)
    except SlurmUnexpected as exc:
        assert exc.exit_code == EXIT_SLURM_UNEXPECTED and exc.message
        return None
    finally:
        assert time.perf_counter() - start < TIME_CAP_S, f"{fn.__name__} took over {TIME_CAP_S}s"


def guarded(what: str, fn):
    """A parser as the backend calls it: inside `reading()` (the seam's one exception translator)."""

    def call(*args):
        with reading(what):
            return fn(*args)

    call.__name__ = getattr(fn, "__name__", what)
    return call


TEXT_PARSERS = [
    ("scontrol partition", partitions_from_scontrol),
    ("sinfo -O", nodes_from_text),
    ("squeue -o", slurm_cli.jobs_from_text),
    ("sacct", parse_sacct),
    ("sacct gpumem", parse_gpumem),
    ("sbatch --test-only", parse_test_only),
    ("sbatch --parsable", parse_parsable),
    ("sinfo --version", parse_version),
    ("gres", parse_gpu_gres),
    ("hostlist", expand_hostlist),
    ("scontrol config", cluster_name_from_config),
]

# What a hostile or broken Slurm might put in a field: control characters, replacement characters, separators,
# numbers of every kind, deep or odd JSON.
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from(list("|=:,()[]+-*%0123456789 \t\n\x00\x1b\ufffd\u00b2a")), max_size=60),
    st.sampled_from(
        [
            "",
            "(null)",
            "N/A",
            "UNLIMITED",
            "INFINITE",
            "gpu:a100:4(IDX:0-3)",
            "n[1-99999999]",
            "a100-[1-2],t4-[1,3-4]",
            "1-00:00:00",
            "99999999999999999999",
            "Job 1 to start at 2026-13-45T99:99:99 using 1 processors on nodes a in partition p",
            "-1",
            "1e999",
            "\u00b2",
        ]
    ),
)
json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        hostile_text,
    ),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=10,
)


@SETTINGS
@given(st.sampled_from(TEXT_PARSERS), st.binary(max_size=400))
@example(("scontrol partition", partitions_from_scontrol), b"PartitionName=p MaxNodes=\xb2 Nodes=n[1-2")
@example(("sacct gpumem", parse_gpumem), b"1|gres/gpumem=1.2.3G\n")
def test_text_parsers_take_random_bytes(parser, data):
    what, fn = parser
    within_seam(guarded(what, fn), decode(data))


@SETTINGS
@given(st.sampled_from(TEXT_PARSERS), st.lists(hostile_text, min_size=1, max_size=12))
def test_text_parsers_take_hostile_fields(parser, fields):
    what, fn = parser
    within_seam(guarded(what, fn), "|".join(fields) + "\n" + " ".join(f"K{i}={f}" for i, f in enumerate(fields)))


def _recorded(version: str, name: str, key: str) -> dict:
    return json.loads((DATA / f"slurm-{version}" / name).read_text())


RECORDED = [
    (v, n, k)
    for v in ("22.05", "25.11")
    for n, k in (("squeue.out", "jobs"), ("sinfo.out", "nodes"), ("scontrol-nodes.out", "nodes"))
    if (DATA / f"slurm-{v}" / n).exists()
]


def _reader(version: str, key: str):
    """The backend's reader for a recorded answer: jobs through _parse_jobs, nodes through node_from_json."""
    b = backend(tuple(int(x) for x in version.split(".")))

    def nodes(text: str):
        with reading("nodes json"):
            return [slurm_cli.node_from_json(n) for n in slurm_cli.json_list(text, "nodes", ["sinfo", "--json"])]

    return b._parse_jobs if key == "jobs" else nodes


@SETTINGS
@given(st.sampled_from(RECORDED), st.data())
def test_recorded_answers_with_one_field_made_hostile(recorded, data):
    version, name, key = recorded
    payload = _recorded(version, name, key)
    items = payload.get(key) or []
    if not items:
        return
    item = items[data.draw(st.integers(0, len(items) - 1))]
    field = data.draw(st.sampled_from(sorted(item)))
    item[field] = data.draw(json_values)
    text = json.dumps(payload, allow_nan=True)
    within_seam(_reader(version, key), text)


@SETTINGS
@given(st.sampled_from(RECORDED), st.binary(min_size=1, max_size=8), st.floats(0, 1))
def test_recorded_answers_with_random_bytes_spliced_in(recorded, junk, where):
    version, name, key = recorded
    raw = (DATA / f"slurm-{version}" / name).read_bytes()
    cut = int(len(raw) * where)
    within_seam(_reader(version, key), decode(raw[:cut] + junk + raw[cut:]))


@SETTINGS
@given(json_values)
def test_malformed_json_documents(value):
    for version in ("22.05", "25.11"):
        within_seam(_reader(version, "jobs"), json.dumps(value, allow_nan=True))
        within_seam(_reader(version, "jobs"), json.dumps({"jobs": value}, allow_nan=True))
        within_seam(_reader(version, "nodes"), json.dumps({"nodes": [value]}, allow_nan=True))


HUGE = 1_000_000  # 1 MB of each shape (test_seam_hostile_answers.py reads the audit's 4 MB scontrol line)
HUGE_ANSWERS = {
    "word run": "PartitionName=p Nodes=n1 " + "a" * HUGE,
    "digit run": "1" * HUGE,
    "key run": "K=" * (HUGE // 2),
    "no spaces": "=" * HUGE,
    "pipes": "|" * HUGE,
    "gres parens": "gpu:a100:4(" + "(" * HUGE,
    "gres commas": "gpu:a100:4," * (HUGE // 11),
    "hostlist": "n[" + "1," * (HUGE // 2) + "]",
    "json nesting": "[" * HUGE,
    "json string": '{"jobs": [{"name": "' + "\\u00e9" * (HUGE // 6) + '"}]}',
    "test-only": "Job 1 to start at 2026-01-01T00:00:00 using 1 processors on " * (HUGE // 60),
}


@pytest.mark.parametrize("name", sorted(HUGE_ANSWERS))
def test_huge_answers_are_read_in_linear_time(name):
    text = HUGE_ANSWERS[name]
    start = time.perf_counter()
    for what, fn in TEXT_PARSERS:
        within_seam(guarded(what, fn), text)
    for version in ("22.05", "25.11"):
        within_seam(_reader(version, "jobs"), text)
    assert time.perf_counter() - start < 20 * TIME_CAP_S


@pytest.fixture
def squeue_prints(tmp_path, monkeypatch):
    """A stand-in `squeue` printing the bytes given (and `sinfo --version` answering 22.05)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    answer = tmp_path / "answer"
    for tool, body in {"squeue": f"cat {answer}", "sinfo": "echo 'slurm 22.05.8'"}.items():
        (bindir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bindir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")

    def set_answer(data: bytes) -> None:
        answer.write_bytes(data)

    return set_answer


@settings(
    max_examples=15,
    deadline=dt.timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.one_of(
        st.binary(max_size=300),
        st.builds(
            lambda junk: b'{"jobs": [{"job_id": 1, "name": "' + junk + b'", "job_state": "PENDING"}]}',
            st.binary(max_size=40),
        ),
    )
)
def test_random_bytes_from_a_real_command(squeue_prints, data):
    """Through run(): bytes from a real process (a stand-in squeue), then the backend's reader."""
    squeue_prints(data)
    b = SlurmCliBackend()
    b._features = FEATURES[1][1]  # JSON, 22.05's shapes
    b.version = "fuzz"
    jobs = within_seam(b.jobs)
    for j in jobs or []:
        json.loads(json.dumps(dataclasses.asdict(j)))  # what fsqueue --json and the queue cache write


def test_random_bytes_through_run_decode_exactly(tmp_path):
    """run() turns every byte sequence into text: valid UTF-8 unchanged, anything else with U+FFFD."""
    import random

    rng = random.Random(19)
    for _ in range(20):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 2000)))
        f = tmp_path / "b"
        f.write_bytes(data)
        assert run(["cat", str(f)]).stdout == data.decode("utf-8", errors="replace")
