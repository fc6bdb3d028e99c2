"""Measures, per pipeline rank, the peak of saved activations plus accumulated gradients under torch's own schedules.

Runs torch.distributed.pipelining (gloo, one process per rank, CPU) on a stack of bias-free linear blocks, counts
the bytes each block's forward saves for backward (a saved-tensors hook whose holder subtracts its bytes when torch
drops it) and the bytes of the gradients accumulated so far, and records their largest sum per rank. That is what
`marp/pipeline_order.py` replays: it predicts the same peak from one chunk-micro-batch's saved bytes and one chunk's
gradient bytes. Plain parameters accumulate `.grad` at each chunk's first backward and keep it, as FSDP2 keeps its
unsharded gradients under torch's PipelineStage.

    nice python benchmarks/pipeline_schedule_cpu.py       # 1f1b, interleaved, gpipe at pp 2 and 4 (~2 min)
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from frenzy_slurm.marp.memory_activations import in_flight  # noqa: E402
from frenzy_slurm.marp.pipeline_order import rank_ops, replay  # noqa: E402
from frenzy_slurm.marp.plan import ParallelPlan  # noqa: E402


class _Live:
    """Bytes of saved activations and accumulated gradients alive on this rank, and the largest sum seen."""

    def __init__(self) -> None:
        self.saved = 0
        self.grads = 0
        self.peak = 0

    def note(self) -> None:
        self.peak = max(self.peak, self.saved + self.grads)


class _Held:
    def __init__(self, t: torch.Tensor, live: _Live) -> None:
        self.t, self.live, self.n = t, live, t.numel() * t.element_size()
        live.saved += self.n
        live.note()

    def __del__(self) -> None:
        self.live.saved -= self.n


class _Block(nn.Module):
    """x @ w: saves its input (and the weight, which the hook leaves out: it is a parameter); block k's output is
    block k + 1's saved input, so a chunk-micro-batch saves `layers` inputs."""

    def __init__(self, d: int, live: _Live) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(d, d) / d**0.5)
        self.live = live
        self.w.register_post_accumulate_grad_hook(self._grad)

    def _grad(self, p: torch.Tensor) -> None:
        if not getattr(p, "_counted", False):  # the first accumulation allocates .grad; later ones add into it
            p._counted = True  # type: ignore[attr-defined]
            self.live.grads += p.numel() * p.element_size()
        self.live.note()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = {self.w.data_ptr()}

        def pack(t: torch.Tensor) -> object:
            return t if t.data_ptr() in params else _Held(t, self.live)

        def unpack(h: object) -> torch.Tensor:
            return h.t if isinstance(h, _Held) else h  # type: ignore[return-value]

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            return x @ self.w


def _run(rank: int, world: int, init: str, cfg: dict, out: dict) -> None:
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.manual_seed(0)
    schedule, n_mb, mb, d, layers = cfg["schedule"], cfg["n_mb"], cfg["mb"], cfg["d"], cfg["layers"]
    v = cfg["v"] if schedule == "interleaved" else 1
    live = _Live()
    n_stages = world * v
    stages = [
        PipelineStage(nn.Sequential(*[_Block(d, live) for _ in range(layers)]), s, n_stages, torch.device("cpu"))
        for s in range(rank, n_stages, world)  # torchtitan's "loop" style: rank r runs stages r, r + pp, ...
    ]
    loss_fn = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    if schedule == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=n_mb, loss_fn=loss_fn)
    else:
        cls = Schedule1F1B if schedule == "1f1b" else ScheduleGPipe
        sched = cls(stages[0], n_microbatches=n_mb, loss_fn=loss_fn)
    x, target = torch.randn(n_mb * mb, d), torch.randn(n_mb * mb, d)
    first, last = rank == 0, rank == (n_stages - 1) % world
    args = (x,) if first else ()
    if last:
        sched.step(*args, target=target, losses=[])
    else:
        sched.step(*args)
    act = layers * mb * d * 4  # one chunk-micro-batch's saved inputs (fp32)
    grad = layers * d * d * 4  # one chunk's gradients
    states = replay(rank_ops(schedule, world, rank, n_mb, v), v)
    predicted = max(n * v * act + share * v * grad for n, share in states)
    # before the replay: the in-flight micro-batches beside the stage's whole gradients
    plan = ParallelPlan(pp=world, grad_accum=n_mb, schedule=schedule, virtual_stages=v)
    before = in_flight(plan, rank) * v * act + v * grad
    out[rank] = (live.peak, predicted, before)
    dist.destroy_process_group()


def measure(schedule: str, pp: int, n_mb: int, v: int = 2, mb: int = 2, d: int = 32, layers: int = 2) -> dict:
    """{rank: (measured peak bytes, replayed by marp/pipeline_order.py, in flight beside every gradient)}."""
    cfg = {"schedule": schedule, "n_mb": n_mb, "v": v, "mb": mb, "d": d, "layers": layers}
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        init = f"file://{os.path.join(tmp, 'rdzv')}"
        mp.start_processes(_run, args=(pp, init, cfg, out), nprocs=pp, start_method="spawn")
        return dict(out)


def main() -> None:
    print(f"torch {torch.__version__}; bytes: measured / replayed (marp/pipeline_order.py) / in flight + all grads")
    for schedule, v in (("1f1b", 1), ("interleaved", 2), ("gpipe", 1)):
        for pp, n_mb in ((2, 2), (2, 4), (4, 4), (4, 8)):  # torchtitan's default: as many micro-batches as stages
            for d in (8, 64):  # activations dominate / gradients dominate
                got = measure(schedule, pp, n_mb=n_mb, v=v, d=d)
                cells = ", ".join(f"r{r} {m}/{p:.0f}/{b:.0f}" for r, (m, p, b) in sorted(got.items()))
                print(f"{schedule:12s} pp={pp} v={v} n_mb={n_mb} d={d}: {cells}")


if __name__ == "__main__":
    main()
