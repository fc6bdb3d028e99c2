"""HAS's pipeline step-time model against real DeepSpeed pipelines on the CPU (gloo), stage splits balanced and not.

    nice -n 10 python benchmarks/pipeline_step.py [--out benchmarks/data/pipeline_step.json] [--steps 6]

A heterogeneous job is a DeepSpeed pipeline whose stages run on different GPU types; HAS predicts its step
as (grad_accum + pp - 1) x the slowest stage's micro-batch time (1F1B: fill, steady state, drain), plus the
activations sent between stages and the fixed costs of a step (`frenzy_slurm.has.hetero.step_time`). A
slower GPU type and a stage with more layers are the same thing to that model: the slowest stage sets the
pace. On the CPU every rank is as fast as the others, so the split varies the stage times instead.

Each point trains the built-in model as a PipelineModule (the runtime's `models.pipe.pipeline_module`, an
exact layer split), one process and one thread per stage, for `--steps` optimizer steps, and records the
median of the steps after the first. The single-stage points calibrate what the model cannot know about
this CPU: the effective FLOP/s (from the per-micro-batch slope over grad_accum) and the fixed cost of a
step (the intercept). tests/test_has_pipeline_step.py then predicts every two-stage point through
`step_time` with those two numbers and requires agreement within the tolerance it states; this script is
the only thing that trains. The result goes to a JSON dataset (the points, the machine, the command).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "data" / "pipeline_step.json"

# Large enough that a micro-batch's matmuls, not Python and gloo, take most of a stage's time on one CPU thread.
ARCH = dict(layers=8, hidden=256, heads=4, kv_heads=4, ffn=688, activation="swiglu", vocab=512, max_positions=256)
SEQ_LEN = 256
MICRO_BATCH = 2


def grid() -> list[dict[str, Any]]:
    """Single-stage calibration points, then two-stage pipelines: balanced, and 6:2 / 2:6 (the slowest stage
    three times the other), each at grad_accum 1, 2, 4 and 8 (the bubble (pp - 1) / grad_accum from 1 to 1/8)."""
    pts = [{"split": [8], "grad_accum": ga} for ga in (1, 4)]
    for split in ([4, 4], [6, 2], [2, 6]):
        pts += [{"split": split, "grad_accum": ga} for ga in (1, 2, 4, 8)]
    return pts


def _worker(rank: int, world: int, p: dict, port: int, steps: int, out_dir: str) -> None:
    from cpu_memory_grid import rank_env  # benchmarks/ is on sys.path: it is this script's directory

    rank_env(rank, world, port)
    import logging

    import deepspeed
    import torch

    from frenzy_slurm.jobspec.arch import Architecture
    from frenzy_slurm.models.pipe import pipeline_module
    from frenzy_slurm.runtime.shm import release_allreduce_segment, segment_path

    torch.set_num_threads(1)
    torch.manual_seed(0)
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    deepspeed.init_distributed(dist_backend="gloo")
    release_allreduce_segment(segment_path(rank))  # /dev/shm is RAM; DeepSpeed never unlinks it (runtime/shm.py)
    arch = Architecture(**ARCH)
    ga = p["grad_accum"]
    model = pipeline_module(arch, p["split"], checkpoint=False)
    config = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": ga,
        "train_batch_size": MICRO_BATCH * ga,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}},
        "steps_per_print": 10**9,
    }
    params = [q for q in model.parameters() if q.requires_grad]
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=config)
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randint(0, arch.vocab, (MICRO_BATCH, SEQ_LEN), generator=gen)
        return x, torch.roll(x, -1, 1)

    times = []
    for _ in range(steps):
        data = [batch() for _ in range(ga)]
        torch.distributed.barrier()  # every stage starts the step together
        t0 = time.perf_counter()
        engine.train_batch(data_iter=iter(data))
        torch.distributed.barrier()  # the step ends when its last stage is done
        times.append(time.perf_counter() - t0)
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps({"rank": rank, "step_times_s": times}))


def run_point(p: dict, steps: int) -> dict:
    import torch.multiprocessing as mp

    from frenzy_slurm.runtime.dist import free_port

    world = len(p["split"])
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, p, free_port(), steps, d), nprocs=world, start_method="spawn")
        rank0 = json.loads(Path(d, "rank0.json").read_text())
    times = rank0["step_times_s"][1:]  # the first step builds the optimizer states and warms the caches
    return p | {"step_times_s": times, "step_s": statistics.median(times)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--steps", type=int, default=6, help="optimizer steps per point (the first is not timed)")
    args = ap.parse_args()
    import deepspeed
    import torch

    points = []
    for p in grid():
        r = run_point(p, args.steps)
        print(f"split {r['split']} grad_accum {r['grad_accum']}: {r['step_s'] * 1e3:.1f} ms", flush=True)
        points.append(r)
    out = {
        "command": "nice -n 10 python benchmarks/pipeline_step.py"
        + (f" --steps {args.steps}" if args.steps != 6 else ""),
        "torch": torch.__version__,
        "deepspeed": deepspeed.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, one thread per stage",
        "arch": ARCH,
        "seq_len": SEQ_LEN,
        "micro_batch": MICRO_BATCH,
        "precision": "fp32",
        "points": points,
    }
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
