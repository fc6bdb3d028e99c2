"""Ground truth for MARP on the CPU: real torch/DeepSpeed training (gloo), peak allocated bytes per rank.

    nice -n 10 python benchmarks/cpu_memory_grid.py [--out benchmarks/data/cpu_memory_grid.json] [--only NAME ...]

Each grid point trains a small Llama-style or GPT-2-style model (frenzy_slurm.models, the built-in trainer's
model; or, for the hf-trainer points, Transformers' Trainer on LlamaForCausalLM / GPT2LMHeadModel built from a
config, which needs the `examples` extra) for four optimizer steps in 1-4 processes on the CPU and records,
per rank, the peak of live tensor bytes over the steady steps 2-4 (the first creates the optimizer states);
a multi-process point runs three times and keeps each rank's median run (`--repeats`). Live bytes come from
the profiler's allocator events (`profile_memory=True`), recorded from before the model exists, so every free is matched
to its allocation (a profiler started later cannot see frees of older blocks), and read as the allocator's
own running total, with c10's accounting on for every thread (`count_all_threads`): gloo drops the last
reference to many collective buffers on its own threads, whose frees the profiler does not report as
events and, without that accounting, never subtracts from the total either (multi-process points then
seemed to grow from step to step). Gloo's own buffers are outside torch's allocator, as NCCL's are on a GPU.

The result is a dataset: every point with the MARP inputs that describe it (architecture, workload
options, the parallel plan) and the measured bytes per rank. tests/test_marp_cpu_memory_grid.py predicts each
point with MARP and requires 3% agreement; this script is the only thing that trains.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "benchmarks" / "data" / "cpu_memory_grid.json"

LLAMA = dict(layers=4, hidden=128, heads=4, kv_heads=2, ffn=344, activation="swiglu", vocab=512, max_positions=512)
GPT2 = dict(
    layers=4,
    hidden=128,
    heads=4,
    kv_heads=4,
    ffn=512,
    activation="gelu",
    vocab=512,
    max_positions=512,
    norm="layernorm",
    position="learned",
    bias="all",
    tied_embeddings=True,
)


# the bitsandbytes release of the QLoRA points (the `grid-litgpt` extra): litgpt 0.5.13 asks for >=0.45.2,<0.50, but
# 0.49's 32-bit optimizer update refuses CPU tensors; 0.50 runs PagedAdamW and the 4-bit matmul on the CPU
BITSANDBYTES = "0.50.2"

TORCHTITAN = "0.3.0"  # the torchtitan release the torchtitan-* points ran (the `grid` extra's pin)

BUCKETS = dict(
    reduce_bucket_size=100_000,
    allgather_bucket_size=100_000,
    stage3_prefetch_bucket_size=50_000,
    stage3_max_live_parameters=1_000_000_000,
)


def _point(name: str, arch: dict, trainer: str, **kw: Any) -> dict:
    p = dict(
        name=name,
        arch=arch,
        trainer=trainer,
        seq_len=128,
        micro_batch=2,
        grad_accum=1,
        precision="fp32",
        zero=0,
        dp=1,
        tp=1,
        pp=1,
        recompute="none",
        lora_rank=0,
        attention="sdpa",
    )
    p.update(kw)
    return p


def grid() -> list[dict]:
    pts = []
    for z in (0, 1, 2, 3):
        pts.append(_point(f"ds-llama-dp2-zero{z}", LLAMA, "deepspeed", dp=2, zero=z))
    pts.append(_point("ds-gpt2-dp2-zero1", GPT2, "deepspeed", dp=2, zero=1))
    pts.append(_point("ds-gpt2-dp2-zero3", GPT2, "deepspeed", dp=2, zero=3))
    pts.append(_point("ds-llama-1gpu", LLAMA, "deepspeed"))
    pts.append(_point("ds-llama-1gpu-mb4", LLAMA, "deepspeed", micro_batch=4))
    pts.append(_point("ds-llama-1gpu-seq256", LLAMA, "deepspeed", seq_len=256))
    pts.append(_point("ds-llama-1gpu-ga2", LLAMA, "deepspeed", grad_accum=2))
    pts.append(_point("ds-llama-1gpu-full", LLAMA, "deepspeed", recompute="full", micro_batch=4))
    pts.append(_point("ds-gpt2-1gpu", GPT2, "deepspeed"))
    pts.append(_point("ds-gpt2-1gpu-full", GPT2, "deepspeed", recompute="full"))
    pts.append(_point("ds-llama-dp2-zero2-bf16", LLAMA, "deepspeed", dp=2, zero=2, precision="bf16-mixed"))
    pts.append(_point("ds-llama-dp2-zero1-bf16", LLAMA, "deepspeed", dp=2, zero=1, precision="bf16-mixed"))
    for pp in (2, 4):
        pts.append(_point(f"pipe-llama-pp{pp}", LLAMA, "pipeline", pp=pp, grad_accum=4))
    pts.append(_point("pipe-gpt2-pp2", GPT2, "pipeline", pp=2, grad_accum=4))
    pts.append(_point("pipe-llama-pp2-full", LLAMA, "pipeline", pp=2, grad_accum=4, recompute="full"))
    pts.append(_point("pipe-llama-pp2-dp2", LLAMA, "pipeline", pp=2, dp=2, zero=1, grad_accum=2))
    pts.append(_point("fsdp2-llama-dp2", LLAMA, "fsdp2", dp=2, zero=3))
    pts.append(_point("fsdp2-gpt2-dp2", GPT2, "fsdp2", dp=2, zero=3))
    pts.append(_point("fsdp2-llama-dp2-bf16", LLAMA, "fsdp2", dp=2, zero=3, precision="bf16-mixed"))
    pts.append(_point("tp-llama-tp2", LLAMA, "tp", tp=2))
    pts.append(_point("ds-llama-1gpu-eager", LLAMA, "deepspeed", attention="eager"))
    pts.append(_point("ds-llama-1gpu-selective", LLAMA, "deepspeed", attention="eager", recompute="selective"))
    pts.append(_point("lora-llama-1gpu", LLAMA, "torch", lora_rank=8))
    pts.append(_point("torch-llama-1gpu", LLAMA, "torch"))
    pts.append(_point("ddp-llama-dp2", LLAMA, "ddp", dp=2))
    pts.append(_point("torch-gpt2-1gpu-mb4", GPT2, "torch", micro_batch=4))
    # the real frameworks, on their own model classes (the `examples` extra)
    pts.append(_point("hf-trainer-llama-1gpu", LLAMA, "hf-trainer"))
    pts.append(_point("hf-trainer-llama-1gpu-bf16", LLAMA, "hf-trainer", precision="bf16-mixed"))
    pts.append(_point("hf-trainer-gpt2-1gpu", GPT2, "hf-trainer"))
    pts.append(_point("hf-trainer-peft-lora-llama-1gpu", LLAMA, "hf-trainer", lora_rank=8))
    pts.append(_point("torchtitan-op-sac-llama-1gpu", LLAMA, "torch", recompute="op"))
    pts.append(_point("torchtitan-op-sac-gpt2-1gpu", GPT2, "torch", recompute="op"))
    pts.append(_point("litgpt-llama-1gpu", LLAMA, "litgpt"))
    pts.append(_point("litgpt-llama-1gpu-bf16", LLAMA, "litgpt", precision="bf16-pure"))
    pts.append(_point("torchtune-llama-1gpu", LLAMA, "torchtune", precision="bf16-pure"))
    pts.append(_point("torchtune-llama-1gpu-ac", LLAMA, "torchtune", precision="bf16-pure", recompute="full"))
    pts.append(_point("lightning-llama-1gpu", LLAMA, "lightning"))
    pts.append(_point("lightning-llama-1gpu-bf16", LLAMA, "lightning", precision="bf16-mixed"))
    # LoRA in torchtune's lora_finetune_single_device recipe (bf16, torchtune's dropout 0) and litgpt's finetune/lora.py
    tt_lora = dict(precision="bf16-pure", lora_rank=8, lora_dropout=0.0)
    pts.append(_point("torchtune-lora-llama-1gpu", LLAMA, "torchtune", **tt_lora))
    pts.append(
        _point("torchtune-lora-llama-1gpu-qvo-mlp", LLAMA, "torchtune", lora_targets=("q", "v", "o", "mlp"), **tt_lora)
    )
    # torchao's NF4 quantises in 64-element blocks with their scalers in blocks of 256: every linear a multiple of 16384
    nf4_llama = dict(LLAMA, hidden=256, ffn=512)
    pts.append(_point("torchtune-qlora-llama-1gpu", nf4_llama, "torchtune", method="qlora", **tt_lora))
    pts.append(_point("litgpt-lora-llama-1gpu", LLAMA, "litgpt", precision="bf16-pure", lora_rank=8))
    qlora = dict(precision="bf16-pure", lora_rank=8, method="qlora")
    pts.append(_point("litgpt-qlora-llama-1gpu", LLAMA, "litgpt", quantize="bnb.nf4", **qlora))
    pts.append(_point("litgpt-qlora-llama-1gpu-dq", LLAMA, "litgpt", quantize="bnb.nf4-dq", **qlora))
    # Transformers' Trainer with accelerate's FSDP2 (fsdp="full_shard", fsdp_config version 2) on 2 processes
    pts.append(_point("hf-trainer-fsdp2-llama-dp2", LLAMA, "hf-trainer", dp=2, zero=3, sharding="full-shard"))
    pts.append(
        _point(
            "hf-trainer-fsdp2-llama-dp2-bf16",
            LLAMA,
            "hf-trainer",
            dp=2,
            zero=3,
            sharding="full-shard",
            precision="bf16-mixed",
        )
    )
    # torchtitan's own Llama 3 model, parallelize_llama and Trainer.train_step, FSDP2 over 2 processes
    pts.append(_point("torchtitan-fsdp2-llama-dp2", LLAMA, "torchtitan", dp=2, zero=3, sharding="full-shard"))
    pts.append(
        _point(
            "torchtitan-fsdp2-llama-dp2-bf16",
            LLAMA,
            "torchtitan",
            dp=2,
            zero=3,
            sharding="full-shard",
            precision="bf16-mixed",  # its default mixed_precision_param
        )
    )
    # its tensor parallelism over 2 processes (gloo), with its default sequence parallelism (and its loss parallel)
    pts.append(_point("torchtitan-tp2-llama", LLAMA, "torchtitan", tp=2, sequence_parallel=True))
    # its torch.compile (compile.enable: each block and the per-chunk loss, inductor on the CPU)
    pts.append(
        _point(
            "torchtitan-fsdp2-llama-dp2-compile", LLAMA, "torchtitan", dp=2, zero=3, sharding="full-shard", compile=True
        )
    )
    return pts


# ---------------------------------------------------------------- measurement


def _lora(model, rank: int, targets: tuple[str, ...] = ("q", "v")):
    import torch
    from torch import nn

    class LoraLinear(nn.Module):
        """PEFT-style adapter: frozen base, dropout on the adapter's input, A then B (B starts at zero)."""

        def __init__(self, base: nn.Linear):
            super().__init__()
            self.base = base
            self.a = nn.Linear(base.in_features, rank, bias=False)
            self.b = nn.Linear(rank, base.out_features, bias=False)
            nn.init.zeros_(self.b.weight)
            self.drop = nn.Dropout(0.05)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + self.b(self.a(self.drop(x))) * 2.0

    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for t in targets:
            setattr(blk, t, LoraLinear(getattr(blk, t)))
    return model


