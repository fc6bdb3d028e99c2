"""What torchtitan's per-op selective checkpointing keeps, eager and compiled, in bf16 and with torchao's Float8
linears, and what a compiled cross-entropy saves: measured on the CPU, next to MARP.

    python benchmarks/float8_sac_cpu.py          # ~2 min on 2 cores (inductor compiles on the CPU)

A Llama block (RMSNorm, separate q/k/v, GQA, SDPA, SwiGLU) in bf16 runs under torch.utils.checkpoint with
torchtitan's per-op policy (its `_save_list`: mm, the SDPA kernels, reduce_scatter, max; every other mm), once
eager and once compiled. The policy is wrapped to record what it decides for each matmul (the op and its
arguments' tensor type: whether it sees `aten.mm` on Float8 tensors or the unwrapped `aten._scaled_mm`). What the
compiled graph saves is read through saved-tensor hooks (AOTAutograd's saved tensors pass through them); the eager
policy's cache is not visible to them and is read from the recorded MUST_SAVE outputs (torch/utils/checkpoint.py
_CachingTorchDispatchMode keeps each until the block's recomputation). With torchao installed (Float8 linears run
on the CPU with torch 2.13 and torchao 0.18), the same with `convert_to_float8_training`. Then torchtitan's loss
(`cross_entropy(pred.flatten(0, 1).float(), labels)`), eager and compiled: the bytes per logit it saves and the
gradient's dtype. MARP's `op_checkpointed_bytes` and `logit_bytes_per_token` for the same shapes are printed beside.
docs/marp.md ("Float8 training as torchao and torchtitan run it") quotes the result.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import workload_from_spec  # noqa: E402
from frenzy_slurm.marp.memory_activations import op_checkpointed_bytes  # noqa: E402
from frenzy_slurm.marp.memory_loss import logit_bytes_per_token  # noqa: E402
from frenzy_slurm.marp.plan import Workload  # noqa: E402

H, HEADS, KV, FFN, SEQ, BATCH, VOCAB = 256, 4, 2, 704, 128, 2, 4096
HD = H // HEADS
DT = torch.bfloat16
_MM = torch.ops.aten.mm.default
# torchtitan e7c0cae torchtitan/models/llama3/parallelize_llama.py:218 (the CPU's flash kernel added)
SAVE_LIST = {
    _MM,
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops.aten.max.default,
}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lin = lambda i, o: nn.Linear(i, o, bias=False, dtype=DT)  # noqa: E731
        self.n1, self.n2 = nn.RMSNorm(H, dtype=DT), nn.RMSNorm(H, dtype=DT)
        self.q, self.k, self.v, self.o = lin(H, H), lin(H, KV * HD), lin(H, KV * HD), lin(H, H)
        self.w1, self.w3, self.w2 = lin(H, FFN), lin(H, FFN), lin(FFN, H)

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.n1(x)
        q, k, v = self.q(y).view(b, s, HEADS, HD), self.k(y).view(b, s, KV, HD), self.v(y).view(b, s, KV, HD)
        k, v = k.repeat_interleave(HEADS // KV, dim=2), v.repeat_interleave(HEADS // KV, dim=2)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).contiguous().view(b, s, H))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.inner, x, use_reentrant=False, context_fn=policy, preserve_rng_state=False)


RECORD: list[tuple[str, str, int]] = []  # each forward matmul: (op and argument type, decision, output bytes)


def policy() -> object:
    """torchtitan's per-op policy, recording each matmul's decision in RECORD (forward only; a module-level
    function: dynamo takes no bound method as context_fn)."""
    meta: defaultdict[str, int] = defaultdict(int)
    RECORD.clear()

    def decide(ctx: object, func: object, *args: object, **kwargs: object) -> CheckpointPolicy:
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"  # type: ignore[attr-defined]
        if func == _MM:
            meta[key] += 1
        save = func in SAVE_LIST and not (func == _MM and meta[key] % 2 == 0)
        pol = CheckpointPolicy.MUST_SAVE if save else CheckpointPolicy.PREFER_RECOMPUTE
        if not ctx.is_recompute and func in (_MM, torch.ops.aten._scaled_mm.default):  # type: ignore[attr-defined]
            out = ctx.op_output  # type: ignore[attr-defined]
            RECORD.append((f"{func}({type(args[0]).__name__})", pol.name, out.numel() * out.element_size()))
        return pol

    return create_selective_checkpoint_contexts(decide)


def saved_bytes(fn: Callable[..., torch.Tensor], make: Callable[[], tuple], fixed: set[int]) -> list[tuple[int, str]]:
    """(bytes, dtype) of each distinct storage the autograd graph saves in one forward, parameters left out."""
    seen: dict[int, tuple[int, str]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = (st.nbytes(), str(t.dtype))
        return t

    args = make()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    out.float().sum().backward()
    return [v for p, v in seen.items() if p not in fixed and v[0] > 64]


def block_row(fp8: bool, compiled: bool) -> tuple[float, float]:
    """(bytes per token the block keeps, bytes per token of the saved matmul outputs the policy chose)."""
    torch.manual_seed(0)
    m = Block()
    if fp8:
        from torchao.float8 import convert_to_float8_training

        convert_to_float8_training(m)
    fn = torch.compile(m) if compiled else m

    def make() -> tuple:
        return ((torch.randn(BATCH, SEQ, H, dtype=DT, requires_grad=True) * 1.0),)

    fn(*make()).float().sum().backward()  # compile and warm up
    fixed = {p.untyped_storage().data_ptr() for p in m.parameters()}
    saved = saved_bytes(fn, make, fixed)
    chosen = sum(n for _, pol, n in RECORD if pol == "MUST_SAVE")
    print(f"  policy saw: {sorted({r[0] for r in RECORD})}")
    tokens = BATCH * SEQ
    if compiled:
        return sum(n for n, _ in saved) / tokens, chosen / tokens
    # eager: the checkpoint's input (what the hooks see) and the policy's cache of every MUST_SAVE output
    sdpa_out_lse = (H * 2 + HEADS * 4) * tokens
    return (sum(n for n, _ in saved) + chosen + sdpa_out_lse) / tokens, chosen / tokens


def loss_row(compiled: bool) -> tuple[float, str]:
    def ce(pred: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))

    fn = torch.compile(ce) if compiled else ce
    labels = torch.randint(0, VOCAB, (1, BATCH * SEQ))

    def make() -> tuple:
        return ((torch.randn(1, BATCH * SEQ, VOCAB, dtype=DT) * 1.0).requires_grad_(), labels)

    pred, _ = make()
    fn(pred, labels).backward()
    saved = saved_bytes(lambda p, y: fn(p, y).reshape(1), make, set())
    return sum(n for n, _ in saved) / (BATCH * SEQ * VOCAB), str(pred.grad.dtype)


def marp_workload(compiled: bool) -> Workload:
    """What MARP sees for a torchtitan model.yaml of this run (its profile, on the CPU): the product's path."""
    arch = Architecture(layers=1, hidden=H, heads=HEADS, kv_heads=KV, ffn=FFN, vocab=VOCAB, activation="swiglu")
    spec = JobSpec.model_validate(
        {
            "name": "float8-sac",
            "model": {"arch": arch.model_dump(exclude_none=True)},
            "training": {"seq_len": SEQ, "global_batch": 1, "micro_batch": 1, "steps": 1, "precision": "bf16-pure",
                         "attention": "sdpa", "compile": compiled, "activation_checkpointing": "op"},
            "entry": {"trainer": "script", "script": "train.py", "framework": "torchtitan"},
        }
    )  # fmt: skip
    return workload_from_spec(spec, ResolvedModel(arch=arch, name=spec.name), device="cpu")


def main() -> None:
    try:
        import torchao  # noqa: F401

        kinds = (False, True)
    except ImportError:
        print("torchao is not installed: the Float8 rows are skipped (pip install torchao)")
        kinds = (False,)
    print(f"block h={H} kv={KV * HD} ffn={FFN}, bytes per token     measured   MUST_SAVE mm   MARP")
    for fp8 in kinds:
        for compiled in (False, True):
            print(f"{'Float8' if fp8 else 'bf16'}, {'compiled' if compiled else 'eager'}:")
            kept, chosen = block_row(fp8, compiled)
            marp = op_checkpointed_bytes(marp_workload(compiled), 1, False, False)
            print(f"  {'kept':36} {kept:8.0f}   {chosen:12.0f}   {marp:6.0f}")
    for compiled in (False, True):
        per_logit, grad = loss_row(compiled)
        marp = logit_bytes_per_token(marp_workload(compiled), 1) / VOCAB
        print(
            f"loss {'compiled' if compiled else 'eager'}: saves {per_logit:.2f} B per logit, gradient {grad}, "
            f"MARP's logits and loss tensors {marp:.2f} B per logit"
        )


if __name__ == "__main__":
    main()
