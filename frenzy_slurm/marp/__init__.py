"""Stage 2, MARP: per-GPU peak training memory for parallel plans, and GPU-type candidates.

from frenzy_slurm.marp import workload_from_spec, estimate_memory, ParallelPlan
est = estimate_memory(workload_from_spec(spec, model), ParallelPlan(dp=4, zero=1, micro_batch=2))
"""

from __future__ import annotations

import math
from typing import Literal

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.core.gpus import GpuSpec
from frenzy_slurm.core.units import GiB
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import Optimizer
from frenzy_slurm.marp.allocator import AllocatorConfig, parse_alloc_conf
from frenzy_slurm.marp.candidates import Candidate, GpuOption, SearchSpace, plan_groups, search
from frenzy_slurm.marp.framework_facts import (
    hf_loss_upcasts,
    litgpt_longest_first,
    litgpt_stable_embedding,
    unsloth_fused_chunk_bytes,
    unsloth_loss_kernel,
    unsloth_offloads_checkpoints,
)
from frenzy_slurm.marp.frameworks import (
    DEEPSPEED_SHARDING,
    Capabilities,
    FrameworkProfile,
    ModelCode,
    default_compile_loss,
    default_fused_optimizer,
    empties_cache_after_setup,
    fsdp_offloads_parameters,
    fsdp_version,
    fused_projections,
    gelu_tanh_eager,
    profile_of,
    runs_fsdp,
    version_tuple,
)
from frenzy_slurm.marp.llmc import layout_from_spec
from frenzy_slurm.marp.memory import MemoryEstimate, StageMemory, estimate_memory
from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Recompute, parse_plan
from frenzy_slurm.marp.workload import (
    ActivationPolicy,
    Adapters,
    AllocatorPolicy,
    Communication,
    LossPolicy,
    ModelStates,
    Workload,
)

__all__ = [
    "Candidate",
    "GpuOption",
    "MemoryEstimate",
    "Overheads",
    "ParallelPlan",
    "SearchSpace",
    "StageMemory",
    "Workload",
    "eager_module_loading",
    "estimate_memory",
    "job_overheads",
    "parse_plan",
    "pinned_plan",
    "predict_pinned",
    "search",
    "search_space_from_spec",
    "state_layout",
    "with_exact_params",
    "workload_from_spec",
]


def with_exact_params(spec: JobSpec, model: ResolvedModel, trusted: tuple[str, ...] = ()) -> ResolvedModel:
    """A factory model with its exact parameter count, traced on the meta device (imports torch);
    any other model source is returned unchanged. The spec stage never imports the tracer. `trusted` is the
    site file's `trusted_factories` (factories allowed beside the user's own files)."""
    if spec.model.factory is None or model.exact_params is not None:
        return model
    # imports torch: only to trace a factory (--trace-factory)
    from frenzy_slurm.marp.trace import count_factory_parameters

    exact = count_factory_parameters(spec.model.factory, spec.model.factory_kwargs, trusted)
    return ResolvedModel(arch=model.arch, name=model.name, exact_params=exact)


def workload_from_spec(spec: JobSpec, model: ResolvedModel, device: str = "cuda") -> Workload:
    """The MARP view of the job as its framework runs it (marp/frameworks.py: the profile of
    `entry.framework`, its defaults where model.yaml says nothing). `device`: cuda, or cpu for CPU runs
    (the local cluster), where torch's optimizers step per tensor and frenzy's RMSNorm is a composite of
    ops that keeps its normalised output. The only constructor of a Workload from a job."""
    t = spec.training
    prof = profile_of(spec)
    arch = model.arch
    _check_encoder_decoder(spec, arch)
    if prof.unties_embeddings and arch.tied_embeddings and arch.head == "lm":
        arch = arch.model_copy(update={"tied_embeddings": False})
    fsdp1 = fsdp_version(spec) == 1
    return Workload(
        arch=arch,
        # padded to the longest of each micro-batch: the longest sample sets the peak (data.lengths: variable)
        seq_len=spec.longest_tokens,
        median_seq_len=spec.median_tokens,
        length_mean=spec.data.mean,
        length_sd=spec.data.sd,
        target_len=t.target_len,
        precision=t.precision,
        framework=state_layout(spec),
        method=t.method,
        exact_params=model.exact_params,
        states=_model_states(spec, prof, device),
        adapters=_adapters(spec, prof),
        activations=_activation_policy(spec, prof, arch, device),
        loss=_loss_policy(spec, prof, arch),
        comm=Communication(
            buckets=spec.deepspeed,
            reshard_after_forward=spec.parallel.reshard_after_forward is not False,
            # accelerate's tail unit is its FSDP2 wrapping; under FSDP1 the root holds the output layer
            fsdp_tail_unit=prof.fsdp_tail_unit and fsdp1 is False,
            vocab_parallel=prof.code(spec).vocab_parallel,
            # torchtitan's "default" reshard policy (model.yaml's parallel.reshard_after_forward unset)
            fsdp_pp_unsharded=prof.fsdp_pp_unsharded and spec.parallel.reshard_after_forward is None,
            fsdp1=fsdp1,
            fsdp1_cache_emptied=empties_cache_after_setup(spec),
            fsdp1_sync=prof.fsdp1_sync_module_states,
        ),
        alloc=AllocatorPolicy(
            expandable_segments=_alloc_conf(spec).expandable_segments, caching_allocator=device != "cpu"
        ),
        llmc=layout_from_spec(spec, arch) if prof.family == "llm.c" else None,
    )


