"""The MARP workload: everything about a training run that decides memory, apart from the parallel plan.

`Workload` keeps what every term reads (the architecture, sequence length, precision, framework, method and
exact parameter count) and groups the rest by the term that reads it, each a frozen object of its own:
`ModelStates` (the optimizer and the gradients' lifetime), `Adapters` (LoRA/QLoRA), `ActivationPolicy` (what a
block saves for backward), `LossPolicy` (the logits and the loss, as the training loop holds them),
`Communication` (buckets, FSDP units, vocab-parallel layers) and `AllocatorPolicy` (the caching allocator).

The fields keep their names inside the groups, so `Workload.of(arch, seq_len, loss_chunks=8)` and
`.with_(loss_chunks=8)` take the flat names (each routed to its group) and `w.loss.loss_chunks` reads one.
`marp.workload_from_spec` is the one constructor of a Workload from a job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import Attention, DeepSpeedBuffers, Method, Optimizer, Precision

Framework = Literal["deepspeed", "torch", "megatron", "llm.c"]
Date = tuple[int, int, int]  # YYYY, MM, DD

# DeepSpeed's buffer sizes as model.yaml's `deepspeed:` section gives them (and ds_config.json writes them)
DeepSpeedBuckets = DeepSpeedBuffers


@dataclass(frozen=True)
class ModelStates:
    """The optimizer and when gradients exist (marp/memory_states.py, marp/memory_buffers.py)."""

    optimizer: Optimizer = "adamw"
    fused_optimizer: bool = False  # False: foreach kernels (one optimizer-state-sized temporary at step)
    optimizer_in_backward: bool = False
    paged_optimizer: bool = False  # states in CUDA managed memory, outside the caching allocator's counts
    zero_grad_to_none: bool = True  # grads freed after each step (torch >= 2.0 default); False keeps zeroed buffers
    # the loop zeroes gradients between the forward and the backward (Lightning's automatic optimization: its closure
    # runs training_step, then zero_grad, then backward), so the previous step's gradients live through the forward
    zero_grad_after_forward: bool = False


@dataclass(frozen=True)
class Adapters:
    """LoRA's adapters and QLoRA's quantised base (read only where `Workload.method` is lora or qlora)."""

    lora_rank: int = 16
    lora_targets: tuple[str, ...] = ("q", "v")
    lora_dropout: bool = True
    nf4_double_quant: bool = True  # QLoRA's double-quantised absmax (4.127 bits); False: plain NF4, 4.5 bits
    nf4_torchao: bool = False  # QLoRA's NF4 is torchao's tensor subclass (dequantised in eager ops unless compiled)
    nf4_saves_inputs: bool = True  # bitsandbytes' 4-bit matmul saves its input (torchao's NF4 linear does not)
    qlora_quantized_head: bool = False  # QLoRA quantises the (untied) output layer too (litgpt's bitsandbytes plugin)
    # bitsandbytes QLoRA swaps in bitsandbytes' StableEmbedding after building the optimizer (litgpt): the old embedding
    # stays, the new one's gradient is never freed, its fp32 LayerNorm saves an fp32 copy of its output
    bnb_stable_embedding: bool = False
    lora_qkv_scatter: bool = False  # fused-q/k/v LoRA scatters adapter outputs with index_copy (litgpt), saving them
    # PEFT's LoRA layers (peft/tuners/lora/layer.py Linear.forward: `x = self._cast_input_dtype(x,
    # lora_A.weight.dtype)`) cast each adapter's input to the adapter weights' dtype: a copy of its own per adapter
    # wherever the dtypes differ
    lora_input_cast: bool = False
    # the adapters are fp32 over a 16-bit base (PEFT >= 0.12: get_peft_model's autocast_adapter_dtype)
    lora_fp32: bool = False
    # ... but compute in their input's dtype, their weights cast to it (Unsloth's matmul_lora): no input copies
    lora_in_input_dtype: bool = False


@dataclass(frozen=True)
class ActivationPolicy:
    """What the model's code saves for backward (marp/memory_activations.py)."""

    attention: Attention = "flash"
    compile: bool = False
    activation_offload: bool = False
    # full checkpointing keeps each checkpointed block's input in host memory, about two in transfer on the GPU
    # (Unsloth's use_gradient_checkpointing="unsloth"); activation_offload does so for every checkpointing policy
    checkpoint_inputs_on_host: bool = False
    norm_upcast: bool = False  # norm computed on an fp32 copy of its input (HF/torchtune/litgpt RMSNorm, eager)
    # the upcast norm keeps its normalised value in fp32 (torchtune's F.rms_norm(x.float(), weight=...)), not 16-bit
    norm_fp32_normalized: bool = False
    gqa_expand: bool = False  # K/V repeated to all query heads before the attention kernel (HF repeat_kv)
    unfused_rope: bool = False  # rotary embedding in eager ops (HF/litgpt/torchtune/built-in): rotated q, k are new
    rope_tables_per_layer: bool = False  # cos/sin built in every block (the built-in model) instead of once per forward
    softmax_fp32: bool = False  # eager attention's softmax(..., dtype=float32).to(dtype) (HF Llama-style eager)
    fp8: bool = False  # float8 linears (torchao/Transformer Engine): fp8 copies of inputs and weights, amax history
    # DTensor TP (torchtitan): the column-parallel linears save their all-gathered input (whole under SP)
    tp_saves_gathered_inputs: bool = False
    # GELU's tanh approximation in eager ops (HF's gelu_new, NewGELUActivation: GPT-2): 0.5*x*(1+tanh(...)) keeps
    # tanh's output, 0.5*x and 1+tanh besides its input
    gelu_tanh_eager: bool = False
    # dropout keeps a mask of its input's dtype (the CPU: torch's dropout multiplies by a noise tensor); False: the
    # fused CUDA kernel's bool mask
    dropout_mask_full_width: bool = False
    fused_projections: bool = False  # q/k/v (and SwiGLU gate/up) are one fused linear (litgpt, GPT-2, NeoX, Megatron)
    # the adapted gated MLP saves its gate and up outputs only, recomputing the product (Unsloth's LoRA_MLP)
    lora_mlp_saves_gate_up: bool = False


