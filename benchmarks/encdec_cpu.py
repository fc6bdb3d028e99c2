"""MARP's encoder-decoder terms against a real tiny T5ForConditionalGeneration trained on the CPU.

    python benchmarks/encdec_cpu.py [--json OUT]       # ~1 min on 2 cores; needs the `examples` extra

For each configuration (FFN relu / gated-gelu, eager or SDPA attention, dropout, full checkpointing, LoRA through
PEFT's T5 defaults, lengths and layer counts of each stack) it trains one step of a tiny T5 (transformers 5.17,
fp32, AdamW stepped per tensor, a padded sample in the batch, the model output bound through the backward as the
usual loop binds it) and records the peak of the CPU allocator's running total over that step (the profiler's
memory events, as the CPU grid measures). Beside it: the `allocated` estimate of the model.yaml that describes the
run, through the product path (workload_from_spec, pinned_plan, estimate_memory). docs/marp.md quotes the table.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import estimate_memory, pinned_plan, workload_from_spec  # noqa: E402
from frenzy_slurm.runtime.memory import CpuMemoryRecorder  # noqa: E402

HIDDEN, HEADS, D_KV, FFN, VOCAB = 64, 6, 16, 192, 2048

# (name, settings): enc/dec layers, source/target length, batch, FFN, attention, dropout, checkpointing, method
POINTS: list[tuple[str, dict]] = [
    ("relu eager dropout", {}),
    ("gated-gelu eager dropout", {"proj": "gated-gelu"}),
    ("relu sdpa", {"attn": "sdpa", "drop": 0.0}),
    ("gated-gelu sdpa, target longer", {"proj": "gated-gelu", "attn": "sdpa", "drop": 0.0, "s": 16, "t": 128}),
    ("relu eager, source longer", {"s": 128, "t": 16, "b": 2}),
    ("checkpointed eager dropout", {"ckpt": True}),
    ("checkpointed eager", {"ckpt": True, "drop": 0.0}),
    ("checkpointed sdpa", {"ckpt": True, "attn": "sdpa", "drop": 0.0}),
    ("checkpointed, target longer", {"ckpt": True, "s": 32, "t": 64}),
    ("checkpointed gated, batch 8", {"ckpt": True, "proj": "gated-gelu", "b": 8}),
    ("checkpointed 2+4 layers, source 128", {"ckpt": True, "enc": 2, "dec": 4, "s": 128}),
    ("LoRA q,v eager dropout", {"lora": True}),
    ("LoRA q,v checkpointed", {"lora": True, "ckpt": True}),
    ("LoRA q,v gated sdpa", {"lora": True, "proj": "gated-gelu", "attn": "sdpa", "drop": 0.0}),
]


def measure(
    proj: str = "relu",
    attn: str = "eager",
    drop: float = 0.1,
    ckpt: bool = False,
    lora: bool = False,
    enc: int = 3,
    dec: int = 2,
    s: int = 64,
    t: int = 32,
    b: int = 4,
) -> tuple[float, float]:
    """(measured peak bytes, predicted bytes) of one configuration."""
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    cfg = T5Config(
        vocab_size=VOCAB,
        d_model=HIDDEN,
        d_ff=FFN,
        d_kv=D_KV,
        num_heads=HEADS,
        num_layers=enc,
        num_decoder_layers=dec,
        feed_forward_proj=proj,
        dropout_rate=drop,
        attn_implementation=attn,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = T5ForConditionalGeneration(cfg).train()
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora:
        from peft import LoraConfig, get_peft_model

        # PEFT's T5 default target modules: q and v (utils/constants.py)
        model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, task_type="SEQ_2_SEQ_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=False)
    x = torch.randint(0, VOCAB, (b, s))
    y = torch.randint(0, VOCAB, (b, t))
    mask = torch.ones_like(x)
    mask[0, -4:] = 0

    def step() -> None:
        out = model(input_ids=x, attention_mask=mask, labels=y)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    gc.collect()
    measured, _ = CpuMemoryRecorder().start().peak_of(step)
    arch = Architecture(
        layers=dec,
        encoder_layers=enc,
        hidden=HIDDEN,
        heads=HEADS,
        d_kv=D_KV,
        ffn=FFN,
        vocab=VOCAB,
        activation="geglu" if proj.startswith("gated") else "relu",
        tied_embeddings=True,  # transformers 5.17 ties T5's LM head whatever the config says
        position="relative",
        norm="rmsnorm",
        bias="none",
        dropout=drop,
        activation_dropout=drop,
    )
    spec = JobSpec.model_validate(
        {
            "name": "tiny-t5",
            "model": {"arch": arch.model_dump(exclude_defaults=True)},
            "training": {
                "seq_len": s,
                "target_len": t,
                "global_batch": b,
                "micro_batch": b,
                "steps": 1,
                "precision": "fp32",
                "attention": "eager" if attn == "eager" else "sdpa",
                "activation_checkpointing": "full" if ckpt else "none",
                "optimizer_impl": "fused",
                "method": "lora" if lora else "full",
                "lora": {"rank": 8, "targets": ["q", "v"], "dropout": 0.05},
            },
            "parallel": {"sharding": "none", "tp": 1, "pp": 1},
            "entry": {"trainer": "script", "script": "train.py", "framework": "torch"},
        }
    )
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="tiny-t5"), device="cpu")
    predicted = estimate_memory(w, pinned_plan(spec, w, 1), "allocated").peak
    return measured, predicted


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", type=Path, help="write the table as JSON")
    args = ap.parse_args()
    rows = []
    print(f"{'configuration':40s} {'measured MiB':>12s} {'MARP MiB':>9s} {'error':>7s}")
    for name, kw in POINTS:
        measured, predicted = measure(**kw)
        err = predicted / measured - 1.0
        rows.append({"point": name, "measured": measured, "predicted": predicted, "error": err})
        print(f"{name:40s} {measured / 2**20:12.3f} {predicted / 2**20:9.3f} {err:+7.1%}")
    errors = [r["error"] for r in rows]
    print(
        f"error from {min(errors):+.1%} to {max(errors):+.1%}, mean |error| {sum(map(abs, errors)) / len(errors):.1%}"
    )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
