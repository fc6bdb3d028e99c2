"""Every input file (model.yaml, a site file, a snapshot) must be a small regular UTF-8 file: a device, a FIFO,
an oversized file, an alias bomb, deep nesting or an unreadable value is refused at once (exit 2), naming the
file (and line). docs/security.md states the trust model these tests hold."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec import load_job_spec

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = ROOT / "examples"

GOOD = (EXAMPLES / "tiny-cpu.yaml").read_text()


def _input_error(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    return exc.value.message


# --- files that are not small regular UTF-8 files -------------------------------------------------------


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_device_as_model_yaml_is_refused_at_once(device):
    t0 = time.monotonic()
    msg = _input_error(load_job_spec, Path(device))
    assert time.monotonic() - t0 < 2
    assert device in msg and "not a regular file" in msg


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "model.yaml"
    os.mkfifo(fifo)  # no writer: a plain open() would block forever
    assert "FIFO" in _input_error(load_job_spec, fifo)


def test_oversized_file_is_refused(tmp_path):
    big = tmp_path / "model.yaml"
    big.write_text(GOOD + "#" * (2 << 20) + "\n")
    msg = _input_error(load_job_spec, big)
    assert str(big) in msg and "bytes" in msg


def test_alias_bomb_is_refused_fast(tmp_path):
    """Nine levels of nine aliases: 1 KB on disk, 387 million strings expanded."""
    text = 'a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for i in range(1, 10):
        text += f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n"
    bomb = tmp_path / "model.yaml"
    bomb.write_text(text)
    t0 = time.monotonic()
    msg = _input_error(load_job_spec, bomb)
    assert time.monotonic() - t0 < 2
    assert f"{bomb}:" in msg and "aliases" in msg


def test_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "model.yaml"
    path.write_text("name: &a [*a]\n")  # PyYAML composes this into a cycle
    assert "recursive structure" in _input_error(load_job_spec, path)


def test_alias_bomb_reached_from_later_siblings_is_counted(tmp_path):
    """Shared nodes are counted once per reference however the document orders them."""
    text = "x0: &x0 [" + ", ".join(["lol"] * 50) + "]\n"
    for i in range(1, 5):
        text += f"y{i}: [&x{i} [{', '.join([f'*x{i - 1}'] * 50)}], *x{i}]\n"
    path = tmp_path / "model.yaml"
    path.write_text(text)
    assert "expand to more than" in _input_error(load_job_spec, path)


def test_moderate_aliases_still_work(tmp_path):
    """Anchors for repeated blocks are legitimate YAML; only expansion beyond the cap is refused."""
    path = tmp_path / "model.yaml"
    path.write_text(GOOD.replace("training:\n", "training: &t\n") + "x-copy: *t\n".replace("x-copy", "#x"))
    assert load_job_spec(path).name == "tiny-cpu"


@pytest.mark.parametrize("depth,needle", [(100, "nested more than"), (5000, "nested too deeply")])
def test_deep_nesting_is_an_input_error(tmp_path, depth, needle):
    path = tmp_path / "model.yaml"
    path.write_text("name: " + "[" * depth + "]" * depth + "\n")
    assert needle in _input_error(load_job_spec, path)


@pytest.mark.parametrize(
    "raw,needle",
    [
        (b"name: caf\xe9\n", ":1: the file is not UTF-8"),
        (b"name: x\nmodel:\n  preset: a\x00b\n", ":3: the file contains a NUL byte"),
        (b"name: x\nlimits:\n  deadline: 2026-13-45\n", ":3: a value cannot be read"),
        (b"name: x\ntraining:\n  seq_len: " + b"9" * 5000 + b"\n", ":3: a value cannot be read"),
        (b"name: x\x01\n", ":1: not valid YAML"),
    ],
)
def test_unreadable_values_name_file_and_line(tmp_path, raw, needle):
    path = tmp_path / "model.yaml"
    path.write_bytes(raw)
    msg = _input_error(load_job_spec, path)
    assert f"{path}{needle}" in msg


def _run(prog: str, *args: str, env: dict | None = None):
    import subprocess
    import sys

    module = {"fsbatch": "fsbatch", "fsqueue": "fsqueue", "frenzy-slurm": "admin"}[prog]
    code = f"import sys; from frenzy_slurm.cli.{module} import main; sys.argv[0] = {prog!r}; main()"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A synthetic cluster as a static snapshot plus its site file: fsbatch without Slurm."""
    import yaml

    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    pools = [("a100", "A100-40GB", 2, 4), ("v100", "V100-32GB", 2, 8), ("t4", "T4", 4, 4)]
    d = tmp_path_factory.mktemp("offline")
    (d / "snap.json").write_text(synthetic(pools).model_dump_json())
    (d / "site.yaml").write_text(yaml.safe_dump(synthetic_site(pools).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(d / "snap.json"), "--site", str(d / "site.yaml")]


@pytest.mark.parametrize("which", ["--site", "--snapshot"])
def test_device_as_site_file_or_snapshot_is_refused(offline, tmp_path, which):
    args = list(offline)
    args[args.index(which) + 1] = "/dev/zero"
    res = _run("fsbatch", str(EXAMPLES / "tiny-cpu.yaml"), "--dry-run", *args, "--job-dir", str(tmp_path / "job"))
    assert res.returncode == 2 and "/dev/zero" in res.stderr and "not a regular file" in res.stderr, res.stderr