def _ds_config(p: dict) -> dict:
    cfg = {
        "train_micro_batch_size_per_gpu": p["micro_batch"],
        "gradient_accumulation_steps": p["grad_accum"],
        "train_batch_size": p["micro_batch"] * p["grad_accum"] * p["dp"],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        # small buckets, so that they show next to the tiny model's tensors instead of hiding them (DeepSpeed
        # allocates the whole reduce bucket whatever the model's size); no persistent small parameters
        "zero_optimization": {
            "stage": p["zero"],
            **BUCKETS,
            "contiguous_gradients": True,
            "overlap_comm": False,
            "stage3_param_persistence_threshold": 0,
        },
        "bf16": {"enabled": p["precision"] == "bf16-mixed"},
        "steps_per_print": 10**9,
    }
    return cfg


def rank_env(rank: int, world: int, port: int) -> None:
    """What torch.distributed and DeepSpeed read in a rank of a one-machine CPU run (also pipeline_step.py)."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_SIZE=str(world),
        DS_ACCELERATOR="cpu",
    )


def _worker(rank: int, world: int, p: dict, port: int, out_dir: str) -> None:
    rank_env(rank, world, port)
    import logging

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    torch.manual_seed(0)
    from frenzy_slurm.runtime.memory import count_all_threads

    count_all_threads()  # frees on gloo's threads reach the running total (frenzy_slurm/runtime/memory.py)
    from frenzy_slurm.jobspec.arch import Architecture
    from frenzy_slurm.models.gpt import GPT, lm_loss

    arch = Architecture(**p["arch"])
    mb, seq, ga = p["micro_batch"], p["seq_len"], p["grad_accum"]
    checkpoint = p["recompute"] == "full"
    gen = torch.Generator().manual_seed(rank)

    def batch():
        x = torch.randint(0, arch.vocab, (mb, seq), generator=gen)
        return x, torch.roll(x, -1, 1)

    steps = 4
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
        trainer = p["trainer"]
        if trainer == "hf-trainer":
            _hf_trainer(p, rank, world, steps)
        elif trainer == "lightning":
            _lightning(p, rank, world, steps)
        elif trainer == "torchtune":
            (_torchtune_lora if p["lora_rank"] else _torchtune)(p, rank, world, steps)
        elif trainer == "torchtitan":
            _torchtitan(p, rank, world, steps)
        elif trainer == "litgpt":
            (_litgpt_lora if p["lora_rank"] else _litgpt)(p, rank, world, steps)
        elif trainer in ("deepspeed", "pipeline"):
            import deepspeed

            logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
            deepspeed.init_distributed(dist_backend="gloo")
            from frenzy_slurm.runtime.shm import release_allreduce_segment, segment_path

            release_allreduce_segment(segment_path(rank))  # /dev/shm is RAM; DeepSpeed never unlinks it (shm.py)
            if trainer == "pipeline":
                from frenzy_slurm.marp.plan import ParallelPlan
                from frenzy_slurm.models.pipe import pipeline_module

                split = list(ParallelPlan(pp=p["pp"]).stage_layers(arch.layers))
                model = pipeline_module(arch, split, checkpoint)
            else:
                # the built-in model's own eager core and its selective recomputation, as the runtime builds it
                model = GPT(arch, checkpoint, attention=p["attention"], recompute_core=p["recompute"] == "selective")
            params = [q for q in model.parameters() if q.requires_grad]
            engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=params, config=_ds_config(p))

            def step() -> None:
                if trainer == "pipeline":
                    engine.train_batch(data_iter=iter([batch() for _ in range(ga)]))
                    return
                for _ in range(ga):
                    x, y = batch()
                    logits = engine(x)
                    loss = lm_loss(logits, y)
                    del logits
                    engine.backward(loss)
                    engine.step()
        else:
            import torch.distributed as dist

            dist.init_process_group("gloo", rank=rank, world_size=world)
            model = GPT(arch, checkpoint=checkpoint)
            if p["recompute"] == "op":
                _torchtitan_op_sac(model)
            if p["lora_rank"]:
                model = _lora(model, p["lora_rank"])
            if trainer == "fsdp2":
                from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

                mp = (
                    MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                    if p["precision"] == "bf16-mixed"
                    else MixedPrecisionPolicy()
                )
                for blk in model.blocks:
                    fully_shard(blk, mp_policy=mp)
                fully_shard(model, mp_policy=mp)
            elif trainer == "ddp":
                from torch.nn.parallel import DistributedDataParallel

                model = DistributedDataParallel(model)
            elif trainer == "tp":
                from torch.distributed.device_mesh import init_device_mesh
                from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

                mesh = init_device_mesh("cpu", (world,))
                for blk in model.blocks:
                    plan = {n: ColwiseParallel() for n in ("q", "k", "v", "up", "gate") if hasattr(blk, n)}
                    plan |= {"o": RowwiseParallel(), "down": RowwiseParallel()}
                    parallelize_module(blk, mesh, plan)
            opt = torch.optim.AdamW([q for q in model.parameters() if q.requires_grad], lr=1e-3)

            def step() -> None:
                for _ in range(ga):
                    x, y = batch()
                    logits = model(x)
                    loss = lm_loss(logits, y)
                    del logits
                    loss.backward()
                    del loss
                opt.step()
                opt.zero_grad(set_to_none=True)

        import gc

        for i in range(steps if trainer not in ("hf-trainer", "lightning", "torchtune", "litgpt", "torchtitan") else 0):
            # GRID_GC=1 collects Python's cyclic garbage before every step (an experiment: it removed the
            # step-to-step growth the single-process DeepSpeed points had while this harness copied the block's
            # forward into closures, and moves other ranks' frees; docs/accuracy.md). The stored dataset is measured
            # without it, as training runs.
            if os.environ.get("GRID_GC"):
                gc.collect()
            with record_function(f"grid-step-{i}"):
                step()
    from frenzy_slurm.runtime.memory import peak_context, trace_events, trace_timeline

    events = trace_events(prof)
    timeline, windows = trace_timeline(events=events)
    # steps 1.. are steady (step 0 creates the optimizer states): the peak is the largest over them, the start
    # the smallest (the live bytes before a step)
    starts, peaks = [], []
    for i in range(1, steps):
        a, b = windows[f"grid-step-{i}"]
        before = [v for t, v, _ in timeline if t < a]
        starts.append(before[-1] if before else 0)
        peaks.append(max([v for t, v, _ in timeline if a <= t <= b] + [starts[-1]]))
    result = {"rank": rank, "start_bytes": min(starts), "peak_bytes": max(peaks), "step_peaks": peaks}
    # the allocator's timeline at the peak: where in its step the largest peak fell and what was running
    worst = 1 + max(range(len(peaks)), key=lambda k: peaks[k])
    result["at_peak"] = peak_context(events, timeline, windows[f"grid-step-{worst}"])
    if os.environ.get("GRID_DEBUG"):
        print(
            f"rank {rank}: starts {[round(x / 2**20, 3) for x in starts]} "
            f"peaks {[round(x / 2**20, 3) for x in peaks]} MiB"
        )
        _debug_alive_at_peak(events, rank, windows[f"grid-step-{steps - 1}"])
    if trainer == "pipeline":
        result["stage"] = engine.stage_id
    elif trainer in ("deepspeed",):
        result["stage"] = 0
    else:
        result["stage"] = 0
    Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


def _hf_model(p: dict):
    """Transformers' own model class for the point's architecture, built from a config (random weights)."""
    import transformers

    a = p["arch"]
    common = dict(vocab_size=a["vocab"], attn_implementation=p["attention"])
    if a.get("norm", "rmsnorm") == "rmsnorm":
        config = transformers.LlamaConfig(
            hidden_size=a["hidden"],
            intermediate_size=a["ffn"],
            num_hidden_layers=a["layers"],
            num_attention_heads=a["heads"],
            num_key_value_heads=a["kv_heads"],
            max_position_embeddings=a["max_positions"],
            tie_word_embeddings=a.get("tied_embeddings", False),
            **common,
        )
        return transformers.LlamaForCausalLM(config)
    config = transformers.GPT2Config(
        n_embd=a["hidden"],
        n_layer=a["layers"],
        n_head=a["heads"],
        n_inner=a["ffn"],
        n_positions=a["max_positions"],
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        **common,
    )
    return transformers.GPT2LMHeadModel(config)


def _lightning(p: dict, rank: int, world: int, steps: int) -> None:
    """PyTorch Lightning's Trainer with a LightningModule as its docs write one: training_step returns the loss
    (Lightning runs backward after it returns), configure_optimizers torch's AdamW; a callback marks each batch
    (one optimizer step, no accumulation) as the other modes' loop does."""
    import lightning as L
    import torch
    import torch.nn.functional as F
    from torch.autograd.profiler import record_function

    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
    model = _hf_model(p)
    vocab = p["arch"]["vocab"]

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):  # noqa: ANN001 - Lightning's signature
            x, y = batch
            logits = self.model(input_ids=x).logits
            return F.cross_entropy(logits.view(-1, vocab).float(), y.view(-1))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Windows(L.Callback):
        def __init__(self) -> None:
            self.cm = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):  # noqa: ANN001
            self.cm = record_function(f"grid-step-{batch_idx}")
            self.cm.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # noqa: ANN001
            self.cm.__exit__(None, None, None)

    gen = torch.Generator().manual_seed(rank)
    data = []
    for _ in range(steps):
        x = torch.randint(0, vocab, (p["micro_batch"], p["seq_len"]), generator=gen)
        data.append((x, torch.roll(x, -1, 1)))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        precision="bf16-mixed" if p["precision"] == "bf16-mixed" else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[Windows()],
    )
    trainer.fit(Module(), train_dataloaders=torch.utils.data.DataLoader(data, batch_size=None))


