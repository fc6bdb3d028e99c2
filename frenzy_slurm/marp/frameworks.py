"""Framework profiles: what each training framework keeps alive in memory and which plans it can run.

model.yaml's `entry.framework` names how the job runs; its profile here turns the job spec into MARP's
`Workload` (the implementation behaviours that decide memory, with the framework's own defaults where
model.yaml says nothing) and into the candidate search's `SearchSpace` (only plans the framework can
run). `workload_from_spec` and `search_space_from_spec` (marp/__init__.py) are the only callers, for
fsbatch, `frenzy-slurm memory`, the simulator and the accuracy benchmarks alike: no other code sets
a Workload's implementation fields.

Each profile says which releases it describes (`describes`), read from the framework's source at
those versions; docs/marp.md lists them. A profile's behaviours fall in three groups:

- the **model code** the framework trains (Hugging Face transformers for hf-trainer, lightning, torch
  and deepspeed scripts; torchtune's, litgpt's, torchtitan's and Megatron's own; frenzy's built-in
  model): how norms, rotary embeddings, grouped-query attention and projections are computed
  (`ModelCode`); model.yaml's `entry.model_code` names another;
- the **training loop**: what it keeps bound between forward and backward (the logits, the previous
  step's output), which optimizer implementation it builds, its loss (chunked, in fp32), LoRA/QLoRA
  defaults;
- **what it can parallelise** (`Capabilities`): the degrees the search may try by itself (`auto`) and
  the ones it accepts only when model.yaml asks (a TP-capable model the user brings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import UNMODELLED_FRAMEWORKS, FrameworkName, JobSpec, ModelCodeName

Support = Literal["auto", "asked", "no"]  # the search tries it / only when model.yaml pins it / never


@dataclass(frozen=True)
class ModelCode:
    """How a model implementation computes a transformer block, as far as memory is concerned."""

    name: ModelCodeName
    # the RMSNorm computes on an fp32 copy of its input (eager HF/litgpt/torchtune RMSNorm: `x.to(float32)`)
    norm_upcast: bool
    # K/V repeated to every query head before the attention kernel (HF's repeat_kv)
    gqa_expand: bool
    # rotary embedding in eager ops after the head transpose: rotated q, k are new head-major tensors
    unfused_rope: bool
    # cos/sin tables built in every block instead of once per forward (frenzy's built-in model)
    rope_tables_per_layer: bool = False
    # q/k/v (and SwiGLU gate/up) as one fused linear: "always", "never", or "by-model" (Hugging Face: GPT-2,
    # NeoX, Falcon fuse them; Llama-style and BERT-style models keep separate linears)
    fused_projections: Literal["always", "never", "by-model"] = "always"
    # eager attention's softmax(..., dtype=float32).to(dtype) (HF Llama-style eager attention)
    softmax_fp32_eager: bool = False
    # GELU as the model class computes it: "fused" (one kernel), or "by-model" (Hugging Face: GPT-2's gelu_new in eager
    # ops; the others' configs name torch's fused GELU)
    gelu: Literal["fused", "by-model"] = "fused"
    # from this framework release on, SDPA takes the K/V heads as they are (enable_gqa), so gqa_expand holds for
    # eager attention only; None: K/V are repeated for every kernel
    sdpa_gqa_from: tuple[int, ...] | None = None
    # the upcast RMSNorm keeps its normalised value in fp32 (the weight multiplies inside the fp32 computation)
    norm_fp32_normalized: bool = False
    # the RMSNorm upcast only on the CPU (frenzy's model: fused RMSNorm kernel on the GPU, a composite on the CPU)
    norm_upcast_on_cpu_only: bool = False
    # LoRA on a fused q/k/v linear scatters the adapters' outputs into the fused width with index_copy, which saves
    # its source for backward (litgpt's LoRAQKVLinear.zero_pad, when only some of q/k/v are adapted)
    lora_qkv_scatter: bool = False
    # LoRA's adapters run in their input's dtype, their weights cast to it (Unsloth's fast_lora kernels: matmul_lora's
    # `X @ A.to(X.dtype)`), where the adapters have no dropout: no per-adapter copy of the input
    lora_in_input_dtype: bool = False
    # ... and a gated MLP with adapters runs as one autograd function that saves its input and the gate and up
    # outputs only, recomputing the activation and the product in backward (Unsloth's LoRA_MLP)
    lora_mlp_saves_gate_up: bool = False
    # tensor parallelism splits the embedding, output layer and logits over the vocabulary (Megatron's
    # VocabParallelEmbedding, torchtitan's loss_parallel); False: every TP rank holds them whole
    vocab_parallel: bool = True


MODEL_CODES: dict[str, ModelCode] = {
    # transformers 4.40-4.57 modeling_llama.py / modeling_gpt2.py (eager RMSNorm upcast, repeat_kv, apply_rotary_pos_emb
    # on the transposed q/k). `q * cos + rotate_half(q) * sin` keeps q's sequence-major layout (the first operand's
    # strides decide), and the SDPA kernels write their output sequence-major, so the transpose back is a view that
    # o_proj saves with the kernel's own output: no copy (measured per block against transformers 5.17's Llama on
    # the CPU, fp32, bf16 and autocast: tests/test_marp_lora_eager_context.py)
    "hf": ModelCode(
        "hf",
        norm_upcast=True,
        gqa_expand=True,
        unfused_rope=False,
        fused_projections="by-model",
        # eager_attention_forward: softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)
        softmax_fp32_eager=True,
        gelu="by-model",
        # transformers 5 (integrations/sdpa_attention.py, use_gqa_in_sdpa: no attention mask, head_dim <= 256) passes
        # enable_gqa=True; the 4.x releases repeat_kv before SDPA
        sdpa_gqa_from=(5,),
    ),
    # Unsloth's forwards over transformers' classes (unsloth/models/llama.py LlamaDecoderLayer_fast_forward,
    # LlamaAttention_fast_forward, read at HEAD 2026-08): kernels/rms_layernorm.py fast_rms_layernorm (a Triton kernel
    # that saves its input and an fp32 per-row statistic, no fp32 copy); kernels/rope_embedding.py
    # fast_rope_embedding (a Triton kernel, cos/sin saved); utils/attention_dispatch.py run_attention takes the K/V
    # heads as they are (flash-attn, or SDPA with enable_gqa where torch has it). Its fused LoRA autograd functions
    # (kernels/fast_lora.py LoRA_MLP, LoRA_QKV, LoRA_W; get_peft_model patches them in where lora_dropout == 0 and
    # bias == "none", its defaults) compute the adapters in the input's dtype (kernels/utils.py matmul_lora:
    # `XA = torch_matmul(X, A.to(dtype))`), and LoRA_MLP saves `X, e, g` (its input, the gate and up outputs;
    # `ctx.save_for_backward(gateA, gateB, upA, upB, downA, downB, X, e, g)`), recomputing the activation and the
    # product in backward (read at HEAD, 2026-08, and in 2024.4's kernels/fast_lora.py). LoRA_QKV and LoRA_W save
    # their input, as the base linears' adapters do already
    "unsloth": ModelCode(
        "unsloth",
        norm_upcast=False,
        gqa_expand=False,
        unfused_rope=False,
        fused_projections="by-model",
        gelu="by-model",
        lora_in_input_dtype=True,
        lora_mlp_saves_gate_up=True,
    ),
    # frenzy_slurm.models.gpt: rotates q/k in eager ops and builds cos/sin per block; torch's fused RMSNorm on the GPU
    "frenzy": ModelCode(
        "frenzy",
        norm_upcast=True,
        gqa_expand=False,
        unfused_rope=True,
        rope_tables_per_layer=True,
        fused_projections="never",
        norm_upcast_on_cpu_only=True,
        vocab_parallel=False,
    ),
    # torchtune 0.3-0.6 modules: RMSNorm upcasts (0.6: F.rms_norm(x.float(), weight=scale), so the normalised value
    # saved for the scale's gradient is fp32); K/V expanded to every query head before SDPA; RoPE applied before
    # the transpose (sequence-major: the attention output needs no copy); separate q/k/v and w1/w3 linears
    "torchtune": ModelCode(
        "torchtune",
        norm_upcast=True,
        gqa_expand=True,
        unfused_rope=False,
        fused_projections="never",
        norm_fp32_normalized=True,
    ),
    # litgpt 0.4-0.5 model.py: fused qkv linear, RMSNorm upcast, eager RoPE after the transpose, GQA repeated
    # (its RMSNorm multiplies by the weight in fp32: `(x_normed * weight.float()).to(dtype)`, so the normalised value
    # saved for the weight's gradient is fp32)
    "litgpt": ModelCode(
        "litgpt",
        norm_upcast=True,
        gqa_expand=True,
        unfused_rope=True,
        fused_projections="always",
        norm_fp32_normalized=True,
        lora_qkv_scatter=True,
    ),
    # torchtitan's llama: nn.RMSNorm (F.rms_norm: one fused kernel on the GPU, a composite of ops on the CPU that keeps
    # its normalised output, as frenzy's does), complex RoPE on sequence-major tensors, separate wq/wk/wv (0.3's llama3
    # flavours fuse them: fuse_qkv=True) and w1/w3
    "torchtitan": ModelCode(
        "torchtitan",
        norm_upcast=True,
        gqa_expand=False,
        unfused_rope=False,
        fused_projections="never",
        norm_upcast_on_cpu_only=True,
    ),
    # Megatron-Core with Transformer Engine: fused kernels, fused qkv
    "megatron": ModelCode("megatron", norm_upcast=False, gqa_expand=False, unfused_rope=False),
    # llm.c's train_gpt2.cu: GPT-2 in its own CUDA kernels, fused qkv; its memory is its static layout (marp/llmc.py)
    "llm.c": ModelCode("llm.c", norm_upcast=False, gqa_expand=False, unfused_rope=False, vocab_parallel=False),
}


@dataclass(frozen=True)
class Capabilities:
    """Which parallel plans the framework can run."""

    tp: Support = "no"
    pp: Support = "no"
    cp: Support = "no"
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)  # 1/2/3: DeepSpeed ZeRO stages; FSDP full shard = 3, SHARD_GRAD_OP = 2
    selective_recompute: bool = False  # Megatron-style attention-core recomputation
    op_recompute: Support = "no"  # torchtitan's per-op selective checkpointing (SelectiveAC)
    offload: bool = False  # optimizer/parameter CPU offload
    # pipeline stages sized to different GPU types in one job (frenzy's runtime lays out the stages itself)
    heterogeneous: bool = False
    max_zero_with_pp: int = 1  # DeepSpeed's pipeline engine refuses ZeRO-2/3; FSDP2 + PP (torchtitan) shards fully
    # FSDP's mesh spans the context-parallel ranks too, so with cp > 1 the states are sharded even at dp 1
    # (torchtitan 0.3.0: parallel_dims.py, fsdp = dp_shard * cp; llama3/parallelize.py always applies FSDP)
    fsdp_over_cp: bool = False
    # the pipeline schedules its stages run (parallel.schedule): a pipeline engine's, or "sequential" (naive model
    # parallelism: Hugging Face's device_map, layers on several GPUs of one process run one after another)
    schedules: tuple[str, ...] = ("1f1b", "interleaved", "gpipe")
    # it can checkpoint whole blocks (activation_checkpointing: full); llm.c cannot (its -r recomputes GELU and norms)
    block_recompute: bool = True


@dataclass(frozen=True)
class FrameworkProfile:
    """One framework's defaults and capabilities (see the module docstring)."""

    name: FrameworkName
    title: str
    describes: str  # the releases read, e.g. "transformers 4.40-4.57, accelerate 1.x"
    family: Literal["deepspeed", "torch", "megatron", "llm.c"]  # how MARP lays out model states and buffers
    model_code: ModelCodeName
    can: Capabilities
    fused_optimizer: bool  # the optimizer it builds by default: fused/per-tensor kernels (no state-sized temporary)
    holds_logits: bool  # the loop keeps the model output (logits) bound through backward
    keeps_previous_output: bool = False  # `logits = model(...)` stays bound until the next forward returns
    zero_grad_after_forward: bool = False  # zero_grad runs between forward and backward (the old gradients live)
    loss_chunks: int = 1  # cross-entropy in this many chunks by default
    loss_chunk_tokens: int | None = None  # or: chunks of this many tokens (litgpt's chunked_cross_entropy)
    loss_fp32_in_pure_bf16: bool = True  # False: the loss runs on 16-bit logits when weights are pure bf16
    compiles_plain_loss: bool = True  # with compile: an unchunked loss is compiled too
    # ... only from the release or snapshot date marp/framework_facts.py names (torchtitan: from 0.1.0 / 2025-04-02)
    loss_compile_by_version: bool = False
    # under tensor parallelism its unchunked loss runs as DTensor's loss_parallel (sharded over the vocabulary)
    dtensor_loss_parallel: bool = False
    lora_dropout: float = 0.05  # PEFT's examples / the frameworks' LoRA configs
    qlora_quantized_head: bool = False  # QLoRA quantises the output layer too
    nf4_quantizer: Literal["bitsandbytes", "torchao"] = "bitsandbytes"
    # the model's output comes back converted to fp32 (Lightning Fabric's precision plugins: convert_output to the
    # default dtype), so the loop holds an fp32 copy of the 16-bit logits and the loss runs on it
    output_fp32: bool = False
    # under bitsandbytes QLoRA the token embedding is swapped for bitsandbytes' StableEmbedding after the optimizer
    # is built (litgpt's finetune/lora.py): the new one trains outside the optimizer (its gradient is never freed),
    # the old one stays referenced, and its fp32 LayerNorm saves an fp32 copy of the embedding output
    qlora_stable_embedding: bool = False
    # the fine-tuning loop's order (the longest sample first) and its StableEmbedding swap follow the release or
    # snapshot date entry.framework_version names (litgpt: marp/framework_facts.py)
    loop_by_version: bool = False
    # bitsandbytes QLoRA steps with bitsandbytes' paged AdamW (states in CUDA managed memory)
    qlora_paged_optimizer: bool = False
    # LoRA/QLoRA adapters are PEFT's (get_peft_model on a Hugging Face model); False: the framework's own LoRA modules
    # (torchtune's LoRALinear, litgpt's lora.py, frenzy's), built in the model's dtype, with no cast of their input
    lora_by_peft: bool = False
    # what the framework's shipped configs set, for a run described as "the defaults"
    shipped_checkpointing: Literal["none", "full"] | None = None
    # what the framework runs when neither its configuration nor the user turns activation checkpointing on (its
    # code's default, read from its source); None: no single default (it depends on the strategy or the release).
    # A published run that does not state checkpointing ran this.
    unset_checkpointing: Literal["none", "full"] | None = None
    unties_embeddings: bool = False  # its model class has its own output matrix: a tied checkpoint loads into two
    # FSDP2 wraps the embedding in a unit of its own and the final norm with the output layer in a tail unit kept
    # gathered from its forward to its backward (accelerate's fsdp2_prepare_model); False: the blocks are wrapped and
    # the root unit holds the rest (torch's fully_shard examples)
    fsdp_tail_unit: bool = False
    # tensor parallelism as DTensor modules (parallelize_module): with sequence parallelism the all-gather before each
    # column-parallel linear is an op of its own, so the linear saves the gathered, full-sequence input (Megatron's
    # linears save their sharded input and gather it again in backward); the output layer's input is the replicated
    # hidden state either way
    tp_saves_gathered_inputs: bool = False
    # the chunked loss splits the model's hidden states (not its logits) into detached contiguous chunk copies and
    # collects their gradients in an fp32 buffer of the hidden states' size, both alive through its chunk loop
    # (torchtitan's ChunkedLossWrapper and GradAccumulator)
    loss_detaches_hidden: bool = False
    # the default optimizer depends on the versions (marp/framework_facts.py): True for hf-trainer, whose
    # TrainingArguments picks fused AdamW only from transformers 4.54 with torch 2.8; False: `fused_optimizer` always
    optimizer_by_version: bool = False
    # with pipeline stages, FSDP2 keeps each stage's weights gathered and its gradients unsharded over the step's
    # micro-batches (torchtitan's default reshard policy with torch's PipelineStage; marp/framework_facts.py)
    fsdp_pp_unsharded: bool = False
    # model chunks per pipeline rank under `parallel.schedule: interleaved` when model.yaml gives no
    # `virtual_stages` (torchtitan: 2 for its multi-stage schedules)
    interleaved_virtual_stages: int = 1
    # where the default layer split puts the blocks left over (ParallelPlan.layer_balance): "front" (the first
    # stages), "middle" (torchtitan: the first stage one block less, the middle ones one more, the last the rest)
    layer_balance: str = "front"
    # the FSDP APIs it can run (parallel.fsdp_version: 1 FullyShardedDataParallel, 2 fully_shard) and the one it runs
    # when model.yaml does not say; `fsdp2_from`: a release of the framework (of torch for the plain loop) before which
    # its default is FSDP1 (each profile below cites where it is read; docs/marp.md lists them)
    fsdp_versions: tuple[int, ...] = (1, 2)
    fsdp_default: int = 2
    fsdp2_from: tuple[int, ...] | None = None
    # FSDP1 wrapping: the units' parameters are broadcast from rank 0 (sync_module_states) as they are moved
    fsdp1_sync_module_states: bool = True
    # torch.cuda.empty_cache() runs between FSDP's wrapping and the training steps (model.yaml's
    # entry.empty_cache_after_setup says otherwise)
    empties_cache_after_setup: bool = False
    # the loss is Unsloth's own kernel, picked by its release (marp/framework_facts.py unsloth_fused_loss): the
    # in-place Fast_CrossEntropyLoss on the whole 16-bit logits, or the chunked fused linear UnslothFusedLoss
    unsloth_loss: bool = False  # (Apple's Cut Cross-Entropy between 2024.11.7 and 2025.8.4)
    # full checkpointing keeps the checkpointed blocks' inputs in host memory (Unsloth's use_gradient_checkpointing=
    # "unsloth", from the release framework_facts.unsloth_offloads_checkpoints names)
    checkpoint_inputs_on_host: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    def code(self, spec: JobSpec) -> ModelCode:
        return MODEL_CODES[spec.entry.model_code or self.model_code]


