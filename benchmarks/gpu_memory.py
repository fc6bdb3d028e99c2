"""A few of the CPU grid's framework points, scaled to a GPU-sized model, run on one GPU beside MARP.

    python benchmarks/gpu_memory.py [--points NAME ...] [--steps 4] [--json OUT] [--device cuda|cpu]
    python benchmarks/gpu_memory.py --predict-only     # MARP's predictions, nothing runs
    python benchmarks/gpu_memory.py --device cpu --size grid --points hf-trainer-llama-1gpu --steps 1   # dry run

Each point is a point of benchmarks/data/cpu_memory_grid.json (its model.yaml, `spec`) with the architecture
and sequence length of a ~0.5B Llama-style model (`scaled_spec`); MARP predicts it through the product's path
(`workload_from_spec` on that model.yaml and the candidate search's own plan for one GPU, exactly what
`frenzy-slurm memory MODEL.yaml --world 1 --metric M` prints), and the point's framework trains it for a few
steps: the built-in DeepSpeed trainer's model under a DeepSpeed engine, or Transformers' Trainer on a
LlamaForCausalLM built from the same config (when transformers is importable; otherwise the point is listed
as skipped). It prints torch.cuda.max_memory_allocated / max_memory_reserved and NVML's used bytes beside
MARP's allocated / reserved / device predictions. Without a GPU it says so and exits 0; `--device cpu` runs
the same points on the CPU (allocated bytes from the profiler's allocator events are not taken: the CPU
figures printed are only what torch reports, to check the script end to end). One short run on an H200
takes about two minutes.

On a GPU each point's run is also recorded with `torch.cuda.memory._record_memory_history()` (events only, no
stacks) and its allocation events are replayed through MARP's caching-allocator replayer
(`frenzy_slurm/marp/allocator_replay.py`): the line under each point gives the replay's allocated and reserved
peaks next to torch's, which checks the replayer on the real request sequence of a training step.
`--snapshots DIR` keeps each point's snapshot as JSON (`python -m frenzy_slurm.marp.allocator_trace FILE`
replays it again).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.core.units import GiB  # noqa: E402
from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.marp import ParallelPlan, Workload, estimate_memory, pinned_plan, workload_from_spec  # noqa: E402
from frenzy_slurm.marp.allocator_trace import replay_trace, settings_from_snapshot  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "data" / "cpu_memory_grid.json"
# One-GPU points of the CPU grid, one per framework this script can run (a multi-rank point needs several GPUs)
DEFAULT_POINTS = ("ds-llama-1gpu", "ds-gpt2-1gpu", "hf-trainer-llama-1gpu-bf16", "hf-trainer-llama-1gpu")
# A GPU-sized Llama-style block stack (~0.5B parameters): big enough that the context and workspaces are not the
# peak, small enough for any 24 GB GPU at these batch sizes.
GPU_ARCH = dict(layers=8, hidden=2048, heads=16, kv_heads=8, ffn=5632, vocab=32000, max_positions=2048)
GPU_SEQ = 1024
METRICS = ("allocated", "reserved", "device")
RESULT = "gpu_memory-result: "  # the worker's line with its peaks
WORKER_TIMEOUT_S = 240  # one point, a few steps: well under a minute on an H100/H200
TRACE_EVENTS = 1_000_000  # the recorder's ring: a few steps of a 0.5B model make tens of thousands of events


def load_points(names: tuple[str, ...] = DEFAULT_POINTS, grid: Path = GRID) -> list[dict]:
    """The grid points named, in that order; KeyError naming one the grid does not have."""
    points = {p["name"]: p for p in json.loads(grid.read_text())["points"]}
    missing = [n for n in names if n not in points]
    if missing:
        raise KeyError(f"{', '.join(missing)} not in {grid} (its points: {', '.join(sorted(points))})")
    return [points[n] for n in names]


def scaled_spec(point: dict, size: str = "gpu") -> dict:
    """The point's model.yaml with a GPU-sized architecture and sequence length (`size` "gpu"; "grid" keeps the
    CPU grid's own small model, for a dry run on the CPU): its framework, precision, optimizer, attention,
    checkpointing, batch and DeepSpeed settings stay; the grid arch's kind (GPT-2's LayerNorm, GELU, learned
    positions, tied head) is kept too."""
    spec = copy.deepcopy(point["spec"])
    if size == "grid":
        spec["name"] = point["name"]
        return spec
    arch = dict(spec["model"]["arch"])
    kept = {k: arch[k] for k in ("activation", "norm", "position", "bias", "tied_embeddings") if k in arch}
    gqa = arch.get("kv_heads") not in (None, arch.get("heads"))
    spec["model"]["arch"] = GPU_ARCH | kept | ({} if gqa else {"kv_heads": GPU_ARCH["heads"]})
    spec["training"]["seq_len"] = GPU_SEQ
    spec["name"] = f"{point['name']}-gpu"
    return spec


def prepare(spec_dict: dict) -> tuple[JobSpec, Workload, ParallelPlan]:
    """The model.yaml's JobSpec, its Workload and the plan fsbatch would pin for one GPU (the product's path)."""
    spec = JobSpec.model_validate(spec_dict)
    assert spec.model.arch is not None
    w = workload_from_spec(spec, ResolvedModel(arch=spec.model.arch, name=spec.name))
    return spec, w, pinned_plan(spec, w, 1)


def predict(spec_dict: dict) -> dict[str, float]:
    """MARP's peak per metric (GiB) for one GPU, through the product's path (what `frenzy-slurm memory` prints)."""
    _, w, plan = prepare(spec_dict)
    return {m: estimate_memory(w, plan, m).peak_gib for m in METRICS}


def _batches(spec: JobSpec, n: int, micro_batch: int, device: Any) -> list:
    import torch

    assert spec.model.arch is not None
    shape = (micro_batch, spec.training.seq_len + 1)
    return [torch.randint(0, spec.model.arch.vocab, shape, device=device) for _ in range(n)]


def run_deepspeed(spec_dict: dict, steps: int, device: Any) -> None:
    """The built-in trainer's model and loss under a DeepSpeed engine with the DeepSpeed config fsbatch renders
    for the point's plan (render/ds_config.py)."""
    import deepspeed

    from frenzy_slurm.models.gpt import GPT, lm_loss
    from frenzy_slurm.render.ds_config import ds_config

    spec, w, plan = prepare(spec_dict)
    assert spec.model.arch is not None
    # as the runtime builds it: model.yaml's attention kernel, selective recomputation of its core
    model = GPT(spec.model.arch, plan.recompute == "full", spec.training.attention, plan.recompute == "selective")
    model = model.to(device)
    cfg = ds_config(spec, plan, w.comm.buckets)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    for x in _batches(spec, steps * plan.grad_accum, plan.micro_batch, device):
        loss = lm_loss(engine(x[:, :-1]), x[:, 1:])
        engine.backward(loss)
        engine.step()
    engine.destroy()


