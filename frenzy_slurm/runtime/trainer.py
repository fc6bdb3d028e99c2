"""The built-in trainer: DeepSpeed over the plan HAS chose, with checkpoints, resume, metrics.json and progress.json.

Pipeline plans use a PipelineModule with HAS's exact layer split; ranks are laid out pipe-major
(stage s holds ranks s*dp .. s*dp+dp-1), which is component order in the hetjob step. Data
parallelism and ZeRO come from ds_config.json. On a CPU (no GPU in the task) DeepSpeed runs with
DS_ACCELERATOR=cpu over gloo.

Signals: SIGUSR2 (sent 300 s before the time limit) and SIGTERM (scancel, preemption) make the
trainer save a checkpoint at the next step boundary, every rank at the same one (`agreed_stop`); after USR2,
and after the SIGTERM of a preemption (in_job.preempted), rank 0 also requeues the job so it resumes from
that checkpoint.

`job_dir` is the directory runtime/trust.py opened and checked (named through its file descriptor). A
checkpoint is loaded only when its files are the ones this job recorded after saving them
(runtime/checkpoints.py's manifest): DeepSpeed's load unpickles them.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frenzy_slurm.core.errors import FrenzyError, InputError
from frenzy_slurm.core.records import write_json
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobdir import oom
from frenzy_slurm.jobdir.planfile import PlanFile, read_plan
from frenzy_slurm.jobdir.safety import check_private_dir
from frenzy_slurm.jobspec import ResolvedModel
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.memory import estimate_memory
from frenzy_slurm.marp.plan import checkpoint_route
from frenzy_slurm.render.shapes import runs_as
from frenzy_slurm.runtime import checkpoints, oom_hook, signals
from frenzy_slurm.runtime.build_lock import watch_start
from frenzy_slurm.runtime.children import child_env
from frenzy_slurm.runtime.dist import DistEnv
from frenzy_slurm.runtime.shm import start_deepspeed_comm, uses_shm_allreduce
from frenzy_slurm.slurm import open_backend
from frenzy_slurm.track.progress import ProgressRecorder

if TYPE_CHECKING:  # torch is imported inside the functions: the job imports it only after the signal handlers
    import torch

    from frenzy_slurm.has.model import Decision
    from frenzy_slurm.marp.plan import ParallelPlan

_stop = signals.STOP  # set by runtime.signals' handler, installed before anything heavy is imported
# The stop signals as one number per rank, the larger winning where ranks saw different ones: the time-limit
# warning (checkpoint and requeue) before a SIGTERM (scancel, or a preemption, which also requeues)
_STOP_CODES: dict[str | None, int] = {None: 0, "SIGTERM": 1, "SIGUSR2": 2}


def agreed_stop(device: torch.device, world_size: int) -> str | None:
    """The stop signal any rank has received by this step boundary, the same on every rank (and recorded as
    this rank's own). Slurm signals each task by itself, so at one step boundary some ranks may have the
    signal and others not yet: a rank that stops to checkpoint (a collective save and a barrier) while another
    runs on into the next step (pipeline sends) would wait for it until SIGKILL, and a preempted job would end
    PREEMPTED by Slurm instead of requeued by its trainer (seen on the local cluster: tests/
    test_has_preemptible_live.py). One all-reduce of one integer per step."""
    import torch

    if world_size <= 1 or not torch.distributed.is_initialized():
        return _stop["signal"]
    code = torch.tensor([_STOP_CODES[_stop["signal"]]], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(code, op=torch.distributed.ReduceOp.MAX)
    agreed = next(name for name, c in _STOP_CODES.items() if c == int(code.item()))
    if agreed is not None and _STOP_CODES[_stop["signal"]] < _STOP_CODES[agreed]:
        _stop["signal"] = agreed
    return agreed


def _device(dist: DistEnv) -> tuple[torch.device, str]:
    import torch

    if torch.cuda.is_available() and dist.visible_gpus:
        dev = torch.device("cuda", dist.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        return dev, "nccl"
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    return torch.device("cpu"), "gloo"


def _stage_of(rank: int, plan: ParallelPlan) -> int:
    return rank // (plan.dp * plan.tp)


def _component_of(stage: int, decision: Decision) -> dict[str, str | None]:
    for c in decision.chosen.components:
        if stage in c.stages:
            return {"gpu_type": c.gpu_type, "gpu_model": c.gpu_model, "partition": c.partition}
    return {"gpu_type": None, "gpu_model": None, "partition": None}


def _lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return f


def _client_optimizer(name: str, params: list[torch.nn.Parameter], lr: float) -> torch.optim.Optimizer | None:
    import torch

    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adafactor":
        return torch.optim.Adafactor(params, lr=lr)
    if name == "adam-8bit":
        try:
            import bitsandbytes as bnb  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            raise SystemExit("optimizer adam-8bit needs bitsandbytes in the job's Python environment") from None
        return bnb.optim.Adam8bit(params, lr=lr)
    if name == "adam-4bit":
        try:
            from torchao.optim import AdamW4bit  # type: ignore[import-not-found]
        except ImportError:
            raise SystemExit("optimizer adam-4bit needs torchao (AdamW4bit) in the job's Python") from None
        return AdamW4bit(params, lr=lr)
    return None  # adam/adamw come from ds_config.json


def run_training(job_dir: Path, dist: DistEnv) -> int:
    """Train the plan in `job_dir` on this rank: the engine (resumed from a verified checkpoint), the steps with
    checkpoints at the interval and on a stop signal, then metrics.json (rank 0) and a requeue where asked."""
    pf, shaped = runs_as(read_plan(job_dir / "plan.json"), os.environ)  # slurm.replan: the shape Slurm gave it
    device, backend = _device(dist)
    import torch

    # DeepSpeed builds or loads its ops here; a lock left by a killed build would hang it silently (build_lock.py)
    with watch_start(speaks=dist.local_rank == 0):
        _init_distributed(dist, backend)
        torch.manual_seed(pf.spec.training.seed)
        engine, start_step = _engine(job_dir, pf, dist, shaped)
    run = _Run(job_dir, pf, dist, device, engine, start_step)
    run.train()
    stage = _stage_of(dist.rank, pf.decision.chosen.plan)
    record = {
        "rank": dist.rank,
        "host": socket.gethostname(),
        "stage": stage,
        "device": device.type,
        **_component_of(stage, pf.decision),
        **run.peak,
        "predicted_allocated_gib": _predicted_allocated(pf, stage, device.type),
    }
    gathered = [None] * dist.world_size
    torch.distributed.all_gather_object(gathered, record)
    if dist.rank == 0:
        run.write_metrics(gathered)
        if os.environ.get("SLURM_JOB_ID") and (_stop["signal"] == "SIGUSR2" or _preempted()):
            _requeue(int(os.environ.get("SLURM_HET_JOB_ID") or os.environ["SLURM_JOB_ID"]))
    # every rank is done: the group down after a barrier (runtime/ending.py; `python -m frenzy_slurm.runtime` then
    # exits with os._exit, so no C++ destructor at interpreter exit can turn this finished run into a failed one)
    from frenzy_slurm.runtime.ending import close_process_group

    close_process_group(barrier=True)
    return 0


def _init_distributed(dist: DistEnv, backend: str) -> None:
    """DeepSpeed's process group; over gloo on one host, with the shared-memory segments DeepSpeed will make
    created under this job's names first."""
    import deepspeed

    signals.install()  # normally done already by `python -m frenzy_slurm.runtime`; idempotent

    if backend == "gloo" and uses_shm_allreduce(dist.world_size):  # DeepSpeed will make shared-memory segments
        start_deepspeed_comm(dist.rank, dist.world_size, partial(deepspeed.init_distributed, dist_backend=backend))
    else:
        deepspeed.init_distributed(dist_backend=backend)


def _engine(job_dir: Path, pf: PlanFile, dist: DistEnv, shaped: dict[str, Any] | None = None) -> tuple[Any, int]:
    """(the DeepSpeed engine over the built-in model as plan.json lays it out, the step it starts at): loaded from
    the checkpoint this job may resume, converted to DeepSpeed's universal format where the plan changed."""
    import deepspeed
    import torch

    from frenzy_slurm.models.gpt import GPT
    from frenzy_slurm.models.pipe import pipeline_module

    spec, arch, plan = pf.spec, pf.arch, pf.decision.chosen.plan
    t = spec.training
    ds_config = shaped if shaped is not None else json.loads((job_dir / "ds_config.json").read_text())
    recompute = plan.recompute == "full"
    # the attention kernel model.yaml names, and selective recomputation of its core: what MARP predicted
    core = plan.recompute == "selective"
    if plan.pp > 1:
        # plan.json's split, written out
        model = pipeline_module(arch, plan.stage_layers(arch.layers), recompute, t.attention, core)
    else:
        model = GPT(arch, recompute, t.attention, core)
    if t.precision == "bf16-pure":
        model = model.to(torch.bfloat16)
    params = [p for p in model.parameters() if p.requires_grad]
    client_opt = _client_optimizer(t.optimizer, params, t.learning_rate)
    source = _resume_source(job_dir, pf, dist)
    if source is not None and source.universal:
        ds_config.setdefault("checkpoint", {})["load_universal"] = True  # this run only: the files keep theirs
    # DeepSpeed steps the schedule at each optimizer step and saves it in checkpoints
    schedule = _lr_lambda(t.warmup_steps, t.total_steps)
    engine, _, _, _ = deepspeed.initialize(
        model=model,
        model_parameters=params,
        optimizer=client_opt,
        config=ds_config,
        lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, schedule),
    )
    if source is None:
        return engine, 0
    _prefer_weights_only(engine)
    _, client = engine.load_checkpoint(str(source.directory), tag=source.tag)
    return engine, int((client or {}).get("step", source.step))