PROFILES: dict[str, FrameworkProfile] = {
    p.name: p
    for p in (
        FrameworkProfile(
            "frenzy",
            "frenzy-slurm's built-in DeepSpeed trainer",
            "frenzy-slurm's runtime with DeepSpeed 0.19 (torch 2.13)",
            "deepspeed",
            "frenzy",
            Capabilities(pp="auto", selective_recompute=True, offload=True, heterogeneous=True),
            # ds_config.json sets torch_adam (no extension to build at job start): torch's AdamW, foreach on a GPU
            fused_optimizer=False,
            holds_logits=False,
        ),
        FrameworkProfile(
            "deepspeed",
            "your DeepSpeed script (deepspeed.initialize with the rendered ds_config.json)",
            "DeepSpeed 0.14-0.19",
            "deepspeed",
            "hf",
            # AutoTP / Megatron-DeepSpeed models only when you pin parallel.tp; the pipeline engine needs a
            # PipelineModule, which pp: auto assumes your script builds
            Capabilities(tp="asked", pp="auto", selective_recompute=True, offload=True),
            # DeepSpeed's FusedAdam, what a config of its own naming Adam/AdamW builds; the rendered
            # $FRENZY_DS_CONFIG sets torch_adam instead (say training.optimizer_impl: foreach if you use it as is)
            fused_optimizer=True,
            holds_logits=False,
            # activation checkpointing only where the script calls deepspeed.checkpointing or its config's
            # activation_checkpointing section asks for it (off unless written)
            unset_checkpointing="none",
            lora_by_peft=True,  # (the engine casts the whole module, adapters too, to its 16-bit dtype)
        ),
        FrameworkProfile(
            "hf-trainer",
            "Transformers Trainer / accelerate (DeepSpeed or FSDP backend)",
            "transformers 4.40-5.17, accelerate 0.30-1.15 (CPU grid: 5.17)",
            "torch",
            "hf",
            # tp_plan="auto" models only when asked; pipeline stages only as naive model parallelism: a model loaded
            # with device_map over the process's GPUs (Trainer's is_model_parallel: it leaves the model where
            # from_pretrained put it), which neither FSDP nor DeepSpeed can shard
            Capabilities(tp="asked", pp="asked", offload=True, max_zero_with_pp=0, schedules=("sequential",)),
            # TrainingArguments.optim: adamw_torch_fused from transformers 4.54 with torch >= 2.8, else adamw_torch
            # (foreach); the newest described release with a current torch is fused (marp/framework_facts.py)
            fused_optimizer=True,
            optimizer_by_version=True,
            # Trainer.compute_loss returns the loss only: the model output (logits) is gone before backward
            holds_logits=False,
            # accelerate 1.15 fsdp2_prepare_model: fully_shard(embedding), fully_shard([norm, lm_head],
            # reshard_after_forward=False) besides the decoder layers (CPU grid: hf-trainer-fsdp2-*)
            fsdp_tail_unit=True,
            unset_checkpointing="none",  # TrainingArguments.gradient_checkpointing: bool = False
            # FSDP1 before transformers 5.10 (4.x: accelerate's FullyShardedDataParallelPlugin, FSDP_VERSION unset ->
            # 1; 5.0-5.9: fsdp_config "version" default 1), FSDP2 from 5.10 (fsdp_config.get("version", 2))
            fsdp_default=2,
            fsdp2_from=(5, 10),
            lora_by_peft=True,  # (TRL's SFTTrainer and ms-swift call peft's get_peft_model too)
        ),
        FrameworkProfile(
            "unsloth",
            "Unsloth (FastLanguageModel with TRL's SFTTrainer / transformers' Trainer)",
            "unsloth 2024.4-2026.8 with unsloth-zoo (loss and checkpointing by release; read, not measured: it needs "
            "a GPU)",
            "torch",
            "unsloth",  # transformers' classes under Unsloth's forwards and kernels (MODEL_CODES above)
            # one GPU, or DDP under accelerate/torchrun (no FSDP, DeepSpeed, TP or PP)
            Capabilities(zero_stages=(0,)),
            # it trains through TRL's SFTTrainer (transformers' Trainer): TrainingArguments.optim's default at the
            # entry.transformers_version named; its notebooks write optim="adamw_8bit", which model.yaml says
            fused_optimizer=True,
            optimizer_by_version=True,
            holds_logits=False,  # Trainer.compute_loss returns the loss only
            # the notebooks' get_peft_model(lora_dropout=0): "Supports any, but = 0 is optimized" (models/llama.py)
            lora_dropout=0.0,
            # get_peft_model's use_gradient_checkpointing="unsloth" default (models/llama.py FastLlamaModel)
            unset_checkpointing="full",
            unsloth_loss=True,
            checkpoint_inputs_on_host=True,
            lora_by_peft=True,  # peft's get_peft_model, then its forwards patched with fast_lora's kernels
        ),
        FrameworkProfile(
            "torchtune",
            "torchtune recipes (full_finetune_*, lora_finetune_*)",
            "torchtune 0.3-0.6 (CPU grid: 0.6.1)",
            "torch",
            "torchtune",
            Capabilities(tp="asked", zero_stages=(0, 3), offload=True),  # FSDP2 full shard; tensor_parallel_dim
            fused_optimizer=True,  # shipped configs set optimizer.fused: True
            holds_logits=False,  # recipes `del logits` after the loss
            loss_chunks=8,  # the shipped LLM configs' loss since 0.3: CEWithChunkedOutputLoss (8 chunks)
            lora_dropout=0.0,  # the shipped LoRA configs' lora_dropout
            compiles_plain_loss=False,  # compile_loss compiles the chunked loss's per-chunk cross-entropy only
            shipped_checkpointing="full",  # shipped configs set enable_activation_checkpointing: True
            # the recipes' cfg.get("enable_activation_checkpointing", False) (0.3-0.6 full_finetune_*, lora_finetune_*)
            unset_checkpointing="none",
            nf4_quantizer="torchao",
            fsdp_versions=(2,),  # training.shard_model: fully_shard on each layer, then the model (0.3-0.6)
        ),
        FrameworkProfile(
            "torchtitan",
            "torchtitan (FSDP2, TP, PP, CP)",
            "torchtitan 0.1-0.3 and earlier snapshots by date (CPU grid: 0.3.0, FSDP2)",
            "torch",
            "torchtitan",
            Capabilities(
                tp="auto",
                pp="auto",
                cp="asked",
                zero_stages=(0, 3),
                max_zero_with_pp=3,
                op_recompute="auto",
                fsdp_over_cp=True,
            ),
            # torch's AdamW as the described releases build it by default (foreach on a GPU); set
            # training.optimizer_impl: fused where optimizer.implementation says fused
            fused_optimizer=False,
            holds_logits=False,
            # apply_fsdp_to_decoder: fully_shard(tok_embeddings), each block, fully_shard([norm, output],
            # reshard_after_forward=False) (0.3: lm_head; CPU grid: torchtitan-fsdp2-llama-dp2)
            fsdp_tail_unit=True,
            # models/llama3/sharding.py: SequenceParallel norms, ColwiseParallel q/k/v and w1/w3 over DTensor
            # (CPU grid: torchtitan-tp2-llama)
            tp_saves_gathered_inputs=True,
            loss_detaches_hidden=True,  # components/loss.py ChunkedLossWrapper (its default loss, 8 chunks)
            fsdp_pp_unsharded=True,  # distributed/fsdp.py: reshard_after_forward = not pp_enabled (0.3.0)
            # generate_split_points: num_stages_per_rank = 2 for a PipelineScheduleMulti without split points
            # (9dec370 parallelisms/pipelining_utils.py; v0.2.0 and main distributed/pipeline_parallel.py: "For
            # multi-stage schedules, default is 2 virtual stages per rank")
            interleaved_virtual_stages=2,
            layer_balance="middle",  # 9dec370 pipelining_utils.py generate_split_points (126 blocks: 15, 16 x 6, 15)
            fsdp_versions=(2,),  # apply_fsdp: fully_shard only
            # the loss is compiled with the blocks from 0.1.0 (bbb1b616e), not before (9dec370 train.py:137-138)
            loss_compile_by_version=True,
            # with tp: the loss under torch.distributed.tensor.parallel.loss_parallel (train.py's train_context at
            # 9dec370, loss_parallel_enabled in 0.3.0's distributed/utils.py)
            dtensor_loss_parallel=True,
        ),
        FrameworkProfile(
            "litgpt",
            "litgpt (finetune full / lora / qlora, pretrain)",
            "litgpt 0.4-0.5 (CPU grid: 0.5.13, lightning 2.6.6, bitsandbytes 0.50.2); loop order and StableEmbedding "
            "back to lit-gpt's 2023 snapshots, by date",
            "torch",
            "litgpt",
            Capabilities(zero_stages=(0, 3)),  # DDP or FSDP
            fused_optimizer=False,  # torch's default (foreach on a GPU)
            holds_logits=True,
            keeps_previous_output=True,
            loss_chunk_tokens=128,  # chunked_cross_entropy(chunk_size=128) in the fine-tuning scripts
            # Fabric's bf16-true and bitsandbytes plugins return the logits converted to fp32 (measured on the CPU
            # grid: the held output and the loss are fp32)
            output_fp32=True,
            qlora_quantized_head=True,  # the bitsandbytes plugin replaces every nn.Linear, lm_head's too
            qlora_stable_embedding=True,  # finetune/lora.py under BitsandbytesPrecision (read in litgpt 0.5.13)
            # lit-gpt's 2023 snapshots ran the longest sample first; the StableEmbedding swap came with 0.5.0
            loop_by_version=True,
            qlora_paged_optimizer=True,  # instantiate_bnb_optimizer: bitsandbytes.optim.PagedAdamW
            unties_embeddings=True,  # GPT has lm_head beside wte, and the fine-tuning scripts do not tie them
            # Fabric's FSDPStrategy wraps with FullyShardedDataParallel (lightning 2.6 fabric/strategies/fsdp.py
            # setup_module); the scripts build the model on the meta device (init_module(empty_init=world > 1)),
            # so wrapping materialises each unit on the GPU, with no broadcast, and nothing empties the cache
            fsdp_versions=(1,),
            fsdp_default=1,
            fsdp1_sync_module_states=False,
        ),
        FrameworkProfile(
            "lightning",
            "PyTorch Lightning / Fabric (DDP, FSDP or DeepSpeed strategy)",
            "lightning 2.2-2.6 (CPU grid: 2.6.6)",
            "torch",
            "hf",
            Capabilities(tp="asked", offload=True),
            fused_optimizer=False,  # configure_optimizers returns torch's default AdamW (foreach)
            # training_step returns the loss and Lightning runs backward after it returns: its locals are gone
            holds_logits=False,
            # automatic optimization's closure: training_step, then optimizer.zero_grad, then backward (measured on
            # the CPU grid: the previous step's gradients are alive at the end of the forward)
            zero_grad_after_forward=True,
            unset_checkpointing="none",  # none unless the LightningModule or the FSDP strategy's policy asks
            # FSDPStrategy: FullyShardedDataParallel (lightning 2.6 pytorch/strategies/fsdp.py _setup_model);
            # ModelParallelStrategy (2.4 on) runs fully_shard. The Trainer empties the cache after wrapping:
            # trainer.py _run calls strategy.setup (the wrap) and then checkpoint_connector.resume_end, which calls
            # torch.cuda.empty_cache(); FSDPStrategy passes no sync_module_states
            fsdp_default=1,
            fsdp1_sync_module_states=False,
            empties_cache_after_setup=True,
            lora_by_peft=True,  # Lightning has no LoRA of its own: a LightningModule wraps its model with PEFT
        ),
        FrameworkProfile(
            "megatron",
            "Megatron-Core / NeMo",
            "megatron-core 0.8-0.12",
            "megatron",
            "megatron",
            Capabilities(tp="auto", pp="auto", cp="asked", zero_stages=(0, 1), selective_recompute=True),
            fused_optimizer=True,  # Apex/TE FusedAdam; zero 1 = the distributed optimizer
            holds_logits=False,
            unset_checkpointing="none",  # --recompute-granularity defaults to None (TransformerConfig: no recompute)
        ),
        FrameworkProfile(
            "torch",
            "a plain PyTorch loop (DDP, FSDP/FSDP2)",
            "torch 2.0-2.13",
            "torch",
            "hf",
            # (torch.utils.checkpoint's selective contexts run torchtitan's per-op policy in any loop)
            Capabilities(
                tp="asked",
                pp="asked",
                zero_stages=(0, 2, 3),
                offload=True,
                max_zero_with_pp=3,
                op_recompute="asked",
                # torch.distributed.pipelining's schedules, or a model moved layer by layer with .to(device)
                schedules=("1f1b", "interleaved", "gpipe", "sequential"),
            ),
            fused_optimizer=False,  # torch.optim.AdamW's default: foreach on a GPU
            holds_logits=True,  # `logits = model(x); loss = f(logits, y); loss.backward()`
            unset_checkpointing="none",  # torch.utils.checkpoint only where the loop calls it
            # fully_shard from torch 2.4 (torch.distributed._composable.fsdp; torch.distributed.fsdp from 2.6), which
            # torch's FSDP tutorial teaches; before it only FullyShardedDataParallel. The version is entry.torch_version
            fsdp_default=2,
            fsdp2_from=(2, 4),
            # FullyShardedDataParallel(sync_module_states=False): torch's default (fully_sharded_data_parallel.py)
            fsdp1_sync_module_states=False,
            lora_by_peft=True,
        ),
        FrameworkProfile(
            "llm.c",
            "llm.c's train_gpt2.cu (GPT-2 in CUDA C; MPI/NCCL data parallelism)",
            "karpathy/llm.c train_gpt2.cu, master 2024.05.13 (PR #309) to 2024.08.16 (0ddedf9)",
            "llm.c",
            "llm.c",
            # -z 0 or 1 (set_zero_configs: stages 2 and 3 "are not yet supported"); no tp, pp, cp or offload
            Capabilities(zero_stages=(0, 1), block_recompute=False),
            fused_optimizer=True,  # adamw_kernel3: one kernel over the flat parameters, no temporaries
            holds_logits=False,  # the output buffer is among its static buffers (marp/llmc.py)
            unset_checkpointing="none",  # it checkpoints no blocks (its -r is entry.llmc.recompute)
        ),
    )
}


