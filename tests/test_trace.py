"""The tracing path: exact counts on the meta device, and the analytic model against a fake-tensor step."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="tracing needs torch (pip install -e '.[dev]')")

from frenzy_slurm.jobspec import load_job_spec, resolve_model  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import ParallelPlan, Workload, estimate_memory, with_exact_params  # noqa: E402
from frenzy_slurm.marp.params import count_params  # noqa: E402
from frenzy_slurm.marp.trace import count_factory_parameters, fake_step_peak  # noqa: E402

from .helpers import ROOT  # noqa: E402


def test_meta_count_matches_analytic():
    from tests.tiny_factory import build

    n = count_factory_parameters("tests.tiny_factory:build", {"layers": 3})
    assert n == sum(p.numel() for p in build(3).parameters())
    a = Architecture(layers=3, hidden=64, heads=4, kv_heads=2, ffn=172, vocab=256, max_positions=128)
    assert n == count_params(a).total(a.layers)


def test_factory_spec_resolves_exact_count(write_yaml, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    path = write_yaml("""\
name: traced
model:
  factory: tests.tiny_factory:build
  factory_kwargs: {layers: 2}
  factory_arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    spec = load_job_spec(path)
    model = with_exact_params(spec, resolve_model(spec, path.parent))
    assert model.exact_params == count_params(model.arch).total(2)


@pytest.mark.slow
@pytest.mark.parametrize(
    "arch,seq,mb",
    [
        (Architecture(layers=4, hidden=256, heads=8, kv_heads=4, ffn=688, vocab=1024, max_positions=512), 128, 2),
        (Architecture(layers=4, hidden=256, heads=8, kv_heads=4, ffn=688, vocab=1024, max_positions=512), 256, 4),
        (
            Architecture(
                layers=2,
                hidden=128,
                heads=4,
                ffn=512,
                activation="gelu",
                vocab=512,
                norm="layernorm",
                position="learned",
                tied_embeddings=True,
                max_positions=256,
            ),
            256,
            4,
        ),
    ],
    ids=["llama-small", "llama-longer", "gpt2-style"],
)
def test_analytic_matches_fake_tensor_step(arch, seq, mb):
    traced = fake_step_peak(arch, seq, mb)["Total"]
    # the built-in model on the CPU: composite RMSNorm, eager rotary embedding with per-block cos/sin
    w = Workload.of(
        arch=arch,
        seq_len=seq,
        precision="fp32",
        attention="sdpa",
        framework="torch",
        fused_optimizer=True,
        norm_upcast=arch.norm == "rmsnorm",
        unfused_rope=True,
        rope_tables_per_layer=True,
    )
    predicted = estimate_memory(w, ParallelPlan(micro_batch=mb), "allocated").peak
    # never more than 5% under the traced peak; over-prediction bounded too
    assert 0.95 <= predicted / traced <= 1.2, (predicted, traced)
