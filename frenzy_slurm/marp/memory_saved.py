"""What a stage holds of its saved activations at the peak: its blocks' tensors (memory_activations) times the
micro-batches in flight, per checkpointing policy, from the per-plan facts every term reads (memory_job's Job).
A module of its own: memory_job builds the Job with memory_activations, so this term cannot live there."""

from __future__ import annotations

from frenzy_slurm.marp.memory_activations import layer_activation_bytes, op_checkpointed_bytes
from frenzy_slurm.marp.memory_job import Job


def saved_activations(j: Job, i: int, n_layers: int, inflight: float) -> tuple[float, float, float]:
    """(saved activations, the block recomputed in backward, one block's backward working set), per the
    checkpointing policy: full recomputation keeps each checkpointed block's input (recompute_layers < all: the
    rest keep everything), activation offload about two blocks' tensors in transfer; eager attention's backward
    holds score-sized gradients."""
    w, a, plan = j.w, j.w.arch, j.plan
    tp, cp, tokens = plan.tp, plan.cp, j.tokens
    per_layer_act = j.per_layer_act
    layer_input = j.r * a.hidden / j.rep
    recomputed = 0.0
    if plan.recompute == "op":
        kept_per_token = op_checkpointed_bytes(w, tp, plan.sequence_parallel, j.amp)
        acts = n_layers * kept_per_token * tokens * inflight
        # a block's backward: what its recomputation adds to the outputs it saved (those are reused, not made again)
        recomputed = max(0.0, per_layer_act - kept_per_token) * tokens
    elif plan.recompute == "full":
        ck = n_layers if plan.recompute_layers is None else min(plan.recompute_layers, n_layers)
        kept = (ck * layer_input + (n_layers - ck) * per_layer_act) * tokens * inflight
        if w.activations.activation_offload:  # offloaded to host memory, with about two blocks' tensors in transfer
            kept = min(2, n_layers) * layer_input * tokens
        elif w.activations.checkpoint_inputs_on_host:  # only the checkpointed blocks' inputs go to the host
            kept = (min(2, ck) * layer_input + (n_layers - ck) * per_layer_act) * tokens * inflight
        acts = kept
        recomputed = per_layer_act * tokens  # one block recomputed during its backward (not while the loss runs)
    elif w.activations.activation_offload:
        acts = min(2, n_layers) * per_layer_act * tokens
    else:
        acts = n_layers * per_layer_act * tokens * inflight
        stable_embedding = w.method == "qlora" and w.adapters.bnb_stable_embedding
        if i == 0 and w.method != "full" and n_layers and not stable_embedding:
            # the first block's input comes from LoRA's frozen embedding and needs no gradient
            first = layer_activation_bytes(w, tp, plan.sequence_parallel, plan.recompute, j.amp, cp, frozen_input=True)
            acts -= (per_layer_act - first) * tokens * inflight
        if i == 0 and stable_embedding:
            acts += 4.0 * a.hidden / j.rep * tokens * inflight  # StableEmbedding's fp32 LayerNorm input
    work = 2 * max(a.ffn, a.hidden) * j.e_act * tokens / tp  # gradient working set of one block's backward
    if w.activations.attention == "eager":
        # eager attention's backward holds two score-sized gradients (probs', scores') beside the saved
        # probabilities; selective recomputation rebuilds those probabilities first (one more)
        units = 3 if plan.recompute == "selective" else 2
        # (under autocast the softmax and its backward run in fp32, as its saved output is)
        score = 4.0 if j.amp else j.e_act
        work = max(work, units * a.heads * (w.seq_len // cp) * score * tokens / tp)
    if i == 0 and a.dropout > 0:
        acts += tokens  # embedding dropout mask (the embedding's output is the first block's saved input)
    if w.activations.unfused_rope and a.position == "rope" and w.activations.rope_tables_per_layer:
        # cos/sin of q and k, built per block; a fully recomputed block builds them again in backward, its forward
        # keeps only its input (the recorded step, tests/test_marp_step_requests.py)
        kept_layers = n_layers
        on_host = w.activations.activation_offload or w.activations.checkpoint_inputs_on_host
        if plan.recompute == "full" and not on_host:
            kept_layers -= n_layers if plan.recompute_layers is None else min(plan.recompute_layers, n_layers)
        acts += kept_layers * inflight * 2 * w.seq_len * a.head_dim * j.e_act
    return acts, recomputed, work