# Training programs MARP has no profile for, by name, with why (model.yaml's entry.framework refuses them)
UNMODELLED: dict[str, str] = UNMODELLED_FRAMEWORKS


def profile_of(spec: JobSpec) -> FrameworkProfile:
    return PROFILES[spec.entry.runs_with]


def fused_projections(code: ModelCode, arch: Architecture) -> bool:
    """Whether q/k/v (and SwiGLU's gate/up) are one linear in this model code."""
    if code.fused_projections == "by-model":
        # Hugging Face: GPT-2 (c_attn), GPT-NeoX/Falcon (query_key_value) fuse; Llama-style (RMSNorm) and
        # BERT-style (an encoder head) models keep q_proj/k_proj/v_proj
        return arch.norm == "layernorm" and arch.head == "lm"
    return code.fused_projections == "always"


def gelu_tanh_eager(code: ModelCode, arch: Architecture) -> bool:
    """Whether the GELU is the tanh approximation in eager ops: Hugging Face's GPT-2 class (learned positions,
    layer norm, an LM head) runs `gelu_new` (NewGELUActivation); measured on the CPU grid (hf-trainer-gpt2-1gpu).
    T5 v1.1 / Flan-T5's gated-gelu FFN is `gelu_new` too (transformers 5.17 models/t5/configuration_t5.py:
    feed_forward_proj "gated-gelu" sets dense_act_fn "gelu_new"); BART's `gelu` is the exact one (one kernel)."""
    if code.gelu != "by-model":
        return False
    gpt2 = (
        arch.activation == "gelu"
        and arch.position == "learned"
        and arch.norm == "layernorm"
        and arch.head == "lm"
        and not arch.encoder_decoder
    )
    return gpt2 or (arch.activation == "geglu" and arch.position == "relative")


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    return tuple(int(p) for p in text.split(".")) if text else None