def _check_encoder_decoder(spec: JobSpec, arch: Architecture) -> None:
    """An encoder-decoder model needs its decoder's length and runs as one pipeline stage without context
    parallelism; the settings MARP does not model for it are refused by name (InputError), as is a target length
    given for a model without an encoder."""
    t, par = spec.training, spec.parallel
    if not arch.encoder_decoder:
        if t.target_len is not None:
            raise InputError(
                f"training.target_len: {t.target_len}: the model has no encoder (arch.encoder_layers: 0), so its "
                "length is training.seq_len alone; remove target_len"
            )
        return
    refused = [
        (
            t.target_len is None,
            "training.target_len is not given: the decoder's (target) length sets its "
            "activations, logits and loss; give it (the max_target_length the data is padded or truncated to)",
        ),
        (
            isinstance(par.pp, int) and par.pp > 1,
            f"parallel.pp: {par.pp}: pipeline stages of an encoder-decoder model are not modelled; set pp: 1",
        ),
        (
            par.cp > 1,
            f"parallel.cp: {par.cp}: context parallelism of an encoder-decoder model is not modelled; set cp: 1",
        ),
        (
            t.activation_checkpointing == "op",
            "training.activation_checkpointing: op (torchtitan's per-op policy) is "
            "not modelled for an encoder-decoder model; use full, selective or none",
        ),
        (t.activation_offload, "training.activation_offload is not modelled for an encoder-decoder model"),
        (
            spec.entry.trainer == "builtin",
            "entry.trainer: builtin trains decoder-only models; an encoder-decoder model needs entry.trainer: script",
        ),
    ]
    problems = [why for bad, why in refused if bad]
    if problems:
        raise InputError(
            f"{spec.name}: encoder-decoder model (arch.encoder_layers {arch.encoder_layers}): " + "; ".join(problems)
        )


def _quantizer(spec: JobSpec, prof: FrameworkProfile) -> str | None:
    """QLoRA's NF4 implementation: model.yaml's `lora.quantizer`, else the framework's."""
    return spec.training.lora.quantizer or prof.nf4_quantizer


def _model_states(spec: JobSpec, prof: FrameworkProfile, device: str) -> ModelStates:
    """The optimizer as the framework runs it, and when the loop frees and zeroes gradients."""
    t = spec.training
    bnb_qlora = t.method == "qlora" and _quantizer(spec, prof) == "bitsandbytes"
    # (bitsandbytes' paged optimizers page CUDA managed memory; on the CPU their states are ordinary tensors)
    bnb_paged = bnb_qlora and prof.qlora_paged_optimizer and t.optimizer == "adamw"
    paged = (t.optimizer.startswith("paged-") or bnb_paged) and device != "cpu"
    optimizer: Optimizer = (
        "adam-8bit"
        if t.optimizer == "paged-adamw-8bit"
        else "adamw"
        if t.optimizer.startswith("paged-")
        else t.optimizer  # type: ignore[assignment]
    )
    if t.optimizer_impl is not None:
        fused = t.optimizer_impl == "fused"
    else:
        fused = default_fused_optimizer(spec, device)  # the framework's default at these versions
    torch_version = version_tuple(spec.entry.torch_version)
    return ModelStates(
        optimizer=optimizer,
        fused_optimizer=fused,
        optimizer_in_backward=t.optimizer_in_backward,
        paged_optimizer=paged,
        zero_grad_to_none=torch_version is None or torch_version >= (2, 0),
        zero_grad_after_forward=prof.zero_grad_after_forward,
    )


