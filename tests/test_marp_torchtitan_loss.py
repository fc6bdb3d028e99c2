"""torchtitan's loss and per-op checkpointing as its releases run them: the loss compiled with the blocks only from
0.1.0 (2025-04-02 as a snapshot date), the compiled per-op saved set, a compiled loss's 16-bit input and gradient,
and DTensor's loss_parallel backward under tensor parallelism (marp/framework_facts.py, marp/memory_loss.py,
marp/memory_activations.py op_checkpointed_bytes; docs/marp.md "Logits and loss")."""

from __future__ import annotations

import pytest

from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import MeasuredRow, interpret_row
from frenzy_slurm.jobspec import ResolvedModel, resolve_model
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.framework_facts import torchtitan_compiles_loss
from frenzy_slurm.marp.frameworks import default_compile_loss, profile_summary
from frenzy_slurm.marp.memory_activations import op_checkpointed_bytes
from frenzy_slurm.marp.memory_loss import logit_bytes_per_token

from .helpers import make_spec
from .test_eval_reading import ROW

# Llama 3.1 8B's shapes (the torchtitan benchmark's model)
LLAMA8 = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336, "vocab": 128256}


def _titan(version: str | None = None, **over):
    entry: dict[str, object] = {"trainer": "script", "script": "train.py", "framework": "torchtitan"}
    if version:
        entry["framework_version"] = version
    over.setdefault("training__compile", True)
    over.setdefault("training__loss_chunks", 1)
    return make_spec(entry=entry, model={"arch": LLAMA8}, parallel={"sharding": "full-shard"}, **over)


def _workload(spec):
    return workload_from_spec(spec, ResolvedModel(arch=resolve_model(spec, ".").arch, name="llama"))


@pytest.mark.parametrize(
    ("version", "compiled"),
    [
        (None, True),  # the newest release described (0.3)
        ((0, 3, 0), True),
        ((0, 1, 0), True),  # version.txt 0.1.0 from b461ea82c (2025-06-05)
        ((0, 0, 2), False),  # 2024-04-16 .. 2025-06-04: most of its snapshots leave the loss eager
        ((2024, 12, 26), False),  # 9dec370: `loss_fn = torch.compile(loss_fn)` commented out
        ((2025, 4, 1), False),
        ((2025, 4, 2), True),  # bbb1b616e: build_cross_entropy_loss compiles it with training.compile
        ((2025, 6, 11), True),  # e7c0cae
    ],
)
def test_torchtitan_compiles_its_loss_from_0_1_or_2025_04_02(version, compiled):
    assert torchtitan_compiles_loss(version) is compiled


def test_the_profile_default_follows_the_version_and_model_yaml_wins():
    assert default_compile_loss(_titan()) is True
    assert default_compile_loss(_titan("2024.12.26")) is False
    assert profile_summary(_titan("0.0.2"))["defaults_taken"]["training.compile_loss"] is False  # type: ignore[index]
    assert _workload(_titan("2024.12.26")).loss.compile_loss is False
    assert _workload(_titan("2024.12.26", training__compile_loss=True)).loss.compile_loss is True
    # other frameworks keep their profile's fixed default
    spec = make_spec(entry={"trainer": "script", "script": "train.py", "framework": "torch"}, training__compile=True)
    assert default_compile_loss(spec) is True


def test_loss_bytes_per_logit_eager_compiled_and_loss_parallel():
    v = LLAMA8["vocab"]
    eager = _workload(_titan("2024.12.26"))
    compiled = _workload(_titan("0.3.0"))
    # eager: saved fp32 log-softmax output and the two fp32 gradients of its backward
    assert logit_bytes_per_token(eager, 1) == pytest.approx(12.0 * v)
    # compiled: the loss graph saves the 16-bit logits it is given and writes their 16-bit gradient
    assert logit_bytes_per_token(compiled, 1) == pytest.approx(4.0 * v)
    # DTensor's loss_parallel (tp 8, vocab-sharded): the saved output, zeros_like, (zeros + exp(x)) and the product
    assert logit_bytes_per_token(eager, 8) == pytest.approx(16.0 * v / 8)
    assert logit_bytes_per_token(compiled, 8) == pytest.approx(4.0 * v / 8)


