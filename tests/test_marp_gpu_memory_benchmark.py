"""benchmarks/gpu_memory.py: the script a lent GPU runs. Without one it must exit 0 saying so; its points and
predictions are checked here on the CPU, and its predictions must be what `frenzy-slurm memory` prints."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from .helpers import load_benchmark

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_memory.py"
gm = load_benchmark("gpu_memory")


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(_cuda(), reason="a GPU is here: the script would measure")
def test_without_a_gpu_it_exits_0_and_says_so():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--points", "ds-llama-1gpu"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert "nothing measured" in out.stdout
    assert "no GPU found" in out.stdout or "torch is not installed" in out.stdout


def test_points_are_one_gpu_grid_points_scaled_to_a_gpu():
    points = gm.load_points()
    assert [p["name"] for p in points] == list(gm.DEFAULT_POINTS)
    for p in points:
        assert len({r["rank"] for r in p["ranks"]}) == 1  # one GPU
        spec = gm.scaled_spec(p)
        assert spec["model"]["arch"]["hidden"] == gm.GPU_ARCH["hidden"]
        assert spec["training"]["seq_len"] == gm.GPU_SEQ
        for key in ("precision", "optimizer", "attention", "micro_batch", "global_batch"):
            assert spec["training"][key] == p["spec"]["training"][key]
        assert spec["entry"] == p["spec"]["entry"]
        assert gm.scaled_spec(p, "grid")["model"] == p["spec"]["model"]
        gm.runner_of(p)  # each has a runner
    gpt2 = gm.scaled_spec(gm.load_points(("ds-gpt2-1gpu",))[0])["model"]["arch"]
    assert gpt2["norm"] == "layernorm" and gpt2["kv_heads"] == gpt2["heads"]
    with pytest.raises(KeyError, match="not Llama-style"):
        gm.runner_of(gm.load_points(("hf-trainer-gpt2-1gpu",))[0])
    with pytest.raises(KeyError, match="no-such-point not in"):
        gm.load_points(("no-such-point",))


def test_unknown_point_is_refused_with_exit_2():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--points", "nope", "--predict-only"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and "nope not in" in out.stderr


@pytest.mark.parametrize("name", gm.DEFAULT_POINTS)
def test_predictions_are_what_frenzy_slurm_memory_prints(name, tmp_path):
    from frenzy_slurm.cli.admin import main

    spec = gm.scaled_spec(gm.load_points((name,))[0])
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(spec))
    (tmp_path / "train.py").write_text("print('train')\n")
    pred = gm.predict(spec)
    assert pred["allocated"] < pred["reserved"] < pred["device"]
    for metric in gm.METRICS:
        out = CliRunner().invoke(main, ["memory", str(path), "--world", "1", "--metric", metric, "--json"])
        assert out.exit_code == 0, out.output
        printed = json.loads(out.stdout if hasattr(out, "stdout") else out.output)
        assert printed["peak_gib"] == pytest.approx(pred[metric], rel=1e-12), metric


@pytest.mark.slow
def test_dry_run_on_the_cpu_trains_the_points():
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--size", "grid", "--steps", "1", "--points",
         "hf-trainer-llama-1gpu", "ds-llama-1gpu"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith(("hf-trainer-llama-1gpu ", "ds-llama-1gpu "))]
    assert len(lines) == 2 and all("ran (the CPU" in line for line in lines), out.stdout


def test_a_recorded_trace_is_replayed_through_the_allocator_replayer():
    """On a GPU each point's recorded allocator events go through MARP's replayer: the hand-made snapshot of
    tests/data, whose own segment events peak at 40 MiB reserved, replays to the same peak."""
    snapshot = json.loads((ROOT / "tests" / "data" / "allocator_trace_small.json").read_text())
    got = gm.replay_figures(snapshot)
    assert got["replay_reserved"] == pytest.approx(40 / 1024)
    assert 0 < got["replay_allocated"] <= got["replay_reserved"]
    missing = gm.replay_figures({"device_traces": []})
    assert missing["replay_reserved"] != missing["replay_reserved"]  # nan: no trace for that device
