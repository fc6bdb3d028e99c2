"""The allocation requests of one real training step on the CPU, by phase, next to MARP's generated ones.

    python benchmarks/step_requests_cpu.py [--point torch-llama-1gpu] [--recompute full] [--micro-batch N]
        [--seq-len N] [--dtype bf16-mixed|bf16-pure] [--show]                       # seconds on 1 core
    python benchmarks/step_requests_cpu.py --point hf-trainer-llama-1gpu
    python benchmarks/step_requests_cpu.py --point ds-llama-1gpu                   # also ds-gpt2-1gpu, -full
    python benchmarks/step_requests_cpu.py --point lora-llama-1gpu  # the grid's PEFT-style LoRA, frozen base
    python benchmarks/step_requests_cpu.py --point hf-trainer-peft-lora-llama-1gpu   # PEFT's LoRA, the Trainer

Runs a CPU grid point's plain PyTorch loop (benchmarks/cpu_memory_grid.py's `torch` trainer: the built-in model,
`frenzy_slurm.models.gpt.GPT`, `lm_loss`, torch's AdamW, `zero_grad(set_to_none=True)`) for three steps under the
profiler with `profile_memory=True`, as the grid measures, and reads the last (steady) step's allocator events:
each `[memory]` event's address and bytes (positive: an allocation, negative: a free). Profiler ranges around the
step's parts give each event its phase: `forward` (the embedding and the blocks, one range per block), `loss` (the
final norm, the output layer and the loss: MARP counts the final norm's and the head's saved inputs with the
loss), `backward` (`loss.backward()`) and `optimizer` (`step()` and `zero_grad`). An address is a tensor from
its allocation to its free; a free of a block allocated before the step (an optimizer state, a gradient) keeps
the size of its allocation.

`--recompute full` runs the point with the built-in model's per-block checkpointing (torch.utils.checkpoint, as the
grid's trainers do), `--micro-batch` / `--seq-len` at another shape. `--dtype bf16-mixed` runs the plain loop's
forward and loss under `torch.autocast("cpu", dtype=torch.bfloat16)` over fp32 weights (the CPU's autocast stands
for CUDA's: marp/step_dtypes.py), `--dtype bf16-pure` the model in bf16 (`model.to(torch.bfloat16)`, AdamW on bf16
states); both with oneDNN off, whose 16-bit matmul takes a scratchpad per call that CUDA's cuBLAS does not. `--point
hf-trainer-llama-1gpu` runs the grid's Hugging Face Trainer instead (`record_hf_step`), and generates with the "hf"
model code and the fused AdamW. The one-rank DeepSpeed points (`ds-*-1gpu`, ZeRO-0) run the built-in model in the
grid's engine (`engine.backward`, `engine.step`), with every thread's frees counted (gloo's thread may let go of the
reduced bucket).

`--show` prints both sequences side by side per phase; without it, the comparison
(`frenzy_slurm.marp.step_requests.compare`) and both replays' peaks. tests/test_marp_step_requests.py runs the
same comparison with its tolerances.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from frenzy_slurm.marp.step_requests import Request  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
GRID = ROOT / "benchmarks" / "data" / "cpu_memory_grid.json"
STEPS = 3  # the first creates the optimizer states; the last is read


def grid_point(name: str) -> dict[str, Any]:
    """The stored grid point `name` (its model.yaml, `spec`, and its measured ranks)."""
    points = json.loads(GRID.read_text())["points"]
    return next(p for p in points if p["name"] == name)


def variant(
    point: dict[str, Any], recompute: str = "", micro_batch: int = 0, seq_len: int = 0, precision: str = ""
) -> dict[str, Any]:
    """The grid point with its training's activation checkpointing, micro-batch, sequence length or precision
    changed (the others as they are); its name says what changed."""
    out = json.loads(json.dumps(point))
    training = out["spec"]["training"]
    if micro_batch:  # (the global batch grows with it: the same number of micro-batches)
        training["global_batch"] = training["global_batch"] // training["micro_batch"] * micro_batch
    changes = (
        ("activation_checkpointing", recompute),
        ("micro_batch", micro_batch),
        ("seq_len", seq_len),
        ("precision", precision),
    )
    for key, value in changes:
        if value:
            training[key] = value
            out["name"] += f"+{key}={value}"
    return out


def record(point: dict[str, Any]) -> list[Request]:
    """The steady step's requests of the point, by its trainer: the plain torch loop or the Trainer."""
    if point["spec"]["entry"].get("framework") == "hf-trainer":
        return record_hf_step(point)
    return record_step(point)