def _lora_dropout(spec: JobSpec, prof: FrameworkProfile) -> bool:
    """Whether LoRA's adapters drop their input: model.yaml's training.lora.dropout, else the framework's."""
    lora = spec.training.lora
    return (lora.dropout if lora.dropout is not None else prof.lora_dropout) > 0


def _adapters(spec: JobSpec, prof: FrameworkProfile) -> Adapters:
    """LoRA's adapters and QLoRA's NF4 base as model.yaml and the framework give them."""
    lora = spec.training.lora
    quantizer = _quantizer(spec, prof)
    bnb_version = version_tuple(lora.quantizer_version)
    peft_version = version_tuple(lora.peft_version)
    dropout = _lora_dropout(spec, prof)
    # (Unsloth patches its kernels in only where the adapters have no dropout: models/llama.py patch_peft_model)
    in_input_dtype = prof.code(spec).lora_in_input_dtype and not dropout
    return Adapters(
        lora_rank=lora.rank,
        lora_targets=tuple(lora.targets),
        lora_dropout=dropout,
        nf4_double_quant=lora.double_quant if lora.double_quant is not None else True,
        nf4_torchao=quantizer == "torchao",
        # bitsandbytes' MatMul4Bit kept its input on ctx up to 0.43.1 (ctx.tensors = (A, B)); 0.43.2 on keep (None, B)
        nf4_saves_inputs=quantizer == "bitsandbytes" and (bnb_version is None or bnb_version < (0, 43, 2)),
        qlora_quantized_head=lora.quantize_head if lora.quantize_head is not None else prof.qlora_quantized_head,
        bnb_stable_embedding=prof.qlora_stable_embedding
        and quantizer == "bitsandbytes"
        and (not prof.loop_by_version or litgpt_stable_embedding(version_tuple(spec.entry.framework_version))),
        lora_qkv_scatter=prof.code(spec).lora_qkv_scatter,
        lora_input_cast=prof.lora_by_peft and not in_input_dtype,
        lora_in_input_dtype=in_input_dtype,
        # peft 0.12 (PR #1706) added get_peft_model(autocast_adapter_dtype=True), which upcasts bf16/fp16 adapter
        # weights to fp32 (tuners_utils.py cast_adapter_dtype); 0.11 built them in the base weight's dtype
        # (lora/layer.py update_layer: self.to(weight.device, dtype=weight.dtype)). DeepSpeed's engine casts the whole
        # module, adapters too, back to its 16-bit dtype (engine.py _configure_distributed_model: module.bfloat16())
        lora_fp32=prof.lora_by_peft
        and state_layout(spec) != "deepspeed"
        and (peft_version is None or peft_version >= (0, 12)),
    )


def _activation_policy(spec: JobSpec, prof: FrameworkProfile, arch: Architecture, device: str) -> ActivationPolicy:
    """What the framework's model code saves for backward (its `ModelCode`), on this device."""
    t = spec.training
    code = prof.code(spec)
    framework_version = version_tuple(spec.entry.framework_version)
    return ActivationPolicy(
        attention=t.attention,
        compile=t.compile,
        activation_offload=t.activation_offload,
        checkpoint_inputs_on_host=prof.checkpoint_inputs_on_host and unsloth_offloads_checkpoints(framework_version),
        norm_upcast=code.norm_upcast
        and arch.norm == "rmsnorm"
        and (device == "cpu" or not code.norm_upcast_on_cpu_only),
        # (the CPU's composite rms_norm multiplies the weight in fp32 before casting back: its normalised value is fp32)
        norm_fp32_normalized=code.norm_fp32_normalized or (code.norm_upcast_on_cpu_only and device == "cpu"),
        gqa_expand=code.gqa_expand
        and arch.kv < arch.heads
        and (t.attention == "eager" or not _sdpa_runs_gqa(code, _model_code_release(spec, prof))),
        unfused_rope=code.unfused_rope,
        rope_tables_per_layer=code.rope_tables_per_layer,
        softmax_fp32=code.softmax_fp32_eager and t.attention == "eager",
        fp8=t.fp8,
        tp_saves_gathered_inputs=prof.tp_saves_gathered_inputs,
        gelu_tanh_eager=gelu_tanh_eager(code, arch),
        dropout_mask_full_width=device == "cpu",
        fused_projections=fused_projections(code, arch),
        # (its kernel is patched in only where the adapters have no dropout: models/llama.py patch_peft_model)
        lora_mlp_saves_gate_up=code.lora_mlp_saves_gate_up and t.method != "full" and not _lora_dropout(spec, prof),
    )


