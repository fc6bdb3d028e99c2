"""Bytes a transformer block saves for backward, and a chunked loss's peak, eager and compiled, next to MARP.

    python benchmarks/saved_tensors_cpu.py        # ~1-2 min on 2 cores (inductor compiles on the CPU)

Builds a torchtune-style Llama block (torchtune 0.6's RMSNorm on an fp32 copy, separate q/k/v, rotary embedding on the
sequence-major layout before the transpose, GQA by expanding k/v, SDPA, SwiGLU) and a GELU MLP in bf16,
runs forward and backward once eager and once compiled (inductor), and sums the distinct storages the
autograd graph saves (saved-tensor hooks see AOTAutograd's saved tensors too), per token. MARP's
`_layer_activation_bytes` for a model.yaml of the same run (torchtune's profile, through `workload_from_spec` on
the CPU, as fsbatch derives it) is printed beside it. Then a chunked output layer and
cross-entropy as torchtune runs them (8 chunks of bf16 logits, the per-chunk loss on an fp32 upcast, eager or
compiled, the output weight frozen or trained): the peak of the allocator's running total over one step
(the profiler's memory events, as the CPU grid measures), next to MARP's logits and head-gradient terms.
docs/accuracy.md quotes the result.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import workload_from_spec  # noqa: E402
from frenzy_slurm.marp.memory import _layer_activation_bytes, _logit_bytes_per_token  # noqa: E402
from frenzy_slurm.marp.plan import Workload  # noqa: E402
from frenzy_slurm.runtime.memory import CpuMemoryRecorder  # noqa: E402

H, HEADS, KV, FFN, SEQ, BATCH = 256, 8, 2, 704, 256, 2
HD = H // HEADS
DT = torch.bfloat16


class RMSNorm(nn.Module):
    """torchtune 0.6's: F.rms_norm on an fp32 copy with the scale, cast back (the normalised value the scale's
    gradient needs is saved in fp32), as the torchtune profile (marp/frameworks.py) describes it."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d, dtype=DT))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), weight=self.scale, eps=1e-6).to(x.dtype)


