"""Reading published training-memory measurements (CSV) into MARP workloads.

Each row of a measurements CSV (schema: shared/data/README.md) describes a run in
free text. `interpret_row` turns it into (Workload, ParallelPlan, Metric) or a
reason why it cannot, so the accuracy benchmark never drops a row silently.
"""

from __future__ import annotations

import csv
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from frenzy_slurm.marp.overheads import Overheads
from frenzy_slurm.marp.params import count_params
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Workload
from frenzy_slurm.spec.arch import Architecture

REQUIRED_COLUMNS = (
    "row_id", "category", "model", "params_B", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied_emb",
    "seq_len", "micro_batch", "num_gpus", "precision", "optimizer", "parallelism", "sharding_offload",
    "activation_ckpt", "attention_impl", "compile", "other_settings", "value_GiB", "metric_type", "source", "confidence",
)


class RowError(Exception):
    """This row cannot be interpreted; the message says why."""


@dataclass(frozen=True)
class MeasuredRow:
    row_id: str
    category: str
    confidence: str
    model: str
    measured_gib: float
    raw: dict[str, str]


@dataclass(frozen=True)
class Interpreted:
    workload: Workload
    plan: ParallelPlan
    metric: Metric
    overheads: Overheads


def read_measurements(path: Path) -> list[MeasuredRow]:
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing columns {', '.join(missing)} (schema: shared/data/README.md)")
        rows = []
        for raw in reader:
            try:
                measured = float(raw["value_GiB"])
            except ValueError:
                measured = float("nan")
            rows.append(MeasuredRow(raw["row_id"], raw["category"].strip(), raw["confidence"].strip().lower(),
                                    raw["model"], measured, raw))
    return rows


def _first_int(text: str, what: str) -> int:
    m = re.search(r"\d+", text.replace(",", ""))
    if not m:
        raise RowError(f"{what} '{text}' has no number")
    return int(m.group())


def _seq_len(text: str) -> int:
    t = text.strip().lower()
    if t.startswith("variable") or not t:
        raise RowError(f"sequence length '{text}' is data-dependent and the longest sample is not stated")
    if t.startswith("<="):
        if "truncat" in t:  # truncation at the bound: the longest padded batch reaches it
            return _first_int(t, "seq_len")
        raise RowError(f"sequence length '{text[:40]}...' is padded to the longest sample, which is not stated")
    return _first_int(t, "seq_len")


def _arch(raw: dict[str, str]) -> Architecture:
    text = " ".join(raw[k] for k in ("model", "other_settings")).lower()
    try:
        base = dict(
            layers=int(raw["layers"]), hidden=int(raw["hidden"]), heads=int(raw["heads"]),
            kv_heads=int(raw["kv_heads"] or raw["heads"]), ffn=int(raw["ffn"]), vocab=int(raw["vocab"]),
            tied_embeddings=raw["tied_emb"].strip().lower().startswith("yes"),
        )
    except ValueError as exc:
        raise RowError(f"architecture columns are not numbers ({exc})") from None
    if "bert" in text:
        base.update(norm="layernorm", position="learned", bias="all", dropout=0.1, max_positions=512,
                    head="classification" if "classification" in text else "mlm")
    # The FFN's shape (gated with 3 matrices, or 2) is chosen by matching the published parameter count.
    try:
        target = float(raw["params_B"]) * 1e9
    except ValueError:
        target = 0.0
    options = []
    for act in ("swiglu", "gelu"):
        try:
            arch = Architecture(**base, activation=act)
        except ValidationError as exc:
            raise RowError(f"architecture is inconsistent: {exc.errors()[0]['msg']}") from None
        options.append((abs(count_params(arch).total(arch.layers) - target), arch))
    return min(options, key=lambda o: o[0])[1]


