"""The caching allocator's replay of a generated training step against MARP's fitted reserved rate (issue 29).

    python benchmarks/step_replay_vs_rate.py                                        # a few seconds

For each case - the CPU grid's plain-loop points as if they ran on a GPU, and Llama-2-7B's shapes (32 blocks,
hidden 4096, ffn 11008, vocab 32000) in bf16 and with LoRA at 1 and 2 x 4096 tokens - the replayed sequence is:
the weights, one tensor per parameter in the model's order (marp/allocator.py `parameter_shapes`, and the LoRA
adapters); then three steps of marp/step_requests.py's requests with `device="cuda"` (no CPU kernel workspaces,
foreach AdamW), AdamW's two states per trained parameter made at the start of the first step's optimizer phase
(torch's AdamW makes them lazily, in `_init_group`). marp/allocator_replay.py gives the allocated and reserved
peaks over the three steps.

Beside it, MARP's estimate of the same workload with the caching allocator on (`estimate_memory`, metrics
`allocated` and `reserved`: `allocator_overhead` with `Overheads.step_fragmentation`'s fitted 25 % of the step's
bytes). The table prints both reserved/allocated ratios and the replayed reserved peak against MARP's. The
generator's op sequence is the CPU's in what step_dtypes does not tell apart (RMSNorm's composite rather than a
fused CUDA kernel), so the GPU-scale rows are the replay of that sequence, not of a measured CUDA step.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.jobspec import JobSpec, ResolvedModel  # noqa: E402
from frenzy_slurm.jobspec.arch import Architecture  # noqa: E402
from frenzy_slurm.marp import pinned_plan, workload_from_spec  # noqa: E402
from frenzy_slurm.marp.allocator import parameter_shapes  # noqa: E402
from frenzy_slurm.marp.allocator_replay import Event, alloc, replay  # noqa: E402
from frenzy_slurm.marp.memory import estimate_memory  # noqa: E402
from frenzy_slurm.marp.plan import ParallelPlan, Workload  # noqa: E402
from frenzy_slurm.marp.step_dtypes import step_dtypes  # noqa: E402
from frenzy_slurm.marp.step_frenzy import frenzy_graph  # noqa: E402
from frenzy_slurm.marp.step_requests import Request, events_of, step_requests  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "data" / "cpu_memory_grid.json"
MiB = 2**20
STEPS = 3
LLAMA2_7B = Architecture(
    layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008, activation="swiglu", vocab=32000, max_positions=4096
)


def _cuda_workload(spec_data: dict) -> tuple[Workload, ParallelPlan]:
    """The Workload and one-GPU plan fsbatch derives from this model.yaml for a CUDA pool (the product's path)."""
    spec = JobSpec.model_validate(spec_data)
    assert spec.model.arch is not None
    w = workload_from_spec(spec, ResolvedModel(arch=spec.model.arch, name=spec.name), device="cuda")
    return w, pinned_plan(spec, w, 1)


def _llama2_7b(mb: int, precision: str, method: str) -> dict:
    """A plain torch loop's model.yaml for Llama-2-7B's shapes at mb x 4096 tokens (LoRA r16 on q and v, no dropout)."""
    lora = {"lora": {"rank": 16, "targets": ["q", "v"], "dropout": 0.0}} if method == "lora" else {}
    return {
        "name": "llama2-7b",
        "model": {"arch": LLAMA2_7B.model_dump(exclude_none=True)},
        "training": {"seq_len": 4096, "global_batch": mb, "micro_batch": mb, "steps": 1, "precision": precision,
                     "activation_checkpointing": "none",
                     "method": method, **lora},
        "entry": {"trainer": "script", "script": "train.py", "framework": "torch"},
        "parallel": {"sharding": "none", "tp": 1, "pp": 1},
    }  # fmt: skip


def cases() -> list[tuple[str, Workload, ParallelPlan]]:
    """(name, workload, plan): the grid's plain-loop points in fp32, bf16 and with LoRA, and Llama-2-7B shapes, each
    from the model.yaml a user would write, on a CUDA pool."""
    points = {p["name"]: p for p in json.loads(GRID.read_text())["points"]}
    out = []
    for name, precision in (
        ("torch-llama-1gpu", "fp32"),
        ("torch-llama-1gpu", "bf16-mixed"),
        ("torch-llama-1gpu", "bf16-pure"),
        ("torch-gpt2-1gpu-mb4", "fp32"),
        ("lora-llama-1gpu", "fp32"),
    ):
        data = copy.deepcopy(points[name]["spec"])
        data["training"]["precision"] = precision
        w, plan = _cuda_workload(data)
        out.append((f"{name} {precision}", w, plan))
    for mb in (1, 2):
        for precision, method in (("bf16-mixed", "full"), ("bf16-pure", "full"), ("fp32", "lora")):
            w, plan = _cuda_workload(_llama2_7b(mb, precision, method))
            out.append((f"llama2-7b {mb}x4096 {precision} {method}", w, plan))
    return out


def long_lived(w: Workload, plan: ParallelPlan) -> tuple[list[Event], list[Event]]:
    """(the weights' allocations, AdamW's states' allocations) in the model's order."""
    dt = step_dtypes(w.precision, "cuda")
    _, trained = frenzy_graph(w, plan, 1, dt)
    weights: list[tuple[str, int]] = []
    if w.method == "lora":  # (the frozen base in the weights' dtype, the adapters beside it)
        for n, (elements, count) in enumerate(parameter_shapes(w.arch, w.arch.layers, True, True, 1, 1)):
            weights += [(f"w{n}.{k}", int(elements * dt.param)) for k in range(int(count))]
    weights += trained
    states = [(f"{p}.{s}", size) for p, size in trained for s in ("exp_avg", "exp_avg_sq")]
    return [alloc(f"weight.{k}", n) for k, n in weights], [alloc(f"state.{k}", n) for k, n in states]


def replayed(w: Workload, plan: ParallelPlan) -> tuple[int, int]:
    """(allocated peak, reserved peak) of the weights and three steps, the states made in the first."""
    weights, states = long_lived(w, plan)
    events = list(weights)
    for step in range(STEPS):
        reqs: list[Request] = step_requests(w, plan, step=step, device="cuda")
        step_events = events_of(reqs)
        if step == 0:  # (AdamW's states, made at the start of the first optimizer step)
            first = len(events_of(reqs[: next(n for n, r in enumerate(reqs) if r.phase == "optimizer")]))
            step_events[first:first] = states
        events += step_events
    result = replay(events)
    return result.allocated_peak, result.reserved_peak


def main() -> int:
    print(
        f"{'case':42} {'alloc MiB':>10} {'reserved':>9} {'ratio':>6} | {'MARP alloc':>10} {'reserved':>9} "
        f"{'ratio':>6} | {'replay/MARP reserved':>20}"
    )
    for name, w, plan in cases():
        start = time.perf_counter()
        a, r = replayed(w, plan)
        seconds = time.perf_counter() - start
        ma = estimate_memory(w, plan, "allocated").peak
        mr = estimate_memory(w, plan, "reserved").peak
        print(
            f"{name:42} {a / MiB:10.1f} {r / MiB:9.1f} {r / a:6.3f} | {ma / MiB:10.1f} {mr / MiB:9.1f} "
            f"{mr / ma:6.3f} | {r / mr:19.3f}  ({seconds:.2f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
