"""A plain PyTorch training loop (DDP, or FSDP where the plan shards: FRENZY_ZERO 3), as frenzy-slurm plans it.

    fsbatch examples/scripts/torch_ddp.yaml

No framework beyond torch: the script reads the plan from the environment (FRENZY_MICRO_BATCH, FRENZY_GRAD_ACCUM,
FRENZY_LEARNING_RATE, FRENZY_STEPS, FRENZY_SEQ_LEN, FRENZY_ZERO, FRENZY_RECOMPUTE; docs/runtime.md) and the
architecture from plan.json, and builds a small causal decoder of it (random weights, synthetic learnable
data). The runtime has set RANK, WORLD_SIZE, LOCAL_RANK and MASTER_ADDR/PORT, so init_process_group needs
nothing else; on a CPU node it runs over gloo.

Every rank polls frenzy_slurm.in_job at step boundaries and the ranks agree (all_reduce) before they stop: at
USR2 or TERM rank 0 saves checkpoints/step<N>/state.pt, and after USR2 requeues the job; the next run resumes
from the newest step<N>.
"""

from __future__ import annotations

from frenzy_slurm import in_job  # first: the USR2/TERM handler is in place before torch is imported

import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def env(name: str) -> str:
    return os.environ[f"FRENZY_{name}"]


class Decoder(nn.Module):
    """Embedding, pre-norm causal transformer blocks, untied output layer."""

    def __init__(self, arch: dict, recompute: bool) -> None:
        super().__init__()
        h = arch["hidden"]
        self.embed = nn.Embedding(arch["vocab"], h)
        self.pos = nn.Embedding(arch["max_positions"], h)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(h, arch["heads"], arch["ffn"], dropout=0.0, batch_first=True, norm_first=True)
            for _ in range(arch["layers"])
        )
        self.norm = nn.LayerNorm(h)
        self.head = nn.Linear(h, arch["vocab"], bias=False)
        self.recompute = recompute

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(s, device=x.device)
        y = self.embed(x) + self.pos(torch.arange(s, device=x.device))
        for block in self.blocks:
            if self.recompute and self.training:
                y = checkpoint(block, y, mask, None, True, use_reentrant=False)
            else:
                y = block(y, src_mask=mask, is_causal=True)
        return self.head(self.norm(y))


def batch(step: int, micro: int, rank: int, size: int, seq: int, vocab: int, device: torch.device) -> torch.Tensor:
    """x_t = (x_0 + t*k) mod V, depending only on (step, micro-batch, rank): a resumed run sees the same data."""
    g = torch.Generator().manual_seed((step * 1009 + micro) * 65537 + rank)
    x0 = torch.randint(0, vocab, (size, 1), generator=g)
    k = torch.randint(1, 8, (size, 1), generator=g)
    return ((x0 + torch.arange(seq + 1) * k) % vocab).to(device)


def write_summary(summary: dict) -> None:
    """JOBDIR/example-result.json (what tests/test_repo_examples_live.py reads) and one line in the job's output."""
    Path(os.environ["FRENZY_JOB_DIR"], "example-result.json").write_text(json.dumps(summary) + "\n")
    last = summary["loss"][-1] if summary["loss"] else float("nan")
    print(f"frenzy-example: step {summary['step']}/{summary['max_steps']}, loss {last:.4f}", flush=True)


def main() -> int:
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    arch = json.loads(Path(env("PLAN")).read_text())["arch"]
    micro, accum = int(env("MICRO_BATCH")), int(env("GRAD_ACCUM"))
    steps, seq, lr = int(env("STEPS")), int(env("SEQ_LEN")), float(env("LEARNING_RATE"))
    torch.manual_seed(int(env("SEED")))
    model = Decoder(arch, recompute=env("RECOMPUTE") != "none").to(device)
    start, state = 0, None
    resume = in_job.latest_checkpoint()
    if resume is not None:  # rank 0 saved full tensors; every rank loads them before the model is wrapped
        state = torch.load(resume / "state.pt", map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        start = state["step"] + 1
        if rank == 0:
            print(f"resuming from {resume} at step {start}", flush=True)
    if env("ZERO") == "3":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    elif world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    if state is not None and state["optimizer"]:
        opt.load_state_dict(state["optimizer"])

    losses: list[float] = []
    stop = torch.zeros(1, device=device)
    step = start - 1
    for step in range(start, steps):
        t0 = time.perf_counter()
        total = 0.0
        for m in range(accum):
            x = batch(step, m, rank, micro, seq, arch["vocab"], device)
            logits = model(x[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1)) / accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        if rank == 0:
            print(f"step {step + 1}/{steps} loss {total:.4f} ({time.perf_counter() - t0:.2f} s)", flush=True)
        stop.fill_(1.0 if in_job.stop_requested() else 0.0)
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # one rank saw the signal: all stop at this step
        if stop.item():
            break

    stopped = bool(stop.item())
    inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    model_state = inner.state_dict()
    if env("ZERO") == "3":  # FSDP2 holds DTensor shards: gather full tensors for the checkpoint
        model_state = {k: v.full_tensor() for k, v in model_state.items()}
    if rank == 0:
        tag = in_job.checkpoint_dir() / f"step{step}"
        tag.mkdir(exist_ok=True)
        # FSDP's optimizer state is sharded: this example keeps only the weights then (a real loop would use
        # torch.distributed.checkpoint)
        optimizer = opt.state_dict() if env("ZERO") != "3" else {}
        torch.save({"model": model_state, "optimizer": optimizer, "step": step}, tag / "state.pt")
        done = step + 1
        write_summary({"step": done, "max_steps": steps, "loss": losses})
    dist.barrier()
    dist.destroy_process_group()
    if stopped:
        in_job.exit_for_requeue()
    return 0


if __name__ == "__main__":
    # the process group down after a barrier, then exit without the interpreter's teardown, where a finished
    # rank can abort on gloo's threads and make the job FAILED (in_job.finish)
    in_job.finish(main())