def default_compile_loss(spec: JobSpec) -> bool:
    """Whether the framework compiles an unchunked loss when model.yaml's training.compile is on and it says
    nothing of the loss: the profile's, or its versions' rule (torchtitan: marp/framework_facts.py)."""
    from frenzy_slurm.marp.framework_facts import torchtitan_compiles_loss

    prof = profile_of(spec)
    if prof.loss_compile_by_version:
        return torchtitan_compiles_loss(version_tuple(spec.entry.framework_version))
    return prof.compiles_plain_loss


def default_fused_optimizer(spec: JobSpec, device: str = "cuda") -> bool:
    """Whether the framework's default optimizer steps fused (or per tensor): the profile's, or its versions'
    rule; torch's optimizers default to foreach only for CUDA tensors, so on the CPU they step per tensor."""
    from frenzy_slurm.marp.framework_facts import hf_trainer_fused_adamw

    prof = profile_of(spec)
    if device == "cpu":
        return True
    if prof.optimizer_by_version:
        e = spec.entry
        # the Trainer's release: hf-trainer's own version, else (a framework that trains through it) the transformers
        # release model.yaml names
        release = e.framework_version if prof.name == "hf-trainer" else e.transformers_version
        return hf_trainer_fused_adamw(version_tuple(release), version_tuple(e.torch_version))
    return prof.fused_optimizer


