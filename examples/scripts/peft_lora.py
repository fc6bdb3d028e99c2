"""LoRA (or, with --qlora, QLoRA) fine-tune with PEFT and the Hugging Face Trainer, as frenzy-slurm plans it.

    fsbatch examples/scripts/peft_lora.yaml          # tiny random model, CPU or GPU
    fsbatch examples/llama3-8b-lora.yaml             # the same script on Llama-3.1-8B weights (--model)

This one reads the plan from the environment instead of flags: FRENZY_MICRO_BATCH, FRENZY_GRAD_ACCUM,
FRENZY_LEARNING_RATE, FRENZY_STEPS, FRENZY_LORA_RANK, FRENZY_PRECISION, FRENZY_RECOMPUTE, FRENZY_CHECKPOINT_DIR
(docs/runtime.md lists them all), and trains with plain data parallelism (LoRA's few trainable weights need no
ZeRO). Without `--model` the base model is a random Llama of the planned architecture (plan.json): no download.

QLoRA loads the frozen base in 4 bits with bitsandbytes, which needs a CUDA GPU: on a CPU node the script says
so and exits 2 before it loads anything.
"""

from __future__ import annotations

from frenzy_slurm import in_job  # first: the USR2/TERM handler is in place before the long imports

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

TARGETS = {  # model.yaml's training.lora.targets in Llama's module names
    "q": ["q_proj"],
    "k": ["k_proj"],
    "v": ["v_proj"],
    "o": ["o_proj"],
    "mlp": ["gate_proj", "up_proj", "down_proj"],
}


def env(name: str) -> str:
    return os.environ[f"FRENZY_{name}"]


def planned_config():
    from transformers import LlamaConfig

    arch = json.loads(Path(env("PLAN")).read_text())["arch"]
    return LlamaConfig(
        vocab_size=arch["vocab"],
        hidden_size=arch["hidden"],
        intermediate_size=arch["ffn"],
        num_hidden_layers=arch["layers"],
        num_attention_heads=arch["heads"],
        num_key_value_heads=arch.get("kv_heads") or arch["heads"],
        max_position_embeddings=arch["max_positions"],
    )


def lora_targets() -> list[str]:
    spec = json.loads(Path(env("PLAN")).read_text())["spec"]
    names = spec["training"].get("lora", {}).get("targets", ["q", "v"])
    return [m for t in names for m in TARGETS.get(t, [])]


def base_model(name: str | None, qlora: bool):
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    dtype = torch.bfloat16 if env("PRECISION").startswith("bf16") else torch.float32
    if not qlora:
        if name:
            return AutoModelForCausalLM.from_pretrained(name, torch_dtype=dtype)
        return LlamaForCausalLM(planned_config()).to(dtype)
    from peft import prepare_model_for_kbit_training
    from transformers import BitsAndBytesConfig

    quant = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if name is None:  # 4-bit loading goes through from_pretrained: save the random model first
        name = tempfile.mkdtemp(prefix="frenzy-qlora-base-")
        torch.manual_seed(int(env("SEED")))
        LlamaForCausalLM(planned_config()).save_pretrained(name)
    model = AutoModelForCausalLM.from_pretrained(name, quantization_config=quant, device_map={"": local})
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=env("RECOMPUTE") != "none")


def qlora_usable() -> str | None:
    """Why QLoRA cannot run here, or None."""
    if not torch.cuda.is_available():
        return "QLoRA needs a CUDA GPU (bitsandbytes' 4-bit kernels); this node has none"
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        return "QLoRA needs bitsandbytes in the job's Python: pip install bitsandbytes"
    return None


class TokenData(torch.utils.data.Dataset):
    """Synthetic learnable sequences x_t = (x_0 + t*k) mod V."""

    def __init__(self, vocab: int, seq_len: int, seed: int) -> None:
        self.vocab, self.seq_len, self.seed = vocab, seq_len, seed

    def __len__(self) -> int:
        return 1 << 20

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        x0, k = torch.randint(0, self.vocab, (2,), generator=g)
        x = (x0 + torch.arange(self.seq_len) * (k % 7 + 1)) % self.vocab
        return {"input_ids": x, "labels": x.clone()}


def write_summary(summary: dict) -> None:
    """JOBDIR/example-result.json (what tests/test_repo_examples_live.py reads) and one line in the job's output."""
    Path(os.environ["FRENZY_JOB_DIR"], "example-result.json").write_text(json.dumps(summary) + "\n")
    last = summary["loss"][-1] if summary["loss"] else float("nan")
    print(f"frenzy-example: step {summary['step']}/{summary['max_steps']}, loss {last:.4f}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="from_pretrained name or directory of the base model (default: random)")
    ap.add_argument("--qlora", action="store_true", help="4-bit frozen base (bitsandbytes, CUDA only)")
    ap.add_argument("--logging-steps", type=int, default=1)
    ns = ap.parse_args()
    if ns.qlora and (why := qlora_usable()) is not None:
        print(f"peft_lora.py: {why}. Run it on a GPU partition, or train LoRA without --qlora.", file=sys.stderr)
        return 2

    from peft import LoraConfig, get_peft_model
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class StopAtSignal(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # TrainerCallback's signature
            if in_job.stop_requested():
                control.should_save = control.should_training_stop = True
            return control

    rank = int(env("LORA_RANK"))
    model = get_peft_model(
        base_model(ns.model, ns.qlora),
        LoraConfig(
            r=rank, lora_alpha=2 * rank, lora_dropout=0.05, target_modules=lora_targets(), task_type="CAUSAL_LM"
        ),
    )
    if in_job.rank() == 0:
        model.print_trainable_parameters()
    args = TrainingArguments(
        output_dir=env("CHECKPOINT_DIR"),
        per_device_train_batch_size=int(env("MICRO_BATCH")),
        gradient_accumulation_steps=int(env("GRAD_ACCUM")),
        learning_rate=float(env("LEARNING_RATE")),
        max_steps=int(env("STEPS")),
        warmup_steps=int(env("WARMUP_STEPS")),
        seed=int(env("SEED")),
        bf16=env("PRECISION").startswith("bf16"),
        gradient_checkpointing=env("RECOMPUTE") != "none" and not ns.qlora,
        logging_steps=ns.logging_steps,
        save_strategy="steps",
        save_steps=int(env("CHECKPOINT_INTERVAL")) or int(env("STEPS")),
        report_to=[],
        disable_tqdm=True,
        use_cpu=not torch.cuda.is_available(),
    )
    data = TokenData(model.config.vocab_size, int(env("SEQ_LEN")), args.seed)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[StopAtSignal()])
    resume = in_job.latest_checkpoint()
    trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    if trainer.is_world_process_zero():
        losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        summary = {"step": trainer.state.global_step, "max_steps": args.max_steps, "loss": losses}
        write_summary(summary)
    if in_job.stop_requested():
        in_job.exit_for_requeue()
    return 0


if __name__ == "__main__":
    # the process group down after a barrier, then exit without the interpreter's teardown, where a finished
    # rank can abort on gloo's threads and make the job FAILED (in_job.finish)
    in_job.finish(main())