class _Run:
    """The steps of one run on this rank, from `start_step`: losses, step times, the memory peak measured."""

    def __init__(
        self, job_dir: Path, pf: PlanFile, dist: DistEnv, device: torch.device, engine: Any, start_step: int
    ) -> None:
        from frenzy_slurm.runtime.data import Batches

        self.job_dir, self.pf, self.dist, self.device, self.engine = job_dir, pf, dist, device, engine
        self.start_step = self.step = start_step
        t, plan = pf.spec.training, pf.decision.chosen.plan
        self.dp_rank = (dist.rank % (plan.dp * plan.tp)) // plan.tp
        entry = pf.spec.entry
        data_path = Path(entry.data) if entry.data else None
        self.data = Batches(pf.arch.vocab, t.seq_len, plan.micro_batch, t.seed, data_path, entry.data_dtype)
        prior = {}
        if dist.rank == 0 and (job_dir / "metrics.json").exists():
            prior = json.loads((job_dir / "metrics.json").read_text())
        self.losses: list[Any] = list(prior.get("loss", [])) if start_step else []
        self.step_times: list[float] = []
        self.peak: dict[str, float | str | None] = {}

    def one_step(self, step: int) -> float:
        """One optimizer step's mean loss over its micro-batches (a pipeline's schedule runs them all)."""
        from frenzy_slurm.models.gpt import lm_loss

        plan, engine = self.pf.decision.chosen.plan, self.engine
        if plan.pp > 1:
            it = iter([self.data.get(step, self.dp_rank, m) for m in range(plan.grad_accum)])
            loss = engine.train_batch(data_iter=it)
            return float(loss.detach())
        total = 0.0
        for m in range(plan.grad_accum):
            x, y = self.data.get(step, self.dp_rank, m)
            loss = lm_loss(engine(x.to(self.device)), y.to(self.device))
            engine.backward(loss)
            engine.step()
            total += float(loss.detach())
        return total / plan.grad_accum

    def guarded(self, step: int) -> float:
        """one_step; a CUDA out-of-memory error is recorded for the job's epilogue first (jobdir/oom.py)."""
        planned = _component_peak(self.pf, _stage_of(self.dist.rank, self.pf.decision.chosen.plan))
        try:
            oom_hook.test_capacity_exceeded(step, planned)
            return self.one_step(step)
        except Exception as exc:
            if oom.is_cuda_oom(exc):
                oom.record(self.job_dir, exc, planned)
            raise

    def train(self) -> None:
        """Steps until total_steps or a stop signal, a checkpoint at the interval, the last step and a stop; the
        CPU's peak measured on the step after the first (the only one when a single step is left)."""
        from frenzy_slurm.runtime.memory import CpuMemoryRecorder, gpu_peaks

        t = self.pf.spec.training
        recorder = CpuMemoryRecorder().start() if self.device.type == "cpu" else None  # from a step before
        progress = ProgressRecorder(self.job_dir, t.total_steps)  # progress.json for fsbatch --wait's line
        while self.step < t.total_steps:
            t0 = time.perf_counter()
            measure = self.step == self.start_step + 1 or (t.total_steps - self.start_step == 1)
            if measure and recorder is not None:
                peak_bytes, loss = recorder.peak_of(partial(self.guarded, self.step))
                recorder = None
                self.peak = {"peak_gib": peak_bytes / GiB, "metric": "allocated (profiler)"}
            else:
                loss = self.guarded(self.step)
            self.step_times.append(time.perf_counter() - t0)
            self.step += 1
            self.losses.append([self.step, loss])
            if self.dist.rank == 0:
                line = f"frenzy-slurm: step {self.step}/{t.total_steps} loss {loss:.4f} {self.step_times[-1]:.3f}s"
                print(line, flush=True)
                progress.step(self.step, loss, self.step_times[-1])
            stop = agreed_stop(self.device, self.dist.world_size)
            if self.step % (t.checkpoint_interval or 1000) == 0 or self.step == t.total_steps or stop:
                self.checkpoint()
            if stop:
                break
        if recorder is not None:  # stopped before the measured step
            recorder.close()
        if self.device.type == "cuda":
            self.peak = gpu_peaks(self.device) | {"metric": "allocated"}
            self.peak["peak_gib"] = self.peak["peak_allocated_gib"]

    def checkpoint(self) -> None:
        """Every rank's shards of this step, their digests and manifest, then the old checkpoints pruned."""
        import torch

        ckpt_dir = self.job_dir / "checkpoints"
        tag = checkpoints.tag(self.step)
        self.engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state={"step": self.step})
        torch.distributed.barrier()  # every rank's shards are written before they are digested
        _record_checkpoint(ckpt_dir / tag, self.dist, self.pf.submission)
        if self.dist.rank == 0:
            checkpoints.prune(ckpt_dir, self.pf.spec.training.keep_checkpoints)

    def write_metrics(self, ranks: list[Any]) -> None:
        """metrics.json (rank 0): the steady step time, throughput, losses and every rank's record."""
        # the steady state, which MARP predicts and calibration fits: without the warm-up step and the step
        # profiled for memory
        from frenzy_slurm.calibration.observe import steady_step_time

        t = self.pf.spec.training
        profiled = [0 if t.total_steps - self.start_step == 1 else 1]
        med = steady_step_time(self.step_times, profiled)
        metrics = {
            "job_id": os.environ.get("SLURM_JOB_ID"),
            "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            "resumed_from_step": self.start_step,
            "step": self.step,
            "total_steps": t.total_steps,
            "step_times_s": self.step_times,
            "profiled_steps": profiled,
            "step_time_s": med,
            "tokens_per_s": t.global_batch * t.seq_len / med if med else None,
            "loss": self.losses,
            "ranks": ranks,
            "stopped_by": _stop["signal"],
            "written_at": time.time(),
        }
        write_json(self.job_dir / "metrics.json", metrics)