def generate(point: dict[str, Any]) -> list[Request]:
    """MARP's generated requests of the point's step: its framework's model code profile, and for the Trainer the
    optimizer its versions default to (the installed transformers and torch)."""
    from importlib.metadata import version

    from frenzy_slurm.eval.grid import spec_of, workload_of
    from frenzy_slurm.marp.framework_facts import hf_trainer_fused_adamw
    from frenzy_slurm.marp.frameworks import profile_of, version_tuple
    from frenzy_slurm.marp.step_requests import step_requests

    spec = spec_of(point)
    w, plan = workload_of(point)
    code = profile_of(spec).code(spec).name
    fused = spec.entry.framework == "hf-trainer" and hf_trainer_fused_adamw(
        version_tuple(version("transformers").split("+")[0]), version_tuple(version("torch").split("+")[0])
    )
    return step_requests(w, plan, code=code, fused_adamw=fused)


def record_step(point: dict[str, Any]) -> list[Request]:
    """The steady step's allocator requests of the grid point's plain PyTorch loop, in order, by phase."""
    import torch
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from frenzy_slurm.jobspec.arch import Architecture
    from frenzy_slurm.models.gpt import GPT, lm_loss
    from frenzy_slurm.runtime.memory import trace_events

    spec = point["spec"]
    training = spec["training"]
    recompute = training["activation_checkpointing"]
    # (DeepSpeed's engine on the built-in model: the grid's `builtin` trainer)
    ds = spec["entry"].get("trainer") == "builtin" and spec["parallel"]["sharding"] == "none"
    one_rank = {r["rank"] for r in point["ranks"]} == {0}
    precision = training["precision"]
    if (
        not one_rank
        or (spec["entry"].get("framework") != "torch" and not ds)
        or recompute not in ("none", "full")
        or precision not in ("fp32", "bf16-mixed", "bf16-pure")
        or (ds and precision != "fp32")
    ):
        raise ValueError(
            f"{point['name']}: the recorder runs the grid's plain torch loop (fp32, bf16 autocast or pure bf16) or "
            "DeepSpeed ZeRO-0 (fp32) on one rank, no or full checkpointing"
        )
    torch.manual_seed(0)
    torch.set_num_threads(1)
    arch = Architecture(**spec["model"]["arch"])
    mb, seq = training["micro_batch"], training["seq_len"]
    # (the grid's torch trainer: `GPT(arch, checkpoint=...)`, torch.utils.checkpoint per block, non-reentrant)
    model = GPT(arch, checkpoint=recompute == "full", attention=training["attention"])
    lora = spec["training"].get("lora", {}) if spec["training"].get("method") == "lora" else {}
    if lora:  # (the grid's PEFT-style adapters on the built-in model: frozen base, A and B trainable)
        model = _grid()._lora(model, lora["rank"], tuple(lora["targets"]))
    if precision == "bf16-pure":  # (bf16 weights, gradients and AdamW states: model.to(torch.bfloat16))
        model = model.to(torch.bfloat16)
    # bf16-mixed: fp32 weights, the forward and the loss under autocast (the CPU's stands for CUDA's: the same
    # weight cache, cleared when the region exits; the backward runs outside it)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    engine = _deepspeed_engine(point, model) if ds else None
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3) if engine is None else None  # (the grid's torch trainer)
    gen = torch.Generator().manual_seed(0)
    ranges: list[Any] = []

    def enter(name: str) -> None:
        ranges.append(record_function(name).__enter__())

    def leave() -> None:
        ranges.pop().__exit__(None, None, None)

    step_no = [0]
    for i, blk in enumerate(model.blocks):
        # (a checkpointed block runs again in backward, and its recomputation stops with an exception after the
        # last saved tensor: `always_call` closes its range then too)
        blk.register_forward_pre_hook(lambda _m, _a, i=i: enter(f"s{step_no[0]}.layer{i}"))
        blk.register_forward_hook(lambda _m, _a, _o: leave(), always_call=True)

    def to_loss(_m: Any, _a: Any) -> None:  # the final norm starts the loss phase
        leave()
        enter(f"s{step_no[0]}.loss")

    model.norm.register_forward_pre_hook(to_loss)

    def step(n: int) -> None:
        step_no[0] = n
        x = torch.randint(0, arch.vocab, (mb, seq), generator=gen)
        y = torch.roll(x, -1, 1)
        enter(f"s{n}.forward")
        with autocast:
            logits = model(x) if engine is None else engine(x)
            loss = lm_loss(logits, y)
            del logits
        leave()
        with record_function(f"s{n}.backward"):
            if engine is None:
                loss.backward()
            else:
                engine.backward(loss)
            del loss
        with record_function(f"s{n}.optimizer"):
            if engine is None:
                opt.step()
                opt.zero_grad(set_to_none=True)
            else:
                engine.step()

    # (oneDNN's 16-bit matrix products take a scratchpad from the allocator in every call; with it off the CPU's
    # own GEMM takes none, as on CUDA, where cuBLAS's workspace is taken once per handle, outside the step)
    mkldnn = torch.backends.mkldnn.enabled
    torch.backends.mkldnn.enabled = mkldnn and precision == "fp32"
    try:
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
            for n in range(STEPS):
                step(n)
    finally:
        torch.backends.mkldnn.enabled = mkldnn
    return requests_of(trace_events(prof), f"s{STEPS - 1}.")