def _torchtitan_op_sac(model) -> None:
    """torchtitan 0.3's per-op selective activation checkpointing (its SelectiveAC policy, its own code) around every
    block of the built-in model. Its save list names the GPU attention kernels; on the CPU SDPA runs
    `_scaled_dot_product_flash_attention_for_cpu`, which is added so the policy keeps what it keeps on a GPU."""
    import torch
    from torchtitan.distributed.activation_checkpoint import SelectiveAC

    class OnTheCpu(SelectiveAC):
        def get_save_ops(self) -> set:
            return super().get_save_ops() | {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default}

    policy = OnTheCpu(SelectiveAC.Config())
    for i, blk in enumerate(model.blocks):
        model.blocks[i] = policy._wrap_block(blk, base_fqn=f"blocks.{i}")


def _litgpt_config(config_class: type, a: dict, **extra: Any) -> Any:
    """litgpt's Config for the point's Llama-style architecture (its own GPT, LLaMAMLP and RMSNorm); `extra`: the
    LoRA fields of litgpt.lora.Config."""
    return config_class(
        n_layer=a["layers"],
        n_head=a["heads"],
        n_embd=a["hidden"],
        block_size=a["max_positions"],
        vocab_size=a["vocab"],
        padded_vocab_size=a["vocab"],
        n_query_groups=a["kv_heads"],
        intermediate_size=a["ffn"],
        mlp_class_name="LLaMAMLP",
        norm_class_name="RMSNorm",
        bias=False,
        parallel_residual=False,
        rotary_percentage=1.0,
        **extra,
    )


