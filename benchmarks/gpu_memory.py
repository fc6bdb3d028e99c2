"""Real peak memory and step time of the built-in trainer on a GPU, against MARP's predictions.

    python benchmarks/gpu_memory.py [--steps 6] [--json OUT]

For GPT-2-medium and a 1B Llama-style model at two sequence lengths, ZeRO 0 and 2 (one GPU, bf16
mixed precision, AdamW), runs a few DeepSpeed training steps on whatever GPU it finds and prints
measured torch.cuda.max_memory_allocated / max_memory_reserved / NVML used and step time beside
MARP's allocated, reserved and device predictions for that GPU. Without a GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.gpus import match_gpu  # noqa: E402
from frenzy_slurm.jobspec import presets  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import ParallelPlan, Workload, estimate_memory  # noqa: E402
from frenzy_slurm.marp.memory import Overheads  # noqa: E402
from frenzy_slurm.marp.speed import Links, step_time  # noqa: E402
from frenzy_slurm.units import GiB  # noqa: E402

LLAMA_1B = Architecture(layers=16, hidden=2048, heads=32, kv_heads=8, ffn=8192, vocab=32000, max_positions=4096)
CASES = [
    (name, arch, seq, zero, mb)
    for name, arch in (("gpt2-medium", presets()["gpt2-medium"].arch), ("llama-1b", LLAMA_1B))
    for seq in (512, 1024)
    for zero in (0, 2)
    for mb in (4,)
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("gpu_memory: torch is not installed (pip install -e '.[train]'); nothing measured")
        return 0
    if not torch.cuda.is_available():
        print("gpu_memory: no GPU found (torch.cuda.is_available() is False); nothing measured")
        return 0
    import deepspeed

    from frenzy_slurm.models.gpt import GPT, lm_loss

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29577")
    deepspeed.init_distributed(dist_backend="nccl")
    dev = torch.device("cuda", 0)
    name = torch.cuda.get_device_name(dev)
    spec = match_gpu(name)
    print(f"GPU: {name} (catalog: {spec.name if spec else 'unknown'})")
    torch.cuda.synchronize()
    context_gib = None
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)

        def nvml_used() -> float:
            return pynvml.nvmlDeviceGetMemoryInfo(handle).used / GiB

        context_gib = nvml_used() - torch.cuda.memory_reserved(dev) / GiB
    except Exception:  # noqa: BLE001 - pynvml.NVMLError or missing pynvml

        def nvml_used() -> float:
            return float("nan")

    rows = []
    header = (
        f"{'model':12} {'seq':>5} {'zero':>4} {'mb':>3} | {'alloc':>6} {'pred':>6} {'acc':>6} | "
        f"{'resv':>6} {'pred':>6} | {'nvml':>6} {'pred':>6} | {'step ms':>8} {'pred':>8}"
    )
    print(header)
    for model_name, arch, seq, zero, mb in CASES:
        gb = mb
        cfg = {
            "train_batch_size": gb,
            "train_micro_batch_size_per_gpu": mb,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {
                "stage": zero,
                "reduce_bucket_size": 200_000_000,
                "allgather_bucket_size": 200_000_000,
                "overlap_comm": False,
                "contiguous_gradients": True,
            },
            "bf16": {"enabled": True},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        }
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
        engine = model = None
        try:
            model = GPT(arch)
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
            times = []
            for _ in range(args.steps):
                x = torch.randint(0, arch.vocab, (mb, seq + 1), device=dev)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                loss = lm_loss(engine(x[:, :-1]), x[:, 1:])
                engine.backward(loss)
                engine.step()
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            measured = {
                "allocated": torch.cuda.max_memory_allocated(dev) / GiB,
                "reserved": torch.cuda.max_memory_reserved(dev) / GiB,
                "nvml": nvml_used(),
                "step_s": statistics.median(times[1:]) if len(times) > 1 else times[0],
            }
            error = None
        except torch.cuda.OutOfMemoryError as exc:
            measured, error = {}, f"OOM: {exc}"[:200]
        finally:
            engine = model = None  # drop the last references before measuring the next case
            gc.collect()
            torch.cuda.empty_cache()
        w = Workload(arch=arch, seq_len=seq, precision="bf16-mixed", optimizer="adamw", attention="sdpa")
        plan = ParallelPlan(dp=1, zero=zero, micro_batch=mb)
        ov = Overheads(context_gib=context_gib) if context_gib and context_gib > 0 else Overheads()
        pred = {m: estimate_memory(w, plan, m, ov).peak_gib for m in ("allocated", "reserved", "device")}
        pred_step = step_time(w, plan, spec, gb, Links(spec.link_gbs)) if spec else None
        row = {
            "model": model_name,
            "seq_len": seq,
            "zero": zero,
            "micro_batch": mb,
            "measured": measured,
            "predicted": pred | {"step_s": pred_step},
            "error": error,
        }
        if measured:
            row["accuracy_allocated"] = 1 - abs(pred["allocated"] - measured["allocated"]) / measured["allocated"]
        rows.append(row)
        if error:
            print(f"{model_name:12} {seq:5} {zero:4} {mb:3} | {error}")
            continue
        print(
            f"{model_name:12} {seq:5} {zero:4} {mb:3} | {measured['allocated']:6.2f} {pred['allocated']:6.2f} "
            f"{row['accuracy_allocated']:6.1%} | {measured['reserved']:6.2f} {pred['reserved']:6.2f} | "
            f"{measured['nvml']:6.2f} {pred['device']:6.2f} | {measured['step_s'] * 1e3:8.1f} "
            f"{(pred_step or float('nan')) * 1e3:8.1f}"
        )
    accs = [r["accuracy_allocated"] for r in rows if "accuracy_allocated" in r]
    if accs:
        print(
            f"mean accuracy (allocated): {statistics.mean(accs):.1%} over {len(accs)} runs; "
            f"CUDA context measured {context_gib if context_gib is not None else float('nan'):.2f} GiB"
        )
    if args.json:
        args.json.write_text(json.dumps({"gpu": name, "context_gib": context_gib, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
