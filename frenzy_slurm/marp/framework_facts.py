"""Framework defaults that change with the framework's or torch's version, each read from the source it names.

The profiles (marp/frameworks.py) say what a framework does; where that depends on the release, the rule is
here, keyed on model.yaml's `entry.framework_version` (None: the newest the profile describes) and
`entry.torch_version` (None: a current release), with the file and versions it was read in.
"""

from __future__ import annotations

from frenzy_slurm.core.units import GiB

# transformers' TrainingArguments.optim default (training_args.py, `default_optim`): "adamw_torch" (torch.optim.AdamW,
# foreach on CUDA tensors) in every release up to 4.53 (read in 4.45.0, 4.50.0, 4.52.1, 4.53.0: the fused default is
# commented out); from 4.54.0 "adamw_torch_fused" where `is_torch_greater_or_equal_than_2_8` (pytorch_utils.py),
# else "adamw_torch" (read in 4.54.0, 4.55.0, 4.56.0, 4.57.1, 5.17.0)
HF_FUSED_DEFAULT_FROM = (4, 54)
HF_FUSED_DEFAULT_TORCH = (2, 8)


def hf_trainer_fused_adamw(framework_version: tuple[int, ...] | None, torch_version: tuple[int, ...] | None) -> bool:
    """Whether the Trainer's default optimizer is the fused AdamW for these transformers and torch versions."""
    if framework_version is not None and framework_version[:2] < HF_FUSED_DEFAULT_FROM:
        return False
    return torch_version is None or torch_version[:2] >= HF_FUSED_DEFAULT_TORCH


# FSDP2 with pipeline stages, as torchtitan runs it: its default `fsdp_reshard_after_forward` policy resolves to
# `not pp_enabled` (torchtitan 0.3.0, distributed/fsdp.py get_fsdp_reshard_after_forward_policy), so a stage's blocks
# stay gathered from forward to backward; torch's PipelineStage runs every micro-batch's backward but the last with
# set_reshard_after_backward(False) and set_requires_gradient_sync(False) (torch 2.13,
# distributed/pipelining/stage.py), and FSDP2 then keeps each unsharded gradient across micro-batches in the reduce
# dtype (_fsdp_param.py to_accumulated_grad_if_needed; torchtitan's mixed_precision_reduce is float32, config/
# configs.py): the stage's whole gradient, unsharded, in fp32, until the last micro-batch's reduce-scatter.
FSDP_PP_REDUCE_BYTES = 4.0


# Whether transformers' causal-LM class computes its loss on an fp32 copy of the logits, read in the released wheels'
# models/*/modeling_*.py: from 4.49.0 GPT-2 and OPT call `self.loss_function` (loss/loss_utils.py ForCausalLMLoss:
# `logits = logits.float()`), as Llama does from 4.46.0; before, GPT-2 and OPT ran CrossEntropyLoss on their shifted
# 16-bit logits (read in 4.25.1, 4.31.0, 4.45.2, 4.46.0, 4.48.0). Llama's forward upcast its logits
# (`logits = logits.float()`) from 4.31.0 (not in 4.30.2), the Llama-style classes copied from it likewise.
HF_LOSS_UPCAST_ALL_FROM = (4, 49)
HF_LLAMA_UPCAST_FROM = (4, 31)


def hf_loss_upcasts(layer_norm_lm: bool, transformers_version: tuple[int, ...] | None) -> bool:
    """Whether a Hugging Face causal LM's own loss upcasts 16-bit logits to fp32 at this transformers release
    (None: a current one). `layer_norm_lm`: a GPT-2/OPT-style class (LayerNorm, an LM head), which kept a 16-bit
    loss until 4.49; the RMSNorm (Llama-style) classes upcast from 4.31."""
    if transformers_version is None or transformers_version[:2] >= HF_LOSS_UPCAST_ALL_FROM:
        return True
    return not layer_norm_lm and transformers_version[:2] >= HF_LLAMA_UPCAST_FROM


# torchtitan's loss under `training.compile`. At 9dec370 (2024-12-26, the commit benchmarks/
# llama3_h100_202412_torchtitan.md names) train.py:131-138 builds `loss_fn` as `cross_entropy(pred.flatten(0, 1)
# .float(), labels.flatten(0, 1))` and leaves `loss_fn = torch.compile(loss_fn)` commented out ("compiling loss
# function causes CUDA errors"): only the blocks are compiled (parallelize_llama.py apply_compile). From bbb1b616e
# (2025-04-02) components/loss.py `build_cross_entropy_loss` compiles it whenever training.compile is on (read at
# e7c0cae, 2025-06-11, and 0.3.0). assets/version.txt read 0.0.2 from b889f3d50 (2024-04-16) to b461ea82c
# (2025-06-05), 0.1.0 from it: the first release compiles the loss, and most of 0.0.2's snapshots do not (those
# from 2025-04-02 to 2025-06-04 do: their users write training.compile_loss: true). torchtitan had no release
# before 0.1.0, so a snapshot may be named by its date instead, `YYYY.MM.DD` as llm.c's are.
TORCHTITAN_LOSS_COMPILED_FROM_RELEASE = (0, 1)
TORCHTITAN_LOSS_COMPILED_FROM_DATE = (2025, 4, 2)
SNAPSHOT_DATE_FROM_YEAR = 2000  # a framework_version whose first part is a year names a snapshot by its date


