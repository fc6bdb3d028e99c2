"""MARP formulas against hand-computed values, and the properties any memory model must have."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import catalog
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import presets
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import GpuOption, ParallelPlan, Workload, estimate_memory, parse_plan, search
from frenzy_slurm.marp.memory import _layer_activation_bytes

LLAMA7 = presets()["llama-2-7b"].arch
GPT3ISH = Architecture(
    layers=24,
    hidden=2048,
    heads=16,
    ffn=8192,
    activation="gelu",
    vocab=50257,
    norm="layernorm",
    position="learned",
    bias="all",
    dropout=0.1,
    max_positions=2048,
)


def test_korthikanti_activation_formula():
    # GPT-3 style block, 16-bit, eager attention, dropout: s*b*h*(34 + 5*a*s/h) bytes per layer
    s = 2048
    w = Workload.of(arch=GPT3ISH, seq_len=s, attention="eager")
    per_token = _layer_activation_bytes(w, tp=1, sp=False, recompute="none")
    assert per_token == pytest.approx(GPT3ISH.hidden * (34 + 5 * GPT3ISH.heads * s / GPT3ISH.hidden))


def test_korthikanti_tensor_parallel_formulas():
    s, h, a, t = 2048, GPT3ISH.hidden, GPT3ISH.heads, 4
    w = Workload.of(arch=GPT3ISH, seq_len=s, attention="eager")
    assert _layer_activation_bytes(w, t, False, "none") == pytest.approx(h * (10 + 24 / t + 5 * a * s / (h * t)))
    assert _layer_activation_bytes(w, t, True, "none") == pytest.approx(h * (34 + 5 * a * s / h) / t)
    # selective recomputation drops exactly the attention-score terms
    assert _layer_activation_bytes(w, 1, False, "selective") == pytest.approx(34 * h)
    # flash attention: no s x s terms, output + log-sum-exp instead of scores
    wf = Workload.of(arch=GPT3ISH, seq_len=s, attention="flash")
    assert _layer_activation_bytes(wf, 1, False, "none") == pytest.approx(34 * h + 4 * a)


def test_bytes_per_parameter_by_precision():
    base = dict(arch=LLAMA7, seq_len=1, framework="torch", fused_optimizer=True, optimizer="adamw")
    n = 6_738_415_616
    plan = ParallelPlan(micro_batch=1)

    def states(precision):
        st = estimate_memory(Workload.of(precision=precision, **base), plan, "allocated").stages[0]
        return (st.weights + st.optimizer) / n

    assert states("fp32") == pytest.approx(12.0)  # 4 weights + 8 Adam (grads counted separately)
    assert states("bf16-pure") == pytest.approx(6.0)
    ds = estimate_memory(Workload.of(arch=LLAMA7, seq_len=1, precision="bf16-mixed"), plan, "allocated").stages[0]
    # DeepSpeed mixed precision: 2 (bf16 weights) + 4 master + 8 Adam + 4 fp32 grad accumulation
    assert (ds.weights + ds.optimizer) / n == pytest.approx(18.0)
    assert ds.gradients / n == pytest.approx(2.0)


def test_a_checkpoint_holds_the_trained_weights_their_master_and_their_optimizer_states():
    from frenzy_slurm.marp.memory_states import checkpoint_bytes

    n = 6_738_415_616
    torch = dict(arch=LLAMA7, seq_len=1, framework="torch", fused_optimizer=True, optimizer="adamw")
    # what the step holds and the checkpoint does not: DeepSpeed's fp32 gradient accumulation buffer
    assert checkpoint_bytes(Workload.of(arch=LLAMA7, seq_len=1, precision="bf16-mixed")) / n == pytest.approx(14.0)
    assert checkpoint_bytes(Workload.of(precision="fp32", **torch)) / n == pytest.approx(12.0)  # no separate master
    assert checkpoint_bytes(Workload.of(precision="bf16-pure", **torch)) / n == pytest.approx(6.0)
    # LoRA: the adapters and their states, not the frozen weights (every start reads those from the base model)
    lora = checkpoint_bytes(Workload.of(precision="bf16-pure", method="lora", lora_rank=16, **torch))
    adapters = 32 * 2 * 16 * 2 * 4096  # rank 16 on q and v (the default) of 32 layers: A and B, 4096 x 16 each
    assert lora == pytest.approx(adapters * 6.0, rel=0.01) and lora < n * 0.01


def test_zero_stages_shard_what_they_should():
    w = Workload.of(arch=LLAMA7, seq_len=2048)
    n = 6_738_415_616
    # gradient accumulation keeps the gradients through the forward pass, so the peak moment shows them
    st = {z: estimate_memory(w, ParallelPlan(dp=8, zero=z, grad_accum=2), "allocated").stages[0] for z in (1, 2, 3)}
    assert st[1].optimizer / n == pytest.approx(12 / 8)
    assert st[1].gradients / n == pytest.approx(2.0)
    assert st[2].gradients / n == pytest.approx(2 / 8)
    assert st[3].weights / n == pytest.approx(2 / 8)


def _peak(w, **plan):
    return estimate_memory(w, ParallelPlan(**plan), "device").peak


@pytest.mark.parametrize(
    "arch", [LLAMA7, GPT3ISH, presets()["llama-3.2-1b"].arch], ids=["llama7b", "gpt3ish", "llama1b"]
)
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed", "bf16-pure"])
def test_monotonic_properties(arch, precision):
    w = Workload.of(arch=arch, seq_len=2048, precision=precision)
    # more ZeRO sharding never costs memory at fixed micro-batch
    z = [_peak(w, dp=8, zero=k, micro_batch=2) for k in (0, 1, 2, 3)]
    assert z == sorted(z, reverse=True)
    # more GPUs never costs memory at fixed micro-batch, for every sharding degree
    for kind in ("dp", "tp", "pp"):
        vals = []
        # (from 1 GPU to ZeRO the optimizer gains its fp32 partition and the buckets: dp starts at 2)
        for g in (2, 4, 8) if kind == "dp" else (1, 2, 4, 8):
            kw = {kind: g, "micro_batch": 2}
            if kind == "dp":
                kw["zero"] = 3 if g > 1 else 0
            if kind == "pp":
                kw["grad_accum"] = 8
            vals.append(_peak(w, **kw))
        assert vals == sorted(vals, reverse=True), (kind, vals)
    # never shrinks with sequence length or micro-batch; grows once activations set the peak (sharded states)
    for plan in (dict(), dict(dp=8, zero=3)):
        seqs = [
            _peak(Workload.of(arch=arch, seq_len=s, precision=precision), micro_batch=1, **plan)
            for s in (512, 1024, 2048, 4096, 8192)
        ]
        assert seqs == sorted(seqs)
        mbs = [_peak(w, micro_batch=m, **plan) for m in (1, 2, 4, 8, 16)]
        assert mbs == sorted(mbs)
    assert seqs[0] < seqs[-1] and mbs[0] < mbs[-1]
    # recomputation saves activation memory
    assert _peak(w, micro_batch=4, recompute="full") < _peak(w, micro_batch=4)


def test_pipeline_first_stage_holds_pp_microbatches():
    w = Workload.of(arch=LLAMA7, seq_len=4096)
    est = estimate_memory(w, ParallelPlan(pp=4, micro_batch=4, grad_accum=16), "allocated")
    acts = [s.activations for s in est.stages]
    assert acts[0] > acts[1] > acts[2]
    assert est.stages[0].activations / est.stages[2].activations == pytest.approx(4 / 2, rel=0.05)
    assert all(s.phase == "backward-start" for s in est.stages)
    assert est.stages[-1].logits > 0 and est.stages[0].logits == 0


def test_lora_and_qlora_reduce_memory():
    full = Workload.of(arch=LLAMA7, seq_len=1024, precision="bf16-pure")
    lora = full.with_(method="lora")
    qlora = full.with_(method="qlora")
    p = dict(micro_batch=1)
    assert _peak(qlora, **p) < _peak(lora, **p) < _peak(full, **p)
    q = estimate_memory(qlora, ParallelPlan(), "allocated").stages[0]
    assert q.weights / 6.74e9 == pytest.approx(0.6, abs=0.1)  # ~4 bits linear + bf16 embeddings


def test_gqa_and_swiglu_change_activations():
    mha = Architecture(layers=2, hidden=4096, heads=32, ffn=11008, vocab=32000)
    gqa = mha.model_copy(update={"kv_heads": 8})
    gelu = mha.model_copy(update={"activation": "gelu"})
    w = dict(seq_len=1024)
    assert _layer_activation_bytes(Workload.of(arch=gqa, **w), 1, False, "none") < _layer_activation_bytes(
        Workload.of(arch=mha, **w), 1, False, "none"
    )
    assert _layer_activation_bytes(Workload.of(arch=gelu, **w), 1, False, "none") < _layer_activation_bytes(
        Workload.of(arch=mha, **w), 1, False, "none"
    )


def test_metric_overheads_order():
    w = Workload.of(arch=LLAMA7, seq_len=2048)
    alloc, res, dev = (
        estimate_memory(w, ParallelPlan(dp=2, zero=1), m).peak for m in ("allocated", "reserved", "device")
    )
    assert alloc < res < dev


def test_parse_plan():
    p = parse_plan("dp=4,tp=2,pp=1,zero=1,mb=2,ckpt=full,sp=1")
    assert (p.dp, p.tp, p.zero, p.micro_batch, p.recompute, p.sequence_parallel) == (4, 2, 1, 2, "full", True)
    for bad in ("dp=x", "foo=1", "zero=5", "offload=opt", "ckpt=some"):
        with pytest.raises(InputError):
            parse_plan(bad)


def test_candidates_fit_and_order():
    w = Workload.of(arch=LLAMA7, seq_len=4096)
    opts = [GpuOption("a100", catalog()["A100-80GB"], 16), GpuOption("t4", catalog()["T4"], 8)]
    cands = search(w, opts, global_batch=64, steps=10)
    assert cands["a100"], "a 7B model fits 16 A100-80GB"
    for c in cands["a100"]:
        assert c.memory.peak <= opts[0].usable_bytes
        assert c.plan.world == c.gpus
    times = [c.step_time_s for c in cands["a100"]]
    assert times == sorted(times)
    # 8 T4 (15 GiB each) cannot hold 7B with Adam at 16 B/param: 108 GB of states alone is > 8 * 15 GiB
    assert cands["t4"] == []


@pytest.mark.parametrize("pp,ga,mb", [(2, 8, 1), (4, 3, 2), (8, 16, 1), (16, 32, 4)])
def test_peak_stages_only_gives_same_peak(pp, ga, mb):
    for arch in (LLAMA7, presets()["llama-2-70b"].arch, presets()["llama-3.2-1b"].arch):
        w = Workload.of(arch=arch, seq_len=2048)
        plan = ParallelPlan(dp=2, pp=pp, zero=1, micro_batch=mb, grad_accum=ga)
        assert estimate_memory(w, plan, peak_stages_only=True).peak == estimate_memory(w, plan).peak


def test_qlora_dequantises_one_block_linear_not_the_embedding():
    # bitsandbytes/torchao dequantise one 4-bit linear at a time; the 16-bit embedding is never dequantised
    w = Workload.of(arch=LLAMA7, seq_len=1024, precision="bf16-pure", method="qlora", framework="torch")
    st = estimate_memory(w, ParallelPlan(), "allocated").stages[0]
    assert st.phase == "backward-start"
    # the largest block matrix, 16-bit: a fused q/k/v projection (h x 3h) is larger than the MLP's h x ffn here
    assert st.buffers == pytest.approx(max(LLAMA7.hidden * LLAMA7.ffn, LLAMA7.hidden * 3 * LLAMA7.hidden) * 2.0)
    assert st.buffers < LLAMA7.vocab * LLAMA7.hidden * 2.0


def test_adapters_under_fsdp_gather_nf4_blocks_and_reduce_adapter_grads_only():
    from frenzy_slurm.marp.memory import QLORA_BYTES_PER_PARAM
    from frenzy_slurm.marp.params import count_params, lora_params_per_layer

    arch = presets()["llama-2-70b"].arch
    pc = count_params(arch)
    plan = ParallelPlan(dp=8, zero=3, recompute="full")
    base = dict(arch=arch, seq_len=2048, precision="bf16-pure", framework="torch", lora_targets=("q", "v"))
    lora_grads = lora_params_per_layer(arch, 16, ("q", "v")) * 2.0
    lora = estimate_memory(Workload.of(method="lora", **base), plan, "allocated").stages[0]
    # two gathered 16-bit blocks (the block is larger than the embedding) plus one block's adapter gradients
    assert lora.buffers == pytest.approx(2 * max(pc.per_layer, pc.largest_matrix) * 2.0 + lora_grads)
    q = estimate_memory(Workload.of(method="qlora", **base), plan, "allocated").stages[0]
    block_nf4 = (pc.linear_per_layer * QLORA_BYTES_PER_PARAM + (pc.per_layer - pc.linear_per_layer) * 2.0) / 2.0
    gathered = 2 * max(block_nf4, pc.largest_matrix) * 2.0
    assert q.buffers == pytest.approx(gathered + lora_grads + pc.largest_linear * 2.0)
    assert q.buffers < lora.buffers


def test_reserved_fragments_per_step_bytes_not_long_lived_states():
    from frenzy_slurm.marp import Overheads

    ov = Overheads()
    assert (ov.fragmentation, ov.step_fragmentation) == (0.0, 0.25)  # long-lived: the allocator model's packing
    w = Workload.of(arch=LLAMA7, seq_len=2048, framework="torch", precision="bf16-pure", fused_optimizer=True)
    plan = ParallelPlan(micro_batch=1, grad_accum=2)  # gradients kept between micro-batches: long-lived
    a, r = (estimate_memory(w, plan, m).stages[0] for m in ("allocated", "reserved"))
    assert a.phase == r.phase == "backward-start"
    long_lived = a.weights + a.optimizer + a.gradients
    step = a.peak - long_lived
    # LLaMA-7B's bf16 matrices are whole 2 MiB multiples: the long-lived tensors pack without waste (the norms'
    # small-pool segments are a few MiB)
    assert r.overhead == pytest.approx(0.25 * step, abs=8 * 2**20)
    # nvidia-smi adds the context and the cuBLAS workspaces, nothing else on one GPU
    d = estimate_memory(w, plan, "device", Overheads(context_gib=1.3)).stages[0]
    assert d.overhead - r.overhead == pytest.approx(1.3 * GiB + 64 * 2**20)


def test_autocast_casts_the_input_once_per_separate_projection():
    # autocast caches casts of leaf tensors (weights) only: q, k, v and gate, up each save their own 16-bit copy
    w = Workload.of(arch=LLAMA7, seq_len=1024, framework="torch", precision="bf16-mixed")
    sep = _layer_activation_bytes(w, 1, False, "none", True)
    fused = _layer_activation_bytes(w.with_(fused_projections=True), 1, False, "none", True)
    assert sep - fused == pytest.approx((2 + 1) * 2.0 * LLAMA7.hidden)
    # without autocast nothing is cast: the same either way
    assert _layer_activation_bytes(w, 1, False, "none") == _layer_activation_bytes(
        w.with_(fused_projections=True), 1, False, "none"
    )


def test_compile_keeps_three_swiglu_tensors_and_both_gelu_tensors():
    # measured on the CPU with inductor (torch 2.13): the partitioner keeps gate, up and the down projection's input
    # and recomputes only silu(gate); a GELU MLP keeps the fc output and the GELU output either way
    w = Workload.of(arch=LLAMA7, seq_len=1024, precision="bf16-pure", framework="torch")
    eager = _layer_activation_bytes(w, 1, False, "none")
    comp = _layer_activation_bytes(w.with_(compile=True), 1, False, "none")
    assert eager - comp == pytest.approx(2.0 * LLAMA7.ffn)  # the silu output only
    g = Workload.of(arch=GPT3ISH, seq_len=1024, precision="bf16-pure", framework="torch")
    assert _layer_activation_bytes(g, 1, False, "none") == _layer_activation_bytes(
        g.with_(compile=True), 1, False, "none"
    )


def test_uncompiled_loss_beside_compiled_blocks():
    from frenzy_slurm.marp.memory import _logit_bytes_per_token

    w = Workload.of(arch=LLAMA7, seq_len=1024, precision="bf16-pure", framework="torch", compile=True)
    v = LLAMA7.vocab
    # compiled, the upcast is inside the loss graph: it saves the 16-bit logits and writes their 16-bit gradient
    assert _logit_bytes_per_token(w, 1) == pytest.approx(2 * 2.0 * v)
    assert _logit_bytes_per_token(w.with_(compile_loss=False), 1) == pytest.approx(3 * 4.0 * v)


def test_autocast_eager_attention_backward_holds_fp32_score_gradients():
    bert = Architecture(
        layers=4,
        hidden=1024,
        heads=16,
        ffn=4096,
        activation="gelu",
        vocab=30522,
        norm="layernorm",
        position="learned",
        bias="all",
        dropout=0.1,
        max_positions=512,
        head="classification",
    )
    s, mb = 512, 4
    w = Workload.of(arch=bert, seq_len=s, framework="torch", precision="fp16-mixed", attention="eager")
    st = estimate_memory(w, ParallelPlan(micro_batch=mb), "allocated").stages[0]
    assert st.phase == "backward-start" and st.logits == 0
    t, h = s * mb, bert.hidden
    saved = bert.layers * _layer_activation_bytes(w, 1, False, "none", True) * t
    extra = t * 1.0 + (4.0 * h + 2.0 * h) * t  # embedding dropout mask; final norm input (fp32) and head input
    work = st.activations - saved - extra
    # two score-sized gradients at 4 bytes (the softmax runs in fp32 under autocast), not 2
    assert work == pytest.approx(2 * bert.heads * s * 4.0 * t)


def test_chunked_loss_peaks_measured_on_the_cpu():
    # benchmarks/saved_tensors_cpu.py: 8 chunks, bf16 logits, fp32 loss; eager 6.5 and compiled 2.26 bytes x vocab
    # per token over what was alive before the output layer
    from frenzy_slurm.marp.memory import _logit_bytes_per_token

    w = Workload.of(arch=LLAMA7, seq_len=1024, precision="bf16-pure", framework="torch", loss_chunks=8)
    v = LLAMA7.vocab
    assert _logit_bytes_per_token(w, 1) == pytest.approx(6.5 * v)
    assert _logit_bytes_per_token(w.with_(compile=True), 1) == pytest.approx(2.25 * v)


def test_chunked_output_layer_sums_its_weight_gradient_beside_the_chunks():
    arch = Architecture(layers=2, hidden=3072, heads=24, kv_heads=8, ffn=8192, vocab=128256)
    w = Workload.of(
        arch=arch,
        seq_len=4096,
        precision="bf16-pure",
        framework="torch",
        loss_chunks=8,
        compile=True,
        fused_optimizer=True,
    )
    st = estimate_memory(w, ParallelPlan(micro_batch=2, recompute="full"), "allocated").stages[0]
    t, head = 2 * 4096, arch.vocab * arch.hidden * 2.0
    assert st.phase == "backward-start"
    assert st.gradients == pytest.approx(2 * head)  # the summed gradient and the chunk's contribution
    assert st.logits == pytest.approx(2.25 * arch.vocab * t)
    # with accumulation the summed gradient is the kept one: one more contribution only
    acc = estimate_memory(w, ParallelPlan(micro_batch=2, recompute="full", grad_accum=2), "allocated").stages[0]
    assert acc.gradients - acc.weights == pytest.approx(head)  # kept gradients (= weights, bf16) plus one head


def test_chunked_16_bit_loss_held_logits():
    # litgpt: the loop keeps the logit chunks, the loss runs on them in 16 bits (4 chunks)
    from frenzy_slurm.marp.memory import _logit_bytes_per_token

    w = Workload.of(
        arch=LLAMA7,
        seq_len=512,
        precision="bf16-pure",
        framework="torch",
        loss_chunks=4,
        loss_fp32=False,
        hold_logits=True,
    )
    assert _logit_bytes_per_token(w, 1) == pytest.approx((2 + 2 + (4 + 2) / 4) * LLAMA7.vocab)


def test_qlora_with_a_quantised_output_layer():
    from frenzy_slurm.marp.memory import NF4_PLAIN_BYTES_PER_PARAM

    arch = Architecture(layers=2, hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256)
    w = Workload.of(
        arch=arch, seq_len=512, precision="bf16-pure", framework="torch", method="qlora", nf4_double_quant=False
    )
    plain, quant = (
        estimate_memory(x, ParallelPlan(), "allocated").stages[0] for x in (w, w.with_(qlora_quantized_head=True))
    )
    head = arch.vocab * arch.hidden
    assert plain.weights - quant.weights == pytest.approx(head * (2.0 - NF4_PLAIN_BYTES_PER_PARAM))
    assert quant.buffers - plain.buffers == pytest.approx((head - 4096 * 14336) * 2.0)  # dequantised head, 16-bit


def test_previous_output_and_its_ctx_held_4bit_inputs_outlive_the_step():
    # litgpt keeps `logits` bound into the next iteration; bitsandbytes' 4-bit matmul (<= 0.44) stored its input on
    # ctx, outside the saved tensors that backward releases: at the end of the next forward both outputs and every
    # such input of the previous step are alive
    arch = Architecture(layers=4, hidden=1024, heads=8, kv_heads=8, ffn=2816, vocab=8192)
    w = Workload.of(
        arch=arch,
        seq_len=512,
        precision="bf16-pure",
        framework="torch",
        method="qlora",
        hold_logits=True,
        loss_chunks=4,
        loss_fp32=False,
    )
    plan = ParallelPlan(micro_batch=2)
    plain, keep = (estimate_memory(x, plan, "allocated").stages[0] for x in (w, w.with_(keeps_previous_output=True)))
    tokens = 2 * 512
    assert keep.phase == "backward-start"
    assert keep.activations - plain.activations == pytest.approx(4 * 2 * (3 * 1024 + 2816) * tokens)
    assert keep.logits == pytest.approx(2 * 2 * 8192 * tokens)  # this step's 16-bit output and the previous one
    # torchao's NF4 linear saves nothing of its input: only the previous logits stay, which the loss's own tensors
    # outweigh here
    nf4 = w.with_(nf4_saves_inputs=False)
    assert (
        estimate_memory(nf4.with_(keeps_previous_output=True), plan, "allocated").peak
        == estimate_memory(nf4, plan, "allocated").peak
        < keep.peak
    )


def test_ctx_held_inputs_outlive_backward_while_the_output_is_bound():
    """The mechanism behind `keeps_previous_output`, measured on the CPU with the allocator's own events."""
    import torch

    from frenzy_slurm.runtime.memory import CpuMemoryRecorder, count_all_threads

    h, f, v, layers, t = 64, 176, 512, 4, 256

    class CtxHeld(torch.autograd.Function):  # bitsandbytes <= 0.44's MatMul4Bit: `ctx.tensors = (A, B)`
        @staticmethod
        def forward(ctx, x, wt):  # type: ignore[override]
            ctx.tensors = (x, wt)
            return x @ wt.t()

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            return g @ ctx.tensors[1], None

    class Saved(torch.autograd.Function):  # what backward releases: save_for_backward
        @staticmethod
        def forward(ctx, x, wt):  # type: ignore[override]
            ctx.save_for_backward(x, wt)
            return x @ wt.t()

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            return g @ ctx.saved_tensors[1], None

    def forward_peak(fn: type, keep: bool) -> float:
        """Two training steps, then the peak of the next forward up to the loop's rebinding of its output."""
        torch.manual_seed(0)
        ws = [(torch.randn(f, h), torch.randn(h, f)) for _ in range(layers)]
        head, adapter, x = torch.randn(v, h), torch.zeros(h, requires_grad=True), torch.randn(t, h)
        bound: dict = {}

        def forward() -> torch.Tensor:
            y = x + adapter
            for up, down in ws:
                y = y + fn.apply(torch.relu(fn.apply(y, up)), down)
            logits = fn.apply(y, head)
            if keep:
                bound["logits"] = logits  # the loop's variable, rebound by the next forward
            return logits

        for _ in range(2):
            forward().logsumexp(-1).mean().backward()
        return CpuMemoryRecorder().start().peak_of(forward)[0]

    count_all_threads()  # every free of this process reaches the total, also of blocks from before the recorder
    ctx_inputs = 4 * t * (layers * (h + f) + h)  # fp32: each block's two linear inputs, and the head's
    # while the previous output is bound, the previous step's ctx-held inputs are alive; saved ones are not
    assert forward_peak(CtxHeld, True) - forward_peak(Saved, True) == pytest.approx(ctx_inputs, rel=0.01)
    assert forward_peak(CtxHeld, False) == pytest.approx(forward_peak(Saved, False), rel=0.001)
    # and the previous output itself: its logits stay alive to the end of the next forward
    assert forward_peak(Saved, True) - forward_peak(Saved, False) == pytest.approx(4 * t * v, rel=0.01)