def _loss_chunks(spec: JobSpec, prof: FrameworkProfile) -> int:
    """How many pieces the loss computes the logits in: model.yaml's, or the framework's."""
    t = spec.training
    if t.loss_chunks is not None:
        return t.loss_chunks
    if prof.loss_chunk_tokens:
        # litgpt: finetune/full.py chunks the flattened logits (micro_batch x seq tokens) into 128-token pieces;
        # lora.py has the model return 128-position chunks (lm_head_chunk_size=128) along the sequence
        tokens = spec.longest_tokens * (t.micro_batch if t.method == "full" and isinstance(t.micro_batch, int) else 1)
        return max(1, -(-tokens // prof.loss_chunk_tokens))
    return prof.loss_chunks


def _model_code_release(spec: JobSpec, prof: FrameworkProfile) -> tuple[int, ...] | None:
    """The release a ModelCode's version rules read: entry.framework_version, except under a framework whose
    releases are not its model code's (Unsloth patches transformers' classes: entry.transformers_version)."""
    if prof.unsloth_loss:
        return transformers_release(spec)
    return version_tuple(spec.entry.framework_version)


def transformers_release(spec: JobSpec) -> tuple[int, ...] | None:
    """The transformers release whose model code the job runs: entry.transformers_version, or under hf-trainer
    (the Trainer is transformers) entry.framework_version; None: a current one."""
    e = spec.entry
    if e.transformers_version is not None:
        return version_tuple(e.transformers_version)
    return version_tuple(e.framework_version) if profile_of(spec).name == "hf-trainer" else None


def _default_loss_upcast(spec: JobSpec, prof: FrameworkProfile, arch: Architecture) -> bool:
    """Whether a 16-bit module's loss runs on an fp32 copy of the logits by default: the framework's loop, or,
    where the loss is the Hugging Face model's own (model code hf, a profile that leaves the loss to the model),
    what that transformers release's class does (framework_facts.hf_loss_upcasts)."""
    if prof.output_fp32:
        return True
    if prof.loss_fp32_in_pure_bf16 and prof.code(spec).name == "hf" and arch.head == "lm":
        layer_norm_lm = arch.norm == "layernorm" and not arch.encoder_decoder
        return hf_loss_upcasts(layer_norm_lm, transformers_release(spec))
    return prof.loss_fp32_in_pure_bf16


def _loss_policy(spec: JobSpec, prof: FrameworkProfile, arch: Architecture) -> LossPolicy:
    """The logits and the loss as the framework's loop holds them."""
    t = spec.training
    chunks = _loss_chunks(spec, prof)
    unsloth = _unsloth_loss(spec, prof, arch, chunks)
    return LossPolicy(
        loss_chunks=chunks,
        fused_linear_loss=t.fused_linear_loss or unsloth in ("fused", "cce"),
        fused_chunk_fp32_bytes=None if t.fused_linear_loss else _unsloth_chunk_bytes(spec, unsloth),
        ce_in_place=unsloth == "in-place" and not t.fused_linear_loss,
        compile_loss=t.compile_loss if t.compile_loss is not None else (default_compile_loss(spec) or chunks > 1),
        hold_logits=spec.entry.holds_logits if spec.entry.holds_logits is not None else prof.holds_logits,
        keeps_previous_output=prof.keeps_previous_output and not _longest_first(spec, prof),
        loss_detaches_hidden=prof.loss_detaches_hidden and chunks > 1,
        dtensor_loss_parallel=prof.dtensor_loss_parallel,
        output_fp32=prof.output_fp32 and t.precision != "fp32",
        loss_fp32=not sixteen_bit_module(spec)
        or (spec.entry.loss_upcast if spec.entry.loss_upcast is not None else _default_loss_upcast(spec, prof, arch)),
    )


def _unsloth_loss(spec: JobSpec, prof: FrameworkProfile, arch: Architecture, chunks: int) -> str | None:
    """Which of Unsloth's losses a causal LM runs under a profile whose loss is Unsloth's, at the releases model.yaml
    names and the step's tokens (framework_facts.unsloth_loss_kernel): "fused" (UnslothFusedLoss), "in-place"
    (Fast_CrossEntropyLoss) or "cce" (Cut Cross-Entropy); None: not Unsloth's, or model.yaml asks for a chunked loss
    of its own."""
    if not prof.unsloth_loss or arch.head != "lm" or arch.encoder_decoder or chunks > 1:
        return None
    mb = spec.training.micro_batch
    tokens = spec.longest_tokens * (mb if isinstance(mb, int) else 1)
    e = spec.entry
    return unsloth_loss_kernel(version_tuple(e.framework_version), version_tuple(e.torch_version), tokens)


def _unsloth_chunk_bytes(spec: JobSpec, kernel: str | None) -> float | None:
    """LossPolicy.fused_chunk_fp32_bytes of Unsloth's fused losses: its chunk cap at the release named (no cap: one
    chunk), none for Cut Cross-Entropy (its logits stay in on-chip memory); None for any other loss."""
    if kernel == "cce":
        return 0.0
    if kernel == "fused":
        return unsloth_fused_chunk_bytes(version_tuple(spec.entry.framework_version)) or math.inf
    return None


def _longest_first(spec: JobSpec, prof: FrameworkProfile) -> bool:
    """Whether the step with the longest sample, which sets the peak, is the run's first (lit-gpt's 2023 loops:
    marp/framework_facts.py), so nothing of a previous step is alive at the end of its forward."""
    return (
        prof.loop_by_version
        and spec.data.lengths == "variable"
        and litgpt_longest_first(version_tuple(spec.entry.framework_version))
    )


def sixteen_bit_module(spec: JobSpec) -> bool:
    """Whether the model runs in 16 bits without autocast, so the loss sees the logits as the model code returns
    them (fp32 only where it upcasts: entry.loss_upcast): pure bf16, or DeepSpeed's engine in fp16 or bf16, which
    casts the module itself (deepspeed/runtime/engine.py `_configure_distributed_model`: `module.half()` /
    `module.bfloat16()`, DeepSpeed 0.14-0.19) and runs no autocast unless its config's `torch_autocast` section
    asks. Under autocast (bf16-mixed/fp16-mixed elsewhere) cross-entropy runs in fp32 whatever the model does."""
    precision = spec.training.precision
    return precision == "bf16-pure" or (precision in ("fp16-mixed", "bf16-mixed") and state_layout(spec) == "deepspeed")


def state_layout(spec: JobSpec) -> Literal["deepspeed", "torch", "megatron", "llm.c"]:
    """How the job lays out model states and buffers: its framework's family, except that under hf-trainer
    (whose backend is DeepSpeed or FSDP) parallel.sharding zero1/zero2/zero3 names DeepSpeed's engine (fp32 master
    copy in the optimizer, flat buffers, the `deepspeed:` block's buckets) and full-shard/shard-grad-op/
    hybrid-shard/none/auto name FSDP or DDP."""
    prof = profile_of(spec)
    if prof.name == "hf-trainer" and spec.parallel.sharding in DEEPSPEED_SHARDING:
        return "deepspeed"
    return prof.family


def _alloc_conf(spec: JobSpec) -> AllocatorConfig:
    """The caching allocator's settings the job's environment gives (entry.env PYTORCH_CUDA_ALLOC_CONF, or the
    device-generic PYTORCH_ALLOC_CONF of newer torch); InputError naming the variable when it does not parse."""
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        text = spec.entry.env.get(name)
        if text is not None:
            try:
                return parse_alloc_conf(text)
            except ValueError as exc:
                raise InputError(
                    f"entry.env.{name} {text!r}: {exc}; write it as PyTorch reads it, e.g. expandable_segments:True"
                ) from None
    return AllocatorConfig()


def _sdpa_runs_gqa(code: ModelCode, version: tuple[int, ...] | None) -> bool:
    """Whether SDPA attends over the K/V heads as they are (enable_gqa) in this model code and framework release;
    the default release is the newest the profile describes."""
    if code.sdpa_gqa_from is None:
        return False
    return version is None or version >= code.sdpa_gqa_from


def _degrees(value: int | str, support: str, auto: tuple[int, ...], what: str, framework: str) -> tuple[int, ...]:
    if value == "auto":
        return auto if support == "auto" else (1,)
    assert isinstance(value, int)
    if value > 1 and support == "no":
        raise InputError(
            f"parallel.{what}: {value}: framework {framework} cannot run {what} > 1; set {what}: 1 or auto, or name "
            "the framework that runs it (entry.framework; `frenzy-slurm frameworks` lists what each can run)"
        )
    return (value,)


def _heterogeneous(spec: JobSpec, default: bool, can: Capabilities, framework: str) -> bool:
    """Whether HAS may lay pipeline stages over several GPU types: the framework's default, or model.yaml's
    parallel.heterogeneous where the framework runs pipelines over processes at all (naive model parallelism's
    stages are GPUs of one process, on one node)."""
    asked = spec.parallel.heterogeneous
    if asked and can.pp == "no":
        raise InputError(
            f"parallel.heterogeneous: {framework} runs no pipeline stages, so it cannot spread them over GPU types; "
            "set it false"
        )
    if asked and (spec.parallel.schedule == "sequential" or can.schedules == ("sequential",)):
        raise InputError(
            f"parallel.heterogeneous: {framework} runs its stages sequentially in one process (device_map over one "
            "node's GPUs), so it cannot spread them over GPU types in a heterogeneous job; set it false"
        )
    return (default if asked is None else asked) and spec.parallel.pp != 1


def _check_schedule(spec: JobSpec, can: Capabilities, framework: str) -> None:
    """Refuses pipeline stages under a schedule the framework does not run (exit 2), naming the ones it does."""
    par, schedules = spec.parallel, can.schedules
    staged = par.pp > 1 if isinstance(par.pp, int) else can.pp == "auto"
    if par.schedule in schedules or not staged:
        return
    if schedules == ("sequential",):
        raise InputError(
            f"parallel.schedule: {par.schedule}: {framework} runs pipeline stages only as naive model parallelism "
            "(the model loaded with device_map over the GPUs, one active at a time); set parallel.schedule: "
            "sequential, or pp: 1"
        )
    raise InputError(
        f"parallel.schedule: {par.schedule} is not a schedule {framework} runs ({', '.join(schedules)}); "
        "choose one of them, or name the framework that runs it (entry.framework)"
    )


def _recompute_choices(spec: JobSpec, can: Capabilities, fw: str) -> tuple[Recompute, ...]:
    """The checkpointing the search may try: the one model.yaml pins, or under auto what the framework runs;
    InputError for a pinned one the framework does not do."""
    t = spec.training
    recompute: tuple[Recompute, ...]
    if t.activation_checkpointing == "auto" and not can.block_recompute:
        recompute = ("none",)
    elif t.activation_checkpointing == "auto":
        recompute = ("none", "selective", "full") if can.selective_recompute else ("none", "full")
        if can.op_recompute == "auto":
            recompute += ("op",)
    else:
        if t.activation_checkpointing == "op" and can.op_recompute == "no":
            raise InputError(
                f"training.activation_checkpointing: op (torchtitan's per-op selective checkpointing) is not something "
                f"{fw} does; use full (with checkpoint_every for every k-th block) or none"
            )
        if t.activation_checkpointing == "full" and not can.block_recompute:
            raise InputError(
                f"training.activation_checkpointing: full: {fw} checkpoints no blocks (llm.c's -r recomputes the GELU "
                "or the layer norms: entry.llmc.recompute); set none or auto"
            )
        if t.activation_checkpointing == "selective" and not can.selective_recompute:
            raise InputError(
                f"training.activation_checkpointing: selective (Megatron-style attention-core recomputation) is not "
                f"something {fw} does; use full (with checkpoint_every for every k-th block) or none"
            )
        recompute = (t.activation_checkpointing,)
    return recompute


def _check_transformers_version(spec: JobSpec, prof: FrameworkProfile) -> None:
    """entry.transformers_version names the release of the Hugging Face model code a job runs under another
    framework; refused where it would be read by nothing, naming what to write instead."""
    given = spec.entry.transformers_version
    if given is None:
        return
    if prof.name == "hf-trainer":
        raise InputError(
            f"entry.transformers_version: {given}: under hf-trainer the framework is transformers; write "
            f"entry.framework_version: '{given}' instead"
        )
    if prof.code(spec).name not in ("hf", "unsloth"):  # (Unsloth runs transformers' classes and its Trainer)
        raise InputError(
            f"entry.transformers_version: {given}: the job runs {prof.code(spec).name} model code, not transformers' "
            "(entry.model_code); remove it, or set entry.model_code: hf"
        )


def _virtual_stages(spec: JobSpec, prof: FrameworkProfile) -> int:
    """Model chunks per pipeline rank: model.yaml's `virtual_stages`, else the framework's own under interleaved."""
    par = spec.parallel
    if par.schedule != "interleaved" or "virtual_stages" in par.model_fields_set:
        return par.virtual_stages
    return prof.interleaved_virtual_stages


def search_space_from_spec(spec: JobSpec) -> SearchSpace:
    """The plans the job's framework can run, within what model.yaml pins (`parallel:`, micro-batch,
    checkpointing); refuses a pinned setting the framework cannot run (exit 2)."""
    t = spec.training
    par = spec.parallel
    prof = profile_of(spec)
    can = prof.can
    fw = prof.name
    recompute = _recompute_choices(spec, can, fw)
    zero = par.zero_stages
    if zero is not None and any(z not in can.zero_stages for z in zero):
        raise InputError(
            f"parallel.sharding: {par.sharding} is not one {fw} runs (its ZeRO/FSDP stages: "
            f"{', '.join(map(str, can.zero_stages))}); choose another or auto"
        )
    if (par.offload_optimizer or par.offload_params) and not can.offload:
        raise InputError(f"parallel.offload_*: {fw} does not offload to host memory; set them false")
    if spec.entry.loss_upcast is not None and not sixteen_bit_module(spec):
        raise InputError(
            f"entry.loss_upcast: {str(spec.entry.loss_upcast).lower()}: with training.precision "
            f"{spec.training.precision} under {fw} the loss runs under autocast, in fp32 whatever the model does; "
            "remove it (it matters for bf16-pure, and for DeepSpeed's fp16/bf16 engine)"
        )
    _check_transformers_version(spec, prof)
    if fsdp_offloads_parameters(spec) and par.sharding == "shard-grad-op":
        raise InputError(
            "parallel.offload_optimizer with sharding: shard-grad-op: FSDP's CPU offload moves the parameters too, "
            "which MARP plans with full sharding; set sharding: full-shard (or auto)"
        )
    if par.fsdp_version is not None and runs_fsdp(spec) and par.fsdp_version not in prof.fsdp_versions:
        api = {1: "FullyShardedDataParallel (FSDP1)", 2: "fully_shard (FSDP2)"}
        raise InputError(
            f"parallel.fsdp_version: {par.fsdp_version}: {fw} ({prof.describes}) shards only with "
            + " or ".join(api[v] for v in prof.fsdp_versions)
            + f"; set fsdp_version: {prof.fsdp_versions[0]} or remove it"
        )
    if par.cp > 1 and can.cp == "no":
        raise InputError(f"parallel.cp: {par.cp}: {fw} has no context parallelism; set cp: 1")
    if par.cp > 1 and can.fsdp_over_cp and zero == (0,):
        # torchtitan 0.3.0 parallel_dims.py: fsdp_enabled = dp_shard_enabled or cp_enabled, and
        # llama3/parallelize.py applies fully_shard over the dp_shard_cp mesh whenever it is
        raise InputError(
            f"parallel.sharding: none with cp: {par.cp}: {fw} applies FSDP over the context-parallel ranks whenever "
            "cp > 1, so its states are sharded even at one data-parallel rank; set sharding: full-shard (or auto)"
        )
    _check_schedule(spec, can, fw)
    pinned: dict[str, object] = {
        "cp": par.cp,
        "offload_optimizer": par.offload_optimizer,
        "offload_params": par.offload_params or fsdp_offloads_parameters(spec),
        "schedule": par.schedule,
        "virtual_stages": _virtual_stages(spec, prof),
        "layer_balance": prof.layer_balance,
    }
    if par.shard_group is not None:
        pinned["shard_group"] = par.shard_group
    if par.sequence_parallel is not None:
        pinned["sequence_parallel"] = par.sequence_parallel
    return SearchSpace(
        micro_batch=t.micro_batch if isinstance(t.micro_batch, int) else None,
        recompute=recompute,
        recompute_every=t.checkpoint_every,
        zero_stages=zero or can.zero_stages,
        tp_degrees=_degrees(par.tp, can.tp, (1, 2, 4, 8), "tp", fw),
        pp_degrees=_degrees(par.pp, can.pp, (1, 2, 4, 8, 16), "pp", fw),
        # naive model parallelism puts one model over several GPUs of a process: FSDP and ZeRO shard none of it
        max_zero_with_pp=0 if par.schedule == "sequential" else can.max_zero_with_pp,
        heterogeneous=_heterogeneous(spec, can.heterogeneous, can, fw),
        # hybrid-shard without a shard_group: FSDP's HYBRID_SHARD shards within a node, whatever its GPU count
        shard_per_node=par.sharding == "hybrid-shard" and par.shard_group is None,
        shards_over_cp=can.fsdp_over_cp,
        pinned=pinned,
    )


def pinned_plan(spec: JobSpec, w: Workload, world: int) -> ParallelPlan:
    """The one plan a model.yaml that pins every degree gives at `world` GPUs (the candidate search's own
    enumeration, so what is predicted for it is what fsbatch predicts); InputError when it gives none or
    several (say which `parallel:` or `training:` setting to pin)."""
    t = spec.training
    space = search_space_from_spec(spec)
    plans = [
        g.plan(mb) for g in plan_groups(w, world, t.global_batch, space, gpus_per_node=world) for mb in g.micro_batches
    ]
    if len(plans) != 1:
        shown = ", ".join(p.short() for p in plans[:4]) or "none"
        raise InputError(
            f"{spec.name}: {len(plans)} plans at {world} GPUs ({shown}); pin parallel.sharding, tp, pp and "
            "training.micro_batch and activation_checkpointing to name exactly one"
        )
    return plans[0]


# torch 1.13 set CUDA_MODULE_LOADING=LAZY where the job's environment leaves it unset
LAZY_LOADING_TORCH = (1, 13)


def eager_module_loading(spec: JobSpec) -> bool:
    """Whether the job loads every CUDA kernel at start (the larger context): entry.env CUDA_MODULE_LOADING says so,
    or entry.torch_version is older than torch 1.13. A version not stated is a current release (lazy)."""
    said = spec.entry.env.get("CUDA_MODULE_LOADING")
    if said is not None:
        if said.upper() not in ("LAZY", "EAGER"):
            raise InputError(
                f"entry.env.CUDA_MODULE_LOADING {said!r}: CUDA reads LAZY or EAGER; write one of them, or leave "
                "it unset"
            )
        return said.upper() == "EAGER"
    version = version_tuple(spec.entry.torch_version)
    return version is not None and version[:2] < LAZY_LOADING_TORCH


def job_overheads(spec: JobSpec, pool: Overheads | None = None) -> Overheads:
    """The device overheads this job meets on a pool (the site file's `pools[].overheads`; the defaults without a
    site): the pool's, with the CUDA context of the job's module loading (`eager_module_loading`). fsbatch,
    `frenzy-slurm memory` and the accuracy benchmark all take the context from here."""
    return (pool or Overheads()).for_module_loading(eager_module_loading(spec))


def predict_pinned(
    spec: JobSpec,
    model: ResolvedModel,
    world: int,
    metric: Metric,
    pool: Overheads | None = None,
    device: str = "cuda",
    gpu: GpuSpec | None = None,
) -> tuple[Workload, ParallelPlan, MemoryEstimate]:
    """The per-GPU peak of the one plan model.yaml pins at `world` GPUs, as `frenzy-slurm memory --world [--gpu]`
    shows it and fsbatch's search predicts it: the job's Workload, its pinned plan, and the estimate of `metric`
    with the job's overheads on `pool`, on `gpu` where it is known (`MemoryEstimate.on_gpu`: the cache the
    allocator frees before it fails does not count past the GPU's memory). InputError when the file pins no plan,
    or several."""
    w = workload_from_spec(spec, model, device=device)
    plan = pinned_plan(spec, w, world)
    overheads = job_overheads(spec, pool)
    est = estimate_memory(w, plan, metric, overheads)
    return w, plan, est.on_gpu(gpu.memory_gib * GiB, overheads) if gpu is not None else est
