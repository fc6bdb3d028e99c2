"""Reading published training-memory measurements (CSV) as the model.yaml each run's user would write.

Each row of a measurements CSV (schema: shared/data/README.md) describes a run in free text. `interpret_row`
turns it into a model.yaml (JobSpec) planned as fsbatch plans it, `measurement` into what was measured, or
RowError with the reason, which the converter (eval/convert.py) records as a failure: no row is dropped.

The run's settings are read from its settings columns (eval/reading.py parses the phrasings). The framework and
torch version a row ran are named where its source names them: in the settings columns first, else in any other
free-text column (metric, GPU, source, location, quote, notes), read as words, never matched to a
particular source.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.eval import reading
from frenzy_slurm.eval.cases import Confidence, Measurement
from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.jobspec.job import FrameworkName, Method, Optimizer, OptimizerName
from frenzy_slurm.marp import job_overheads, pinned_plan, workload_from_spec
from frenzy_slurm.marp.framework_facts import LITGPT_FIRST_RELEASE_DATE
from frenzy_slurm.marp.frameworks import PROFILES, UNMODELLED
from frenzy_slurm.marp.overheads import EAGER_LOADING_CONTEXT_GIB, LAZY_LOADING_CONTEXT_GIB, Overheads
from frenzy_slurm.marp.params import count_params
from frenzy_slurm.marp.plan import Metric, ParallelPlan, Recompute, Workload

REQUIRED_COLUMNS = (
    "row_id",
    "category",
    "model",
    "params_B",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "vocab",
    "tied_emb",
    "seq_len",
    "micro_batch",
    "num_gpus",
    "precision",
    "optimizer",
    "parallelism",
    "sharding_offload",
    "activation_ckpt",
    "attention_impl",
    "compile",
    "other_settings",
    "value_GiB",
    "metric_type",
    "source",
    "confidence",
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
    """A row as fsbatch would plan it: the model.yaml it describes (`spec`), the Workload and plan the product's
    functions give for it, and what was measured (`metric`)."""

    workload: Workload
    plan: ParallelPlan
    metric: Metric
    spec: JobSpec

    @property
    def overheads(self) -> Overheads:
        """The device overheads the product gives this model.yaml (the defaults of a pool without a site file)."""
        return job_overheads(self.spec)


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
            rows.append(
                MeasuredRow(
                    raw["row_id"],
                    raw["category"].strip(),
                    raw["confidence"].strip().lower(),
                    raw["model"],
                    measured,
                    raw,
                )
            )
    return rows


# the free-text columns beside the settings, where a source may name the framework and its version
OTHER_TEXT_COLUMNS = ("gpu", "metric_measured", "unit", "source", "location", "quote", "notes")
SETTING_COLUMNS = (
    "model",
    "precision",
    "optimizer",
    "parallelism",
    "sharding_offload",
    "activation_ckpt",
    "attention_impl",
    "compile",
    "other_settings",
    "grad_accum_or_global_batch",
    "metric_type",
    "micro_batch",
    "seq_len",
)


def _first_int(text: str, what: str) -> int:
    m = re.search(r"\d+", text.replace(",", ""))
    if not m:
        raise RowError(f"{what} '{text}' has no number")
    return int(m.group())


def _gpu_count(text: str) -> int:
    """`8`, `8 GPUs`, `16 (2 nodes)`, `2x8`, `2 nodes x 8 GPUs`, `4 nodes of 8`, `8 GPUs per node x 2 nodes`,
    `1 node, 8 GPUs` -> GPUs in all. A count of GPUs, devices or ranks is the total unless it is per node."""
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text.lower()).replace("×", "x").replace(",", " ")
    gpus = r"(?:gpus?|devices|ranks|cards)"
    per_node = r"(\d+)\s*(?:" + gpus + r"?\s*(?:/|\bper\b|\ba\b|\beach\b)\s*node|" + gpus + r"\s+each\b)"
    m = re.search(per_node + r"\D{0,8}?(\d+)\s*nodes?", t) or re.search(r"(\d+)\s*nodes?\D{0,8}?" + per_node, t)
    if m:
        return int(m.group(1)) * int(m.group(2))
    m = re.search(r"(\d+)\s*(?:nodes?)?\s*(?:x|\*|of)\s*(\d+)", t)
    if m:
        return int(m.group(1)) * int(m.group(2))
    m = re.search(r"(\d+)\s*" + gpus + r"\b", t)
    if m and re.search(r"\d+\s*nodes?\b", t):  # `1 node, 8 GPUs`: the node count is not the GPU count
        return int(m.group(1))
    if re.match(r"\D*\d+\s*nodes?\b", t):
        raise RowError(f"num_gpus '{text}' counts nodes, not the GPUs in each")
    return _first_int(t, "num_gpus")


def _seq_len(text: str, stated: int | None) -> int:
    t = text.strip().lower()
    if t.startswith("variable") or (not t and stated is None):
        raise RowError(
            f"sequence length '{text}' is data-dependent and the longest sample (model.yaml's data.longest) is not "
            "stated"
        )
    if t.startswith("<="):
        if "truncat" in t:  # truncation at the bound: the longest padded batch reaches it
            return _first_int(t, "seq_len")
        raise RowError(
            f"sequence length '{text[:40]}...' is padded to the longest sample, which is not stated (model.yaml's "
            "data.longest)"
        )
    if not re.search(r"\d", t) and stated is not None:
        return stated
    # context sizes in K are K of 1024 tokens (2k = 2048, 128k = 131072), as models' context windows are quoted
    k = re.match(r"\D{0,24}?(\d+(?:\.\d+)?)\s*k\b", t)
    if k:
        return round(float(k.group(1)) * 1024)
    return _first_int(t, "seq_len")


# Architecture families by model name: the layer types their public implementations use.
_FAMILIES: tuple[tuple[str, str, dict[str, object]], ...] = (
    # encoder-decoder models as Hugging Face transformers 5.17 builds them (jobspec/hf.py: their config keys):
    # T5 and its descendants (mT5, Flan-T5, T0) with the relative position bias, RMS-style norms, no biases and
    # dropout_rate inside the FFN too; BART/mBART with learned positions, LayerNorm, biases, GELU
    (
        r"\bt5\b|flan[- ]t5|\bmt5\b|\bt0(?:_|\b)|\bumt5\b",
        "t5",
        dict(position="relative", norm="rmsnorm", bias="none", dropout=0.1, activation_dropout=0.1),
    ),
    (
        r"\bm?bart\b",
        "bart",
        dict(position="learned", norm="layernorm", bias="all", dropout=0.1, max_positions=1024, tied_embeddings=True),
    ),
    (r"pegasus|marian|encoder[- ]decoder", "encoder-decoder", {}),
    (
        r"\bbert\b|roberta|electra|deberta|bert[- ]",
        "bert",
        dict(norm="layernorm", position="learned", bias="all", dropout=0.1, max_positions=512),
    ),
    (
        r"gpt[- ]?2|distilgpt|nanogpt|\bopt[- ]\d|gpt[- ]neo\b",
        "gpt2",
        dict(norm="layernorm", position="learned", bias="all", dropout=0.0, max_positions=1024, tied_embeddings=True),
    ),
    (r"phi[- ]?[12]|falcon|stablelm|gpt[- ]?neox|pythia|gpt[- ]?j", "neox", dict(norm="layernorm")),
)


def _family(raw: dict[str, str]) -> tuple[str, dict[str, object]]:
    text = (raw["model"] + " " + raw["other_settings"]).lower()
    for pattern, name, fields in _FAMILIES:
        if re.search(pattern, text):
            return name, dict(fields)
    return "llama", {}


def _arch(raw: dict[str, str]) -> Architecture:
    family, extra = _family(raw)
    if family == "encoder-decoder":
        raise RowError(
            "encoder-decoder model of a family MARP does not model (T5 and BART families are): its position "
            "encoding and layer types are not known"
        )
    cells = {k: reading.annotated_int(raw[k]) for k in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab")}
    if family in ("t5", "bart"):  # the layer cell gives both stacks (`24+24`)
        both = reading.stacks(raw["layers"])
        cells["layers"], extra["encoder_layers"] = (both[1], both[0]) if both else (None, 0)
    missing = [k for k in ("layers", "hidden", "heads", "ffn", "vocab") if cells[k] is None]
    if missing:
        raise RowError(f"architecture columns {', '.join(missing)} are not numbers")
    base: dict[str, object] = dict(
        layers=cells["layers"],
        hidden=cells["hidden"],
        heads=cells["heads"],
        kv_heads=cells["kv_heads"] or cells["heads"],
        ffn=cells["ffn"],
        vocab=cells["vocab"],
        tied_embeddings=raw["tied_emb"].strip().lower().startswith("yes"),
    )
    if family == "bert":
        text = raw["model"].lower()
        extra["head"] = "classification" if ("classification" in text or "sequenceclassification" in text) else "mlm"
    if family == "gpt2":
        extra["tied_embeddings"] = base["tied_embeddings"] or not raw["tied_emb"].strip().lower().startswith("no")
    base.update(extra)
    # the FFN's shape (gated with 3 matrices, or 2) and T5's head size (d_kv: 64 in t5-small to -large, 128 in
    # t5-3b and -11b, not hidden / heads) are chosen by matching the published parameter count
    shapes: list[dict[str, object]]
    if family in ("bert", "gpt2", "bart"):
        shapes = [{"activation": "gelu"}]
    elif family == "t5":
        h, n = int(cells["hidden"] or 0), int(cells["heads"] or 1)
        sizes = sorted({64, 128, h // n} - {0})
        shapes = [{"activation": act, "d_kv": d} for act in ("relu", "geglu") for d in sizes]
    else:
        shapes = [{"activation": "swiglu"}, {"activation": "gelu"}]
    try:
        target = float(raw["params_B"]) * 1e9
    except ValueError:
        target = 0.0
    options = []
    for shape in shapes:
        try:
            arch = Architecture.model_validate({**base, **shape})  # the row's cells, validated
        except ValidationError as exc:
            raise RowError(f"architecture is inconsistent: {exc.errors()[0]['msg']}") from None
        options.append((abs(count_params(arch).total(arch.layers) - target), arch))
    return min(options, key=lambda o: o[0])[1]


def _settings(raw: dict[str, str]) -> str:
    return " | ".join(raw.get(k, "") for k in SETTING_COLUMNS)


def _other_text(raw: dict[str, str]) -> str:
    return " | ".join(raw.get(k, "") for k in OTHER_TEXT_COLUMNS)


def _named_frameworks(raw: dict[str, str]) -> set[str]:
    """The frameworks the row names: a specific framework in its settings wins; where the settings name none (or
    only plain PyTorch/FSDP), the frameworks its other free-text columns name."""
    named = reading.frameworks(_settings(raw))
    if named - {"torch"}:
        return named
    return named | reading.frameworks(_other_text(raw))


def _torch_version(raw: dict[str, str]) -> tuple[int, int] | None:
    """The torch version the row states, in its settings or else in its other free-text columns."""
    return reading.torch_version(_settings(raw)) or reading.torch_version(_other_text(raw))


def _framework_version(raw: dict[str, str], framework: FrameworkName) -> tuple[int, ...] | None:
    """entry.framework_version of a Hugging Face row: the transformers release it states or its framework's release
    pins (reading.transformers_version), in its settings or else its other free-text columns; of an llm.c row (a
    program without releases, versioned by the date of its source) the date the row states; of a torchtitan row
    the date, or month, its run was reported (torchtitan had no release before 0.1.0, 2025-06, and a snapshot is
    named by its date: marp/framework_facts.py); of an Unsloth row the release it names or the month of the date it
    states (reading.unsloth_release); of a litgpt row the date it states, where that is before litgpt's
    first release (lit-gpt's snapshots, named by date; a later date names no release); None otherwise (the newest
    release the profile describes, as for any model.yaml that does not say)."""
    if framework == "llm.c":
        return reading.stated_date(_settings(raw)) or reading.stated_date(_other_text(raw))
    if framework == "torchtitan":
        return reading.stated_month(_settings(raw)) or reading.stated_month(_other_text(raw))
    if framework == "unsloth":  # its release, year.month.patch, or the month of the date the row states
        return reading.unsloth_release(_settings(raw)) or reading.unsloth_release(_other_text(raw))
    if framework == "litgpt":  # lit-gpt's snapshots before its first release are named by date (framework_facts)
        for text in (_settings(raw), _other_text(raw)):
            found = reading.stated_date(text) or reading.stated_us_date(text)
            if found and found < LITGPT_FIRST_RELEASE_DATE:
                return found
        return None
    if framework != "hf-trainer":
        return None
    return reading.transformers_version(_settings(raw)) or reading.transformers_version(_other_text(raw))


def _transformers_version(raw: dict[str, str], framework: FrameworkName) -> tuple[int, ...] | None:
    """entry.transformers_version of a row whose framework runs Hugging Face's model classes but is not the Trainer
    (whose release is entry.framework_version): the release it states, or the newest of the year it names beside
    them (reading.transformers_of_year); None otherwise."""
    if framework == "hf-trainer" or PROFILES[framework].model_code not in ("hf", "unsloth"):
        return None
    for text in (_settings(raw), _other_text(raw)):
        found = reading.transformers_version(text) or reading.transformers_of_year(text)
        if found:
            return found
    return None


def _module_loading(raw: dict[str, str]) -> dict[str, object]:
    """entry.env's CUDA_MODULE_LOADING where the row states the size of the CUDA context its reading includes: a
    context nearer the eager size (every kernel loaded at start) than the lazy one is what a user of that stack
    writes as CUDA_MODULE_LOADING: EAGER (the pool's eager_context_gib then counts, as fsbatch counts it)."""
    stated = reading.stated_context_gib(f"{_settings(raw)} | {_other_text(raw)}")
    if stated is None:
        return {}
    eager = stated > (EAGER_LOADING_CONTEXT_GIB + LAZY_LOADING_CONTEXT_GIB) / 2
    return {"env": {"CUDA_MODULE_LOADING": "EAGER" if eager else "LAZY"}}


# a ZeRO stage however written: ZeRO-3, ZeRO3, zero stage 3, ZeRO (stage 3), ZeRO stage-3, DeepSpeed Z3,
# DeepSpeed stage 3, zero_optimization.stage=3
_ZERO_STAGE = re.compile(
    r"(?:zero[- _]?(?:optimization)?[-_ (.:=]{0,3}(?:stage)?[-_ (.:=]{0,3}([0-3])|\bz([0-3])|"
    r"deepspeed\W{1,3}stage\W{0,3}([0-3]))\b(?!\s*(?:gpus?|nodes?|ranks?|x\b|-way))|\bstage[- _]?([0-3])\W{1,3}zero"
)


def _zero_stage(text: str, sharded: bool) -> int:
    m = _ZERO_STAGE.search(text)
    if m:
        return int(next(g for g in m.groups() if g is not None))
    if re.search(r"shard_grad_op|grad(?:ient)?s? and optimizer|zero2", text):
        return 2
    # (Megatron's "no distributed optimizer" keeps every state on every data-parallel rank)
    distributed = re.search(r"distributed[ _-]optimi[sz]er", text) and not re.search(
        r"\b(?:no|not|without)[ _-]+(?:use[ _-])?distributed[ _-]optimi|"
        r"distributed[ _-]optimi[sz]er\s*[:=]\s*(?:false|0)",
        text,
    )
    if distributed or re.search(r"optimizer state sharding|zero1", text):
        return 1
    return 3 if sharded else 0


def _plan(
    raw: dict[str, str], gpus: int, mb: int, ga_stated: int | None, gbs: int | None, local_batch: int | None
) -> tuple[ParallelPlan, bool]:
    """The parallel plan the row states; returns (plan, activation offload)."""
    text = " ".join(raw[k] for k in ("parallelism", "sharding_offload", "other_settings")).lower()
    # (a degree the row marks as assumed is planned as written; the measurement records it as assumed)
    par = reading.parallelism(text)
    if re.search(r"if devices\s*>\s*1", text) and gpus == 1:
        par = reading.Parallelism(single=True)
    tp, pp, cp = par.tp or 1, par.pp or 1, par.cp or 1
    if par.device_map:
        pp = gpus
    sharded = (
        bool(par.fsdp)
        or bool(
            re.search(
                r"fsdp|full[ _-]shard|fully_shard|zero|hsdp|sharded|\bz[1-3]\b|deepspeed\W{1,3}stage\W{0,3}[1-3]", text
            )
        )
        and not re.search(r"no (?:fsdp|zero|shard)|zero\W{0,3}(?:off|disabled|none|false)\b", text)
    )
    dp = par.fsdp or par.dp or max(1, gpus // (tp * pp * cp))
    if par.single:
        dp = tp = pp = cp = 1
    world = dp * tp * pp * cp
    if gpus and world != gpus:
        raise RowError(f"parallel degrees dp={dp} tp={tp} pp={pp} cp={cp} multiply to {world}, not num_gpus={gpus}")
    # a sharded run shards over its data-parallel ranks, or over the context-parallel ones too where FSDP's
    # mesh spans them (FSDP over 1 x CP 8 still shards the states over 8 ranks)
    zero = _zero_stage(text, sharded) if dp > 1 or par.shard_group or (cp > 1 and sharded) else 0
    if par.shard_group is None and re.search(r"hybrid[_ -]shard|hsdp", text) and dp > 1:
        # FSDP HYBRID_SHARD shards within a node and replicates across nodes
        per_node = re.search(r"(\d+)\s*(?:gpus?)?\s*(?:per|/)\s*node", text + " " + raw["num_gpus"].lower())
        par.shard_group = min(dp, int(per_node.group(1)) if per_node else 8)
    offload, offload_params = _offload(raw, zero)
    mb, ga = _accumulation(par, pp, dp, mb, ga_stated, gbs, local_batch)
    ac = raw["activation_ckpt"].lower()
    try:
        plan = ParallelPlan(
            dp=dp,
            tp=tp,
            pp=pp,
            cp=cp,
            zero=zero,
            micro_batch=mb,
            grad_accum=ga,
            # not stated: what model.yaml gives when it says nothing (on whenever tp > 1)
            sequence_parallel=par.sequence_parallel is not False and tp > 1,
            recompute=_recompute(raw),
            offload_optimizer=offload and zero >= 1,
            offload_params=offload_params,
            shard_group=par.shard_group if par.shard_group and dp % par.shard_group == 0 else None,
            # device_map: naive model parallelism, the stages run one after another (no pipeline schedule)
            schedule="sequential"
            if par.device_map
            else par.schedule or ("interleaved" if par.virtual_stages else "1f1b"),
            virtual_stages=par.virtual_stages or 1,
        )
    except ValidationError as exc:
        raise RowError(f"parallel setup cannot be expressed: {exc.errors()[0]['msg']}") from None
    act_offload = "offload" in ac and not re.search(r"\bno\b[^,;]{0,12}offload", ac)
    return plan, act_offload


def _stated_sequence_parallel(raw: dict[str, str]) -> bool | None:
    text = " ".join(raw[k] for k in ("parallelism", "sharding_offload", "other_settings")).lower()
    return reading.parallelism(text).sequence_parallel


def _offload(raw: dict[str, str], zero: int) -> tuple[bool, bool]:
    """(optimizer states offloaded, parameters offloaded too) as the row states them."""
    text = raw["sharding_offload"].lower() + " " + raw["other_settings"].lower()
    offload = bool(re.search(r"offload", text)) and not re.search(
        r"\b(no|not|without|w/o)\b[^,;.]{0,16}offload|offload\w*(?:\s+to\s+cpu)?\s*[:=]?\s*(?:off|false|none|disabled|no|not)\b",
        text,
    )
    # FSDP's CPU offload is one switch that moves the parameters with the optimizer (marp.frameworks
    # fsdp_offloads_parameters); DeepSpeed's ZeRO offloads the optimizer alone unless the parameters are named
    fsdp = bool(re.search(r"fsdp|fullyshardeddataparallel|fully_shard", text)) and not re.search(
        r"zero|deepspeed", text
    )
    return offload, offload and zero == 3 and (fsdp or bool(re.search(r"param|fsdp cpu offload|cpu offload \(", text)))


def _accumulation(
    par: reading.Parallelism, pp: int, dp: int, mb: int, ga_stated: int | None, gbs: int | None, local: int | None
) -> tuple[int, int]:
    """(micro-batch, gradient accumulation): a local batch split into the pipeline's micro-batches, the stated
    accumulation, or the global batch over dp x micro-batch."""
    if local and pp > 1:
        micro = par.microbatches or pp
        return max(1, local // micro), micro
    if ga_stated is not None:
        return mb, ga_stated
    if gbs:
        return mb, max(1, gbs // (mb * dp))
    return mb, par.microbatches or 1


def _recompute(raw: dict[str, str]) -> Recompute:
    ac = raw["activation_ckpt"].strip().lower()
    framework = _framework(_named_frameworks(raw))
    if framework == "torchtitan" and ("selective" in ac or re.search(r"\bsac\b", ac)):
        # torchtitan's selective checkpointing is per op (SelectiveAC: every other matmul and the attention output
        # kept); a row that names a layer interval ("selective, every 2 layers") checkpoints whole blocks instead
        return "full" if re.search(r"every\s*\d+|\blayer\b", ac) else "op"
    if "selective" in ac or "attention only" in ac or "core attention" in ac:
        return "selective"
    said = reading.checkpointing(ac)
    if said is None:
        prof = PROFILES[framework]
        if "default" in ac and prof.shipped_checkpointing is not None:
            return (
                prof.shipped_checkpointing
            )  # what the shipped configs set (torchtune's enable_activation_checkpointing)
        if _unstated(ac) and prof.unset_checkpointing is not None:
            return prof.unset_checkpointing  # what the framework runs when nobody turns it on
        raise RowError(f"activation checkpointing is not stated ('{raw['activation_ckpt']}')")
    return "full" if said else "none"


def _unstated(text: str) -> bool:
    """A cell that says the source does not state the setting (or says only that it is a default)."""
    t = text.strip().lower()
    return not t or t.startswith(UNSTATED) or bool(re.search(r"\bdefault\b", t))


# how a settings cell says the source leaves the setting out
UNSTATED = ("unclear", "not stated", "unknown", "n/a")


def assumed_settings(raw: dict[str, str]) -> list[str]:
    """The settings a row marks as assumed by whoever wrote it down, or leaves unstated (then the framework's
    default is planned): the measurement records them and the benchmark scores the row as low confidence."""
    out = [
        k for k in (*SETTING_COLUMNS, "num_gpus") if re.search(r"\bassumed\b|\bguess(?:ed)?\b", raw.get(k, "").lower())
    ]
    out += [
        k
        for k in ("optimizer", "sharding_offload", "activation_ckpt")
        if raw.get(k, "").strip().lower().startswith(UNSTATED)
    ]
    return sorted(set(out))


def _lora(raw: dict[str, str], method: str, fws: set[str]) -> tuple[int, tuple[str, ...]]:
    text = " ".join(raw[k] for k in ("other_settings", "optimizer", "parallelism", "model"))
    rank, targets = reading.lora_setting(text)
    named = reading.named_config_lora(text)
    if named is None and "torchtune" in fws:
        m = re.search(r"llama[- ]?(\d)(?:\.(\d))?[- ](\d+)b", raw["model"].lower())
        if m:
            key = f"llama{m.group(1)}_{m.group(2) or 0}/{m.group(3)}b_{'qlora' if method == 'qlora' else 'lora'}"
            named = reading.TORCHTUNE_LORA.get(key) or reading.TORCHTUNE_LORA.get(key.replace("qlora", "lora"))
    if named:
        rank = rank or named[0]
        targets = targets or named[1]
    # PEFT's LoraConfig defaults (r=8, query and value projections) where nothing is stated
    return rank or 8, targets or ("q", "v")


def _method(category: str) -> Method:
    cat = category.lower()
    return "qlora" if "qlora" in cat else ("lora" if "lora" in cat else "full")


def _stated_batch(raw: dict[str, str]) -> reading.Batch:
    # (one cell's words do not run into the next cell's number: `1 accumulation steps | 4 ...`)
    return reading.batch(
        " | ".join(raw[k] for k in ("grad_accum_or_global_batch", "other_settings", "micro_batch", "seq_len"))
    )


def _precision(raw: dict[str, str]) -> reading.PrecisionReading:
    prec = reading.precision(raw["precision"] + " " + raw["other_settings"])
    if prec.precision is None:
        raise RowError(f"precision '{raw['precision']}' is not recognised")
    return prec


def _optimizer(raw: dict[str, str]) -> tuple[OptimizerName, str | None, bool]:
    """(model.yaml's optimizer name, its implementation where stated, stepped in backward) from the row's words."""
    opt_text = raw["optimizer"].lower()
    if opt_text.strip().startswith(UNSTATED):
        return "adamw", None, False  # model.yaml's default, the frameworks' own (assumed_settings records it)
    optimizer: Optimizer = "adamw"
    if "8bit" in opt_text or "8-bit" in opt_text:
        optimizer = "adam-8bit"
    elif "adafactor" in opt_text:
        optimizer = "adafactor"
    elif "sgd" in opt_text:
        optimizer = "sgd-momentum" if "momentum" in opt_text else "sgd"
    elif re.search(r"\blion\b|adagrad|rmsprop", opt_text):
        optimizer = "sgd-momentum"  # one state per parameter (Lion's momentum, Adagrad's sum, RMSprop's square avg)
    elif not re.search(r"adam|lamb|\bdefault|\(config\)", opt_text) and opt_text.strip():
        raise RowError(f"optimizer '{raw['optimizer']}' has no state model in MARP")
    # the optimizer stepped in backward (torchtune's optimizer_in_bwd, "AdamW fused into backward"); another
    # setting's identifier that ends in _in_bwd (torchao's force_recompute_fp8_weight_in_bwd) says nothing of it
    said = re.sub(
        r"\b(?!optimi[sz]er)[a-z0-9]+(?:_[a-z0-9]+)*_in_bwd\b", " ", opt_text + " " + raw["other_settings"].lower()
    )
    # (`in backward` in the optimizer's own cell; elsewhere only where the optimizer or its step is the subject, not
    # `activations recomputed in backward`)
    in_bwd = (
        any(k in said for k in ("in bwd", "in_bwd", "into backward"))
        or bool(re.search(r"\b(?:in|during)[ _-](?:the[ _-])?backward\b", opt_text))
        or bool(re.search(r"optimi[sz]er[ _-](?:step[ _-])?(?:in|during)[ _-](?:the[ _-])?backward\b", said))
    )
    # The implementation where the row states it; else the framework's default (its profile). A row that ran
    # DeepSpeed ran its own config, whose Adam/AdamW is DeepSpeed's FusedAdam (the profile's default).
    impl: str | None = None
    opt_text = re.sub(r"\b(?:fused|foreach)\s*[:=]\s*(?:false|0|no|none)\b", " ", opt_text)  # switched off
    if re.search(r"foreach", opt_text):
        impl = "foreach"
    elif re.search(r"fused(?!\s*into)(?! in)|apex|adamw_torch_fused", opt_text) and not in_bwd:
        impl = "fused"
    if "paged" not in opt_text:
        return optimizer, impl, in_bwd
    paged = {"adamw": "paged-adamw", "adam-8bit": "paged-adamw-8bit"}.get(optimizer)
    if paged is None:
        raise RowError(f"optimizer '{raw['optimizer']}' is paged but has no paged variant MARP models")
    return paged, impl, in_bwd  # type: ignore[return-value]  # the literal names above


def _row_plan(
    raw: dict[str, str], stated: reading.Batch, gpus: int, mb: int, local_batch: int | None
) -> tuple[ParallelPlan, bool]:
    ga_cell = raw["grad_accum_or_global_batch"].strip()
    ga = stated.grad_accum if stated.grad_accum is not None else (int(ga_cell) if ga_cell.isdigit() else None)
    named_gbs = reading.named_config_global_batch(
        " ".join(raw[k] for k in ("grad_accum_or_global_batch", "other_settings"))
    )
    own = reading.batch(ga_cell)
    if re.search(r"\d", ga_cell) and not ga_cell.isdigit() and own.grad_accum is None and own.global_batch is None:
        # (`batch 512`: a global batch or one rank's? a person cannot tell either, so it is not guessed)
        raise RowError(
            f"grad_accum_or_global_batch '{ga_cell}' names neither a gradient accumulation nor a global batch"
        )
    return _plan(raw, gpus, mb, ga, stated.global_batch or named_gbs, local_batch)


def _loss_chunks(raw: dict[str, str], framework: FrameworkName, config_defaults: bool) -> int | None:
    """A row that says it ran a torchtune shipped config's defaults runs what those files set (the profile's
    CEWithChunkedOutputLoss) unless it names its loss; a row that lists its own settings ran a plain loss unless
    it names the chunked one. litgpt's scripts chunk the loss by 128 tokens whatever else is said (its profile)."""
    other = raw["other_settings"].lower()
    if framework == "litgpt":
        return None
    if "chunked" in other:
        return 8  # torchtune's CEWithChunkedOutputLoss: 8 chunks
    if not config_defaults or re.search(r"cross[- _]?entropy|\bce\b|\bloss\b", other):
        return 1
    return None


def _lora_block(raw: dict[str, str], method: Method, fws: set[str], settings: str, config_defaults: bool) -> dict:
    rank, targets = _lora(raw, method, fws) if method != "full" else (16, ("q", "v"))
    text = settings.lower()
    lora: dict[str, object] = {"rank": rank, "targets": list(targets)}
    if not config_defaults:
        lora["dropout"] = 0.05  # the LoRA dropout of PEFT's examples; torchtune's configs set 0.0 (its profile)
    double_quant = bool(re.search(r"nf4[-_]dq|double[- _]quant", text))
    if re.search(r"bnb|bitsandbytes", text):
        lora["quantizer"] = "bitsandbytes"
        lora["double_quant"] = double_quant
    elif double_quant:
        lora["double_quant"] = True
    return lora


# what each metric is called, in the order tried where a cell names several at one place
_METRIC_WORDS = (
    ("device", r"nvml|nvidia[- _]?smi"),
    ("reserved", r"reserved|unspecified|not specified|not stated"),
    ("allocated", r"allocated|active"),
)


def _metric(raw: dict[str, str]) -> Metric:
    """What the row measured: the metric its metric_type cell names first (`max_allocated (+max_reserved in
    secondary)` measured allocated memory, the reserved one is beside it); an unspecified one is read as reserved
    (PyTorch's memory reports lead with it); a program's own report of its device memory as the device's."""
    text = raw["metric_type"].lower()
    named = [(m.start(), metric) for metric, pattern in _METRIC_WORDS for m in [re.search(pattern, text)] if m]
    if named and min(named)[1] == "device":
        return "device"
    if not named and re.search(r"device memory|nvidia-smi|nvml|cudamemgetinfo", raw.get("metric_measured", "").lower()):
        return "device"  # a program's own report of its device memory (the process's share of the GPU)
    if named:
        return min(named)[1]  # type: ignore[return-value]  # the literal names above
    raise RowError(f"metric '{raw['metric_type']}' is not one MARP predicts")


def _sharding(plan: ParallelPlan, raw: dict[str, str]) -> str:
    """model.yaml's sharding name for the row's plan: DeepSpeed's ZeRO stages where the row names ZeRO or DeepSpeed,
    FSDP's names otherwise (under hf-trainer the name picks the backend)."""
    text = " ".join(raw[k] for k in ("parallelism", "sharding_offload", "other_settings")).lower()
    if plan.zero == 0:
        return "none"
    if plan.shard_group is not None and plan.zero == 3:
        return "hybrid-shard"
    if plan.zero == 1 or re.search(r"zero|deepspeed|\bz[1-3]\b", text):
        return f"zero{plan.zero}"
    return {2: "shard-grad-op", 3: "full-shard"}[plan.zero]


def _fsdp_version(raw: dict[str, str], framework: FrameworkName, sharding: str) -> dict[str, int]:
    """parallel.fsdp_version where the row's settings name one FSDP API's own names (reading.fsdp_api) and its
    framework runs both; nothing otherwise (the framework's default at its version: marp.frameworks)."""
    if sharding not in ("full-shard", "shard-grad-op", "hybrid-shard") or len(PROFILES[framework].fsdp_versions) < 2:
        return {}
    stated = reading.fsdp_api(" ".join(raw[k] for k in ("parallelism", "sharding_offload", "other_settings")))
    return {"fsdp_version": stated} if stated else {}


def _parallel_block(plan: ParallelPlan, stated_sp: bool | None, sharding: str) -> dict[str, object]:
    return {
        "sharding": sharding,
        "tp": plan.tp,
        "pp": plan.pp,
        "cp": plan.cp,
        **({"sequence_parallel": stated_sp} if stated_sp is not None and plan.tp > 1 else {}),
        "schedule": plan.schedule,
        # chunks per rank only where the row states them: else the framework's own (torchtitan: 2 under interleaved)
        **({"virtual_stages": plan.virtual_stages} if plan.virtual_stages > 1 else {}),
        "offload_optimizer": plan.offload_optimizer,
        "offload_params": plan.offload_params,
        **({"shard_group": plan.shard_group} if plan.shard_group else {}),
    }


def _target_len(raw: dict[str, str], arch: Architecture) -> dict[str, int]:
    """training.target_len of an encoder-decoder row: the decoder length its settings state (RowError where none
    does: the decoder's activations, logits and loss scale with it); nothing for other models."""
    if not arch.encoder_decoder:
        return {}
    stated = reading.target_length(" ".join(raw[k] for k in ("seq_len", "other_settings", "micro_batch")))
    if stated is None:
        raise RowError(
            f"decoder (target) length is not stated (seq_len '{raw['seq_len']}', other_settings "
            f"'{raw['other_settings'][:60]}'): model.yaml's training.target_len"
        )
    return {"target_len": stated}


def _training_block(
    raw: dict[str, str], row: MeasuredRow, plan: ParallelPlan, act_offload: bool, arch: Architecture
) -> dict:
    settings = _settings(raw)
    fws = _named_frameworks(raw)
    framework = _framework(fws)
    method = _method(row.category)
    prec = _precision(raw)
    optimizer, impl, in_bwd = _optimizer(raw)
    config_defaults = framework == "torchtune" and bool(
        re.search(
            r"\bconfig(?:uration)? defaults?\b|[\w/.-]+_(?:device|lora|qlora|full)\w*\s+defaults?\b", settings.lower()
        )
    )
    chunks = _loss_chunks(raw, framework, config_defaults)
    every = re.search(r"every\s*(\d+)(?:\w*\s*)?(?:layers?|blocks?)?", raw["activation_ckpt"].lower())
    checkpoint_every = int(every.group(1)) if every and plan.recompute == "full" else None
    return {
        "seq_len": _seq_len(raw["seq_len"], _stated_batch(raw).seq_len),
        **_target_len(raw, arch),
        "global_batch": plan.micro_batch * plan.grad_accum * plan.dp,
        "micro_batch": plan.micro_batch,
        "steps": 1,
        "precision": prec.precision,
        "optimizer": optimizer,
        "optimizer_in_backward": in_bwd,
        "attention": "eager" if "eager" in raw["attention_impl"].lower() else "sdpa",
        "activation_checkpointing": plan.recompute,
        "activation_offload": act_offload,
        "fp8": prec.fp8,
        "compile": reading.compiled(raw["compile"]) is True,
        "method": method,
        "lora": _lora_block(raw, method, fws, settings, config_defaults),
        **({"optimizer_impl": impl} if impl else {}),
        **({"loss_chunks": chunks} if chunks else {}),
        **({"checkpoint_every": checkpoint_every} if checkpoint_every else {}),
    }


def _spec_data(row: MeasuredRow, raw: dict[str, str]) -> tuple[dict[str, object], ParallelPlan, Architecture]:
    """The model.yaml the row describes (as a mapping), the plan the row states, and its architecture."""
    for name in sorted(_named_frameworks(raw) & UNMODELLED.keys()):
        raise RowError(f"framework {name} is not modelled: {UNMODELLED[name]}")
    arch = _arch(raw)
    stated = _stated_batch(raw)
    local_batch = stated.local_batch if "local" in raw["micro_batch"].lower() else None
    mb = local_batch or _first_int(raw["micro_batch"], "micro_batch")
    # GPUs: the count stated, or the `devices` of the configuration file the row says it ran ("devices per X.yaml")
    gpus = reading.named_config_devices(raw["num_gpus"]) or _gpu_count(raw["num_gpus"])
    plan, act_offload = _row_plan(raw, stated, gpus, mb, local_batch)
    version = _torch_version(raw)
    framework = _framework(_named_frameworks(raw))
    release = _framework_version(raw, framework)
    hf = _transformers_version(raw, framework)
    sharding = _sharding(plan, raw)
    spec: dict[str, object] = {
        "name": re.sub(r"[^A-Za-z0-9._-]", "-", f"row-{row.row_id}")[:64],
        "model": {"arch": arch.model_dump(exclude_defaults=True)},
        "training": _training_block(raw, row, plan, act_offload, arch),
        "parallel": _parallel_block(plan, _stated_sequence_parallel(raw), sharding)
        | _fsdp_version(raw, framework, sharding),
        "entry": {
            "trainer": "script",
            "script": "train.py",
            "framework": framework,
            **({"framework_version": ".".join(map(str, release))} if release else {}),
            **({"torch_version": ".".join(map(str, version))} if version else {}),
            **({"transformers_version": ".".join(map(str, hf))} if hf else {}),
            **_module_loading(raw),
        },
        "limits": {"min_gpus": plan.world, "max_gpus": plan.world},
        **_data_block(raw),
    }
    return spec, plan, arch


def _data_block(raw: dict[str, str]) -> dict[str, object]:
    """model.yaml's `data:` for a row whose lengths vary (a truncation limit, padding to the longest, a longest
    sample): variable, with the samples' mean and standard deviation where the row states them."""
    if not reading.variable_lengths(raw["seq_len"]):
        return {}
    data: dict[str, object] = {"lengths": "variable"}
    stats = reading.length_statistics(" ".join(raw[k] for k in ("seq_len", "other_settings", "notes") if k in raw))
    if stats:
        data["mean"], data["sd"] = stats
    return {"data": data}


def _cells(row: MeasuredRow) -> dict[str, str]:
    """The row's cells, with the optional columns a CSV may lack read as empty, and each cell's runs of whitespace
    (double spaces, line breaks, padding) read as one space: how a cell is spaced states nothing."""
    return dict.fromkeys((*SETTING_COLUMNS, *OTHER_TEXT_COLUMNS), "") | {
        k: " ".join((v or "").split()) for k, v in row.raw.items() if k is not None
    }


def interpret_row(row: MeasuredRow) -> Interpreted:
    """The row as the model.yaml its run's user would write, planned as fsbatch plans it; RowError with the reason
    when the row's words do not say enough (or say something model.yaml cannot state)."""
    raw = _cells(row)
    spec, plan, arch = _spec_data(row, raw)
    try:
        job = JobSpec.model_validate(spec)
    except ValidationError as exc:
        raise RowError(f"the row's settings are not a valid model.yaml: {exc.errors()[0]['msg']}") from None
    # what fsbatch would do with that model.yaml: the same two functions, the plan from the same search
    try:
        workload = workload_from_spec(job, ResolvedModel(arch=arch, name=row.model))
        planned = pinned_plan(job, workload, plan.world)
    except InputError as exc:
        raise RowError(f"the row's model.yaml cannot be planned: {exc.message}") from None
    # what the row cannot state is the framework's: its default chunks per rank and where its split puts the
    # blocks left over
    unstated: dict[str, object] = {"layer_balance": planned.layer_balance}
    if plan.virtual_stages == 1:
        unstated["virtual_stages"] = planned.virtual_stages
    plan = plan.with_(**unstated)
    if planned != plan:
        raise RowError(f"the row's plan {plan.short()} is not one its model.yaml gives ({planned.short()})")
    return Interpreted(workload, plan, _metric(raw), job)


def measurement(row: MeasuredRow) -> Measurement:
    """What the row measured, as a case file's `measurement:` block (RowError when the value is not a number)."""
    raw = _cells(row)
    if not math.isfinite(row.measured_gib) or row.measured_gib <= 0:
        raise RowError(f"measured value '{raw.get('value_GiB', '')}' is missing or not positive")
    gpus = reading.named_config_devices(raw["num_gpus"]) or _gpu_count(raw["num_gpus"])
    source = " ".join(x for x in (raw.get("source", "").strip(), raw.get("location", "").strip()) if x)
    return Measurement(
        world_size=gpus,
        gpu=raw.get("gpu", "").strip() or "not stated",
        metric=_metric(raw),
        value_gib=row.measured_gib,
        source=source or "not stated",
        confidence=_confidence(row.confidence),
        category=row.category,
        assumed=assumed_settings(raw),
    )


def to_case(row: MeasuredRow) -> dict[str, object]:
    """The row as a case file's data: its model.yaml plus `measurement:` (RowError when it cannot be written)."""
    it = interpret_row(row)
    m = measurement(row).model_copy(update={"world_size": it.plan.world})
    return it.spec.model_dump(mode="json", exclude_defaults=True) | {
        "measurement": m.model_dump(mode="json", exclude_none=True)
    }


def _confidence(text: str) -> Confidence:
    word = text.split()[0] if text.split() else ""
    if word not in ("high", "medium", "low"):
        raise RowError(f"confidence '{text}' is not high, medium or low")
    return word  # type: ignore[return-value]  # checked above


def _framework(fws: set[str]) -> FrameworkName:
    """The framework a row ran, from the names in its settings (the first that applies: llm.c is a program of its
    own; DeepSpeed and Megatron
    decide how states are laid out whatever trains on top; torchtitan, torchtune and litgpt bring their own
    model code; Hugging Face otherwise; a plain PyTorch loop when nothing is named)."""
    for name, framework in (
        ("llm.c", "llm.c"),  # its own program: nothing else named runs its memory
        # its kernels replace the loss, checkpointing and LoRA of the transformers/TRL/PEFT it is named beside
        ("unsloth", "unsloth"),
        ("deepspeed", "deepspeed"),
        ("megatron", "megatron"),
        ("torchtitan", "torchtitan"),
        ("torchtune", "torchtune"),
        ("litgpt", "litgpt"),
        ("transformers", "hf-trainer"),
    ):
        if name in fws:
            return framework  # type: ignore[return-value]  # the literal names above
    return "torch"