def _litgpt(p: dict, rank: int, world: int, steps: int) -> None:
    """litgpt 0.5's finetune/full.py on one device, line for line: Fabric (bf16-true or 32-true) set up as its main()
    does (GPT built under fabric.init_module, fabric.setup, torch's AdamW through fabric.setup_optimizers), then its
    fit loop: `logits = model(input_ids)` (Fabric's precision plugin returns the output converted to fp32) and
    `chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])` bound in the loop's scope (so the previous
    step's output lives until the next forward returns), fabric.backward, step, zero_grad."""
    import lightning as L
    import torch
    from litgpt import GPT, Config
    from litgpt.utils import chunked_cross_entropy
    from torch.autograd.profiler import record_function

    config = _litgpt_config(Config, p["arch"])
    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
    fabric = L.Fabric(
        accelerator="cpu", devices=1, precision="bf16-true" if p["precision"] == "bf16-pure" else "32-true"
    )
    with fabric.init_module(empty_init=False):
        model = GPT(config)
    model = fabric.setup(model)
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    gen = torch.Generator().manual_seed(rank)
    for i in range(steps):
        with record_function(f"grid-step-{i}"):
            for _ in range(p["grad_accum"]):
                input_ids = torch.randint(0, p["arch"]["vocab"], (p["micro_batch"], p["seq_len"]), generator=gen)
                targets = input_ids
                logits = model(input_ids)
                loss = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
                fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def _litgpt_lora(p: dict, rank: int, world: int, steps: int) -> None:
    """litgpt 0.5's finetune/lora.py on one device, its main() and fit loop in order: Fabric (bf16-true; for QLoRA
    its BitsandbytesPrecision plugin, `--quantize bnb.nf4[-dq]`), litgpt's LoRA GPT (litgpt.lora: lora_r, alpha 16,
    dropout 0.05 on query and value by default) built under fabric.init_module, mark_only_lora_as_trainable,
    setup_module; torch's AdamW over model.parameters(), or under bitsandbytes bnb's PagedAdamW and the swap of the
    token embedding for bitsandbytes' StableEmbedding (after the optimizer is built, as lora.py does); the loop's
    `logits = model(input_ids, lm_head_chunk_size=128)`, `logits[-1] = logits[-1][..., :-1, :]`,
    chunked_cross_entropy, fabric.backward, step, zero_grad."""
    import lightning as L
    import torch
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    from litgpt.utils import chunked_cross_entropy, instantiate_bnb_optimizer, instantiate_torch_optimizer
    from torch.autograd.profiler import record_function

    if world == 1:
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
    targets = p.get("lora_targets", ("q", "v"))
    config = _litgpt_config(
        Config,
        p["arch"],
        lora_r=p["lora_rank"],
        lora_alpha=16,
        lora_dropout=p.get("lora_dropout", 0.05),
        lora_query="q" in targets,
        lora_key="k" in targets,
        lora_value="v" in targets,
        lora_projection="o" in targets,
        lora_mlp="mlp" in targets,
        lora_head="head" in targets,
    )
    qlora = p.get("method") == "qlora"
    fabric = L.Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    if qlora:  # lora.py: `plugins = BitsandbytesPrecision(quantize[4:], dtype)` for --quantize bnb.nf4[-dq]
        from lightning.fabric.plugins import BitsandbytesPrecision

        _bitsandbytes_on_the_cpu(fabric, BitsandbytesPrecision(p["quantize"].removeprefix("bnb."), torch.bfloat16))
    with fabric.init_module(empty_init=False):
        model = GPT(config)
    mark_only_lora_as_trainable(model)
    model = fabric.setup_module(model)
    if qlora:
        for m in model.modules():  # what moving the model to the GPU does there (Params4bit quantises on .cuda())
            if hasattr(m, "quantize_"):
                m.quantize_(device=torch.device("cpu"))
        optimizer = instantiate_bnb_optimizer("AdamW", model.parameters())
        from bitsandbytes.nn import StableEmbedding

        old_embedding = model.transformer.wte
        model.transformer.wte = StableEmbedding(old_embedding.num_embeddings, old_embedding.embedding_dim)
        with torch.no_grad():
            model.transformer.wte.weight.copy_(old_embedding.weight)
        model.transformer.wte = model.transformer.wte.to(
            device=old_embedding.weight.device, dtype=old_embedding.weight.dtype
        )
    else:
        optimizer = instantiate_torch_optimizer("AdamW", model.parameters(), lr=3e-4, weight_decay=0.02)
    optimizer = fabric.setup_optimizers(optimizer)
    # litgpt's lora.CausalSelfAttention / LLaMAMLP / GPT build their base class's linears and then replace them with
    # LoRA ones; the plugin's 4-bit linears sit in reference cycles (Params4bit.module, the bound quantize_ hook), so
    # the replaced ones (unquantised here: the plugin quantises at construction only on CUDA) wait for Python's cyclic
    # collector. lora.py then loads the checkpoint and the dataset, which runs that collector long before the loop;
    # this stands for it.
    import gc

    gc.collect()
    gen = torch.Generator().manual_seed(rank)
    for i in range(steps):
        with record_function(f"grid-step-{i}"):
            for _ in range(p["grad_accum"]):
                input_ids = torch.randint(0, p["arch"]["vocab"], (p["micro_batch"], p["seq_len"]), generator=gen)
                targets_ = input_ids
                logits = model(input_ids, lm_head_chunk_size=128)
                logits[-1] = logits[-1][..., :-1, :]
                loss = chunked_cross_entropy(logits, targets_[..., 1:])
                fabric.backward(loss / p["grad_accum"])
            optimizer.step()
            optimizer.zero_grad()