def test_compiled_per_op_set_drops_the_down_projection_output():
    h, kv, f = 4096, 1024, 14336
    eager = _workload(_titan("0.3.0", training__compile=False))
    compiled = _workload(_titan("0.3.0"))
    base = 2 * h + 2 * h + 4 * 32  # block input (bf16 parameters, no autocast), attention output, log-sum-exp
    # the kept matmuls alternate between steps: q, v, gate, down / k, o, up; the peak holds the larger
    assert op_checkpointed_bytes(eager, 1, False, False) == pytest.approx(base + 2 * (h + kv + f + h))
    # compiled, the down projection's output (into the residual sum, read by no backward op) is not saved:
    # q, v, gate (19456 elements) and k, o, up (19456) are level
    assert op_checkpointed_bytes(compiled, 1, False, False) == pytest.approx(base + 2 * (kv + h + f))
    assert op_checkpointed_bytes(eager, 1, False, False) - op_checkpointed_bytes(
        compiled, 1, False, False
    ) == pytest.approx(2 * h)


@pytest.mark.parametrize(
    ("text", "date"),
    [
        ("https://github.com/pytorch/torchtitan/blob/main/benchmarks/llama3_h100_202412_torchtitan.md", (2024, 12, 1)),
        ("benchmarks/llama3_8b_h200_2025-06_torchtitan.md", (2025, 6, 1)),
        ("run of 2024-12-26, reported 2025-01", (2024, 12, 26)),  # a whole date wins
        ("8192 tokens, 131072 global", None),  # not a month
        ("no date", None),
    ],
)
def test_stated_month(text, date):
    assert reading.stated_month(text) == date


def _titan_row(source: str) -> MeasuredRow:
    raw = ROW | {
        "parallelism": "DP(FSDP)=8",
        "num_gpus": "8",
        "grad_accum_or_global_batch": "",
        "sharding_offload": "FSDP2 full shard over 8",
        "other_settings": "torchtitan",
        "compile": "yes",
        "metric_type": "max_reserved",
        "source": source,
    }
    return MeasuredRow("T3", "pretraining", "medium", "GPT-2 medium", 20.0, raw)


def test_a_torchtitan_row_is_versioned_by_the_month_it_states():
    old = interpret_row(_titan_row("https://github.com/pytorch/torchtitan/blob/main/benchmarks/x_202412_y.md"))
    new = interpret_row(_titan_row("https://github.com/pytorch/torchtitan/blob/main/benchmarks/x_2025-06_y.md"))
    bare = interpret_row(_titan_row("https://github.com/pytorch/torchtitan/blob/main/docs/performance.md"))
    assert (old.spec.entry.framework_version, old.workload.loss.compile_loss) == ("2024.12.1", False)
    assert (new.spec.entry.framework_version, new.workload.loss.compile_loss) == ("2025.6.1", True)
    assert (bare.spec.entry.framework_version, bare.workload.loss.compile_loss) == (None, True)


def test_loss_parallel_backward_holds_four_fp32_logit_tensors_on_the_cpu():
    """benchmarks/loss_parallel_cpu.py: torchtitan's eager loss on bf16 logits, plain and under DTensor's
    loss_parallel on a one-rank gloo mesh, peak per logit from the profiler's allocator events."""
    import os
    import re
    import socket
    import subprocess
    import sys
    from pathlib import Path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = Path(__file__).resolve().parent.parent / "benchmarks" / "loss_parallel_cpu.py"
    env = os.environ | {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300).stdout
    measured = dict(re.findall(r"^(\w+)\s+peak .*= +([\d.]+) bytes per logit", out, re.M))
    assert float(measured["plain"]) == pytest.approx(12.0, abs=0.1)  # MARP's eager loss
    assert float(measured["loss_parallel"]) == pytest.approx(16.0, abs=0.5)  # MARP's loss_parallel