def _record_checkpoint(tag_dir: Path, dist: DistEnv, submission: str) -> None:
    """Digest the tag's files (each rank a share) and have rank 0 write the manifest a resume checks."""
    import torch

    share = checkpoints.digest_share(tag_dir, dist.rank, dist.world_size)
    shares: list = [None] * dist.world_size
    torch.distributed.all_gather_object(shares, share)
    if dist.rank == 0:
        checkpoints.write_manifest(tag_dir, {k: v for part in shares for k, v in part.items()}, submission)
    torch.distributed.barrier()  # the manifest exists before anyone prunes or stops


def _prefer_weights_only(engine: Any) -> None:  # a DeepSpeed engine (DeepSpeed is untyped)
    """DeepSpeed loads checkpoints with torch.load(weights_only=False). Try weights_only=True first (tensors and
    plain data: the built-in trainer's ZeRO-0 files are such); only a file of a tag whose digests were just
    checked falls back to a full unpickle (ZeRO optimizer files carry DeepSpeed's own objects)."""
    import pickle

    import torch

    full_load = engine.checkpoint_engine.load

    def load(path: str, map_location: Any = None) -> Any:
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError:
            return full_load(path, map_location=map_location)

    engine.checkpoint_engine.load = load


@dataclass(frozen=True)
class ResumeSource:
    """The checkpoint a run starts from: DeepSpeed's directory and tag, its step, and whether it is a universal
    checkpoint (loaded with `checkpoint.load_universal`)."""

    directory: Path
    tag: str
    step: int
    universal: bool = False