def _bitsandbytes_on_the_cpu(fabric, precision) -> None:  # noqa: ANN001 - lightning's Fabric, BitsandbytesPrecision
    """Lightning 2.6.6 runs its bitsandbytes plugin only on CUDA: Fabric's connector refuses it for another accelerator
    ("Bitsandbytes is only supported on CUDA GPUs.") and the plugin's 4-bit linear quantises only on CUDA
    (_Linear4bit.quantize raises "Unexpected device type: cpu"), though bitsandbytes 0.50 quantises and multiplies in
    4 bits on the CPU too. This hands the plugin to Fabric's strategy, as the connector does on a GPU, and runs the
    plugin's own quantize with the device it is given (the same quantize_4bit call, the same Params4bit)."""
    import bitsandbytes as bnb
    import torch
    from lightning.fabric.plugins.precision import bitsandbytes as plugin

    def quantize(params4bit, weight, device):  # noqa: ANN001, ANN202 - the plugin's signature
        device = device or torch.device("cpu")
        w = weight.contiguous().to(device=device, dtype=torch.half)
        w_4bit, quant_state = bnb.functional.quantize_4bit(
            w,
            blocksize=params4bit.blocksize,
            compress_statistics=params4bit.compress_statistics,
            quant_type=params4bit.quant_type,
            quant_storage=params4bit.quant_storage,
        )
        return plugin._replace_param(params4bit, w_4bit, quant_state)  # noqa: SLF001

    precision._linear_cls.quantize = staticmethod(quantize)  # the 4-bit class the plugin converts nn.Linear to
    fabric.strategy.precision = precision
    fabric._precision = precision  # noqa: SLF001 - Fabric keeps the strategy's plugin, read at setup


def _torchtune(p: dict, rank: int, world: int, steps: int) -> None:
    """torchtune 0.6's full_finetune_single_device recipe as its shipped configs set it: torchtune's own Llama 3
    model (llama3 component builder), dtype bf16 (weights, gradients and states), CEWithChunkedOutputLoss with the
    model's output in chunks, torch's AdamW with fused=True, activation checkpointing per point; the loss step is
    the recipe's own `_loss_step` (which `del logits`), then backward, step, zero_grad(set_to_none=True)."""
    import contextlib
    import importlib.util

    import torch
    import torchtune
    from torch.autograd.profiler import record_function
    from torchtune.models.llama3._component_builders import llama3
    from torchtune.modules import TransformerSelfAttentionLayer
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.training import set_activation_checkpointing

    a = p["arch"]
    dtype = torch.bfloat16 if p["precision"] == "bf16-pure" else torch.float32
    with torch.device("cpu"):
        model = llama3(
            vocab_size=a["vocab"],
            num_layers=a["layers"],
            num_heads=a["heads"],
            num_kv_heads=a["kv_heads"],
            embed_dim=a["hidden"],
            max_seq_len=a["max_positions"],
            intermediate_dim=a["ffn"],
        ).to(dtype)
    if p["recompute"] == "full":
        set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})
    # the recipes ship beside the package, not as one (their __init__ refuses imports): load the file itself
    path = Path(torchtune.__file__).parent.parent / "recipes" / "full_finetune_single_device.py"
    spec = importlib.util.spec_from_file_location("full_finetune_single_device", path)
    assert spec is not None and spec.loader is not None
    recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipes)
    FullFinetuneRecipeSingleDevice = recipes.FullFinetuneRecipeSingleDevice  # noqa: N806 - the recipe's class
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    recipe = object.__new__(FullFinetuneRecipeSingleDevice)  # only its loss step runs: no config, no checkpoint
    recipe._model, recipe._loss_fn = model, loss_fn
    recipe.activations_handling_ctx = contextlib.nullcontext()
    recipe.ignore_labels_cache = torch.full((p["micro_batch"], 1), loss_fn.ignore_index, dtype=torch.int64)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    gen = torch.Generator().manual_seed(rank)
    opt.zero_grad()
    for i in range(steps):
        with record_function(f"grid-step-{i}"):
            for _ in range(p["grad_accum"]):
                x = torch.randint(0, a["vocab"], (p["micro_batch"], p["seq_len"]), generator=gen)
                loss = recipe._loss_step({"tokens": x, "labels": x.clone()})
                loss.backward()
                del loss
            opt.step()
            opt.zero_grad(set_to_none=True)


