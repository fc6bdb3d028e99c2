"""litgpt's fine-tuning loop by release and snapshot date (marp/framework_facts.py): lit-gpt's 2023 scripts ran the
longest sample first, so the step that sets the peak follows no step and nothing of a previous graph (its output,
bitsandbytes' 4-bit matmul inputs kept on ctx) is alive at the end of its forward; the StableEmbedding swap under
bitsandbytes came with 0.5.0. A row's stated date before litgpt's first release names the snapshot."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.units import GiB
from frenzy_slurm.eval import reading
from frenzy_slurm.eval.dataset import MeasuredRow, interpret_row
from frenzy_slurm.jobspec import ResolvedModel, resolve_model
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.framework_facts import litgpt_longest_first, litgpt_stable_embedding
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.memory_job import job
from frenzy_slurm.marp.memory_loss import previous_output
from frenzy_slurm.marp.plan import ParallelPlan

from .helpers import load_benchmark, make_spec
from .test_eval_reading import ROW

# Llama 2 7B's shapes (the lit-gpt resource tables' model)
LLAMA2_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008, "vocab": 32000}
LONGEST = 1304  # the longest Alpaca sample under Llama 2's tokenizer (lit-gpt tutorials/resource-tables.md)


def _qlora(version: str | None = None, lengths: str = "variable"):
    entry: dict[str, object] = {"trainer": "script", "script": "finetune/lora.py", "framework": "litgpt"}
    if version:
        entry["framework_version"] = version
    data = {"lengths": "variable", "longest": LONGEST} if lengths == "variable" else {}
    return make_spec(
        entry=entry,
        model={"arch": LLAMA2_7B},
        training={
            "seq_len": LONGEST,
            "global_batch": 128,
            "steps": 100,
            "precision": "bf16-pure",
            "method": "qlora",
            "lora": {"rank": 8, "targets": ["q", "v"]},
        },
        data=data,
    )


def _workload(spec):
    return workload_from_spec(spec, ResolvedModel(arch=resolve_model(spec, ".").arch, name="llama"))


@pytest.mark.parametrize(
    ("version", "first"),
    [
        (None, False),  # the newest release described: a shuffled DataLoader
        ((0, 5, 13), False),
        ((0, 2, 0), False),  # the first release came after the data refactor
        ((2023, 6, 20), False),
        ((2023, 6, 21), True),  # fa5d73e3 (#184): "force the longest sample at the beginning"
        ((2023, 10, 16), True),  # 8641822, the resource tables' commit
        ((2024, 2, 28), True),
        ((2024, 2, 29), False),  # 73baa2d5 (#950): the scripts move onto a DataLoader
    ],
)
def test_lit_gpt_ran_the_longest_sample_first_from_2023_06_21_to_2024_02_29(version, first):
    assert litgpt_longest_first(version) is first


@pytest.mark.parametrize(
    ("version", "swapped"),
    [
        (None, True),
        ((0, 5, 13), True),
        ((0, 5, 0), True),
        ((0, 4, 10), False),
        ((2023, 10, 16), False),
        ((2024, 10, 3), False),
        ((2024, 10, 4), True),  # ae798aba (#1770)
    ],
)
def test_the_stable_embedding_swap_came_with_0_5(version, swapped):
    assert litgpt_stable_embedding(version) is swapped


def test_the_2023_loop_keeps_no_previous_step_at_the_peak():
    old = _workload(_qlora("2023.10.16"))
    new = _workload(_qlora())
    assert (old.loss.keeps_previous_output, old.adapters.bnb_stable_embedding) == (False, False)
    assert (new.loss.keeps_previous_output, new.adapters.bnb_stable_embedding) == (True, True)
    # with fixed lengths every step is as long, so the second step's forward still ends beside the first's graph
    assert _workload(_qlora("2023.10.16", lengths="fixed")).loss.keeps_previous_output is True


def test_the_previous_graph_s_4bit_inputs_and_output_in_bytes():
    """bitsandbytes up to 0.43.1 (0.41.1 in the tables) kept each 4-bit matmul's input on ctx.tensors: q/k/v's, the
    attention output's, the MLP's and the down projection's, 2 bytes each per token, plus lm_head's input; Fabric's
    fp32 logits. At 1304 tokens: 1.82 GiB of inputs and 0.155 GiB of logits the 2023 loop does not hold."""
    plan = ParallelPlan(dp=1, micro_batch=1, grad_accum=128)
    h, ffn, v, layers = LLAMA2_7B["hidden"], LLAMA2_7B["ffn"], LLAMA2_7B["vocab"], LLAMA2_7B["layers"]
    new = job(_workload(_qlora()), plan)
    out16, prev_logits, prev_inputs = previous_output(new, 0, layers, 1.0)
    assert prev_inputs == pytest.approx((layers * (3 * h + ffn) + h) * 2.0 * LONGEST)
    assert prev_inputs / GiB == pytest.approx(1.821, abs=1e-3)
    assert prev_logits == out16 == pytest.approx(4.0 * v * LONGEST)
    old = job(_workload(_qlora("2023.10.16")), plan)
    assert previous_output(old, 0, layers, 1.0)[1:] == (0.0, 0.0)


def test_the_2023_peak_drops_by_the_previous_graph_and_the_stable_embedding():
    plan = ParallelPlan(dp=1, micro_batch=1, grad_accum=128)
    old = estimate_memory(_workload(_qlora("2023.10.16")), plan).stages[-1]
    new = estimate_memory(_workload(_qlora()), plan).stages[-1]
    h, v = LLAMA2_7B["hidden"], LLAMA2_7B["vocab"]
    # the previous graph's 4-bit matmul inputs; the StableEmbedding's fp32 LayerNorm input (4 h a token) and what
    # the first block keeps once its input needs a gradient (its norm's fp32 input and the saved input, 7 h: without
    # the swap LoRA's frozen embedding feeds it); its never freed gradient (buffers)
    assert new.activations - old.activations == pytest.approx(
        (32 * (3 * h + 11008) + h) * 2.0 * LONGEST + 11.0 * h * LONGEST, rel=1e-6
    )
    assert new.buffers - old.buffers == pytest.approx(2.0 * v * h)  # (a bf16 gradient under bf16-true)
    assert (new.peak - old.peak) / GiB == pytest.approx(2.32, abs=0.01)


def _litgpt_row(source: str) -> MeasuredRow:
    """A row as the dev set writes the lit-gpt resource tables' QLoRA runs."""
    raw = ROW | {
        "category": "QLoRA",
        "model": "Llama-2-7B",
        "params_B": "6.74",
        "layers": "32",
        "hidden": "4096",
        "heads": "32",
        "kv_heads": "32",
        "ffn": "11008",
        "vocab": "32000",
        "tied_emb": "no",
        "seq_len": "1304 (longest Alpaca sample for this tokenizer; batches padded to longest)",
        "micro_batch": "1",
        "grad_accum_or_global_batch": "minibatch 128 (grad accumulation)",
        "num_gpus": "1",
        "precision": "bf16-true",
        "optimizer": "AdamW (LoRA params)",
        "parallelism": "single GPU",
        "sharding_offload": "",
        "attention_impl": "SDPA",
        "other_settings": "finetune/lora.py, LoRA r=8 on query+value; quantization=bnb.nf4",
        "source": source,
    }
    return MeasuredRow("L1", "QLoRA", "medium", raw["model"], 14.0, raw)


