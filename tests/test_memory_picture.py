"""`frenzy-slurm memory --plan`: the breakdown as a terminal bar and, with --plot, as an image."""

from __future__ import annotations

import pytest

from frenzy_slurm.cli.memory_picture import terminal_bars
from frenzy_slurm.jobspec import presets
from frenzy_slurm.marp import ParallelPlan, Workload, estimate_memory

from .helpers import EXAMPLES, run_cli


def test_bar_lengths_follow_the_peaks():
    w = Workload.of(arch=presets()["llama-3.2-1b"].arch, seq_len=2048)
    est = estimate_memory(w, ParallelPlan(dp=2, pp=2, zero=1, micro_batch=2, grad_accum=8), "device")
    text = terminal_bars(est, width=50, colour=False)
    lines = text.splitlines()
    assert len(lines) == 3 and lines[0].startswith("stage 0") and "weights" in lines[2]
    filled = [sum(line.count(g) for g in "█▓▒░≡:·") for line in lines[:2]]
    peaks = [s.peak for s in est.stages]
    assert max(filled) == 50  # the largest stage spans the bar
    assert filled[1] == round(50 * peaks[1] / max(peaks)) or filled[0] == round(50 * peaks[0] / max(peaks))
    # a usable-memory mark beyond the peak is drawn as '|'
    assert "|" in terminal_bars(est, width=50, usable_gib=2 * est.peak_gib, colour=False).splitlines()[0]


def test_memory_plot_writes_an_image(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "mem.png"
    res = run_cli(
        "frenzy-slurm",
        "memory",
        str(EXAMPLES / "llama2-7b.yaml"),
        "--plan",
        "dp=8,zero=1,mb=2",
        "--gpu",
        "A100-80GB",
        "--plot",
        str(out),
    )
    assert res.returncode == 0, res.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000
    assert "█" in res.stdout and "usable" in res.stdout


def test_plot_needs_a_plan(tmp_path):
    res = run_cli("frenzy-slurm", "memory", str(EXAMPLES / "llama2-7b.yaml"), "--plot", str(tmp_path / "m.png"))
    assert res.returncode == 2 and "--plan" in res.stderr and "Traceback" not in res.stderr