def _torchtune_lora(p: dict, rank: int, world: int, steps: int) -> None:
    """torchtune 0.6's lora_finetune_single_device recipe as its shipped configs set it: torchtune's Llama 3.1 LoRA
    builder (lora_llama3_1, what the 3.1 configs instantiate: one RoPE cache shared by the blocks, where 0.6's
    lora_llama3 builds one per block; adapters on lora_attn_modules, and on every MLP projection with
    apply_lora_to_mlp),
    built under the recipe's default dtype bf16 (frozen base and adapters alike), set_trainable_params on the
    adapters only, CEWithChunkedOutputLoss with the model's output in chunks, torch's AdamW(fused=True) over
    model.parameters() (the recipe's _setup_optimizer); the loss step is the recipe's own `_loss_step`, then
    backward, step, zero_grad(set_to_none=True)."""
    import contextlib
    import importlib.util

    import torch
    import torchtune
    from torch.autograd.profiler import record_function
    from torchtune import training
    from torchtune.models.llama3_1._component_builders import lora_llama3_1
    from torchtune.modules.loss import CEWithChunkedOutputLoss
    from torchtune.modules.peft import get_adapter_params, set_trainable_params

    a = p["arch"]
    targets = p.get("lora_targets", ("q", "v"))
    attn = [{"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "output_proj"}[t] for t in targets if t != "mlp"]
    with training.set_default_dtype(torch.bfloat16), torch.device("cpu"):  # the recipe's _setup_model
        model = lora_llama3_1(
            lora_attn_modules=attn,
            apply_lora_to_mlp="mlp" in targets,
            vocab_size=a["vocab"],
            num_layers=a["layers"],
            num_heads=a["heads"],
            num_kv_heads=a["kv_heads"],
            embed_dim=a["hidden"],
            max_seq_len=a["max_positions"],
            intermediate_dim=a["ffn"],
            lora_rank=p["lora_rank"],
            lora_alpha=2 * p["lora_rank"],
            lora_dropout=p.get("lora_dropout", 0.0),
            quantize_base=p.get("method") == "qlora",  # the qlora_* builders: torchao's NF4 base weights
        )
    set_trainable_params(model, get_adapter_params(model))
    path = Path(torchtune.__file__).parent.parent / "recipes" / "lora_finetune_single_device.py"
    spec = importlib.util.spec_from_file_location("lora_finetune_single_device", path)
    assert spec is not None and spec.loader is not None
    recipes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipes)
    LoRAFinetuneRecipeSingleDevice = recipes.LoRAFinetuneRecipeSingleDevice  # noqa: N806 - the recipe's class
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    recipe = object.__new__(LoRAFinetuneRecipeSingleDevice)  # only its loss step runs: no config, no checkpoint
    recipe._model, recipe._loss_fn = model, loss_fn
    recipe.activations_handling_ctx = contextlib.nullcontext()
    recipe.ignore_labels_cache = torch.full((p["micro_batch"], 1), loss_fn.ignore_index, dtype=torch.int64)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    gen = torch.Generator().manual_seed(rank)
    opt.zero_grad()
    for i in range(steps):
        with record_function(f"grid-step-{i}"):
            for _ in range(p["grad_accum"]):
                x = torch.randint(0, a["vocab"], (p["micro_batch"], p["seq_len"]), generator=gen)
                loss = recipe._loss_step({"tokens": x, "labels": x.clone()})
                loss.backward()
                del loss
            opt.step()
            opt.zero_grad(set_to_none=True)


def _hf_trainer(p: dict, rank: int, world: int, steps: int) -> None:
    """Transformers' own Trainer on its own model class (LlamaForCausalLM / GPT2LMHeadModel built from a config:
    random weights, no download) for `steps` optimizer steps; a callback marks each step's window as the other
    modes' loop does (on_step_begin .. on_step_end: the forward and backward of every micro-batch, the optimizer
    step and zero_grad)."""
    import tempfile

    import torch
    import transformers
    from torch.autograd.profiler import record_function

    if world == 1:  # one process, as `python train.py` runs it: no torchrun variables, so no DDP wrapper
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(key, None)
    a = p["arch"]
    fsdp: dict[str, Any] = {}
    if world > 1 and p["zero"] == 3:  # accelerate's FSDP2, as its docs configure it through TrainingArguments
        _accelerate_fsdp_on_the_cpu()
        fsdp = dict(fsdp="full_shard", fsdp_config={"version": 2, "transformer_layer_cls_to_wrap": _hf_block(p)})
    model = _hf_model(p)
    if p["lora_rank"]:  # PEFT's LoRA on the query and value projections, PEFT's default dropout
        import peft

        lora = peft.LoraConfig(
            r=p["lora_rank"],
            lora_alpha=16,
            lora_dropout=0.05,
            target_modules=["q_proj", "v_proj"],
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, lora)
    gen = torch.Generator().manual_seed(rank)
    n = p["micro_batch"] * p["grad_accum"] * steps
    data = [
        {"input_ids": (x := torch.randint(0, a["vocab"], (p["seq_len"],), generator=gen)), "labels": x}
        for _ in range(n)
    ]

    class Windows(transformers.TrainerCallback):
        def __init__(self) -> None:
            self.step = 0
            self.cm = None

        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001 - transformers' callback signature
            self.cm = record_function(f"grid-step-{self.step}")
            self.cm.__enter__()

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            self.cm.__exit__(None, None, None)
            self.step += 1

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out,
            max_steps=steps,
            per_device_train_batch_size=p["micro_batch"],
            gradient_accumulation_steps=p["grad_accum"],
            gradient_checkpointing=p["recompute"] == "full",
            bf16=p["precision"] == "bf16-mixed",
            learning_rate=1e-3,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
            **fsdp,
        )
        transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Windows()]).train()


