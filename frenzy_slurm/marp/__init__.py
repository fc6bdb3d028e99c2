"""Stage 2, MARP: per-GPU peak training memory for parallel plans, and GPU-type candidates.

from frenzy_slurm.marp import workload_from_spec, estimate_memory, ParallelPlan
est = estimate_memory(workload_from_spec(spec, model), ParallelPlan(dp=4, zero=1, micro_batch=2))
"""

from __future__ import annotations

from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.marp.candidates import Candidate, GpuOption, SearchSpace, search
from frenzy_slurm.marp.memory import MemoryEstimate, StageMemory, estimate_memory
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.plan import ParallelPlan, Recompute, Workload, parse_plan

__all__ = [
    "Candidate",
    "GpuOption",
    "MemoryEstimate",
    "Overheads",
    "ParallelPlan",
    "SearchSpace",
    "StageMemory",
    "Workload",
    "estimate_memory",
    "parse_plan",
    "search",
    "search_space_from_spec",
    "with_exact_params",
    "workload_from_spec",
]


def with_exact_params(spec: JobSpec, model: ResolvedModel, trusted: tuple[str, ...] = ()) -> ResolvedModel:
    """A factory model with its exact parameter count, traced on the meta device (imports torch);
    any other model source is returned unchanged. The spec stage never imports the tracer. `trusted` is the
    site file's `trusted_factories` (factories allowed beside the user's own files)."""
    if spec.model.factory is None or model.exact_params is not None:
        return model
    from frenzy_slurm.marp.trace import count_factory_parameters

    exact = count_factory_parameters(spec.model.factory, spec.model.factory_kwargs, trusted)
    return ResolvedModel(arch=model.arch, name=model.name, exact_params=exact)


def workload_from_spec(spec: JobSpec, model: ResolvedModel, device: str = "cuda") -> Workload:
    """The MARP view of a job as frenzy-slurm's DeepSpeed runtime will run it (`device`: cuda, or cpu for
    the CPU runs of the built-in trainer, where RMSNorm is a composite of ops that keeps its normalised output)."""
    t = spec.training
    builtin = spec.entry.trainer == "builtin"
    return Workload(
        arch=model.arch,
        seq_len=t.seq_len,
        precision=t.precision,
        optimizer=t.optimizer,
        attention=t.attention,
        method=t.method,
        lora_rank=t.lora.rank,
        lora_targets=tuple(t.lora.targets),
        lora_dropout=t.lora.dropout > 0,
        loss_chunks=t.loss_chunks,
        compile=t.compile,
        framework="deepspeed",
        exact_params=model.exact_params,
        # the built-in model (frenzy_slurm.models.gpt) rotates q/k in eager ops and builds cos/sin per block
        unfused_rope=builtin,
        rope_tables_per_layer=builtin,
        norm_upcast=builtin and device == "cpu" and model.arch.norm == "rmsnorm",
    )


def search_space_from_spec(spec: JobSpec) -> SearchSpace:
    t = spec.training
    recompute: tuple[Recompute, ...] = (
        ("none", "selective", "full") if t.activation_checkpointing == "auto" else (t.activation_checkpointing,)
    )
    # The built-in DeepSpeed runtime parallelises over data and pipeline stages; tensor parallelism needs a
    # Megatron-style model, which only a user's own script can bring.
    tp = (1, 2, 4, 8) if spec.entry.trainer == "script" else (1,)
    return SearchSpace(
        micro_batch=t.micro_batch if isinstance(t.micro_batch, int) else None, recompute=recompute, tp_degrees=tp
    )