@dataclass(frozen=True)
class LossPolicy:
    """The output layer's logits and the loss, as the framework and its training loop hold them
    (marp/memory_loss.py)."""

    loss_chunks: int = 1
    # Liger's fused linear cross-entropy: chunks of ~hidden-size logits in the forward, no logits kept
    fused_linear_loss: bool = False
    # ... chunked instead so that a chunk's fp32 logits stay within this many bytes (math.inf: one chunk), each chunk
    # compiled: its 16-bit logits and their 16-bit gradient alive at once (Unsloth's UnslothFusedLoss); 0: no logits
    # stored at all (Apple's Cut Cross-Entropy, made in on-chip memory); None: Liger's
    fused_chunk_fp32_bytes: float | None = None
    # the cross-entropy kernel saves the 16-bit logits themselves and writes their gradient into them: no fp32 copy,
    # no log-softmax (Unsloth's Fast_CrossEntropyLoss)
    ce_in_place: bool = False
    compile_loss: bool = True  # with compile: the loss is compiled too (False: the model's blocks only)
    hold_logits: bool = False  # the training loop keeps the 16-bit logits alive (HF-style model outputs)
    # the loop keeps the previous step's output bound until the next forward returns (litgpt's `logits = model(...)`):
    # its 16-bit logits and, through their autograd graph, what custom functions stored on their ctx (bitsandbytes'
    # 4-bit matmul inputs) are alive at the end of the next forward
    keeps_previous_output: bool = False
    # the chunked loss's detached hidden-state chunks and fp32 gradient accumulator (torchtitan's ChunkedLossWrapper)
    loss_detaches_hidden: bool = False
    output_fp32: bool = False  # the loop gets the model's output converted to fp32 (Lightning Fabric) and holds it
    loss_fp32: bool = True  # cross-entropy on an fp32 upcast of the logits (torch's F.cross_entropy on .float())
    # under tensor parallelism the eager loss runs as DTensor's loss_parallel (torchtitan), whose fused nll/log-softmax
    # backward holds four vocab-shard-sized fp32 tensors, not three (marp/memory_loss.py)
    dtensor_loss_parallel: bool = False


@dataclass(frozen=True)
class Communication:
    """How parameters and gradients are split and moved between ranks (marp/memory_buffers.py)."""

    buckets: DeepSpeedBuckets = field(default_factory=DeepSpeedBuckets)
    reshard_after_forward: bool = True  # FSDP: False keeps each unit's gathered 16-bit weights from forward to backward
    # FSDP2 units: the embedding on its own, the final norm and output layer in a tail unit gathered from its forward
    # to its backward (accelerate); False: the root unit holds them (torch's examples)
    fsdp_tail_unit: bool = False
    vocab_parallel: bool = True  # tp splits the embedding, output layer and logits (Megatron); False: replicated
    # FSDP2 under pipeline stages keeps the stage's weights gathered and its gradients unsharded, in fp32, over the
    # micro-batches of a step (torchtitan's default policy; marp/framework_facts.py)
    fsdp_pp_unsharded: bool = False
    # FSDP1 (FullyShardedDataParallel): its wrap leaves a cache the reserved peak never reads below (unless
    # `fsdp1_cache_emptied`: the program empties it before the steps) and its all-gathers hold a stream pool of
    # their own (marp/fsdp_init.py); `fsdp1_sync`: the wrap broadcasts each unit from rank 0 (sync_module_states)
    fsdp1: bool = False
    fsdp1_cache_emptied: bool = False
    fsdp1_sync: bool = True