def interpret_row(row: MeasuredRow, context_by_source: dict[str, float] | None = None) -> Interpreted:
    raw = row.raw
    cat = row.category.lower()
    method = "qlora" if "qlora" in cat else ("lora" if "lora" in cat else "full")
    arch = _arch(raw)
    seq = _seq_len(raw["seq_len"])
    mb = _first_int(raw["micro_batch"], "micro_batch")
    gpus = _first_int(raw["num_gpus"], "num_gpus")

    prec_text = raw["precision"].lower()
    framework = "deepspeed" if "deepspeed" in " ".join(raw.values()).lower() else "torch"
    if "pure" in prec_text or "true" in prec_text or "states bf16" in prec_text or prec_text.strip() == "bf16":
        precision = "bf16-pure"
    elif "fp16" in prec_text:
        precision = "fp16-mixed"
    elif "bf16" in prec_text:
        precision = "bf16-mixed"
    elif "fp32" in prec_text:
        precision = "fp32"
    else:
        raise RowError(f"precision '{raw['precision']}' is not recognised")

    for col in ("optimizer", "activation_ckpt", "sharding_offload"):
        if raw[col].strip().lower().startswith("unclear"):
            raise RowError(f"{col} is not stated by the source ('{raw[col]}')")
    opt_text = raw["optimizer"].lower()
    optimizer = "adamw"
    if "8bit" in opt_text or "8-bit" in opt_text:
        optimizer = "adam-8bit"
    elif "adafactor" in opt_text:
        optimizer = "adafactor"
    elif "sgd" in opt_text:
        optimizer = "sgd-momentum" if "momentum" in opt_text else "sgd"
    in_bwd = any(k in opt_text + raw["other_settings"].lower() for k in ("in bwd", "in_bwd", "into backward"))
    paged = "paged" in opt_text

    shard = (raw["parallelism"] + " " + raw["sharding_offload"]).lower()
    fsdp = "fsdp" in shard or "zero-3" in shard or "full shard" in shard
    dp = gpus if (fsdp or "dp" in shard) else 1
    zero = 3 if (fsdp and dp > 1) else 0
    offload = "cpu offload" in shard or "offload (params" in shard

    ac = raw["activation_ckpt"].lower()
    recompute = "none" if ac.startswith("no") else "full"
    act_offload = "offload" in ac

    other = raw["other_settings"].lower()
    everything = " ".join(raw.values()).lower()
    ga = 1
    ga_text = raw.get("grad_accum_or_global_batch", "").strip().lower()
    if ga_text.isdigit():
        ga = int(ga_text)
    elif re.match(r"(minibatch|gbs|global)", ga_text) and re.search(r"\d+", ga_text):
        ga = max(1, _first_int(ga_text, "global batch") // (mb * dp))
    rank_m = re.search(r"\br\s*=\s*(\d+)", other)
    rank = int(rank_m.group(1)) if rank_m else 16
    source = raw["source"].lower()
    fused = "torchtune" in source or "huggingface" in source or "transformers" in source
    litgpt = "litgpt" in source or "lit-gpt" in source
    # torch < 2.0 (runs published before 2023) zeroed gradients in place instead of freeing them
    old_torch = bool(re.search(r"\b20(1\d|2[0-2])\b", everything))
    chunks = 8 if "chunked" in other else 1
    if litgpt:  # litgpt's fine-tuning scripts compute the output layer in 128-token chunks
        chunks = max(1, -(-seq // 128))

    metric_text = raw["metric_type"].lower()
    metric: Metric
    if "nvml" in metric_text or "nvidia-smi" in metric_text:
        metric = "device"
    elif "reserved" in metric_text or "unspecified" in metric_text:
        metric = "reserved"
    elif "allocated" in metric_text or "active" in metric_text:
        metric = "allocated"
    else:
        raise RowError(f"metric '{raw['metric_type']}' is not one MARP predicts")

    attention = "eager" if "eager" in raw["attention_impl"].lower() else "sdpa"
    overheads = Overheads()
    if context_by_source and raw["source"] in context_by_source:
        overheads = Overheads(context_gib=context_by_source[raw["source"]])

    workload = Workload(
        arch=arch, seq_len=seq, precision=precision, optimizer=optimizer, attention=attention, method=method,
        lora_rank=rank, lora_targets=("q", "v"), loss_chunks=chunks,
        compile=raw["compile"].strip().lower().startswith("yes"), framework=framework, fused_optimizer=fused,
        optimizer_in_backward=in_bwd, activation_offload=act_offload, paged_optimizer=paged,
        norm_upcast=framework == "torch" and arch.norm == "rmsnorm", gqa_expand=framework == "torch" and arch.kv < arch.heads,
        zero_grad_to_none=not old_torch, hold_logits=framework == "torch",
        nf4_saves_inputs="torchtune" not in source,  # torchtune quantises with torchao's NF4 tensor
    )
    try:
        plan = ParallelPlan(dp=dp, zero=zero, micro_batch=mb, grad_accum=ga, recompute=recompute,
                            offload_optimizer=offload and zero >= 1, offload_params=offload and zero == 3)
    except ValueError as exc:
        raise RowError(f"parallel setup cannot be expressed: {exc}") from None
    return Interpreted(workload, plan, metric, overheads)


def contexts_from_notes(rows: list[MeasuredRow]) -> dict[str, float]:
    """CUDA-context sizes a source states ("Kernels alone: 'GPU memory occupied: 1343 MB'"), by source URL."""
    found: dict[str, float] = {}
    for row in rows:
        m = re.search(r"kernels alone[^0-9]*(\d+)\s*MB", row.raw.get("notes", ""), re.IGNORECASE)
        if m:
            found[row.raw["source"]] = int(m.group(1)) / 1024  # nvidia-smi "MB" are MiB
    return found