def torchtitan_compiles_loss(framework_version: tuple[int, ...] | None) -> bool:
    """Whether torchtitan's training.compile compiles its loss too, at the release or snapshot date named (None:
    the newest release described)."""
    if framework_version is None:
        return True
    if framework_version[0] >= SNAPSHOT_DATE_FROM_YEAR:
        return framework_version[:3] >= TORCHTITAN_LOSS_COMPILED_FROM_DATE
    return framework_version[:2] >= TORCHTITAN_LOSS_COMPILED_FROM_RELEASE


# litgpt's fine-tuning loops, read in Lightning-AI/litgpt's history. Before its first release (0.2.0, 2024-03; the
# repository was lit-gpt, its snapshots named by date, `YYYY.MM.DD`) finetune/{full,lora,adapter}.py put the longest
# training sample into the first iteration, "so potential OOMs happen right away": `get_batch(fabric, train_data,
# longest_seq_ix if iter_num == 0 else None)` (read at 8641822, 2023-10-16), from fa5d73e3 (2023-06-21, #184) until
# the data refactor 73baa2d5 (2024-02-29, #950) moved the scripts onto a shuffled DataLoader (read in the 0.2.0,
# 0.4.0 and 0.5.13 wheels). With variable lengths the step that sets the peak then follows no training step: no
# previous output or graph is alive at the end of its forward. The step after it holds the longest step's graph
# beside its own shorter one; that is the smaller moment wherever a step's saved tensors are at least twice what the
# old graph's custom functions keep (bitsandbytes' 4-bit matmul inputs, (3 h + ffn) x 2 bytes a layer and token,
# against a Llama block's ~34 h).
LITGPT_LONGEST_FIRST_DATES = ((2023, 6, 21), (2024, 2, 29))
LITGPT_FIRST_RELEASE_DATE = (2024, 3, 15)  # the 0.2.0 wheel's files (0.1.0 exists only as 0.1.0.dev1, lit_gpt)
# The swap to bitsandbytes' StableEmbedding under bitsandbytes quantisation (finetune/lora.py, adapter.py,
# adapter_v2.py: `model.transformer.wte = StableEmbedding(...)` after the optimizer is built) came with ae798aba
# (2024-10-04, #1770), first released in 0.5.0 (absent from the 0.4.0 and 0.4.10 wheels, present in 0.5.0 and 0.5.13).
LITGPT_STABLE_EMBEDDING_FROM_RELEASE = (0, 5)
LITGPT_STABLE_EMBEDDING_FROM_DATE = (2024, 10, 4)


def litgpt_longest_first(framework_version: tuple[int, ...] | None) -> bool:
    """Whether litgpt's fine-tuning loop runs the longest sample first, at the release or snapshot date named (None:
    the newest release described, which does not)."""
    if framework_version is None or framework_version[0] < SNAPSHOT_DATE_FROM_YEAR:
        return False
    start, end = LITGPT_LONGEST_FIRST_DATES
    return start <= framework_version[:3] < end


def litgpt_stable_embedding(framework_version: tuple[int, ...] | None) -> bool:
    """Whether litgpt's fine-tuning scripts swap in bitsandbytes' StableEmbedding under bitsandbytes quantisation, at
    the release or snapshot date named (None: the newest release described, which does)."""
    if framework_version is None:
        return True
    if framework_version[0] >= SNAPSHOT_DATE_FROM_YEAR:
        return framework_version[:3] >= LITGPT_STABLE_EMBEDDING_FROM_DATE
    return framework_version[:2] >= LITGPT_STABLE_EMBEDDING_FROM_RELEASE