def _grid() -> Any:
    """benchmarks/cpu_memory_grid.py as a module (its trainers' helpers)."""
    import importlib.util

    loader = importlib.util.spec_from_file_location("cpu_memory_grid", ROOT / "benchmarks" / "cpu_memory_grid.py")
    assert loader and loader.loader
    grid = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(grid)
    return grid


def _deepspeed_engine(point: dict[str, Any], model: Any) -> Any:
    """DeepSpeed's engine around `model` as the grid builds it (its ds_config: torch's AdamW, its buckets), one rank
    over gloo."""
    import importlib.util
    import logging
    import socket

    loader = importlib.util.spec_from_file_location("cpu_memory_grid", ROOT / "benchmarks" / "cpu_memory_grid.py")
    assert loader and loader.loader
    grid = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(grid)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    grid.rank_env(0, 1, port)
    import deepspeed

    from frenzy_slurm.runtime.memory import count_all_threads

    # (gloo's work may let go of the reduced bucket on its own thread: counted, as the grid does)
    count_all_threads()

    from frenzy_slurm.runtime.shm import release_allreduce_segment, segment_path

    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
    deepspeed.init_distributed(dist_backend="gloo")
    release_allreduce_segment(segment_path(0))  # (/dev/shm is RAM; DeepSpeed never unlinks it: runtime/shm.py)
    training = point["spec"]["training"]
    p = {"micro_batch": training["micro_batch"], "grad_accum": 1, "dp": 1, "zero": 0, "precision": "fp32"}
    engine, _, _, _ = deepspeed.initialize(
        model=model, model_parameters=list(model.parameters()), config=grid._ds_config(p)
    )
    return engine


