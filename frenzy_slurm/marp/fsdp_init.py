"""FSDP1's reserved memory beyond the step's tensors: what `FullyShardedDataParallel.__init__` leaves cached when it
builds each unit's flat parameter on the GPU, and the unshard stream's pool of all-gather buffers (issue 29).

Wired into the reserved estimate of FSDP1 jobs (model.yaml's `parallel.fsdp_version: 1`, or the framework's
default; marp/memory_reserved.py `fsdp1_reserved`): `stage_units` lays a job's stage out as FSDP1 units, and
`docs/marp.md` ("FSDP1: the wrap-time cache and the unshard stream") says what the terms explain on the fsdp_qlora
rows.

**Wrap time** (torch/distributed/fsdp/_init_utils.py `_init_param_handle_from_module`, _flat_param.py, torch 2.x
FSDP1; read in the 2.13 source, the same sequence as the 2.2 of March 2024): FSDP wraps bottom-up, each unit in turn
on the default stream. For a unit whose parameters are on the host (a model loaded to CPU and wrapped with
`device_id`, as with `sync_module_states=True` from rank 0) it

1. moves each parameter to the GPU (`_move_module_to_device`, one tensor each);
2. with `sync_module_states`, broadcasts them from rank 0 in buckets (`_sync_module_params_and_buffers` ->
   `dist._broadcast_coalesced`, `PARAM_BROADCAST_BUCKET_SIZE` = 250 MiB; a bucket closes once it reaches the size,
   at most two in flight; a bucket of several tensors is flattened into a new one, a single tensor is sent as is);
3. concatenates them into the unsharded flat parameter (`FlatParamHandle.flatten_tensors`, `torch.cat`);
4. clones its rank's chunk (`_get_shard`, `chunk.clone()`), then frees the unsharded flat parameter
   (`shard`: `_typed_storage()._resize_(0)`) and, when the function returns, the moved parameters.

Every clone is carved out of the blocks the earlier units freed (best fit), so the shards end up scattered over
segments whose free rests are too small for the next unit's concatenation: reserved after wrapping is well above
the shards' bytes, and nothing returns it unless the program calls `torch.cuda.empty_cache()`.

What a broadcast sends is not free when it is freed: ProcessGroupNCCL records every collective's inputs on its NCCL
stream (`torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp`, the "[Sync Streams]" note and `collective`'s
`recordStream` unless TORCH_NCCL_AVOID_RECORD_STREAMS; torch 2.2's, the multi-device one, reads the same), so the
caching allocator holds a freed bucket (or a lone parameter sent as is) until an event on that stream completes.
`BroadcastWork::finish` only makes the current stream wait for the NCCL stream (`WorkNCCL::synchronizeStreams`),
so the CPU runs on to the unit's concatenation and clone while the broadcast is still under way: they cannot reuse
those blocks. The next unit's first parameter is then allocated before its copy, and that copy
(`param.to(device)`, not non-blocking: `aten/src/ATen/native/cuda/Copy.cu` `copy_kernel_cuda` ->
`memcpy_and_sync`, a `cudaStreamSynchronize`) waits for the current stream, hence for the broadcast: from the
second parameter on the blocks are reusable. Without `sync_module_states` nothing is sent and nothing waits.
`torch.cuda.reset_peak_memory_stats()` sets the reserved peak to the current reserved bytes, so a peak measured
from there never reads below this cache.

**The unshard stream** (_runtime_utils.py `_unshard`, _flat_param.py `_alloc_padded_unsharded_flat_param` and
`_free_unsharded_flat_param`, _limiter_utils.py): each unit's all-gather output is allocated under
`stream(unshard_stream)`, so its block belongs to that stream's pool, which the compute stream's requests never
reuse; it is freed after `record_stream` on the compute stream. With `limit_all_gathers=True` at most two freed
all-gather buffers wait for their free events before the next all-gather (`_max_num_inflight_all_gathers = 2`). In
backward with `BackwardPrefetch.BACKWARD_PRE` (the default) the unit being computed, the one prefetched and the one
just resharded are held at once; the root unit is not resharded after forward (`not state._is_root`), so its
buffer is held through the step.

**CPU offload of the parameters** (`CPUOffload(offload_params=True)`; _flat_param.py `pre_unshard`, `flat_param_to`,
`_all_gather_flat_param`, `_use_unsharded_flat_param`; _runtime_utils.py `_unshard`, `_reduce_grad`,
`_offload_grad`; read in the 2.13 source, and the same `flat_param_to` and `_unshard(..., pre_unshard_stream)` in
the 2.0-era `flat_param.py`): the shard lives in pinned host memory (`_local_shard.pin_memory()`). Each unshard
first copies it to the GPU under `stream(pre_unshard_stream)` (`flat_param_to(device, non_blocking=True)`: a new
tensor, so a block of a third stream's pool), all-gathers from that copy (`record_stream` on the unshard stream)
and drops it as soon as the flat parameter points at the gathered buffer: the copy is freed, pending until the
all-gather is done. The rate limiter waits only after the copy is allocated and only on the all-gather outputs'
free events, so the copy of the unit before (and, at the first block, the root's) may still be pending:
`pre_unshard_pool` replays two pending copies beside the new one. The reduce-scattered gradient shard stays on the
GPU (`_saved_grad_shard`, the post-backward stream's pool) until the backward's final callback
(`prepare_gradient_for_optim` deletes it), after a non-blocking copy into the pinned `_cpu_grad`; under LoRA it is
the adapters' shard, small, and is not a term here. What offloading does not move: bitsandbytes' quantization
states are attributes of `Params4bit`, neither parameters nor buffers, so they stay on the GPU, whole on every rank
(marp/memory_states.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from frenzy_slurm.marp.allocator import adapter_shapes, parameter_shapes
from frenzy_slurm.marp.allocator_replay import Event, alloc, allocation_size, free, replay
from frenzy_slurm.marp.allocator_settings import MiB, parse_settings, round_size
from frenzy_slurm.marp.memory_job import Job, nf4_bytes

BROADCAST_BUCKET = 250 * MiB  # torch/distributed/fsdp/_init_utils.py PARAM_BROADCAST_BUCKET_SIZE
BROADCASTS_IN_FLIGHT = 2  # torch/csrc/distributed/c10d/comm.cpp broadcast_coalesced: max_in_flight
NCCL_STREAM = 1  # the process group's NCCL stream, on which every collective's inputs are recorded
# all-gather buffers of the unshard stream held at once in backward: the unit computed, the one prefetched
# (BACKWARD_PRE) and the one just resharded whose free event the rate limiter has not waited for yet
UNSHARD_BUFFERS_HELD = 3
# host-shard copies of the pre-unshard stream (CPU offload) still pending when the next one is made: the unit
# before's, and the root's at the first block (the rate limiter waits after the copy, on all-gather outputs only)
PRE_UNSHARD_PENDING = 2


@dataclass(frozen=True)
class WrapCache:
    """Bytes after FSDP1 wrapped every unit: `allocated` (the shards and whatever was resident before), `reserved`
    (the segments the caching allocator holds), `cached` = reserved - allocated (free blocks of the default
    stream, which the step's compute-stream tensors may reuse and the unshard stream's cannot)."""

    allocated: int
    reserved: int

    @property
    def cached(self) -> int:
        return self.reserved - self.allocated


def _buckets(sizes: Sequence[int]) -> list[list[int]]:
    """`compute_bucket_assignment_by_size` with one limit: a bucket closes once it reaches the limit."""
    out: list[list[int]] = []
    cur: list[int] = []
    for s in sizes:
        cur.append(s)
        if sum(cur) >= BROADCAST_BUCKET:
            out.append(cur)
            cur = []
    return out + [cur] if cur else out


def _unit_requests(u: int, sizes: Sequence[int], world: int, sync: bool, offload: bool = False) -> list[Event]:
    """One unit's wrap from host-resident parameters of `sizes` bytes (one dtype): the events of steps 1-4; with
    `offload` (CPU offload of parameters) the shard moves to the host as soon as it is made (`_init_utils.py`
    `_init_param_handle_from_params`: `handle.flat_param_to(torch.device("cpu"))` after `handle.shard()`).

    With `sync`, what each broadcast sends (the bucket's flattened copy, or a lone parameter itself) is recorded on
    the NCCL stream, so once freed it waits for that stream (`NCCL_STREAM`, see `wrap_requests`) until the next
    unit's first host-to-device copy synchronizes."""
    events: list[Event] = []
    for i, s in enumerate(sizes):
        events.append(alloc(f"u{u}p{i}", s))
        if i == 0 and sync:  # the copy's memcpy_and_sync: the earlier units' broadcasts are done from here on
            events.append(Event("synchronize"))
    if sync:
        in_flight: list[str] = []
        first = 0  # the bucket's first parameter
        for b, bucket in enumerate(_buckets(sizes)):
            if len(in_flight) >= BROADCASTS_IN_FLIGHT:
                events.append(free(in_flight.pop(0)))
            if len(bucket) > 1:  # flatten_dense_tensors: a lone tensor is sent as a view
                events.append(alloc(f"u{u}b{b}", sum(bucket)))
                events.append(Event("record_stream", f"u{u}b{b}", stream=NCCL_STREAM))
                in_flight.append(f"u{u}b{b}")
            else:
                events.append(Event("record_stream", f"u{u}p{first}", stream=NCCL_STREAM))
            first += len(bucket)
        events += [free(k) for k in in_flight]
    total = sum(sizes)
    shard = -(-total // world)
    # (a chunk short of `shard` is padded by F.pad, a second tensor of the same size: at most world - 1 elements
    # short, which sizes in bytes cannot see and the allocator's 512-byte rounding hides)
    events += [alloc(f"u{u}flat", total), alloc(f"u{u}shard", shard), free(f"u{u}flat")]
    if offload:
        events.append(free(f"u{u}shard"))
    return events + [free(f"u{u}p{i}") for i in range(len(sizes))]


def wrap_requests(
    units: Sequence[Sequence[int]],
    world: int,
    sync_module_states: bool = True,
    resident: Sequence[int] = (),
    offload: bool = False,
) -> list[Event]:
    """The default stream's requests of wrapping `units` (in wrap order: the nested units first, the root last;
    each the byte sizes of its parameters as moved, in module order) on a rank of `world`, after `resident`
    tensors already on the GPU (e.g. bitsandbytes' quantization states, which are not FSDP parameters). A unit
    built on the meta device is materialised on the GPU tensor by tensor (`_materialize_meta_module`), the same
    requests as a move without the broadcast."""
    events = [alloc(f"r{i}", s) for i, s in enumerate(resident)]
    for u, sizes in enumerate(units):
        events += _unit_requests(u, sizes, world, sync_module_states, offload)
    return events


@lru_cache(maxsize=256)
def _cached_wrap(
    units: tuple[tuple[int, ...], ...], world: int, sync: bool, resident: tuple[int, ...], offload: bool
) -> WrapCache:
    stats = replay(wrap_requests(units, world, sync, resident, offload)).stats
    return WrapCache(stats["allocated_bytes.all.current"], stats["reserved_bytes.all.current"])


def wrap_cache(
    units: Sequence[Sequence[int]],
    world: int,
    sync_module_states: bool = True,
    resident: Sequence[int] = (),
    offload: bool = False,
) -> WrapCache:
    """What the caching allocator holds after FSDP1 wrapped `units` from the host (see `wrap_requests`); memoised,
    since every plan of a search with the same sharding wraps the same units."""
    key = tuple(tuple(u) for u in units)
    return _cached_wrap(key, world, sync_module_states, tuple(resident), offload)


def unshard_pool(root_bytes: int, unit_bytes: Sequence[int]) -> int:
    """Reserved bytes of the unshard stream's pool over a step: the root's all-gather buffer (held through the
    step) and `UNSHARD_BUFFERS_HELD` buffers of the largest nested unit, each a segment of its own rounded as the
    allocator rounds it. `root_bytes` and `unit_bytes` are unsharded (all-gathered) flat-parameter sizes."""
    settings = parse_settings("")

    def segment(n: int) -> int:
        return allocation_size(round_size(n, settings)) if n else 0

    largest = max(unit_bytes, default=0)
    return segment(root_bytes) + UNSHARD_BUFFERS_HELD * segment(largest)


def pre_unshard_requests(
    root_shard: int, unit_shards: Sequence[int], pending: int = PRE_UNSHARD_PENDING
) -> list[Event]:
    """The pre-unshard stream's requests over a step under CPU offload: each unit's host shard copied to the GPU
    (`root_shard`, then `unit_shards` in forward order, then again in backward order: the root is not resharded
    after forward), each copy freed once `pending` later copies have been made (until then its all-gather may still
    be reading it)."""
    order = [("root", root_shard)] + [(f"f{k}", s) for k, s in enumerate(unit_shards)]
    order += [(f"b{k}", s) for k, s in reversed(list(enumerate(unit_shards)))]
    events: list[Event] = []
    for n, (key, size) in enumerate(order):
        events.append(alloc(key, size))
        if n >= pending:
            events.append(free(order[n - pending][0]))
    return events


@lru_cache(maxsize=256)
def pre_unshard_pool(root_shard: int, unit_shards: tuple[int, ...]) -> int:
    """Reserved bytes of the pre-unshard stream's pool under CPU offload (`pre_unshard_requests` replayed)."""
    if not root_shard and not unit_shards:
        return 0
    return replay(pre_unshard_requests(root_shard, unit_shards)).stats["reserved_bytes.all.peak"]


@dataclass(frozen=True)
class StageUnits:
    """A stage laid out as FSDP1 units: `units` in wrap order (each block, then the root), each its parameters' byte
    sizes as stored; `resident` what is on the GPU before wrapping (QLoRA's quantization states); `root_gathered`
    and `unit_gathered` the all-gather sizes of the root and of one block."""

    units: tuple[tuple[int, ...], ...]
    resident: tuple[int, ...]
    root_gathered: int
    unit_gathered: int


def stage_units(j: Job, n_layers: int) -> StageUnits:
    """The units FSDP1's transformer wrap policy makes of one stage (accelerate's TRANSFORMER_BASED_WRAP, Lightning's
    and litgpt's `auto_wrap_policy={Block}`): every block with its LoRA adapters (`use_orig_params=True` lets one
    flat parameter hold frozen and trained tensors), and the root with the embedding, final norm and untied head.
    Parameters are stored in their dtype (QLoRA's NF4 linears as 4-bit storage, their quantization states outside
    FSDP, resident) and gathered in 16 bits (fp32 under fp32 training)."""
    w, a, plan = j.w, j.w.arch, j.plan
    tp, vtp, s = plan.tp, j.vtp, j.scale
    lora, qlora = w.method != "full", w.method == "qlora"
    base = (4.0 if w.precision == "fp32" else 2.0) if lora else j.wb
    gathered = 4.0 if w.precision == "fp32" else 2.0
    block = [(n * s, c) for n, c in parameter_shapes(a, 1, False, False, tp, vtp)]
    nf4 = nf4_bytes(w)
    stored: list[int] = []
    resident: list[int] = []
    gathered_bytes = 0.0
    for n, c in block:
        matrix = qlora and n > a.hidden + a.ffn  # a weight matrix, quantised (norms and biases are not)
        for _ in range(int(c)):
            stored.append(int(n * (0.5 if matrix else base)))
            gathered_bytes += n * (0.5 if matrix else gathered)
            if matrix:
                resident.append(int(n * (nf4 - 0.5)))
    if lora:
        for n, c in adapter_shapes(a, 1, w.adapters.lora_rank, w.adapters.lora_targets, tp):
            stored += [int(n * j.wb)] * int(c)
            gathered_bytes += n * c * gathered
    root = [(n * s, c) for n, c in parameter_shapes(a, 0, True, True, tp, vtp)]
    root_stored = [int(n * base) for n, c in root for _ in range(int(c))]
    return StageUnits(
        units=(tuple(stored),) * n_layers + (tuple(root_stored),),
        resident=tuple(resident * n_layers),
        root_gathered=int(sum(n * c for n, c in root) * gathered),
        unit_gathered=int(gathered_bytes),
    )
