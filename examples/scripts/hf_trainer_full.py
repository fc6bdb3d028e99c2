"""Full fine-tune with the Hugging Face Trainer and DeepSpeed, as frenzy-slurm plans it.

    fsbatch examples/scripts/hf_trainer_full.yaml

model.yaml passes `$FRENZY_FRAMEWORK_ARGS`: the runtime turns it into the TrainingArguments flags of the plan
(--per_device_train_batch_size, --gradient_accumulation_steps, --learning_rate, --max_steps, --output_dir
$FRENZY_CHECKPOINT_DIR, --deepspeed $FRENZY_DS_CONFIG, whose batch and optimizer values are "auto" so HF fills
them from those flags). Without `--model` the model is a random Llama built from the architecture frenzy-slurm
planned (plan.json), so the example needs no download; `--model DIR_OR_NAME` loads real weights. The data are
synthetic, learnable sequences (or `--data FILE`, a flat uint16 token file).

Time limit: at USR2 (300 s before it) or TERM the Trainer saves a checkpoint and stops; after USR2 rank 0
requeues the job, and the next run resumes from the newest checkpoint-N (frenzy_slurm.in_job).
"""

from __future__ import annotations

from frenzy_slurm import in_job  # first: the USR2/TERM handler is in place before the long imports

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import (
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


@dataclass
class ScriptArgs:
    model: str | None = field(default=None, metadata={"help": "from_pretrained name or directory; default random"})
    data: str | None = field(default=None, metadata={"help": "flat uint16 token file; default synthetic"})
    seq_len: int = field(default=int(os.environ.get("FRENZY_SEQ_LEN", "128")), metadata={"help": "tokens/sample"})


class TokenData(torch.utils.data.Dataset):
    """Synthetic x_t = (x_0 + t*k) mod V (learnable, so the loss falls), or windows of a token file."""

    def __init__(self, vocab: int, seq_len: int, path: str | None, seed: int) -> None:
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed
        self.tokens = np.memmap(path, dtype=np.uint16, mode="r") if path else None

    def __len__(self) -> int:
        return 1 << 20 if self.tokens is None else max(1, len(self.tokens) // self.seq_len)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.tokens is not None:
            x = torch.from_numpy(self.tokens[i * self.seq_len : (i + 1) * self.seq_len].astype(np.int64))
        else:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
            x0, k = torch.randint(0, self.vocab, (2,), generator=g)
            x = (x0 + torch.arange(self.seq_len) * (k % 7 + 1)) % self.vocab
        return {"input_ids": x, "labels": x.clone()}


def planned_model() -> LlamaForCausalLM:
    """A random Llama of the architecture frenzy-slurm planned (plan.json's `arch`)."""
    arch = json.loads(Path(os.environ["FRENZY_PLAN"]).read_text())["arch"]
    config = LlamaConfig(
        vocab_size=arch["vocab"],
        hidden_size=arch["hidden"],
        intermediate_size=arch["ffn"],
        num_hidden_layers=arch["layers"],
        num_attention_heads=arch["heads"],
        num_key_value_heads=arch.get("kv_heads") or arch["heads"],
        max_position_embeddings=arch["max_positions"],
        tie_word_embeddings=arch.get("tied_embeddings", False),
    )
    return LlamaForCausalLM(config)


class StopAtSignal(TrainerCallback):
    """Save and stop at the next step once Slurm's time-limit warning (USR2) or TERM has arrived."""

    def on_step_end(self, args, state, control, **kwargs):  # TrainerCallback's signature
        if in_job.stop_requested():
            control.should_save = True
            control.should_training_stop = True
        return control


def write_summary(summary: dict) -> None:
    """JOBDIR/example-result.json (what tests/test_repo_examples_live.py reads) and one line in the job's output."""
    Path(os.environ["FRENZY_JOB_DIR"], "example-result.json").write_text(json.dumps(summary) + "\n")
    last = summary["loss"][-1] if summary["loss"] else float("nan")
    print(f"frenzy-example: step {summary['step']}/{summary['max_steps']}, loss {last:.4f}", flush=True)


def main() -> int:
    argv = sys.argv[1:]
    if not torch.cuda.is_available():  # CPU nodes (the dev cluster): DeepSpeed's CPU accelerator over gloo
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        if "--use_cpu" not in argv:
            argv.append("--use_cpu")
    script, args = HfArgumentParser((ScriptArgs, TrainingArguments)).parse_args_into_dataclasses(argv)
    model = LlamaForCausalLM.from_pretrained(script.model) if script.model else planned_model()
    data = TokenData(model.config.vocab_size, script.seq_len, script.data, args.seed)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[StopAtSignal()])
    resume = in_job.latest_checkpoint()
    if resume is not None and trainer.is_world_process_zero():
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if trainer.is_world_process_zero():
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        summary = {
            "step": trainer.state.global_step,
            "max_steps": args.max_steps,
            "loss": losses,
            "deepspeed": trainer.is_deepspeed_enabled,
        }
        write_summary(summary)
    if in_job.stop_requested():
        in_job.exit_for_requeue()
    return 0


if __name__ == "__main__":
    # the process group down after a barrier, then exit without the interpreter's teardown, where a finished
    # rank can abort on gloo's threads and make the job FAILED (in_job.finish)
    in_job.finish(main())
