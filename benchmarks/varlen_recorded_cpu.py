"""A real run of variable-length steps, recorded on the CPU and replayed through the caching-allocator replayer,
next to MARP's generated steps at the same lengths (marp/allocator_steps.py).

    python benchmarks/varlen_recorded_cpu.py [--steps 16] [--longest 256] [--mean 150] [--sd 100]

A tiny Llama (transformers' own LlamaForCausalLM: 2 layers, hidden 64, vocabulary 32000, fp32, SDPA) trains with
one sample per micro-batch as the Hugging Face Trainer runs a step (`model(input_ids, labels=...).loss`, the
output dropped before `backward()`, torch's AdamW, `zero_grad(set_to_none=True)`), for the lengths
`allocator_steps.step_lengths` gives for the stated distribution, and again with every step at the longest. The
profiler (`profile_memory=True`, as the CPU grid measures) records every allocation and free from before the model
is built; each run's requests are replayed through `allocator_replay` (the CPU has no caching allocator, so the
comparison is replay against replay). Printed: each run's replayed reserved peak, the recorded excess of the
variable run over the fixed one, the generated steps' excess at the same lengths (one layer and the loss,
`allocator_steps.replayed_peak`), and what MARP adds for the same model.yaml (`MemoryEstimate` stage `cached`, over
its own `STEPS` lengths). tests/test_marp_allocator_steps.py runs the same comparison.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.marp import allocator_steps  # noqa: E402
from frenzy_slurm.marp.allocator_replay import Event, alloc, free, replay  # noqa: E402
from frenzy_slurm.marp.allocator_steps import step_lengths  # noqa: E402

ARCH = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4, "ffn": 176, "vocab": 32000}


def record(lengths: tuple[int, ...]) -> list[Event]:
    """Every allocation and free of a run of steps at `lengths`, in order, from before the model is built."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile

    from frenzy_slurm.runtime.memory import trace_events

    torch.manual_seed(0)
    torch.set_num_threads(1)
    cfg = transformers.LlamaConfig(
        hidden_size=ARCH["hidden"],
        intermediate_size=ARCH["ffn"],
        num_hidden_layers=ARCH["layers"],
        num_attention_heads=ARCH["heads"],
        num_key_value_heads=ARCH["kv_heads"],
        vocab_size=ARCH["vocab"],
        max_position_embeddings=max(lengths),
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    gen = torch.Generator().manual_seed(0)
    data = [torch.randint(0, ARCH["vocab"], (1, n), generator=gen) for n in lengths]
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        model = transformers.LlamaForCausalLM(cfg)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for x in data:
            loss = model(input_ids=x, labels=x).loss  # (the Trainer's compute_loss: the output is dropped)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
    return events_of(trace_events(prof))


def events_of(trace: list[dict[str, Any]]) -> list[Event]:
    """The replayer's events from a profile's `[memory]` events (an address is a tensor from its allocation to its
    free; frees of blocks made before the profile are skipped)."""
    mem = [e for e in trace if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
    mem.sort(key=lambda e: e["ts"])
    live: dict[int, str] = {}
    out: list[Event] = []
    for i, e in enumerate(mem):
        addr, size = int(e["args"]["Addr"]), int(e["args"]["Bytes"])
        if size > 0:
            live[addr] = key = f"r{i}"
            out.append(alloc(key, size))
        elif addr in live:
            out.append(free(live.pop(addr)))
    return out


def compare(steps: int, longest: int, mean: float, sd: float) -> dict[str, float]:
    """Recorded and generated reserved excess (bytes) of a variable-length run over a fixed one at the longest."""
    from frenzy_slurm.jobspec import JobSpec, resolve_model
    from frenzy_slurm.marp import ParallelPlan, estimate_memory, workload_from_spec

    lengths = step_lengths(longest, None, mean, sd, 1, steps)
    varied = replay(record(lengths)).reserved_peak
    fixed = replay(record((longest,) * len(lengths))).reserved_peak
    spec = JobSpec.model_validate(
        {
            "name": "varlen-cpu",
            "model": {"arch": ARCH | {"tied_embeddings": False}},
            "training": {
                "seq_len": longest,
                "global_batch": 1,
                "micro_batch": 1,
                "steps": steps,
                "precision": "fp32",
                "activation_checkpointing": "none",
                "attention": "sdpa",
            },
            "entry": {
                "trainer": "script",
                "script": "train.py",
                "framework": "hf-trainer",
                "framework_version": "5.17",
            },
            "data": {"lengths": "variable", "mean": mean, "sd": sd},
        }
    )
    w = workload_from_spec(spec, resolve_model(spec, "."))
    est = estimate_memory(w, ParallelPlan(dp=1, micro_batch=1, grad_accum=1), "reserved")
    args = (1, False, "none", 1, 1, False)  # (tp, sp, recompute, micro-batch, cp, autocast)
    generated = allocator_steps.replayed_peak(w, lengths, *args, True, "") - allocator_steps.replayed_peak(
        w, (longest,) * 2, *args, True, ""
    )
    return {
        "recorded_varied": varied,
        "recorded_fixed": fixed,
        "recorded_excess": varied - fixed,
        "generated_excess": generated,  # the generated steps at the recorded lengths
        "predicted_cached": est.stages[-1].cached,  # what the product adds: its own STEPS lengths
        "lengths_at_longest": sum(1 for n in lengths if n >= longest),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--longest", type=int, default=256)
    ap.add_argument("--mean", type=float, default=150.0)
    ap.add_argument("--sd", type=float, default=100.0)
    args = ap.parse_args()
    r = compare(args.steps, args.longest, args.mean, args.sd)
    mib = 1 << 20
    print(
        f"{args.steps} steps, {args.mean:g} +- {args.sd:g} tokens truncated at {args.longest} "
        f"({r['lengths_at_longest']} at the longest): recorded replay {r['recorded_varied'] / mib:.1f} MiB reserved, "
        f"fixed {r['recorded_fixed'] / mib:.1f} MiB: excess {r['recorded_excess'] / mib:.1f} MiB recorded, "
        f"{r['generated_excess'] / mib:.1f} MiB generated at the same lengths; the prediction adds "
        f"{r['predicted_cached'] / mib:.1f} MiB ({allocator_steps.STEPS} steps)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