# Frameworks that run either DeepSpeed or FSDP underneath (Transformers Trainer / accelerate, Lightning): model.yaml's
# sharding name says which, ZeRO stages naming DeepSpeed's engine and FSDP's names torch's
DEEPSPEED_SHARDING = ("zero1", "zero2", "zero3")


def fsdp_offloads_parameters(spec: JobSpec) -> bool:
    """Whether model.yaml's optimizer offload also moves the parameters to the host: under FSDP (a torch-family
    framework with FSDP's sharding names, not DeepSpeed's ZeRO stages) CPU offload is one switch, FSDP's
    `CPUOffload(offload_params=True)` (FSDP2: `CPUOffloadPolicy`): sharded parameters and their gradients live on
    the host and the optimizer steps there (torch 2.x `torch/distributed/fsdp/api.py`); there is no optimizer-only
    offload, and the rendered run turns on that switch (runtime/framework_argv.py)."""
    par = spec.parallel
    if not par.offload_optimizer or par.offload_params or par.sharding in DEEPSPEED_SHARDING:
        return False
    return profile_of(spec).family == "torch"


def runs_fsdp(spec: JobSpec) -> bool:
    """Whether the job may shard with FSDP: a torch-family framework whose sharding is one of FSDP's names or auto
    (not DDP's `none`, not DeepSpeed's ZeRO stages)."""
    prof = profile_of(spec)
    # (a framework that shards nothing, Unsloth, runs no FSDP: what it cannot run is refused with its plans)
    shards = max(prof.can.zero_stages) > 0
    return prof.family == "torch" and shards and spec.parallel.sharding not in ("none", *DEEPSPEED_SHARDING)