def test_a_lit_gpt_row_is_versioned_by_the_date_it_states_before_the_first_release():
    assert reading.stated_us_date("tables (10/20/2023, lit-gpt commit 8641822)") == (2023, 10, 20)
    assert reading.stated_us_date("no date, 8641822/2023") is None
    old = interpret_row(_litgpt_row("https://github.com/Lightning-AI/litgpt/blob/main/x.md (10/20/2023, lit-gpt)"))
    later = interpret_row(_litgpt_row("https://github.com/Lightning-AI/litgpt/blob/main/x.md (2024-06-01)"))
    bare = interpret_row(_litgpt_row("https://github.com/Lightning-AI/litgpt/blob/main/config_hub/README.md"))
    assert old.spec.entry.framework == "litgpt"
    assert old.spec.entry.framework_version == "2023.10.20"
    assert (old.workload.loss.keeps_previous_output, old.workload.adapters.bnb_stable_embedding) == (False, False)
    # a date after the first release names no release: the newest described
    assert later.spec.entry.framework_version is None and bare.spec.entry.framework_version is None


# one Llama-style MHA block of lit-gpt 8641822's LoRA model (r=8 on q and v, dropout 0.05, bf16, fp32 cos/sin as
# train() rebuilds them), hidden 256, 4 heads, FFN 688, 2 x 64 tokens: bytes per token saved for backward, measured
# on the CPU by `python benchmarks/litgpt_2023_block_cpu.py SRC` (SRC: `git archive 8641822 lit_gpt`), torch 2.13
LIT_GPT_8641822_BLOCK_CPU = 10356


def test_the_2023_lora_block_saves_what_the_snapshot_saved_on_the_cpu():
    """MARP's side of the benchmark (its model.yaml for the snapshot's block, planned by the product's path)."""
    pytest.importorskip("torch")
    bench = load_benchmark("litgpt_2023_block_cpu")
    per_token = bench._predicted(bench.HEADS, "cpu")
    assert per_token == pytest.approx(LIT_GPT_8641822_BLOCK_CPU, rel=0.01)  # 10320: -0.3 %