def _torchtitan(p: dict, rank: int, world: int, steps: int) -> None:
    """torchtitan 0.3's own Llama 3 model, parallelised by its own `parallelize_llama` (FSDP2 over the data-parallel
    ranks: each block, the embedding alone, the final norm with the output layer kept gathered; mixed precision
    param bf16 / reduce fp32 by default, fp32 where the point says so), trained by its Trainer's own `train_step`
    (optimizer zero_grad, forward and backward with its default ChunkedLossWrapper over CrossEntropyLoss,
    gradient clipping, its fused AdamW) on an object built without `Trainer.__init__`, whose device set-up
    assumes an accelerator (tools/utils.py: `_get_available_device_type() or "cuda"`). Attention is torchtitan's
    ScaledDotProductAttention config (is_causal), the maskless backend its graph-trainer tests build: its
    language-model builders accept flex or varlen only, whose kernels are compiled (flex) or CUDA-only (varlen)."""
    import tempfile

    import torch
    import torch.distributed as dist
    import torchtitan.distributed.parallel_dims
    import torchtitan.tools.utils
    from torch.autograd.profiler import record_function
    from torchtitan.components.loss import ChunkedLossWrapper, CrossEntropyLoss
    from torchtitan.components.optimizer import LRSchedulersContainer
    from torchtitan.components.optimizer.optimizer import default_adamw
    from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.distributed import utils as dist_utils
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.common.config_utils import make_ffn_config, make_gqa_config
    from torchtitan.models.llama3 import _EMBEDDING_INIT, _LINEAR_INIT, _NORM_INIT, _depth_init, _output_linear_init
    from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock
    from torchtitan.models.llama3.parallelize import parallelize_llama
    from torchtitan.trainer import Trainer

    # torchtitan picks its device type once, at import: the accelerator found, else "cuda"; on the CPU it is "cpu"
    torchtitan.tools.utils.device_type = torchtitan.distributed.parallel_dims.device_type = "cpu"
    dist.init_process_group("gloo", rank=rank, world_size=world)
    a = p["arch"]
    dim, heads = a["hidden"], a["heads"]
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
            attention=make_gqa_config(
                dim=dim,
                n_heads=heads,
                n_kv_heads=a["kv_heads"],
                wqkv_param_init=_LINEAR_INIT,
                wo_param_init=_depth_init(i),
                inner_attention=ScaledDotProductAttention.Config(),
                fuse_qkv=True,  # the llama3 flavours' default
                rope=ComplexRoPE.Config(dim=dim // heads, max_seq_len=a["max_positions"], theta=500000),
            ),
            feed_forward=make_ffn_config(
                dim=dim, hidden_dim=a["ffn"], w1_param_init=_LINEAR_INIT, w2w3_param_init=_depth_init(i)
            ),
        )
        for i in range(a["layers"])
    ]
    config = Llama3Model.Config(
        dim=dim,
        vocab_size=a["vocab"],
        tok_embeddings=Embedding.Config(num_embeddings=a["vocab"], embedding_dim=dim, param_init=_EMBEDDING_INIT),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=_NORM_INIT),
        lm_head=Linear.Config(in_features=dim, out_features=a["vocab"], param_init=_output_linear_init(dim)),
        layers=layers,
    )
    parallelism = ParallelismConfig(
        data_parallel_shard_degree=p["dp"],
        tensor_parallel_degree=p["tp"],
        enable_sequence_parallel=p.get("sequence_parallel", True),
        spmd_backend="partial_dtensor",
    )
    training = TrainingConfig(
        local_batch_size=p["micro_batch"],
        seq_len=p["seq_len"],
        steps=steps,
        mixed_precision_param="bfloat16" if p["precision"] == "bf16-mixed" else "float32",
        disable_cuda_graphs=True,  # its default captures forward-backward in a CUDA graph, which a CPU run cannot
    )
    dist_utils.set_spmd_backend(parallelism.spmd_backend)  # as Trainer.__init__ does: its loss reads it
    dims = ParallelDims.from_config(parallelism, world)
    dims.build_mesh()
    # what Trainer.__init__ does before building: the model config takes the job's (its sharding plan, RoPE cache)
    job = Trainer.Config(training=training, parallelism=parallelism)
    config.update_from_config(config=job)
    with torch.device("meta"):
        model = config.build()
    with tempfile.TemporaryDirectory() as dump:
        model = parallelize_llama(
            model,
            parallel_dims=dims,
            training=training,
            parallelism=parallelism,
            compile_config=CompileConfig(enable=p.get("compile", False)),
            ac_config=None,
            dump_folder=dump,
        )
    from torch.distributed.fsdp import FSDPModule

    for m in model.modules():
        if isinstance(m, FSDPModule):
            # torchtitan sets gradient_divide_factor 1.0 (its loss divides by the global token count), which FSDP
            # reduces as PREMUL_SUM(1.0): NCCL has it, gloo does not; a plain SUM is the same reduction
            m.set_force_sum_reduction_for_comms(True)
    model.to_empty(device="cpu")
    with torch.no_grad():
        model.init_weights(buffer_device=torch.device("cpu"))
    model.train()
    loss_fn = ChunkedLossWrapper.Config(loss_fn=CrossEntropyLoss.Config(global_vocab_size=a["vocab"])).build(
        compile_config=CompileConfig(enable=p.get("compile", False))  # its default components: model and loss
    )
    loss_fn.set_lm_head(model.lm_head)
    model._skip_lm_head = True
    trainer = object.__new__(Trainer)  # its own train_step on the parts it reads
    trainer.config = job
    trainer.parallel_dims = dims
    trainer.model_parts = [model]
    trainer.model_config = config
    trainer.loss_fn = loss_fn
    trainer.device = torch.device("cpu")
    trainer.gradient_accumulation_steps = p["grad_accum"]
    trainer.num_pipeline_parallel_microbatches = 1
    trainer.optimizers = default_adamw(lr=8e-4).build(model_parts=[model])
    trainer.lr_schedulers = LRSchedulersContainer.Config().build(optimizers=trainer.optimizers, training_steps=steps)
    trainer.train_context = dist_utils.get_spmd_context(parallel_dims=dims)
    trainer.fwd_bwd_fn = trainer._forward_backward_body
    trainer.step = trainer.ntokens_seen = 0
    trainer.metrics_processor = type("M", (), {"should_log": staticmethod(lambda step: False)})()
    trainer.checkpointer = type("K", (), {"maybe_wait_for_staging": staticmethod(lambda: None)})()
    gen = torch.Generator().manual_seed(rank)

    def batches():
        while True:
            x = torch.randint(0, a["vocab"], (p["micro_batch"], p["seq_len"] + 1), generator=gen)
            yield {"input": x[:, :-1]}, x[:, 1:]

    data = batches()
    for i in range(steps):
        with record_function(f"grid-step-{i}"):
            trainer.step += 1
            trainer.train_step(data)


def _hf_block(p: dict) -> list[str]:
    """The decoder layer class accelerate wraps in its own FSDP unit (fsdp_config transformer_layer_cls_to_wrap)."""
    return ["LlamaDecoderLayer"] if p["arch"].get("norm", "rmsnorm") == "rmsnorm" else ["GPT2Block"]


def _accelerate_fsdp_on_the_cpu() -> None:
    """accelerate 1.15's AcceleratorState turns an FSDP plugin on only for accelerator devices (MULTI_GPU, MULTI_XPU,
    ...; state.py): with gloo on the CPU (MULTI_CPU) it silently falls back to DDP. This does what state.py does for
    those devices, for MULTI_CPU too; the rest is accelerate's own FSDP2 path (fsdp2_prepare_model: fully_shard on
    every decoder layer, the embedding, the final norm, the output layer and the root; its MixedPrecisionPolicy)."""
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    original = AcceleratorState.__init__

    def init(self, *args, fsdp_plugin=None, **kw):  # noqa: ANN001, ANN002, ANN003 - accelerate's signature
        original(self, *args, fsdp_plugin=fsdp_plugin, **kw)
        if fsdp_plugin is not None and self.distributed_type == DistributedType.MULTI_CPU:
            self.distributed_type = DistributedType.FSDP
            if self._mixed_precision != "no":
                fsdp_plugin.set_mixed_precision(self._mixed_precision)
            self.fsdp_plugin = fsdp_plugin

    AcceleratorState.__init__ = init  # type: ignore[method-assign]


def _debug_alive_at_peak(events: list[dict], rank: int, window: tuple[float, float]) -> None:
    """GRID_DEBUG: the blocks allocated in the last step and alive at its peak, by size, with the op that made them."""
    import collections

    a, b = window
    mem = sorted((e for e in events if e.get("name") == "[memory]" and a <= e["ts"] <= b), key=lambda e: e["ts"])
    peak_t = max(mem, key=lambda e: e["args"]["Total Allocated"])["ts"]
    ops = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"), key=lambda e: e["ts"])
    alive: dict[int, tuple[int, float]] = {}
    for e in mem:
        if e["ts"] > peak_t:
            break
        addr, n = e["args"]["Addr"], e["args"]["Bytes"]
        if n > 0:
            alive[addr] = (n, e["ts"])
        else:
            alive.pop(addr, None)
    by = collections.Counter()
    for n, t in alive.values():
        op = next((o["name"] for o in reversed(ops) if o["ts"] <= t <= o["ts"] + o.get("dur", 0)), "?")
        by[(round(n / 2**20, 4), op)] += 1
    print(
        f"rank {rank}: alive at peak, allocated in the step (MiB, op, count):",
        sorted(((k[0], k[1], c) for k, c in by.items()), reverse=True)[:25],
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_once(p: dict) -> list[dict]:
    import tempfile

    import torch.multiprocessing as mp

    world = p["dp"] * p["tp"] * p["pp"]
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, p, _free_port(), d), nprocs=world, start_method="spawn", join=True)
        return sorted((json.loads(f.read_text()) for f in Path(d).glob("rank*.json")), key=lambda r: r["rank"])