def default_fsdp_version(spec: JobSpec) -> int:
    """The FSDP API the framework runs at the versions model.yaml names (the newest described when it names none):
    its profile's default, FSDP1 before `fsdp2_from` (a framework release; torch's own for the plain loop)."""
    prof = profile_of(spec)
    if prof.fsdp2_from is not None:
        named = spec.entry.torch_version if prof.name == "torch" else spec.entry.framework_version
        version = version_tuple(named)
        if version is not None and version < prof.fsdp2_from:
            return 1
    return prof.fsdp_default


def fsdp_version(spec: JobSpec) -> int | None:
    """parallel.fsdp_version, else the framework's default; None where the job runs no FSDP (`runs_fsdp`). A
    version the framework cannot run is refused where the plans are searched (search_space_from_spec)."""
    if not runs_fsdp(spec):
        return None
    return spec.parallel.fsdp_version or default_fsdp_version(spec)


def empties_cache_after_setup(spec: JobSpec) -> bool:
    """entry.empty_cache_after_setup, else what the framework does between wrapping and the steps."""
    stated = spec.entry.empty_cache_after_setup
    return profile_of(spec).empties_cache_after_setup if stated is None else stated


def profile_summary(spec: JobSpec, device: str = "cuda") -> dict[str, object]:
    """Which profile predicts this job and which of its defaults apply because model.yaml is silent (for
    `fsbatch --explain` and `frenzy-slurm memory`): the framework, the releases it describes, and each default
    taken, as `{setting: value}`; a version outside those described is noted."""
    prof = profile_of(spec)
    t, e = spec.training, spec.entry
    taken: dict[str, object] = {}
    if e.model_code is None:
        taken["entry.model_code"] = prof.model_code
    if t.optimizer_impl is None:
        taken["training.optimizer_impl"] = "fused" if default_fused_optimizer(spec, device) else "foreach"
    if t.loss_chunks is None:
        taken["training.loss_chunks"] = (
            f"{prof.loss_chunk_tokens}-token chunks" if prof.loss_chunk_tokens else prof.loss_chunks
        )
    if e.holds_logits is None:
        taken["entry.holds_logits"] = prof.holds_logits
    if t.method != "full" and t.lora.dropout is None:
        taken["training.lora.dropout"] = prof.lora_dropout
    if t.method == "qlora":
        if t.lora.quantize_head is None:
            taken["training.lora.quantize_head"] = prof.qlora_quantized_head
        if t.lora.quantizer is None:
            taken["training.lora.quantizer"] = prof.nf4_quantizer
        if t.lora.double_quant is None:
            taken["training.lora.double_quant"] = True
    if t.compile and t.compile_loss is None:
        taken["training.compile_loss"] = default_compile_loss(spec)
    if spec.parallel.fsdp_version is None and runs_fsdp(spec):
        taken["parallel.fsdp_version"] = default_fsdp_version(spec)
    if fsdp_version(spec) == 1 and spec.entry.empty_cache_after_setup is None:
        taken["entry.empty_cache_after_setup"] = prof.empties_cache_after_setup
    if fsdp_offloads_parameters(spec):
        taken["parallel.offload_params"] = "true (FSDP's CPU offload moves the parameters with the optimizer)"
    if prof.family == "llm.c":  # a static layout: the PyTorch loop's settings above say nothing of it
        taken = llmc_defaults(spec)
    can = prof.can
    runs = {
        "tp": can.tp,
        "pp": can.pp,
        "cp": can.cp,
        "zero stages": ",".join(map(str, can.zero_stages)),
        "heterogeneous pipelines": can.heterogeneous,
    }
    if can.pp != "no":
        runs["pipeline schedules"] = ",".join(can.schedules)  # parallel.schedule
    out: dict[str, object] = {
        "framework": prof.name,
        "title": prof.title,
        "describes": prof.describes,
        "defaults_taken": taken,
        "can_run": runs,
    }
    if e.framework_version is not None:
        out["version"] = e.framework_version
    if spec.median_tokens is not None:  # data.lengths: variable
        data: dict[str, object] = {"lengths": "variable", "longest": spec.longest_tokens, "median": spec.median_tokens}
        if spec.data.mean is not None:
            data |= {"mean": spec.data.mean, "sd": spec.data.sd}
        out["data"] = data
    return out