def rope(x: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
    """torchtune's RotaryPositionalEmbeddings on [b, s, n_heads, head_dim]."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    c = cache.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack(
        [xs[..., 0] * c[..., 0] - xs[..., 1] * c[..., 1], xs[..., 1] * c[..., 0] + xs[..., 0] * c[..., 1]], -1
    )
    return out.flatten(3).type_as(x)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        lin = lambda i, o: nn.Linear(i, o, bias=False, dtype=DT)  # noqa: E731
        self.n1, self.n2 = RMSNorm(H), RMSNorm(H)
        self.q, self.k, self.v, self.o = lin(H, H), lin(H, KV * HD), lin(H, KV * HD), lin(H, H)
        self.w1, self.w3, self.w2 = lin(H, FFN), lin(H, FFN), lin(FFN, H)
        theta = 1.0 / (10000 ** (torch.arange(0, HD, 2).float() / HD))
        idx = torch.outer(torch.arange(SEQ).float(), theta)
        self.register_buffer("cache", torch.stack([torch.cos(idx), torch.sin(idx)], -1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        y = self.n1(x)
        q, k, v = (self.q(y).view(b, s, HEADS, HD), self.k(y).view(b, s, KV, HD), self.v(y).view(b, s, KV, HD))
        q, k = rope(q, self.cache), rope(k, self.cache)
        k = k.unsqueeze(3).expand(b, s, KV, HEADS // KV, HD).flatten(2, 3)
        v = v.unsqueeze(3).expand(b, s, KV, HEADS // KV, HD).flatten(2, 3)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(a.transpose(1, 2).contiguous().view(b, s, H))
        y = self.n2(x)
        return x + self.w2(F.silu(self.w1(y)) * self.w3(y))


class GeluMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.proj = nn.Linear(H, 4 * H, dtype=DT), nn.Linear(4 * H, H, dtype=DT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x), approximate="tanh"))


def saved_per_token(module: nn.Module, compiled: bool) -> tuple[float, bool]:
    """(bytes per token the graph saves besides parameters and buffers, whether the input is among them)."""
    fn = torch.compile(module) if compiled else module
    x = torch.randn(BATCH, SEQ, H, dtype=DT, requires_grad=True) * 1.0  # a non-leaf input, as a block's is
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(x)
    out.float().sum().backward()
    fixed = {p.untyped_storage().data_ptr() for p in list(module.parameters()) + list(module.buffers())}
    total = sum(n for ptr, n in seen.items() if ptr not in fixed)
    return total / (BATCH * SEQ), x.untyped_storage().data_ptr() in seen


def workload_of(arch: Architecture, seq_len: int, framework: str, compiled: bool, **training: object) -> Workload:
    """What MARP sees for a model.yaml of this run (the framework's profile, on the CPU): the product's path."""
    spec = JobSpec.model_validate(
        {
            "name": "saved-tensors",
            "model": {"arch": arch.model_dump(exclude_none=True)},
            "training": {"seq_len": seq_len, "global_batch": 1, "micro_batch": 1, "steps": 1,
                         "precision": "bf16-pure", "attention": "sdpa", "compile": compiled, **training},
            "entry": {"trainer": "script", "script": "train.py", "framework": framework},
        }
    )  # fmt: skip
    return workload_from_spec(spec, ResolvedModel(arch=arch, name=spec.name), device="cpu")


def main() -> int:
    torch.manual_seed(0)
    arch = Architecture(layers=1, hidden=H, heads=HEADS, kv_heads=KV, ffn=FFN, vocab=1000)
    print(f"{'case':28} {'measured B/token':>16} {'MARP':>8} {'error':>7}")
    for compiled in (False, True):
        w = workload_of(arch, SEQ, "torchtune", compiled)
        meas, _ = saved_per_token(Block(), compiled)
        marp = _layer_activation_bytes(w, 1, False, "none")
        print(
            f"{'torchtune block, ' + ('compiled' if compiled else 'eager'):28} {meas:16.0f} {marp:8.0f} "
            f"{(marp - meas) / meas:+7.1%}"
        )
    for compiled in (False, True):
        meas, with_input = saved_per_token(GeluMLP(), compiled)
        # MARP's GELU MLP part: the fc output and the GELU output (2 bytes each, 4h wide) plus the input (2h)
        marp = 2 * 2.0 * 4 * H + 2.0 * H
        print(
            f"{'GELU MLP, ' + ('compiled' if compiled else 'eager'):28} {meas:16.0f} {marp:8.0f} "
            f"{(marp - meas) / meas:+7.1%}"
        )
    chunked_loss_peaks()
    return 0


def chunked_loss_peaks(tokens: int = 1536, hidden: int = 576, vocab: int = 16384, chunks: int = 8) -> None:
    """Peak bytes of the output layer and loss over what was alive before, per token, in units of vocab."""
    import gc

    def ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, reduction="sum")  # torchtune's compute_cross_entropy

    arch = Architecture(layers=1, hidden=hidden, heads=HEADS, kv_heads=HEADS, ffn=FFN, vocab=vocab)
    print(f"\n{'chunked loss (8 chunks)':28} {'measured B/tok/V':>16} {'MARP':>8} {'error':>7}")
    for compiled in (False, True):
        fn = torch.compile(ce) if compiled else ce
        for trained in (False, True):
            weight = torch.randn(vocab, hidden, dtype=DT, requires_grad=trained)
            x = torch.randn(tokens, hidden, dtype=DT, requires_grad=True)
            labels = torch.randint(0, vocab, (tokens,))

            # step() runs only in this iteration (ruff B023 would have it bind the loop's variables)
            def step() -> None:
                logits = [F.linear(c, weight) for c in (x * 1.0).chunk(chunks)]  # noqa: B023
                loss = sum(fn(lg, lb) for lg, lb in zip(logits, labels.chunk(chunks), strict=True))  # noqa: B023
                del logits  # as torchtune's recipes do before backward
                loss.backward()
                x.grad = weight.grad = None  # noqa: B023

            step(), step()  # compile and warm up outside the measured step
            gc.collect()
            rec = CpuMemoryRecorder().start()
            base = rec._baseline
            peak, _ = rec.peak_of(step)
            meas = (peak - base) / (tokens * vocab)
            w = workload_of(arch, tokens, "torchtune", compiled, loss_chunks=chunks)
            per_tok = _logit_bytes_per_token(w, 1)
            head = vocab * hidden * 2.0 if trained else 0.0
            marp = (
                max(per_tok * tokens, 2.0 * vocab * (1 + 1 / chunks) * tokens + 2 * head)
                if trained
                else per_tok * tokens
            )
            marp = (marp + 2.0 * hidden * tokens) / (tokens * vocab)  # + the hidden states' gradient
            name = f"{'compiled' if compiled else 'eager'}, head {'trained' if trained else 'frozen'}"
            print(f"{name:28} {meas:16.3f} {marp:8.3f} {(marp - meas) / meas:+7.1%}")


if __name__ == "__main__":
    sys.exit(main())