def record_hf_step(point: dict[str, Any]) -> list[Request]:
    """The steady step's allocator requests of the grid's Hugging Face Trainer point (benchmarks/cpu_memory_grid.py
    `_hf_trainer`: transformers' own model class built from the point's architecture, its own Trainer, one process),
    in order, by phase. Model hooks mark the forward, its blocks and the loss (the final norm on); the backward
    runs from the end of the model's forward to the Trainer's `on_pre_optimizer_step` (the gradient clipping with
    it), the optimizer phase from there to `on_step_end` (step, scheduler, `model.zero_grad()`). A LoRA point gets
    PEFT's adapters as the grid's `_hf_trainer` makes them (`get_peft_model`; the hooks go on the wrapped Llama)."""
    import importlib.util
    import tempfile

    import torch
    import transformers
    from torch.autograd.profiler import record_function
    from torch.profiler import ProfilerActivity, profile

    from frenzy_slurm.runtime.memory import trace_events

    spec = point["spec"]
    training = spec["training"]
    if (
        spec["entry"].get("framework") != "hf-trainer"
        or training["activation_checkpointing"] != "none"
        or training["precision"] != "fp32"
        or training["method"] not in ("full", "lora")
        or {r["rank"] for r in point["ranks"]} != {0}
    ):
        raise ValueError(
            f"{point['name']}: the recorder runs the grid's Trainer in one process, fp32, no checkpointing, full or "
            "PEFT's LoRA"
        )
    loader = importlib.util.spec_from_file_location("cpu_memory_grid", ROOT / "benchmarks" / "cpu_memory_grid.py")
    assert loader and loader.loader
    grid = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(grid)
    if torch.distributed.is_initialized():  # (DeepSpeed's one-rank group stays for the process: its comm keeps it)
        raise RuntimeError("record the Trainer's step before any DeepSpeed step in this process")
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        os.environ.pop(key, None)  # (one process, as the grid runs it: no DDP wrapper)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    arch = spec["model"]["arch"]
    model = grid._hf_model({"arch": arch, "attention": training["attention"]})
    if training["method"] == "lora":  # (PEFT's LoRA as the grid's `_hf_trainer` sets it up)
        import peft

        lora = training["lora"]
        config = peft.LoraConfig(
            r=lora["rank"],
            lora_alpha=16,
            lora_dropout=lora["dropout"],
            target_modules=[f"{t}_proj" for t in lora["targets"]],
            task_type="CAUSAL_LM",
        )
        model = peft.get_peft_model(model, config)
    llama = model.get_base_model() if training["method"] == "lora" else model  # (the LlamaForCausalLM)
    ranges: list[Any] = []
    step_no = [0]

    def enter(name: str) -> None:
        ranges.append(record_function(f"s{step_no[0]}.{name}").__enter__())

    def leave() -> None:
        ranges.pop().__exit__(None, None, None)

    model.register_forward_pre_hook(lambda _m, _a: enter("forward"))
    for i, blk in enumerate(llama.model.layers):
        blk.register_forward_pre_hook(lambda _m, _a, i=i: enter(f"layer{i}"))
        blk.register_forward_hook(lambda _m, _a, _o: leave(), always_call=True)

    def to_loss(_m: Any, _a: Any) -> None:  # the final norm starts the loss phase
        leave()
        enter("loss")

    def to_backward(_m: Any, _a: Any, _o: Any) -> None:
        leave()
        enter("backward")

    llama.model.norm.register_forward_pre_hook(to_loss)
    model.register_forward_hook(to_backward)

    class Phases(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):  # noqa: ANN001 - transformers' callback signature
            step_no[0] = state.global_step

        def on_pre_optimizer_step(self, args, state, control, **kw):  # noqa: ANN001
            leave()
            enter("optimizer")

        def on_step_end(self, args, state, control, **kw):  # noqa: ANN001
            leave()

    gen = torch.Generator().manual_seed(0)
    mb, seq = training["micro_batch"], training["seq_len"]
    data = [
        {"input_ids": (x := torch.randint(0, arch["vocab"], (seq,), generator=gen)), "labels": x}
        for _ in range(mb * STEPS)
    ]
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(  # (as the grid's)
            output_dir=out,
            max_steps=STEPS,
            per_device_train_batch_size=mb,
            learning_rate=1e-3,
            report_to=[],
            save_strategy="no",
            logging_strategy="no",
            use_cpu=True,
            dataloader_num_workers=0,
            seed=0,
        )
        trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[Phases()])
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False) as prof:
            trainer.train()
    return requests_of(trace_events(prof), f"s{STEPS - 1}.")