@dataclass(frozen=True)
class AllocatorPolicy:
    """The memory allocator the tensors live in (marp/memory_reserved.py, marp/allocator.py)."""

    expandable_segments: bool = False  # PYTORCH_CUDA_ALLOC_CONF expandable_segments:True (marp/allocator.py)
    # torch's CUDA caching allocator keeps freed blocks in its segments (reserved > allocated); the CPU allocator
    # hands memory back to the C allocator, so on the CPU (the site's `device: cpu`) reserved is what is allocated
    caching_allocator: bool = True


@dataclass(frozen=True)
class LlmcLayout:
    """What sizes llm.c's buffers beside the architecture and the plan (marp/llmc.py): its flags and its source's
    date. A Workload with one is predicted from llm.c's static layout, not from the moments of a PyTorch step."""

    version: Date  # the date of the train_gpt2.cu built (llm.c has no releases)
    recompute: int  # -r: 0 none, 1 the GELU, 2 the GELU and the layer norms
    cudnn: bool  # USE_CUDNN=1: cuDNN's attention keeps (B, NH, T) fp32 statistics, not the (B, NH, T, T) matrix
    master_weights: bool  # -w: an fp32 master copy of the parameters beside AdamW's m and v
    floatx: int  # bytes of floatX (the PRECISION build): parameters, gradients, activations
    padded_vocab: int  # Vp: the vocabulary padded to a multiple of 128 (train_gpt2.py pad_vocab)
    max_seq: int  # maxT: the positional embedding's rows


_GROUPS: dict[str, type] = {
    "states": ModelStates,
    "adapters": Adapters,
    "activations": ActivationPolicy,
    "loss": LossPolicy,
    "comm": Communication,
    "alloc": AllocatorPolicy,
}
# each grouped field's name -> the Workload attribute holding its group
_GROUP_OF = {f.name: group for group, cls in _GROUPS.items() for f in fields(cls)}


@dataclass(frozen=True)
class Workload:
    """Everything about a training run that decides memory, apart from the parallel plan."""

    arch: Architecture
    seq_len: int
    precision: Precision = "bf16-mixed"
    framework: Framework = "deepspeed"  # torch = plain PyTorch/FSDP training loop (AMP keeps fp32 weights)
    method: Method = "full"
    exact_params: int | None = None  # from tracing: scales the analytic weights to the exact count
    states: ModelStates = ModelStates()
    adapters: Adapters = Adapters()
    activations: ActivationPolicy = ActivationPolicy()
    loss: LossPolicy = LossPolicy()
    comm: Communication = Communication()
    alloc: AllocatorPolicy = AllocatorPolicy()
    # variable sequence lengths (model.yaml's data block): a typical step's length beside seq_len, the longest; the
    # caching allocator keeps the shorter step's blocks when the longest comes (memory_reserved.length_change_cache)
    median_seq_len: int | None = None
    # the samples' lengths before truncation as model.yaml's data block states them (mean and standard deviation, in
    # tokens): the replayed steps' lengths are drawn from them (marp/allocator_steps.py)
    length_mean: float | None = None
    length_sd: float | None = None
    # llm.c's layout (framework llm.c): its buffers, not PyTorch's tensors, make the memory (marp/llmc.py)
    llmc: LlmcLayout | None = None
    # an encoder-decoder model's decoder (target) tokens per sample; seq_len is then the encoder's input length
    target_len: int | None = None

    @property
    def decoder_len(self) -> int:
        """Tokens per sample the output layer and the loss run over: the target of an encoder-decoder model."""
        return self.target_len if (self.arch.encoder_decoder and self.target_len) else self.seq_len

    @classmethod
    def of(cls, arch: Architecture, seq_len: int, **settings: object) -> Workload:
        """A workload from flat setting names (`precision=`, `loss_chunks=`, ...), each put in its group."""
        return cls(arch=arch, seq_len=seq_len).with_(**settings)

    def with_(self, **changes: object) -> Workload:
        """A copy with some settings changed, by their flat names (or whole groups by the group's name)."""
        grouped: dict[str, dict[str, object]] = defaultdict(dict)
        top: dict[str, object] = {}
        for name, value in changes.items():
            if name in _GROUP_OF:
                grouped[_GROUP_OF[name]][name] = value
            else:
                top[name] = value
        for group, settings in grouped.items():
            # (a whole group given beside some of its settings: the settings change the given group)
            current: Any = top[group] if group in top else getattr(self, group)
            top[group] = replace(current, **settings)
        return replace(self, **top)  # type: ignore[arg-type]  # replace() checks names at run time
