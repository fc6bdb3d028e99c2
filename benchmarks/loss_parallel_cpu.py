"""What torchtitan's eager loss holds at its peak, plain and under DTensor's loss_parallel: measured on the CPU.

    python benchmarks/loss_parallel_cpu.py     # a few seconds; one gloo rank

torchtitan 9dec370's loss (`cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`, `del pred`, then
`loss.backward()`) on bf16 logits made by an output projection, once on plain tensors and once, as torchtitan runs
it under tensor parallelism, on a vocabulary-sharded DTensor inside `loss_parallel()` (a one-rank mesh runs the
same handlers, torch/distributed/tensor/parallel/loss.py). The profiler's allocator events give the peak of the
loss's forward and backward above what was alive before it, per logit; MARP's `logit_bytes_per_token` (12 bytes
eager, 16 under loss_parallel) is printed beside. docs/marp.md ("Logits and loss") quotes the result.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.runtime.memory import CpuMemoryRecorder  # noqa: E402

TOKENS, HIDDEN, VOCAB = 512, 64, 8192


def _step(parallel: bool) -> float:
    torch.manual_seed(0)
    x = torch.randn(1, TOKENS, HIDDEN, dtype=torch.bfloat16)
    w = torch.randn(VOCAB, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, VOCAB, (1, TOKENS))
    if parallel:
        mesh = init_device_mesh("cpu", (1,))
        wd = distribute_tensor(w.detach(), mesh, [Shard(0)]).requires_grad_()

    def run() -> None:
        if parallel:
            from torch.distributed.tensor import DTensor

            xd = DTensor.from_local(x, mesh, [torch.distributed.tensor.Replicate()])
            pred = torch.matmul(xd, wd.t())  # Shard(-1): the vocabulary split, as ColwiseParallel's output
            with loss_parallel():
                loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
                del pred
                loss.backward()
        else:
            pred = torch.matmul(x, w.t())
            loss = F.cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))
            del pred
            loss.backward()

    rec = CpuMemoryRecorder().start()
    peak, _ = rec.peak_of(run)
    rec.close()
    return peak


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=0, world_size=1)
    logits = TOKENS * VOCAB
    fixed = (TOKENS * HIDDEN + VOCAB * HIDDEN) * 2  # the head's weight gradient and the input's (bf16)
    for name, parallel, marp in (("plain", False, 12.0), ("loss_parallel", True, 16.0)):
        peak = _step(parallel)
        print(f"{name:14s} peak {peak / 2**20:8.3f} MiB = {(peak - fixed) / logits:5.2f} bytes per logit (MARP {marp})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
