"""What the metric adds to the allocated peak: the caching allocator's reserved excess (marp/allocator.py) and,
for the device metric, the CUDA context, NCCL buffers and cuBLAS workspaces."""

from __future__ import annotations

from functools import lru_cache

from frenzy_slurm.marp import allocator
from frenzy_slurm.marp.fsdp_init import pre_unshard_pool, stage_units, unshard_pool, wrap_cache
from frenzy_slurm.marp.memory_job import Job
from frenzy_slurm.marp.memory_moments import Moment, StageTerms
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.plan import Metric

parameter_shapes = lru_cache(maxsize=4096)(allocator.parameter_shapes)


def allocator_overhead(
    j: Job, i: int, n_layers: int, t: StageTerms, peak: Moment, metric: Metric, overheads: Overheads
) -> float:
    """What the metric adds to the allocated peak (docs/marp.md, "The caching allocator"): the caching allocator's
    reserved excess - its segment packing of the long-lived tensors at their per-tensor sizes (DeepSpeed and
    Megatron flatten them into a few buffers) and of the step's tensors, the measured excess beyond that
    (`overheads.fragmentation`; `step_fragmentation` unless expandable segments), the previous step's freed
    gradients that stay reserved beside the forward's activations - and for the device metric the CUDA context,
    NCCL buffers and cuBLAS workspaces (`Overheads.device_bytes`)."""
    if metric == "allocated":
        return 0.0
    if not j.w.alloc.caching_allocator:  # the CPU: nothing held beyond the tensors, no CUDA context or workspaces
        return overheads.device_bytes(j.plan.world) if metric == "device" else 0.0
    w, a, plan = j.w, j.w.arch, j.plan
    cfg = allocator.AllocatorConfig(expandable_segments=w.alloc.expandable_segments)
    st, resident = t.st, t.b.resident
    grads = t.grads
    long_lived = peak.weights + peak.optimizer + grads + resident
    flat = w.framework in ("deepspeed", "megatron")
    tensors: list[tuple[float, float]] = [(resident, 1.0)]
    if flat:
        tensors += [(peak.weights, 1.0), (peak.optimizer, 1.0), (grads, 1.0)]
    else:
        shapes = parameter_shapes(a, n_layers, i == 0, i == plan.pp - 1, plan.tp, j.vtp)
        lora = w.method != "full"
        trained = (
            allocator.adapter_shapes(a, n_layers, w.adapters.lora_rank, w.adapters.lora_targets, plan.tp)
            if lora
            else shapes
        )
        states = 0 if j.sdt == 0 else round((j.sb + j.mb_) / j.sdt)  # state tensors per parameter (Adam: 2)
        base = (4.0 if w.precision == "fp32" else 2.0) if lora else j.wb  # (QLoRA's NF4 counts as fewer tensors)
        tensors += allocator.spread(peak.weights, shapes, base) + allocator.spread(grads, trained, j.gb)
        tensors += allocator.spread(peak.optimizer, trained, j.sdt or 4.0, max(states, 1))
    step = max(0.0, peak.allocated - long_lived)
    if cfg.expandable_segments:
        tensors.append((step, 1.0))  # one segment per pool, grown in pages
    hidden_tensor = a.hidden * j.e_act * j.tokens / j.rep  # a hidden-wide tensor of the micro-batch
    overhead = _reserved_excess(tensors, cfg, j) + allocator.step_excess(step, hidden_tensor, cfg)
    overhead += long_lived * overheads.fragmentation
    if not cfg.expandable_segments:
        overhead += step * overheads.step_fragmentation
    if peak.phase == "backward-start" and not t.persistent and st.grads_all > st.head_grads:
        overhead += st.grads_all - peak.gradients
    if w.comm.fsdp1 and plan.zero == 3 and plan.pp == 1 and not a.encoder_decoder:
        overhead = fsdp1_reserved(j, n_layers, t, peak, overhead)
    if metric == "device":
        overhead += overheads.device_bytes(plan.world)
    return overhead


