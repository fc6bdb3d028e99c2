"""An encoder-decoder model's (T5, BART) saved activations: the encoder's blocks over the source, the decoder's over
the target with their cross-attention over the source, and the encoder's output, which every decoder block's
cross-attention reads.

The blocks' bytes per token are memory_activations' own terms: an encoder block is a self-attention and FFN block
over the source length (bidirectional attention saves what causal attention does), a decoder block the same over the
target length plus `cross_attention_bytes`. Hugging Face transformers 5.17 (models/t5/modeling_t5.py `T5Stack`,
`T5ForConditionalGeneration.forward`; models/bart/modeling_bart.py) runs the encoder, then the decoder with the
encoder's last hidden state as every cross-attention's key/value input, then the LM head and the loss over the
target; with gradient checkpointing each block is a checkpoint (`GradientCheckpointingLayer`), the encoder output
one of every decoder block's inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.marp.memory_activations import cross_attention_bytes, layer_activation_bytes
from frenzy_slurm.marp.memory_job import Job


@dataclass(frozen=True)
class EncDecBlocks:
    """Bytes per token of one block of each stack, and what the stacks share."""

    encoder: float  # an encoder block, per source token
    encoder_first: float  # the first encoder block, whose input (LoRA: the frozen embedding's) may need no gradient
    decoder: float  # a decoder block's self-attention and FFN, per target token
    decoder_first: float
    cross_target: float  # a decoder block's cross-attention, per target token
    cross_source: float  # ... per source token (k and v)
    encoder_output: float  # the encoder's final norm, dropout mask and output, per source token (once)
    layer_input: float  # a checkpointed block's input, per token
    mask: float  # bytes per dropout-mask element (0 without dropout)


def blocks(j: Job) -> EncDecBlocks:
    """The per-token terms of `j`'s two stacks (memory_activations' functions, at each stack's length)."""
    w, plan = j.w, j.plan
    a = w.arch
    args = (plan.tp, plan.sequence_parallel, plan.recompute, j.amp, 1)
    lora = w.method != "full"
    t = w.decoder_len  # the decoder's self-attention attends over the target
    enc = layer_activation_bytes(w, *args)
    dec = layer_activation_bytes(w, *args, keys=t)
    cross_t, cross_s = cross_attention_bytes(w, *args[:4], source_len=w.seq_len)
    norm_saved = (
        (4.0 + (0.0 if lora else j.e_act)) if (w.activations.norm_upcast and not w.activations.compile) else j.r
    )
    mask = (j.e_act if w.activations.dropout_mask_full_width else 1.0) if a.dropout > 0 else 0.0
    return EncDecBlocks(
        encoder=enc,
        encoder_first=layer_activation_bytes(w, *args, frozen_input=True) if lora else enc,
        decoder=dec,
        decoder_first=layer_activation_bytes(w, *args, frozen_input=True, keys=t) if lora else dec,
        cross_target=cross_t,
        cross_source=cross_s,
        encoder_output=(norm_saved + mask + j.r) * a.hidden / j.rep,
        layer_input=j.r * a.hidden / j.rep,
        mask=mask,
    )


def encdec_saved_activations(j: Job, n_layers: int, inflight: float) -> tuple[float, float, float, float]:
    """(saved activations, the block recomputed in backward, one block's backward working set, what the last
    block's backward to run with (nearly) every gradient made holds) of an encoder-decoder model's `n_layers` decoder
    blocks and its whole encoder (one stage: its plans have pp = 1). Full recomputation keeps each block's input,
    the encoder output the decoder's checkpoints read, and the masks and biases they take; selective
    recomputation drops the eager score matrices (memory_activations)."""
    w, plan, a = j.w, j.plan, j.w.arch
    if plan.pp > 1 or plan.cp > 1:
        raise InputError(
            f"plan {plan.short()}: pipeline stages and context parallelism of an encoder-decoder model (T5, BART) are "
            "not modelled; plan it with pp=1 and cp=1"
        )
    src = plan.micro_batch * w.seq_len  # source tokens per micro-batch
    tgt = j.tokens
    k = blocks(j)
    enc_layers = a.encoder_layers
    dec_block = k.decoder * tgt + k.cross_target * tgt + k.cross_source * src
    enc_block = k.encoder * src
    if plan.recompute == "full":
        ck_dec = n_layers if plan.recompute_layers is None else min(plan.recompute_layers, n_layers)
        kept = (
            enc_layers * k.layer_input * src
            + ck_dec * k.layer_input * tgt
            + (n_layers - ck_dec) * dec_block
            + k.encoder_output * src
        )
        recomputed = (
            dec_block  # the decoder's top block, recomputed as the backward starts (the encoder's: first_block)
        )
        # each checkpoint holds its block's inputs until its backward: beside the hidden states, the attention masks
        # (eager: float, batch x 1 x query x key; SDPA: bool) and the shared position biases of its stack (T5: the
        # relative bias, 1 x heads x query x key, and the cross-attention's zero bias, made to need a gradient
        # under checkpointing: modeling_t5.py T5Attention.forward)
        s, t = w.seq_len, w.decoder_len
        mask_e = j.e_act if w.activations.attention == "eager" else 1.0
        held = mask_e * plan.micro_batch * (s * s + t * t + t * s)
        if a.position == "relative":
            held += j.e_act * a.heads / plan.tp * (s * s + t * t + t * s)
        kept += held
        # the last block whose backward runs with (nearly) every gradient made is the encoder's top one, its stack's
        # checkpointed inputs, the encoder output and the held masks and biases still alive (measured on the CPU:
        # the peak of a checkpointed tiny T5 with dropout falls in the encoder's backward)
        first_block = (k.encoder + enc_layers * k.layer_input + k.encoder_output) * src + held
    else:
        kept = enc_layers * enc_block + n_layers * dec_block + k.encoder_output * src
        kept -= (k.encoder - k.encoder_first) * src + (k.decoder - k.decoder_first) * tgt
        recomputed = 0.0
        first_block = k.encoder_first * src
    if a.dropout > 0:
        # T5Stack's dropout of each stack's embedded input, and of the decoder's final norm output (the LM head's
        # input): an h-wide mask per token each
        kept += k.mask * a.hidden / j.rep * (src + 2 * tgt)
    if a.position == "relative":
        # each stack's relative-bias look-up (T5Attention.compute_bias) saves its bucket indices: int64, query x key
        # positions, one set per stack whatever the batch
        kept += 8.0 * (w.seq_len**2 + w.decoder_len**2)
    # one block's backward working set: the decoder's while the loss's and the decoder's backward run (the
    # backward-start moments), the encoder's in the encoder's backward, with every decoder tensor freed (the
    # backward-end moment: `first_block` carries what it adds over the decoder's)
    e = j.e_act
    dec_work = 2 * max(a.ffn, a.hidden) * e * tgt / plan.tp
    enc_work = 2 * max(a.ffn, a.hidden) * e * src / plan.tp
    if w.activations.attention == "eager":
        units = 3 if plan.recompute == "selective" else 2
        score = 4.0 if j.amp else e
        scores = units * a.heads * score / plan.tp
        dec_work = max(dec_work, scores * max(w.seq_len, w.decoder_len) * tgt)  # cross or self scores
        enc_work = max(enc_work, scores * w.seq_len * src)
    work = dec_work
    first_block += max(0.0, enc_work - dec_work)
    return kept * inflight, recomputed, work, first_block