def _resume_source(job_dir: Path, pf: PlanFile, dist: DistEnv) -> ResumeSource | None:
    """This job's own newest checkpoint; else, for a job `frenzy-slurm watch` moved here (plan.json's
    `moved_from`), the moved job's newest, converted to DeepSpeed's universal checkpoint where the plan's
    layout differs (has/moves.py `resumable` says which moves the watcher makes); else None (start afresh)."""
    own = _verified_resume_tag(job_dir / "checkpoints", dist)
    if own is not None:
        return ResumeSource(job_dir / "checkpoints", own, checkpoints.step_of(own))
    moved = pf.moved_from
    if moved is None:
        return None

    there = Path(moved.job_dir)
    check_private_dir(there, "the job directory this job was moved from")  # the user's, writable by no one else
    tag = _verified_resume_tag(there / "checkpoints", dist, named=str(there))
    if tag is None:
        if dist.rank == 0:
            print(f"frenzy-slurm: job {moved.job_id} left no checkpoint in {there}: starting afresh", flush=True)
        return None
    old, new = moved.plan, pf.decision.chosen.plan
    step = checkpoints.step_of(tag)
    if dist.rank == 0:
        print(f"frenzy-slurm: resuming job {moved.job_id}'s checkpoint {tag} ({old.short()} -> {new.short()})")
    route = checkpoint_route(old, new)
    if route == "as-is":
        return ResumeSource(there / "checkpoints", tag, step)  # DeepSpeed loads it as it is
    if route is None:  # has/moves.py `resumable` never plans such a move
        raise InputError(
            f"job {moved.job_id}'s checkpoint {tag} ({old.short()}) cannot be loaded with this plan ({new.short()}). "
            "Submit again with fsbatch."
        )
    return _universal(job_dir, there / "checkpoints" / tag, moved.job_id, step, dist)