def test_deepspeed_zero3_keeps_what_is_reused_soon_and_its_gradient_partition():
    # DeepSpeed ZeRO-3 releases a module's gathered parameters only when their next use is more than
    # stage3_max_reuse_distance elements away: the output layer and the last blocks stay gathered until backward
    arch = Architecture(layers=8, hidden=2048, heads=16, kv_heads=16, ffn=5504, vocab=32000)
    w = Workload.of(arch=arch, seq_len=1024, precision="bf16-mixed", framework="deepspeed")
    plan = ParallelPlan(dp=8, zero=3, micro_batch=1)
    from frenzy_slurm.marp.params import count_params
    from frenzy_slurm.marp.plan import DeepSpeedBuckets

    pc = count_params(arch)
    head = pc.final + pc.head

    def at(reuse: int):
        buckets = DeepSpeedBuckets(
            stage3_prefetch_bucket_size=0, reduce_bucket_size=1000, stage3_max_reuse_distance=reuse
        )
        return estimate_memory(w.with_(buckets=buckets), plan).stages[0]

    near = at(0)
    far = at(2 * (head + 3 * pc.per_layer))  # enough for the head and three blocks
    assert far.buffers - near.buffers == pytest.approx((head + 3 * pc.per_layer - 2 * pc.largest_matrix) * 2)
    # a model smaller than half the distance stays gathered whole, its embedding too
    whole = at(10**12)
    assert whole.buffers - near.buffers == pytest.approx((pc.total(arch.layers) - 2 * pc.largest_matrix) * 2)
    # the gradient partition of every parameter is allocated once and kept (model dtype), beside the reduce bucket
    assert near.gradients == pytest.approx(pc.total(arch.layers) / 8 * 2)
    torch_fsdp = estimate_memory(w.with_(framework="torch"), plan).stages[0]
    assert torch_fsdp.gradients == 0.0