def run_point(p: dict, repeats: int) -> list[dict]:
    """Per rank, the median peak of `repeats` runs (every run's peak kept in `run_peaks`). A single process is
    deterministic; across processes, which rank frees a communication buffer first depends on gloo's thread
    timing, so one run in a few holds one more buffer on one rank: the median is the typical step."""
    world = p["dp"] * p["tp"] * p["pp"]
    runs = [_run_once(p) for _ in range(repeats if world > 1 else 1)]
    ranks = []
    for i in range(len(runs[0])):
        median = sorted((run[i] for run in runs), key=lambda r: r["peak_bytes"])[(len(runs) - 1) // 2]
        ranks.append(median | {"run_peaks": [run[i]["peak_bytes"] for run in runs]})
    return ranks


def marp_inputs(p: dict) -> dict:
    """What MARP is told about this point: the model.yaml that describes the run (frenzy_slurm/eval/grid.py
    predicts it through the same functions fsbatch calls, on the CPU). The DeepSpeed points run the built-in
    trainer (framework frenzy), the hf-trainer points Transformers' Trainer on its own model classes (framework
    hf-trainer, its profile's defaults); the others a plain PyTorch loop (framework torch) over the built-in model
    (model_code frenzy) that computes the loss inside a function, so the logits are not held through backward."""
    trainer = p["trainer"]
    builtin = trainer in ("deepspeed", "pipeline")
    entry: dict[str, Any] = (
        {"trainer": "builtin"}
        if builtin
        else {"trainer": "script", "script": "train.py", "framework": trainer}
        if trainer in ("hf-trainer", "lightning", "torchtune", "litgpt", "torchtitan")
        else {
            "trainer": "script",
            "script": "benchmarks/cpu_memory_grid.py",
            "framework": "torch",
            "model_code": "frenzy",
            "holds_logits": False,
        }
    )
    spec = {
        "name": p["name"],
        "model": {"arch": p["arch"]},
        "training": {
            "seq_len": p["seq_len"],
            "global_batch": p["micro_batch"] * p["grad_accum"] * p["dp"],
            "micro_batch": p["micro_batch"],
            "steps": 1,
            "precision": p["precision"],
            "optimizer": "adamw",
            "attention": p["attention"],
            "activation_checkpointing": p["recompute"],
            "method": p.get("method", "lora") if p["lora_rank"] else "full",
            "lora": {
                "rank": p["lora_rank"] or 16,
                "targets": list(p.get("lora_targets", ("q", "v"))),
                "dropout": p.get("lora_dropout", 0.05),
                # litgpt's --quantize bnb.nf4 / bnb.nf4-dq, and the bitsandbytes release the grid ran
                **(
                    {"double_quant": p["quantize"].endswith("-dq"), "quantizer_version": BITSANDBYTES}
                    if "quantize" in p
                    else {}
                ),
            },
        },
        "parallel": {
            "sharding": p.get("sharding") or {0: "none", 1: "zero1", 2: "zero2", 3: "zero3"}[p["zero"]],
            "tp": p["tp"],
            "pp": p["pp"],
            # the harness's own TP points split the blocks only (embedding and head stay whole); torchtitan's say
            "sequence_parallel": p.get("sequence_parallel", False),
        },
        "deepspeed": dict(BUCKETS, overlap_comm=False),
        "entry": entry,
    }
    if trainer == "torchtitan":  # its release, and its default loss: ChunkedLossWrapper's 8 chunks
        spec["training"]["loss_chunks"] = 8
        spec["training"]["compile"] = p.get("compile", False)
        entry["framework_version"] = TORCHTITAN
    return {"spec": spec}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="dataset to write (merged by point name)")
    ap.add_argument("--only", nargs="*", default=None, help="point names (prefix match) to run")
    ap.add_argument("--list", action="store_true", help="list the grid and exit")
    ap.add_argument(
        "--compare", action="store_true", help="print MARP's prediction next to every stored point; no training"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each multi-process point; the median peak per rank is stored (default 3)",
    )
    ap.add_argument(
        "--refresh",
        action="store_true",
        help="rewrite the stored MARP inputs of every point from the grid's definitions; no training",
    )
    args = ap.parse_args()
    if args.refresh:
        data = json.loads(args.out.read_text())
        defs = {p["name"]: p for p in grid()}
        for q in data["points"]:
            if q["name"] in defs:
                q.pop("workload", None)
                q.pop("plan", None)
                q.pop("arch", None)
                q.update(marp_inputs(defs[q["name"]]))
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        return 0
    if args.compare:
        from frenzy_slurm.eval.grid import load_grid, predict

        print(f"{'point':30} {'rank':>4} {'stage':>5} {'measured MiB':>12} {'MARP MiB':>9} {'error':>7}")
        for point in load_grid(args.out):
            for r in predict(point):
                print(
                    f"{r.point:30} {r.rank:4} {r.stage:5} {r.measured / 2**20:12.3f} "
                    f"{r.predicted / 2**20:9.3f} {r.error:7.1%}"
                )
        return 0
    pts = grid()
    if args.list:
        for p in pts:
            print(p["name"])
        return 0
    if args.only:
        pts = [p for p in pts if any(p["name"].startswith(o) for o in args.only)]
    data = json.loads(args.out.read_text()) if args.out.exists() else {"points": []}
    by_name = {q["name"]: q for q in data["points"]}
    import torch

    for p in pts:
        t0 = time.time()
        try:
            ranks = run_point(p, max(1, args.repeats))
        except Exception as exc:  # noqa: BLE001 - one failing point is reported, the grid goes on
            print(f"{p['name']}: FAILED {exc}", flush=True)
            continue
        by_name[p["name"]] = {"name": p["name"], "trainer": p["trainer"], **marp_inputs(p), "ranks": ranks}
        print(
            f"{p['name']}: "
            + " ".join(f"r{r['rank']}/s{r['stage']} {r['peak_bytes'] / 2**20:.3f} MiB" for r in ranks)
            + f" ({time.time() - t0:.0f} s)",
            flush=True,
        )
        try:
            import transformers

            frameworks = {"transformers": transformers.__version__}
        except ImportError:
            frameworks = {}
        import importlib

        for name in ("accelerate", "torchtitan"):
            try:
                frameworks[name] = importlib.import_module(name).__version__
            except (ImportError, AttributeError):
                pass
        data = {
            "torch": torch.__version__,
            "frameworks": frameworks | data.get("frameworks", {}),
            "device": "cpu (gloo)",
            "command": "python benchmarks/cpu_memory_grid.py",
            "points": sorted(by_name.values(), key=lambda q: q["name"]),
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