def _universal(job_dir: Path, source: Path, job_id: int, step: int, dist: DistEnv) -> ResumeSource:
    """Rank 0 converts the checkpoint (checked against its manifest) to DeepSpeed's universal checkpoint in this
    job's checkpoints/ (a new directory each run: nothing there is loaded that this run did not write)."""
    import torch

    name = f"moved-{job_id}-{source.name}-universal-r{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    target = job_dir / "checkpoints" / name
    failed = ""
    if dist.rank == 0:
        (job_dir / "checkpoints").mkdir(mode=0o700, exist_ok=True)
        work = job_dir / "checkpoints" / f".{name}.tmp-{os.getpid()}"
        t0 = time.time()
        failed = convert_to_universal(source, work, job_dir)
        if not failed:
            os.rename(work, target)
            print(f"frenzy-slurm: converted {source.name} to a universal checkpoint in {time.time() - t0:.1f} s")
    said = [failed]
    torch.distributed.broadcast_object_list(said, src=0)
    if said[0]:
        raise InputError(
            f"could not convert job {job_id}'s checkpoint {source.name} for this plan "
            f"(deepspeed.checkpoint.ds_to_universal: {said[0]}). Submit again with fsbatch."
        )
    return ResumeSource(job_dir / "checkpoints", name, step, universal=True)