# Unsloth's loss, read in unslothai/unsloth (releases are year.month.patch, unsloth/models/_utils.py __version__) and
# unslothai/unsloth-zoo, models/llama.py CausalLM_fast_forward. Three kernels, by release and by the step's tokens
# (bsz * q_len):
# - "in-place": the output layer runs whole and kernels/cross_entropy_loss.py `Fast_CrossEntropyLoss` takes its
#   16-bit logits: the forward makes per-row fp32 losses and log-sum-exps only, `ctx.save_for_backward(logits,
#   logsumexp, labels)` keeps the logits themselves and the backward's Triton kernel writes the gradient into them
#   (`return logits, ...`): no fp32 copy, no log-softmax (read at c3d6def6, 2023-11-30, and at HEAD, 2026-08).
#   Unsloth's only loss before 2024.11.7, and for steps of at most 1024 tokens from 2024.12.4 (b9fe2588e5:
#   `if bsz*q_len <= 1024: RETURN_LOGITS = True`) to 2025.10.9.
# - "cce": from 2024.11.7 (fa8e59eb1b, 2024-11-17) where unsloth-zoo's HAS_CUT_CROSS_ENTROPY holds (Apple's
#   cut_cross_entropy, an unsloth-zoo dependency from 2024-11-21, e5aab212; torch >= 2.4, triton >= 3, compute
#   capability >= 7.5), `fused_linear_cross_entropy` -> cut_cross_entropy.linear_cross_entropy: the logits are made
#   block by block in on-chip memory and never stored; only the hidden states' (and a trained head's) gradients.
# - "fused": from 2025.8.5 (806bee2433, 2025-08-13) unsloth-zoo's `unsloth_fused_ce_loss`
#   (fused_losses/cross_entropy_loss.py UnslothFusedLoss): the hidden states split into chunks, each chunk's logits
#   made, upcast and differentiated in the forward (torch.func.grad_and_value, compiled), the hidden states'
#   gradient (`grad_inputs`, their size and dtype) and a trained head's (`zeros_like(lm_head_weight)`) kept for
#   backward; no logits returned. From 2025.10.10 (0528b4ce71, 2025-10-26) for steps of any length.
UNSLOTH_CCE_FROM = (2024, 11, 7)
UNSLOTH_SMALL_STEPS_IN_PLACE = ((2024, 12, 4), (2025, 10, 10))  # steps of <= 1024 tokens keep the in-place kernel
UNSLOTH_SMALL_STEP_TOKENS = 1024
UNSLOTH_FUSED_LOSS_FROM = (2025, 8, 5)
CCE_TORCH_FROM = (2, 4)
# The chunk count (get_chunk_size) keeps a chunk's fp32 logits within target_gb, by default half the free GPU memory
# (`free_gb * 0.5`); unsloth-zoo d9fe1f43 (2026-07-06, required from unsloth 2026.7.1: unsloth_zoo>=2026.7.1) caps
# it at 4 GiB (`min(free_gb, 4.0)`). Half the free memory of a training GPU holds a step's whole fp32 logits, so
# before the cap the loss runs in one chunk.
UNSLOTH_FUSED_CHUNK_CAP_FROM = (2026, 7, 1)
UNSLOTH_FUSED_CHUNK_CAP_BYTES = 4.0 * GiB
# use_gradient_checkpointing="unsloth" (get_peft_model's default, models/llama.py) came with 2024.4 (4474e4bca4,
# 2024-04-08): models/_utils.py Unsloth_Offloaded_Gradient_Checkpointer moves each checkpointed block's input to the
# host (`hidden_states.to("cpu", non_blocking=True)`) and back in its backward; unsloth-zoo's gradient_checkpointing.py
# does the same through pinned CPU_BUFFERS and two GPU staging buffers (GPU_BUFFERS, GPU_BUFFERS_B). Before, True:
# torch's checkpoint, the inputs kept on the GPU.
UNSLOTH_OFFLOADED_CHECKPOINTING_FROM = (2024, 4)


def unsloth_loss_kernel(
    framework_version: tuple[int, ...] | None, torch_version: tuple[int, ...] | None, tokens: int
) -> str:
    """Which of Unsloth's losses ("in-place", "cce", "fused": see above) a causal LM's step of `tokens` tokens runs
    at this Unsloth release (None: the newest described) and torch release (None: a current one)."""
    v = framework_version
    small_in_place = v is not None and UNSLOTH_SMALL_STEPS_IN_PLACE[0] <= v < UNSLOTH_SMALL_STEPS_IN_PLACE[1]
    if v is not None and (v < UNSLOTH_CCE_FROM or (small_in_place and tokens <= UNSLOTH_SMALL_STEP_TOKENS)):
        return "in-place"
    if v is None or v >= UNSLOTH_FUSED_LOSS_FROM:
        return "fused"
    return "cce" if torch_version is None or torch_version[:2] >= CCE_TORCH_FROM else "in-place"


def unsloth_fused_chunk_bytes(framework_version: tuple[int, ...] | None) -> float | None:
    """The most fp32 logits one chunk of Unsloth's fused loss holds at this release (None: no cap, one chunk)."""
    if framework_version is None or framework_version >= UNSLOTH_FUSED_CHUNK_CAP_FROM:
        return UNSLOTH_FUSED_CHUNK_CAP_BYTES
    return None


def unsloth_offloads_checkpoints(framework_version: tuple[int, ...] | None) -> bool:
    """Whether Unsloth's default checkpointing keeps the checkpointed blocks' inputs on the host at this release."""
    return framework_version is None or framework_version[:2] >= UNSLOTH_OFFLOADED_CHECKPOINTING_FROM