def run_hf_trainer(spec_dict: dict, steps: int, device: Any) -> None:
    """Transformers' Trainer on a LlamaForCausalLM of the point's architecture (random tokens), the plan's micro-batch
    and accumulation."""
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    spec, _, plan = prepare(spec_dict)
    a, t = spec.model.arch, spec.training
    assert a is not None
    cfg = LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv, max_position_embeddings=a.max_positions,
        tie_word_embeddings=a.tied_embeddings, attn_implementation="eager" if t.attention == "eager" else "sdpa",
    )  # fmt: skip
    model = LlamaForCausalLM(cfg)
    n = steps * plan.grad_accum * plan.micro_batch
    data = [{"input_ids": x[0, :-1], "labels": x[0, :-1]} for x in _batches(spec, n, 1, "cpu")]
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=plan.micro_batch,
            gradient_accumulation_steps=plan.grad_accum, bf16=t.precision == "bf16-mixed", report_to=[],
            save_strategy="no", logging_strategy="no", use_cpu=str(device) == "cpu",
            gradient_checkpointing=plan.recompute == "full", dataloader_num_workers=0,
        )  # fmt: skip
        Trainer(model=model, args=args, train_dataset=data).train()


RUNNERS = {"deepspeed": ("deepspeed", run_deepspeed), "hf-trainer": ("transformers", run_hf_trainer)}