def converter_argv(source: Path, work: Path) -> list[str]:
    """DeepSpeed's converter from `source` (a checkpoint tag) to a universal checkpoint in `work`, run as
    frenzy-slurm's other children are: -P, so that neither the working directory nor the script's directory
    lands on sys.path (a deepspeed/ or torch.py planted in the job directory would be imported otherwise)."""
    import sys

    return [
        sys.executable,
        "-P",
        "-m",
        "deepspeed.checkpoint.ds_to_universal",
        "--input_folder",
        str(source),
        "--output_folder",
        str(work),
        "--inject_missing_state",  # the built-in model carries no universal_checkpoint_info
        "--num_extract_workers",
        "1",
        "--num_merge_workers",
        "1",
    ]


def convert_to_universal(source: Path, work: Path, job_dir: Path) -> str:
    """Run the converter from "/" (not the job directory, the job's working directory) with PYTHONPATH's empty
    and relative entries dropped (-P does not drop those: '' means the working directory); "" on success, else
    its last line of output."""
    import subprocess

    # the job directory is named through this process's descriptor (/proc/self/fd/N): the converter keeps it
    fds = (int(job_dir.name),) if str(job_dir).startswith("/proc/self/fd/") else ()
    argv = converter_argv(source, work)
    done = subprocess.run(argv, capture_output=True, text=True, pass_fds=fds, cwd="/", env=child_env(), check=False)
    if done.returncode == 0:
        return ""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}"


def _verified_resume_tag(ckpt_dir: Path, dist: DistEnv, named: str | None = None) -> str | None:
    """The checkpoint tag to resume from, once every rank has checked its share of it against the manifest
    this job wrote; None to start afresh. A tag that differs stops the job (FrenzyError, on every rank)."""
    import torch

    tag, skipped = checkpoints.resume_tag(ckpt_dir)
    if skipped and dist.rank == 0:
        print(
            f"frenzy-slurm: not resuming from {', '.join(skipped)}: no manifest (a save cut short, or not "
            "written by this job)",
            flush=True,
        )
    if tag is None:
        return None
    problems = checkpoints.check_share(ckpt_dir / tag, dist.rank, dist.world_size)
    gathered: list = [None] * dist.world_size
    torch.distributed.all_gather_object(gathered, problems)
    found = [p for part in gathered for p in part]
    if found:
        shown = "; ".join(found[:3]) + (f"; and {len(found) - 3} more" if len(found) > 3 else "")
        named = named or os.environ.get("FRENZY_JOB_DIR")  # the path the user knows, not /proc/self/fd/N
        shown = shown.replace(str(ckpt_dir.parent), named) if named else shown
        raise InputError(
            f"checkpoint checkpoints/{tag} is not what this job wrote ({shown}). Loading it would "
            "unpickle it (run code), so the job stops. Remove that directory to resume from an earlier "
            "checkpoint, or all of checkpoints/ to start afresh."
        )
    return tag


def _preempted() -> bool:
    """Whether the stop was the SIGTERM of a preemption, which requeues like the time-limit warning (a scancel
    stops the job). in_job is imported only now: importing it installs its own handler for the signals."""
    if _stop["signal"] != "SIGTERM":
        return False
    # in_job installs its own signal handlers when imported: only now
    from frenzy_slurm import in_job

    return in_job.preempted()


def _requeue(job_id: int) -> None:
    """Back into the queue after the time-limit checkpoint; a failure is logged, the checkpoint is kept."""
    try:
        open_backend("cli").requeue(job_id)
    except FrenzyError as exc:
        print(f"frenzy-slurm: could not requeue job {job_id}: {exc.message}", flush=True)


def _component_peak(pf: PlanFile, stage: int) -> float | None:
    """The device peak (GiB) HAS planned for the component that runs this stage."""
    for c in pf.decision.chosen.components:
        if stage in c.stages:
            return c.peak_gib
    return None


def _predicted_allocated(pf: PlanFile, stage: int, device: str = "cuda") -> float | None:
    """MARP's allocated-memory prediction for this rank's stage, as the built-in trainer runs it."""
    w = workload_from_spec(
        pf.spec, ResolvedModel(arch=pf.arch, name=pf.model_name, exact_params=pf.exact_params), device
    )
    est = estimate_memory(w, pf.decision.chosen.plan, "allocated")
    return est.stages[min(stage, len(est.stages) - 1)].peak / GiB