def requests_of(events: list[dict[str, Any]], prefix: str) -> list[Request]:
    """The requests of the step whose ranges start with `prefix`, from a profile's Chrome-trace events."""
    windows = [
        (e["name"][len(prefix) :], e["ts"], e["ts"] + e.get("dur", 0))
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "user_annotation" and e["name"].startswith(prefix)
    ]
    phases = [(name, a, b) for name, a, b in windows if not name.startswith("layer")]
    # (a block's range twice where its recomputation runs in backward)
    layers = [(int(name[5:]), a, b) for name, a, b in windows if name.startswith("layer")]
    mem = [e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type") == 0]
    mem.sort(key=lambda e: e["ts"])  # (stable: events of one instant keep the trace's order)
    live: dict[int, tuple[str, int]] = {}
    out: list[Request] = []
    serial = 0
    total: int | None = None
    for e in mem:
        t, addr, size = e["ts"], int(e["args"]["Addr"]), int(e["args"]["Bytes"])
        phase = next((name for name, a, b in phases if a <= t <= b), "")
        layer = next((i for i, a, b in layers if a <= t <= b), -1)
        reported = e["args"].get("Total Allocated")
        if total is not None and reported is not None and total + size > reported:
            # a free on another thread (gloo's, letting go of DeepSpeed's reduced bucket): the profiler records
            # only its own threads, the running total (count_all_threads) all of them; the latest live block of
            # that size is taken for it
            gone = next((a for a in reversed(live) if live[a][1] == total + size - reported), None)
            if gone is not None:
                key, was = live.pop(gone)
                if phase:
                    out.append(Request(phase, layer, "free", key, was))
        total = reported
        if size > 0:
            serial += 1
            key = f"r{serial}"
            live[addr] = (key, size)
            if phase:
                out.append(Request(phase, layer, "alloc", key, size))
        elif addr in live:
            key, was = live.pop(addr)
            if phase:
                out.append(Request(phase, layer, "free", key, was))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--point", default="torch-llama-1gpu", help="a grid point of the plain torch loop")
    ap.add_argument("--show", action="store_true", help="print both sequences per phase")
    ap.add_argument("--recompute", default="", help="the point with this activation checkpointing (none, full)")
    ap.add_argument("--micro-batch", type=int, default=0, help="the point with this micro-batch")
    ap.add_argument("--seq-len", type=int, default=0, help="the point with this sequence length")
    ap.add_argument(
        "--dtype", default="", help="the point with this precision: bf16-mixed (autocast over fp32 weights), bf16-pure"
    )
    args = ap.parse_args()
    from frenzy_slurm.eval.grid import workload_of
    from frenzy_slurm.marp.step_requests import PHASES, compare, replay_peaks

    point = variant(grid_point(args.point), args.recompute, args.micro_batch, args.seq_len, args.dtype)
    recorded = record(point)
    w, plan = workload_of(point)
    generated = generate(point)
    if args.show:
        for phase in PHASES:
            print(f"== {phase}")
            floor = 4 * plan.micro_batch * w.seq_len  # (what `compare` leaves out)
            rec = [f"{r.action[0]}{r.size}" for r in recorded if r.phase == phase and r.size > floor]
            gen = [f"{r.action[0]}{r.size}" for r in generated if r.phase == phase and r.size > floor]
            for k in range(max(len(rec), len(gen))):
                print(f"{rec[k] if k < len(rec) else '':>12} {gen[k] if k < len(gen) else '':>12}")
    for phase, c in compare(recorded, generated, tokens=plan.micro_batch * w.seq_len).items():
        print(f"{phase:10} {c}")
    print(f"replay (recorded): {replay_peaks(recorded)}")
    print(f"replay (generated): {replay_peaks(generated)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