def runner_of(point: dict) -> tuple[str, Any]:
    """(the module it needs, the function that trains the point) for the point's trainer."""
    trainer = point.get("trainer", "deepspeed")
    if trainer not in RUNNERS:
        raise KeyError(f"point {point['name']}: no GPU runner for trainer {trainer!r} (have {', '.join(RUNNERS)})")
    arch = point["spec"]["model"]["arch"]
    if trainer == "hf-trainer" and (
        arch.get("activation", "swiglu") != "swiglu" or arch.get("norm", "rmsnorm") != "rmsnorm"
    ):
        raise KeyError(
            f"point {point['name']}: the hf-trainer runner builds a LlamaForCausalLM; this point is not Llama-style"
        )
    return RUNNERS[trainer]


def measure(
    point: dict, spec_dict: dict, steps: int, device: str, snapshot: Path | None = None
) -> dict[str, float] | str:
    """Peak allocated / reserved (torch) and NVML used bytes (GiB) of a few training steps in a process of its own
    (a fresh CUDA context and peak counters per point, and no distributed state left for the next point), or why
    none were taken."""
    module, _ = runner_of(point)
    if importlib.util.find_spec(module) is None:
        return f"skipped: {module} is not importable"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec_dict)]
    cmd += ["--trainer", point.get("trainer", "deepspeed"), "--steps", str(steps), "--device", device]
    cmd += ["--snapshot-to", str(snapshot)] if snapshot else []
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=WORKER_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return f"timed out after {WORKER_TIMEOUT_S} s"
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(RESULT):
            got = json.loads(line[len(RESULT) :])
            return got if isinstance(got, dict) else str(got)
    return f"worker failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-300:]}"


def replay_figures(snapshot: dict[str, Any], device: int = 0) -> dict[str, float]:
    """The replayer's allocated and reserved peaks (GiB) for one device's recorded trace of a snapshot, with the
    allocator settings the snapshot records; nan where the snapshot holds no trace for that device."""
    traces = snapshot.get("device_traces") or []
    if device >= len(traces) or not traces[device]:
        return {"replay_allocated": float("nan"), "replay_reserved": float("nan")}
    replay = replay_trace(traces[device], settings_from_snapshot(snapshot))
    return {
        "replay_allocated": replay.stats["allocated_bytes.all.peak"] / GiB,
        "replay_reserved": replay.stats["reserved_bytes.all.peak"] / GiB,
    }


def worker(spec_dict: dict, trainer: str, steps: int, device_name: str, snapshot_to: str | None = None) -> int:
    """One point in this process: train it, print RESULT and the peaks as JSON (or the reason as a string)."""
    import torch

    device = torch.device(device_name, 0) if device_name == "cuda" else torch.device("cpu")
    if trainer == "deepspeed":  # one rank of its own, without a launcher
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29577")
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
        # the allocator's events only (no stack frames): what the replayer reads
        torch.cuda.memory._record_memory_history(context=None, stacks="python", max_entries=TRACE_EVENTS)
    result: dict[str, float] | str
    try:
        RUNNERS[trainer][1](spec_dict, steps, device)
        result = {m: float("nan") for m in METRICS}
        if cuda:
            torch.cuda.synchronize(device)
            result = {
                "allocated": torch.cuda.max_memory_allocated(device) / GiB,
                "reserved": torch.cuda.max_memory_reserved(device) / GiB,
                "device": _nvml_used_gib(device.index or 0),
            }
            snapshot = torch.cuda.memory._snapshot(device)
            result |= replay_figures(snapshot, device.index or 0)
            if snapshot_to:
                Path(snapshot_to).write_text(json.dumps(snapshot, default=str))
    except torch.cuda.OutOfMemoryError as exc:
        result = f"OOM: {exc}"[:160]
    print(RESULT + json.dumps(result), flush=True)
    return 0


