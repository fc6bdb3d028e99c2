"""The fuzz test of inputs: hostile model.yaml files, site files and fsbatch flags, through `fsbatch --dry-run`
on a static cluster. Whatever the input: an exit code from the documented set, never a traceback, a message
that names the file (and field) or the flag, and an answer within a time cap. Bounded (a fixed seed, a few
dozen examples per input kind, a deadline per example) so it runs in well under a minute."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis", reason="the fuzz test needs hypothesis (pip install -e '.[dev]')")
from click.testing import CliRunner  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from frenzy_slurm.cli.fsbatch import main as fsbatch  # noqa: E402
from frenzy_slurm.core.errors import EXIT_BAD_INPUT, EXIT_NO_FIT, EXIT_OK  # noqa: E402
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GOOD = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
POOLS = [("a100", "A100-40GB", 2, 4), ("t4", "T4", 2, 4)]
SITE = synthetic_site(POOLS).model_dump(mode="json")
DOCUMENTED = {EXIT_OK, EXIT_BAD_INPUT, EXIT_NO_FIT}  # what a dry run on a static cluster may answer
SETTINGS = settings(
    max_examples=60,
    deadline=dt.timedelta(seconds=5),
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
TIME_CAP_S = 5.0

# Values a hostile (or careless) user might write anywhere: huge and negative numbers, NaN, control characters,
# wrong types, nesting.
scalars = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 2**31 - 1, 2**32, 2**63, 10**20, 10**30]),
    st.booleans(),
    st.none(),
    st.text(alphabet=st.characters(max_codepoint=0x2FF), max_size=24),
    st.sampled_from(["", "auto", "0", "-1", "1e400", "1-00:00:00", "../../etc/passwd", "$(id)", "a\nb", "\x1b[2J"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=6,
)


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        out.append(prefix + (k,))
        if isinstance(v, dict):
            out += _paths(v, prefix + (k,))
    return out


def _set(d: dict, path: tuple, value) -> dict:
    import copy

    d = copy.deepcopy(d)
    cur = d
    for k in path[:-1]:
        cur = cur[k]
    cur[path[-1]] = value
    return d


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    (d / "snap.json").write_text(synthetic(POOLS).model_dump_json())
    return d


def fsbatch_dry(args: list[str]) -> tuple[int, str, float]:
    t0 = time.monotonic()
    res = CliRunner().invoke(fsbatch, args, catch_exceptions=True)
    took = time.monotonic() - t0
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        pytest.fail("fsbatch crashed: " + "".join(traceback.format_exception(res.exception))[-3000:])
    return res.exit_code, res.stderr + res.stdout, took


def _common(cluster: Path, site: Path) -> list[str]:
    return [
        "--dry-run",
        "--backend",
        "static",
        "--snapshot",
        str(cluster / "snap.json"),
        "--site",
        str(site),
        "--job-dir",
        str(cluster / "job"),
    ]


def _site(cluster: Path) -> Path:
    p = cluster / "site.yaml"
    if not p.exists():
        p.write_text(yaml.safe_dump(SITE))
    return p


@SETTINGS
@given(path=st.sampled_from(_paths(GOOD)), value=values)
@example(path=("model", "arch", "layers"), value=10**30)  # used to hang the plan search on the login node
@example(path=("model", "arch", "vocab"), value=10**20)
@example(path=("training", "seed"), value=2**64)
@example(path=("model", "arch"), value=[{"a": "b"}])
def test_fuzz_model_yaml_fields(cluster, path, value):
    model = cluster / "model.yaml"
    model.write_text(yaml.safe_dump(_set(GOOD, path, value)))
    code, out, took = fsbatch_dry([str(model), *_common(cluster, _site(cluster))])
    assert code in DOCUMENTED, out
    assert took < TIME_CAP_S
    if code == EXIT_BAD_INPUT:
        assert str(model) in out, out
        assert path[0] in out or "(top level)" in out, (path, out)


@SETTINGS
@given(raw=st.one_of(st.binary(max_size=300), st.text(max_size=300)))
@example(raw=b"name: &a [*a]\n")  # a recursive alias: PyYAML composes a cycle
@example(raw=b"a: &a [" + b"[" * 60 + b"]" * 60 + b"]\nb: [*a, [*a, [*a]]]\n")  # deep only once expanded
def test_fuzz_model_yaml_bytes(cluster, raw):
    model = cluster / "raw.yaml"
    model.write_bytes(raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass"))
    code, out, took = fsbatch_dry([str(model), *_common(cluster, _site(cluster))])
    assert code in DOCUMENTED and took < TIME_CAP_S, out
    if code == EXIT_BAD_INPUT:
        assert str(model) in out, out


@SETTINGS
@given(path=st.sampled_from(_paths(SITE)), value=values)
def test_fuzz_site_file(cluster, path, value):
    site = cluster / "fuzz-site.yaml"
    site.write_text(yaml.safe_dump(_set(SITE, path, value)))
    code, out, took = fsbatch_dry([str(ROOT / "examples" / "tiny-cpu.yaml"), *_common(cluster, site)])
    assert code in DOCUMENTED and took < TIME_CAP_S, out
    if code == EXIT_BAD_INPUT:
        assert str(site) in out, out


FLAGS = ["-t", "-A", "-q", "-C", "-J", "-o", "-e", "--mail-type", "--mail-user", "--sbatch"]


@SETTINGS
@given(
    flag=st.sampled_from(FLAGS),
    value=st.one_of(
        st.text(alphabet=st.characters(max_codepoint=0x2FF, blacklist_categories=("Cs",)), max_size=30),
        st.sampled_from(
            [
                "1",
                "0",
                "-5",
                "99999999999999999999",
                "--comment=x",
                "--chdir=/",
                "a\n#SBATCH --uid=0",
                "$(id)",
                "-",
                "--",
                "--time=1",
            ]
        ),
    ),
)
def test_fuzz_flags(cluster, flag, value):
    if "\x00" in value:  # a NUL cannot be in a command-line argument at all (execve refuses it)
        value = value.replace("\x00", "")
    given = [f"{flag}={value}"] if flag.startswith("--") else [flag, value]
    code, out, took = fsbatch_dry([str(ROOT / "examples" / "tiny-cpu.yaml"), *_common(cluster, _site(cluster)), *given])
    assert code in DOCUMENTED and took < TIME_CAP_S, out
    if code == EXIT_BAD_INPUT:
        names = {
            "-t": "time",
            "-A": "account",
            "-q": "qos",
            "-C": "constraint",
            "-J": "job",
            "-o": "output",
            "-e": "error",
            "--mail-type": "mail",
            "--mail-user": "mail",
            "--sbatch": "'",
        }
        assert names[flag] in out.lower() or flag in out, (flag, value, out)