def fsdp1_reserved(j: Job, n_layers: int, t: StageTerms, peak: Moment, overhead: float) -> float:
    """The reserved excess of an FSDP1 job (marp/fsdp_init.py; docs/marp.md, "FSDP1: the wrap-time cache and the
    unshard stream"), from `overhead`, the excess as if every tensor shared one pool. The gathered parameters live
    in the unshard stream's pool (the root's buffer and three blocks', `unshard_pool`; under CPU offload also the
    pre-unshard stream's host-shard copies, `pre_unshard_pool`), not in the compute
    stream's, whose reserved bytes never read below what wrapping left cached (`wrap_cache`), unless the program
    empties the cache after wrapping (model.yaml's entry.empty_cache_after_setup, or the framework's habit).
    Pipeline stages, SHARD_GRAD_OP and encoder-decoder models are not laid out as units here (their callers
    leave `overhead` as it is). The allocated peak is unchanged: of the pool's buffers only those
    `zero3_gathered` counts are allocated at once; the others are freed blocks waiting for their streams."""
    units = stage_units(j, n_layers)
    pool = unshard_pool(units.root_gathered, [units.unit_gathered])
    if j.plan.offload_params:  # each unshard first copies the host shard to the GPU on a stream of its own
        world = j.weight_div
        shards = tuple(-(-sum(u) // world) for u in units.units)
        pool += pre_unshard_pool(shards[-1], shards[:-1])
    live = 0.0 if peak.phase == "optimizer-step" else t.b.gathered  # the gathered weights, alive at the peak
    compute = peak.allocated + overhead - live
    if not j.w.comm.fsdp1_cache_emptied:
        wrap = wrap_cache(units.units, j.weight_div, j.w.comm.fsdp1_sync, units.resident, j.plan.offload_params)
        compute = max(compute, wrap.reserved)
    return compute + pool - peak.allocated


def _reserved_excess(tensors: list[tuple[float, float]], cfg: allocator.AllocatorConfig, j: Job) -> float:
    """`allocator.reserved_excess(tensors, cfg)`, through the search's memo when `j` has one: keyed by the
    (bytes, count) pairs themselves (all floats here) and the config, its only inputs. A group's plans differ in
    micro-batch, which changes none of the long-lived tensors, so most estimates find their packing there."""
    if j.memo is None:
        return allocator.reserved_excess(tensors, cfg)
    key = (tuple(tensors), cfg)
    return j.memo.get("reserved_excess", key, lambda: allocator.reserved_excess(key[0], cfg))


def length_change_cache(j: Job, peak: Moment, metric: Metric, last: bool = True) -> float:
    """Reserved bytes that shorter steps' freed blocks keep cached when steps of the longest length come (model.yaml's
    `data.lengths: variable`; marp/allocator_steps.variable_length_excess replays a run of steps of the stated
    lengths, two layers' saved tensors and, on the last stage, the loss's): a fraction of the peak's saved
    activations plus, on the last stage, the loss's own. They show in the reserved reading and in nvidia-smi, but
    the allocator frees cached blocks and retries before it reports out of memory, so they decide no fit
    (MemoryEstimate.needed leaves them out)."""
    w = j.w
    if metric == "allocated" or not w.alloc.caching_allocator or w.median_seq_len is None:
        return 0.0
    if w.median_seq_len >= w.seq_len and w.length_mean is None:
        return 0.0
    # the replayer is imported only for variable lengths: it adds about 4 ms to every fsbatch --dry-run otherwise
    from frenzy_slurm.marp.allocator_steps import variable_length_excess

    plan = j.plan
    settings = "expandable_segments:True" if w.alloc.expandable_segments else ""
    fraction, loss = variable_length_excess(
        w, plan.tp, plan.sequence_parallel, plan.recompute, plan.micro_batch, plan.cp, j.amp, settings
    )
    return max(0.0, fraction * peak.activations + (loss if last else 0.0))