def _nvml_used_gib(index: int) -> float:
    """This process's used bytes on the GPU (NVML), or nan where NVML is not there."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        mine = [p for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid == os.getpid()]
        if mine and mine[0].usedGpuMemory:
            return mine[0].usedGpuMemory / GiB
        return pynvml.nvmlDeviceGetMemoryInfo(handle).used / GiB
    except Exception:  # noqa: BLE001 - pynvml.NVMLError, or pynvml missing
        return float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--points", nargs="+", default=list(DEFAULT_POINTS), help="grid point names")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size", choices=("gpu", "grid"), default="gpu", help="grid: the CPU grid's own small model")
    ap.add_argument("--predict-only", action="store_true", help="print MARP's predictions; run nothing")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--snapshots", type=Path, help="keep each point's allocator snapshot here, as JSON")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # one point's model.yaml (JSON), run in this process
    ap.add_argument("--trainer", help=argparse.SUPPRESS)
    ap.add_argument("--snapshot-to", help=argparse.SUPPRESS)  # the worker's snapshot file
    args = ap.parse_args(argv)
    if args.worker:
        return worker(json.loads(args.worker), args.trainer, args.steps, args.device, args.snapshot_to)
    try:
        points = load_points(tuple(args.points))
        for p in points:
            runner_of(p)
    except KeyError as exc:
        print(f"gpu_memory: {exc.args[0]}", file=sys.stderr)
        return 2
    if not args.predict_only:
        if importlib.util.find_spec("torch") is None:
            print("gpu_memory: torch is not installed (pip install -e '.[train]'); nothing measured")
            return 0
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            print("gpu_memory: no GPU found (torch.cuda.is_available() is False); nothing measured")
            return 0
        if args.device == "cuda":
            print(f"GPU: {torch.cuda.get_device_name(0)}")
    print(f"{'point':30} | {'alloc':>6} {'MARP':>6} | {'resv':>6} {'MARP':>6} | {'nvml':>6} {'MARP':>6}   GiB")
    rows = []
    for p in points:
        spec = scaled_spec(p, args.size)
        pred = predict(spec)
        snapshot = None
        if args.snapshots:
            args.snapshots.mkdir(parents=True, exist_ok=True)
            snapshot = args.snapshots / f"{p['name']}.json"
        got = "not run (--predict-only)" if args.predict_only else measure(p, spec, args.steps, args.device, snapshot)
        rows.append({"point": p["name"], "spec": spec, "predicted": pred, "measured": got})
        if isinstance(got, str):
            cells = [f"{pred[m]:6.2f}" for m in METRICS]
            print(f"{p['name']:30} |      - {cells[0]} |      - {cells[1]} |      - {cells[2]}   {got}")
            continue
        errors = ", ".join(f"{m} {(pred[m] - got[m]) / got[m]:+.1%}" for m in METRICS if got[m] == got[m])
        cells = " | ".join(f"{got[m]:6.2f} {pred[m]:6.2f}" for m in METRICS)
        print(f"{p['name']:30} | {cells}   {errors or 'ran (the CPU has no allocator peaks to compare)'}")
        if got.get("replay_reserved", float("nan")) == got.get("replay_reserved"):
            print(
                f"{'  replay of its allocator trace':30} | {got['replay_allocated']:6.2f} {'':6} | "
                f"{got['replay_reserved']:6.2f} {'':6} |   reserved {got['replay_reserved'] - got['reserved']:+.3f} GiB"
                " against torch's"
            )
    if args.json:
        args.json.write_text(json.dumps({"device": args.device, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