def llmc_defaults(spec: JobSpec) -> dict[str, object]:
    """The llm.c settings model.yaml leaves to llm.c's defaults at the date of its source (marp/llmc.py)."""
    from frenzy_slurm.marp.llmc import NEWEST, llmc_version, recompute_level

    taken: dict[str, object] = {}
    if spec.entry.framework_version is None:
        taken["entry.framework_version"] = "{}.{:02d}.{:02d} (the newest layout described)".format(*NEWEST)
    if spec.entry.llmc.recompute is None:
        taken["entry.llmc.recompute"] = recompute_level(spec, llmc_version(spec.entry.framework_version))
    return taken


def profile_lines(spec: JobSpec, device: str = "cuda") -> list[str]:
    """profile_summary as the lines --explain prints."""
    s = profile_summary(spec, device)
    lines = [f"framework: {s['framework']} ({s['title']}; profile describes {s['describes']})"]
    taken = s["defaults_taken"]
    assert isinstance(taken, dict)
    if taken:
        lines.append("  its defaults used: " + ", ".join(f"{k}={v}" for k, v in taken.items()))
    runs = s["can_run"]
    assert isinstance(runs, dict)
    lines.append(
        "  plans it can run: "
        + ", ".join(f"{k} {'searched' if v == 'auto' else 'if pinned' if v == 'asked' else v}" for k, v in runs.items())
    )
    data = s.get("data")
    if isinstance(data, dict):
        replayed = (
            f"steps drawn evenly from {data['mean']:g} +- {data['sd']:g} tokens truncated at the longest"
            if "mean" in data
            else "a median-length step before a longest one"
        )
        lines.append(
            f"data: variable lengths, longest {data['longest']} tokens, median {data['median']}: memory is that of "
            f"the longest step; reserved adds what shorter steps leave cached ({replayed}, one layer's saved "
            f"tensors and the loss's, replayed through the caching allocator), which decides no fit: the allocator "
            f"frees it before reporting out of memory, so on a known GPU it counts only up to the GPU's memory less "
            f"the CUDA context, NCCL and cuBLAS (capped)"
        )
    return lines
