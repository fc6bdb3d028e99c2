"""Reading the free-text settings of a published measurement, as a careful person would.

Each function takes one or more cells of a measurements row and returns what they state, or None where
they state nothing. Nothing here looks at the source URL, the notes column or a year: a row is read
from its own settings (parallelism, batch, precision, optimizer, framework and configuration names).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from frenzy_slurm.jobspec.job import Precision
from frenzy_slurm.marp.plan import Schedule

# -------------------------------------------------------------------- numbers in cells


def annotated_int(text: str) -> int | None:
    """`50257 (padded 50304)` -> 50304; `32000 (padded)` -> 32000 rounded up to 128; `4,096` -> 4096.

    A padded vocabulary is what the embedding holds, so the padded size wins. Megatron pads to a multiple
    of 128 (make-vocab-size-divisible-by) when the size is not given.
    """
    t = text.replace(",", "").replace("_", "").strip().lower()
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*([km])?\b", t)
    if not m:
        return None
    value = float(m.group(1)) * {"k": 1e3, "m": 1e6, None: 1}[m.group(2)]
    padded = re.search(r"pad\w*\s*(?:to\s*)?(\d+)", t)
    if padded:
        return int(padded.group(1))
    if "pad" in t:
        return -(-int(value) // 128) * 128
    return int(value)


# -------------------------------------------------------------------- parallelism

_DEGREE_NAMES = {
    "dp": "dp",
    "ddp": "dp",
    "data": "dp",
    "data parallel": "dp",
    "data-parallel": "dp",
    "fsdp": "fsdp",
    "zero": "fsdp",
    "hsdp": "hsdp",
    "shard": "shard",
    "tp": "tp",
    "tensor": "tp",
    "tensor parallel": "tp",
    "tensor-parallel": "tp",
    "mp": "tp",
    "model parallel": "tp",
    "pp": "pp",
    "pipeline": "pp",
    "pipeline parallel": "pp",
    "pipeline-parallel": "pp",
    "stages": "pp",
    "cp": "cp",
    "context": "cp",
    "context parallel": "cp",
    "context-parallel": "cp",
    "ring": "cp",
    "sp": "sp",
    "sequence parallel": "sp",
    "ep": "ep",
    "expert": "ep",
    "expert parallel": "ep",
    "vpp": "vpp",
    "virtual": "vpp",
    "virtual pipeline": "vpp",
    "virtual stages": "vpp",
}
_NAME = (
    r"(dp|ddp|fsdp|hsdp|zero|tp|mp|pp|cp|sp|ep|vpp|data[- ]parallel|tensor[- ]parallel|pipeline[- ]parallel|"
    r"context[- ]parallel|sequence[- ]parallel|expert[- ]parallel|model parallel|virtual pipeline|"
    r"virtual stages|data|tensor|pipeline|context|expert|stages)"
)


@dataclass
class Parallelism:
    dp: int | None = None
    fsdp: int | None = None  # sharded data parallel degree (FSDP / ZeRO world)
    shard_group: int | None = None  # HSDP: ranks in one shard group
    tp: int | None = None
    pp: int | None = None
    cp: int | None = None
    sequence_parallel: bool | None = None  # None: not stated
    virtual_stages: int | None = None
    schedule: Schedule | None = None
    device_map: bool = False  # naive model parallelism: layers spread over GPUs, one active at a time
    single: bool = False
    microbatches: int | None = None

    def stated(self) -> bool:
        return any(v for v in (self.dp, self.fsdp, self.tp, self.pp, self.cp, self.device_map, self.single))


def _degree_spellings(t: str) -> str:
    """Configuration names of the degrees written as the plain names `_degrees` reads: Megatron's
    `tensor_model_parallel_size` / `--pipeline-model-parallel-size`, torchtitan's `context_parallel_degree` and
    `data_parallel_shard_degree` (its FSDP degree), `tensor_parallel_size`; glued abbreviations `TP8`, `CP2`."""
    t = re.sub(r"data[ _-]parallel[ _-]shard[ _-]degree", "fsdp", t)
    t = re.sub(
        r"\b(tensor|pipeline|context|data|expert|sequence)(?:[ _-]model)?[ _-]parallel(?:ism)?"
        r"(?:[ _-](?:size|degree))?",
        r"\1 parallel",
        t,
    )
    # (fsdp2 is FSDP's second API, not a degree: only these abbreviations take a glued number)
    return re.sub(r"\b(tp|pp|cp|dp|ep)(\d+)\b", r"\1=\2", t)


def _degrees(t: str) -> dict[str, int]:
    """Each parallel degree a lower-cased text names, by its canonical name (dp, fsdp, tp, pp, cp, ep, vpp, ...)."""
    found: dict[str, int] = {}
    m: re.Match[str] | None  # each pattern's match in turn
    t = _degree_spellings(t)
    # NAME = 8 / NAME 8 / NAME(alias)=8 / NAME: 8 / NAME of 8
    for m in re.finditer(
        _NAME + r"\s*(?:\((\w+)\))?\s*(?:degree|size)?\s*(?:=|:|of|\s)\s*(\d+)(?![\d.]*\s*(?:gb|gib|b\b|%))", t
    ):
        name = (
            _DEGREE_NAMES[m.group(1).replace("-", " ").strip()]
            if m.group(1) in _DEGREE_NAMES or m.group(1).replace("-", " ") in _DEGREE_NAMES
            else None
        )
        alias = m.group(2)
        if name is None:
            continue
        if alias in ("fsdp", "zero", "zero3", "zero-3") or (name == "dp" and alias == "fsdp"):
            name = "fsdp"
        found.setdefault(name, int(m.group(3)))
    # 8-way tensor parallel / 4 pipeline stages / 2 GPUs per shard group
    for m in re.finditer(
        r"(\d+)[- ]?(?:way)?\s+(data|tensor|pipeline|context|sequence|expert|fsdp|model)[- ]?"
        r"(?:parallel\w*|stages?|shards?)",
        t,
    ):
        name = _DEGREE_NAMES.get(m.group(2))
        if name:
            found.setdefault(name, int(m.group(1)))
    # 4-way TP, 8-way FSDP
    for m in re.finditer(r"(\d+)[- ]way\s+(dp|ddp|fsdp|tp|pp|cp|ep)\b", t):
        found.setdefault(_DEGREE_NAMES[m.group(2)], int(m.group(1)))
    m = re.search(r"(\d+)\s*(?:pipeline\s*)?stages", t)
    if m:
        found.setdefault("pp", int(m.group(1)))
    m = re.search(r"shard(?:ing)?\s*group\s*(?:size)?\s*(?:=|:|of)?\s*(\d+)", t)
    if m:
        found["shard"] = int(m.group(1))
    return found


def parallelism(text: str) -> Parallelism:
    """Degrees in any common phrasing: `DP=8`, `TP=8 x PP=8`, `FSDP=4, CP=2`, `FSDP 32 x TP 8`,
    `tensor parallel 2`, `8-way tensor parallel`, `DP(FSDP)=8`, `3D (TP=2, PP=4, DP=8)`, `device_map="auto"`."""
    t = text.lower().replace("×", "x")
    out = Parallelism()
    found = _degrees(t)
    m: re.Match[str] | None
    out.dp, out.tp, out.pp, out.cp = found.get("dp"), found.get("tp"), found.get("pp"), found.get("cp")
    out.fsdp = found.get("fsdp")
    if "hsdp" in found:
        out.shard_group = found["hsdp"] if found["hsdp"] and "fsdp" in found else out.shard_group
    out.shard_group = found.get("shard", out.shard_group)
    out.virtual_stages = found.get("vpp")
    if re.search(r"\b(?:no(?:t)?|without|w/o)\s+(?:sp\b|sequence[- _]parallel)", t) or re.search(
        r"(?:\bsp|sequence[- _]parallel\w*)\s*[:=]?\s*(?:off|false|disabled|no|0)\b", t
    ):
        out.sequence_parallel = False
    elif re.search(r"\bsp\b|sequence[- _]parallel", t):
        out.sequence_parallel = True
    if "interleav" in t:
        out.schedule = "interleaved"
    elif "gpipe" in t or "all-forward" in t:
        out.schedule = "gpipe"
    elif "1f1b" in t or "one-forward" in t:
        out.schedule = "1f1b"
    out.device_map = "device_map" in t or "naive model parallel" in t or "naive pipeline" in t
    out.single = bool(re.search(r"single[- ](gpu|device)|\b1 gpu\b|devices\s*=\s*1\b", t)) and not found
    m = re.search(
        r"(\d+)\s*micro[- ]?batch(?:es)?|micro[- ]?batch(?:es)?\s*(?:=|:)\s*(\d+)|num_microbatches\s*=\s*(\d+)|"
        r"\bm\s*=\s*(\d+)\s*micro",
        t,
    )
    if m:
        out.microbatches = int(next(g for g in m.groups() if g))
    return out


# -------------------------------------------------------------------- batch


@dataclass
class Batch:
    micro_batch: int | None = None
    grad_accum: int | None = None
    global_batch: int | None = None
    local_batch: int | None = None  # per data-parallel rank per step, split into micro-batches
    seq_len: int | None = None


# gradient accumulation by name: GA, GAS, grad accum, gradient_accumulation_steps, accumulate, accum steps
_ACCUM = (
    r"(?:gas?(?:[ _]steps)?|grad(?:ient)?\.?[ _-]?acc(?:um(?:ulation)?)?\.?(?:[ _]steps)?|"
    r"accumulate[ _]grad[ _]batches|accumulat(?:e|ion)(?:[ _]steps)?|"
    r"accum(?:[ _]steps)?)"
)
# the global batch by name (a batch that is `total`, `effective` or `global` is all ranks' and all micro-steps')
_GLOBAL = (
    r"(?:gbs|global[ _-]?(?:batch(?:[ _]size)?|bs)|mini[- ]?batch(?:[ _]size)?|"
    r"(?:effective|total)[ _-]?batch(?:[ _]size)?)"
)


def batch(text: str) -> Batch:
    """`GA 16`, `grad accum 16`, `gradient_accumulation_steps=16`, `16 accumulation steps`, `accumulate 16`,
    `GBS 512`, `global batch 512`, `total batch size 512`, `512 global`, `batch 512 (global)`,
    `minibatch 128 (grad accumulation)`, `local batch 32 (split into PP microbatches)`, `max_length=512`."""
    t = text.lower().replace(",", "")
    out = Batch()
    num = r"\s*(?:=|:|of)?\s*(\d+)"
    m = re.search(r"\b" + _ACCUM + num, t) or re.search(
        r"(?<![\w.])(\d+)\s*(?:x\s*(?:grad(?:ient)?[ _-]?)?accum|"
        r"(?:grad(?:ient)?[ _-]?)?accum\w*[ _-](?:micro[ _-]?)?steps)",
        t,
    )
    # `16 (GA)`; not `128 (grad accumulation)`, a batch reached by accumulating (the minibatch of C-style tables)
    m = m or re.search(r"(?<![\w.])(\d+)\s*\((?:gas?|(?:grad(?:ient)?[ _-]?)?accum\w*[ _]steps)\)", t)
    if m:
        out.grad_accum = int(m.group(1))
    elif re.search(r"\b(?:no|without)\s+(?:grad(?:ient)?\s*)?accum", t):
        out.grad_accum = 1
    m = (
        re.search(r"\b" + _GLOBAL + num, t)
        or re.search(r"\bbatch(?:[ _]size)?\s*(\d+)\s*\(global\)", t)
        # `8 global`, `512 (global)`, `512 global batch`; not `4 global attention layers`
        or re.search(
            r"(?<![\w.])(\d+)\s*(?:sequences|samples)?(?:\s*per\s*(?:optimizer\s*)?step)?\s*\(?global\)?"
            r"(?=\s*(?:$|[|,;()]|batch|bs\b))",
            t,
        )
    )
    if m:
        out.global_batch = int(m.group(1))
    m = re.search(r"\blocal[ _-]?batch(?:[ _]size)?" + num, t)
    if m:
        out.local_batch = int(m.group(1))
    m = re.search(
        r"(?<!global )(?<!total )(?<!effective )\b(?:mbs|micro[ _-]?batch(?:[ _]size)?|"
        r"per[ _-]device[ _-]train[ _-]batch[ _-]size|batch[ _-]size)" + num,
        t,
    )
    if m:
        out.micro_batch = int(m.group(1))
    m = re.search(
        r"\b(?:max[_ ]length|max[_ ]seq(?:uence)?[_ ]len(?:gth)?|seq(?:uence)?[_ ]len(?:gth)?|block[_ ]size)" + num, t
    )
    if m:
        out.seq_len = int(m.group(1))
    return out


# -------------------------------------------------------------------- precision


@dataclass
class PrecisionReading:
    precision: Precision | None
    fp8: bool = False


def _negated(t: str, word: str) -> bool:
    return bool(re.search(r"\b(?:no|not|without|w/o|disabled?)\b[^,;.]{0,12}" + word, t))


# 16-bit states throughout, however said: `pure`, Lightning's `bf16-true`, `states in param dtype`, `bf16
# everywhere`, `full bf16`, `bf16 only`, `no (fp32) master weights`
_PURE_WORDS = (
    "pure",
    "true",
    "states bf16",
    "states in bf16",
    "param dtype",
    "parameter dtype",
    "all bf16",
    "all-bf16",
    "bf16 states",
    "no master",
    "everywhere",
    "full bf16",
    "full bfloat16",
    "bf16 only",
    "bf16-only",
)
_NO_MASTER = re.compile(r"\b(?:no|without|w/o)\s+(?:fp32\s+|float32\s+)?master")
# mixed precision switched off: `fp32, no AMP`, `no mixed precision`
_NO_MIXED = re.compile(r"\b(?:no|not|without|w/o)\s+(?:amp|autocast|mixed)\b")


def precision(text: str) -> PrecisionReading:
    """Pure 16-bit (`pure bf16`, `bf16-true`, `states in param dtype`, `bf16 everywhere`, bare `bf16`), mixed
    (`bf16 mixed`, `AMP`, `fp32 master`, Lightning's `16-mixed`), fp32 (also `fp32, no AMP`), and fp8 linears
    (`fp8`, `float8`, `transformer engine fp8`)."""
    t = text.lower()
    fp8 = bool(re.search(r"\bfp8\b|float8|e4m3", t)) and not _negated(t, "fp8")
    no_master = bool(_NO_MASTER.search(t))
    pure = no_master or any(k in t for k in _PURE_WORDS)
    said = _NO_MIXED.sub(" ", _NO_MASTER.sub(" ", t))  # what is switched on
    mixed = any(k in said for k in ("mixed", "amp", "autocast", "master", "fp32 states", "fp32 optimizer"))
    if "bf16" in t or "bfloat16" in t:
        if mixed and not pure:
            return PrecisionReading("bf16-mixed", fp8)
        return PrecisionReading("bf16-pure" if pure or t.strip() in ("bf16", "bfloat16") else "bf16-mixed", fp8)
    # Lightning's precision="16-mixed" / precision=16: float16 autocast
    if "fp16" in t or "float16" in t or "half" in t or re.search(r"(?<![\w.])16[- ]mixed\b|precision\s*[=:]\s*16\b", t):
        return PrecisionReading("fp16-mixed", fp8)
    if re.search(r"\bamp\b|autocast", said):  # torch.autocast / torch.cuda.amp without a dtype: float16
        return PrecisionReading("fp16-mixed", fp8)
    if fp8:  # fp8 linears run inside bf16 mixed precision
        return PrecisionReading("bf16-mixed", True)
    # (Lightning's precision=32 / "32-true", "32-bit")
    if "fp32" in t or "float32" in t or "full precision" in t or "tf32" in t or re.search(r"\b32[- ](?:bit|true)\b", t):
        return PrecisionReading("fp32")
    return PrecisionReading(None)


# a setting's name written before its value: `gradient_checkpointing=True`, `AC: yes`, `torch.compile=False`,
# `recompute_granularity=full` (the value says it, whatever the setting is called)
_SETTING_LABEL = re.compile(r"^[a-z_][\w. -]{0,40}?\s*[:=]\s*(?=\S)")
# a switch written after what it switches: `activation checkpointing on`, `checkpointing enabled`
_TRAILING_STATE = re.compile(r"^[a-z_][\w. -]{0,40}?\s(on|off|enabled|disabled|true|false)\s*(?:$|[(,;])")


def yes_no(text: str) -> bool | None:
    """`yes ...` -> True, `no ...`/`none`/`off`/`false`/`not used` -> False; `not stated`, `unclear`,
    `config default`, empty -> None. A setting's name before its value (`gradient_checkpointing=True`, `AC: no`)
    or a switch after it (`activation checkpointing on`) reads as the value."""
    t = text.strip().lower()
    if not t or re.match(r"(not stated|unclear|unknown|n/?a\b|\?|config default|default)", t):
        return None
    labelled = _SETTING_LABEL.sub("", t)
    if labelled != t:
        return yes_no(labelled)
    if re.match(r"(no\b|n\b|none|off\b|false|disabled|without|not used|unused|not enabled)", t):
        return False
    if re.match(r"(yes|y\b|on\b|true|enabled|full|selective|every|per[- ]layer)", t):
        return True
    trailing = _TRAILING_STATE.match(t)
    if trailing:
        return trailing.group(1) in ("on", "enabled", "true")
    return None


def checkpointing(text: str) -> bool | None:
    """Whether an activation-checkpointing cell says it is on: yes_no's words, or the feature named and not negated
    (`gradient checkpointing`, `activation checkpointing` -> True; `no gradient checkpointing` -> False), or
    Unsloth's mode named (`unsloth`, `use_gradient_checkpointing="unsloth"` -> True); None where it says neither."""
    said = yes_no(text)
    if said is not None:
        return said
    t = text.strip().lower()
    feature = r"(?:activation|gradient)[ _-]?(?:checkpoint\w*|ckpt)|\bac\b"
    if re.search(r"\b(?:no|not|without|w/o)\b[^,;]{0,12}(?:" + feature + ")", t):
        return False
    if re.match(r"(?:full\s+)?(?:use[ _])?(?:" + feature + r")\s*(?:$|[(,;])", t):
        return True
    # Unsloth's mode by its name: use_gradient_checkpointing="unsloth" (its offloaded checkpointing)
    if re.fullmatch(r"""(?:use[ _]gradient[ _]checkpointing\s*=\s*)?["']?unsloth["']?(?:\s*\(.*\))?""", t):
        return True
    return None


def compiled(text: str) -> bool | None:
    """Whether a compile cell says the model was compiled: yes_no's words, or the compiler named (`torch.compile`,
    `compiled`, `inductor`) and not negated (`not compiled`, `eager (no torch.compile)`); None where it says
    neither."""
    said = yes_no(text)
    if said is not None:
        return said
    t = text.strip().lower()
    if re.search(r"\b(?:no|not|without|w/o)\b[^,;]{0,12}(?:compil|inductor)|\beager\b", t):
        return False
    if re.search(r"\bcompil(?:e|ed|ing)\b|torch\.compile|inductor", t):
        return True
    return None


# -------------------------------------------------------------------- frameworks and their documented defaults

FRAMEWORK_NAMES = {
    "torchtune": "torchtune",
    "litgpt": "litgpt",
    "lit-gpt": "litgpt",
    "lightning": "litgpt",
    "transformers": "transformers",
    "hf trainer": "transformers",
    # (the company's name alone, `HF`, `Hugging Face` or `HuggingFace`, names none of its libraries: a custom loop on
    # its model code says `HF Llama` too)
    "trainer": "transformers",
    "accelerate": "transformers",
    "peft": "transformers",
    "trl": "transformers",
    "axolotl": "transformers",
    "llama-factory": "transformers",
    # Unsloth patches the Hugging Face classes it trains with its own loss, checkpointing and LoRA kernels: a profile of
    # its own (marp/frameworks.py), whatever Trainer (TRL's SFTTrainer) runs it
    "unsloth": "unsloth",
    # ModelScope's ms-swift trains with transformers' Trainer: swift/trainers/trainers.py `class Seq2SeqTrainer(...,
    # HfSeq2SeqTrainer)`, its compute_loss calling transformers' (read at v1.5.0.dev, commit 306fa15a, and v2.x)
    "ms-swift": "transformers",
    "deepspeed": "deepspeed",
    "megatron": "megatron",
    "nemo": "megatron",
    "torchtitan": "torchtitan",
    "fsdp": "torch",
    "pytorch": "torch",
    "llm.c": "llm.c",  # its own CUDA program, predicted from its static buffer layout (marp/llmc.py)
}
# model classes named in a row are the Hugging Face implementation
_HF_CLASS = re.compile(
    r"\b\w+for(?:causallm|sequenceclassification|maskedlm|conditionalgeneration|tokenclassification)\b"
)


def frameworks(settings: str) -> set[str]:
    """Training frameworks a row's settings name (model classes such as `BertForSequenceClassification` name
    Hugging Face transformers)."""
    t = settings.lower()
    found = {fw for name, fw in FRAMEWORK_NAMES.items() if re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w])", t)}
    if _HF_CLASS.search(t) or "from_pretrained" in t:
        found.add("transformers")
    return found


# LoRA defaults of named configurations, from the frameworks' shipped config files.
# torchtune recipes/configs/*/<size>_lora*.yaml: lora_attn_modules, apply_lora_to_mlp, lora_rank.
TORCHTUNE_LORA = {
    "llama3_2/3b_lora": (64, ("q", "v", "o", "mlp")),
    "llama3_2/1b_lora": (64, ("q", "v", "o", "mlp")),
    "llama3_1/8b_lora": (8, ("q", "v", "o", "mlp")),
    "llama3_1/8b_qlora": (8, ("q", "v", "o", "mlp")),
    "llama3_1/70b_lora": (16, ("q", "v", "o", "mlp")),
    "llama3_1/405b_qlora": (16, ("q", "v", "o", "mlp")),
}
# litgpt config_hub/finetune/<model>/lora.yaml (qlora.yaml sets the same adapters): lora_r and the lora_query/key/
# value/projection/mlp/head switches, as the files in Lightning-AI/litgpt set them
_ALL = ("q", "k", "v", "o", "mlp", "head")
LITGPT_LORA = {
    "tiny-llama": (32, _ALL),
    "phi-2": (8, _ALL),
    "gemma-2b": (8, _ALL),
    "llama-2-7b": (32, ("q", "v")),
    "llama-3-8b": (32, ("q", "v")),
    "mistral-7b": (32, ("q", "v")),
    "falcon-7b": (32, ("q", "v")),
}
LITGPT_DEFAULT_LORA = (8, ("q", "v"))  # litgpt's LoRA defaults (finetune/lora.py arguments)
# train.global_batch_size of the same files (micro_batch_size is in the rows themselves)
LITGPT_GLOBAL_BATCH = {
    ("tiny-llama", "full"): 32,
    ("tiny-llama", "lora"): 8,
    ("phi-2", "lora"): 8,
    ("gemma-2b", "lora"): 6,
    ("llama-2-7b", "lora"): 8,
    ("llama-2-7b", "qlora"): 8,
    ("llama-3-8b", "lora"): 8,
    ("mistral-7b", "lora"): 8,
    ("falcon-7b", "lora"): 8,
}

# `devices` of the same files (config_hub/finetune/<model>/full.yaml): the GPUs a run of the file uses, whatever
# the machine has (litgpt runs `devices` ranks; a 4-GPU machine running a 2-device file uses 2)
LITGPT_DEVICES = {("phi-2", "full"): 2, ("stablelm-base-alpha-3b", "full"): 2, ("gemma-2b", "full"): 4}


def named_config_devices(text: str) -> int | None:
    """The device count a named litgpt config_hub file sets, where the row says its GPUs are `devices per` it."""
    m = re.search(
        r"devices\s+(?:per|from|as in|of)\s+(?:config_hub/finetune/)?([\w.\-]+)/(full|q?lora)\.yaml", text.lower()
    )
    return LITGPT_DEVICES.get((m.group(1), m.group(2))) if m else None


def named_config_global_batch(text: str) -> int | None:
    """The global batch a named litgpt config_hub file sets (`see tiny-llama/full.yaml`)."""
    m = re.search(r"([\w.\-]+)/(full|q?lora)\.yaml", text.lower())
    return LITGPT_GLOBAL_BATCH.get((m.group(1), m.group(2))) if m else None


def lora_setting(text: str) -> tuple[int | None, tuple[str, ...] | None]:
    """Rank and target modules stated anywhere: `r=8`, `rank 16`, `lora_r: 64`, `on query+value`,
    `q,k,v,o`, `all linear layers`, `attention and MLP`."""
    t = text.lower()
    rank = None
    m = re.search(r"(?:lora[_ ]?r(?:ank)?|\br|\brank)\s*(?:=|:)?\s*(\d+)\b", t)
    if m:
        rank = int(m.group(1))
    targets: list[str] = []
    if re.search(r"all[- ]linear|all (?:linear )?layers|all projections", t):
        targets = ["q", "k", "v", "o", "mlp"]
    else:
        names = {
            "q": r"\bq(?:_proj)?\b|query",
            "k": r"\bk(?:_proj)?\b|\bkey\b",
            "v": r"\bv(?:_proj)?\b|value",
            "o": r"\bo(?:_proj)?\b|output_proj|out_proj|\bprojection\b|\bdense\b",
            # (a list of module names: `q,k,v,gate,up,down`; gate exists only in the MLP)
            "mlp": r"mlp|ffn|feed[- ]forward|gate_proj|up_proj|down_proj|\bgate\b",
        }
        for name, pat in names.items():
            if re.search(pat, t):
                targets.append(name)
    return rank, (tuple(targets) if targets else None)


def named_config_lora(text: str) -> tuple[int, tuple[str, ...]] | None:
    """The documented LoRA defaults of a configuration the row names (torchtune recipe configs, litgpt config_hub)."""
    t = text.lower().replace("-", "_")
    for key, value in TORCHTUNE_LORA.items():
        if key in t or key.split("/")[1] + "_single_device" in t and key.split("/")[0] in t:
            return value
    m = re.search(r"(\w+/\d+b_q?lora)", t)
    if m and m.group(1) in TORCHTUNE_LORA:
        return TORCHTUNE_LORA[m.group(1)]
    m = re.search(r"(?:config_hub/finetune/)?([\w.\-]+)/q?lora\.yaml", text.lower())
    if m:
        return LITGPT_LORA.get(m.group(1), LITGPT_DEFAULT_LORA)
    return None


_CONTEXT_SIZE = r"~?\s*(\d[\d,]*(?:\.\d+)?)\s*(MiB|MB|GiB|GB)\b"
_CONTEXT_PATTERNS = (
    re.compile(_CONTEXT_SIZE + r"\s+(?:of\s+)?(?:the\s+)?CUDA context", re.IGNORECASE),  # "~1343 MiB CUDA context"
    re.compile(r"CUDA context\s*(?:of|:|=|is|takes|uses)?\s*" + _CONTEXT_SIZE, re.IGNORECASE),  # "CUDA context: 1.3 GB"
)


def stated_context_gib(text: str) -> float | None:
    """The CUDA context a row says its reading includes (`includes ~1343 MiB CUDA context`), in GiB; None where
    it states no size. nvidia-smi's and NVML's MB are MiB (they divide by 1024**2)."""
    for pattern in _CONTEXT_PATTERNS:
        m = pattern.search(text)
        if m:
            value = float(m.group(1).replace(",", ""))
            return value / 1024 if m.group(2).lower() in ("mib", "mb") else value
    return None


def _named_release(name: str, text: str) -> tuple[int, int] | None:
    """(major, minor) of the release written after `name` (a regex): `NAME 2.4`, `NAME==2.1.0`, `NAME v4.36`."""
    m = re.search(name + r"\s*(?:==|=|v|version)?\s*(\d+)\.(\d+)", text.lower())
    return (int(m.group(1)), int(m.group(2))) if m else None


# FSDP's two APIs by the names only one of them has: FSDP2 is `fully_shard` (torch.distributed.fsdp, 2.6; _composable
# in 2.4-2.5); FSDP1 is the `FullyShardedDataParallel` class, whose `sharding_strategy` takes ShardingStrategy's
# FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD (FSDP2 has none: it reshards after forward or not, over a 1- or 2-D mesh)
_FSDP2_NAMES = re.compile(r"\bfsdp(?:-?v?| v)2\b(?!\s*(?:gpus?|ranks?|devices|x\b|way))|\bfully_shard\b")
_FSDP1_NAMES = re.compile(
    r"\bfsdp(?:-?v?| v)1\b(?!\s*(?:gpus?|ranks?|devices|x\b|way))|fullyshardeddataparallel|sharding_?strategy|"
    r"\b(?:full|hybrid)[_ -]shard|\bshard[_ -]grad[_ -]op\b"
)


def fsdp_api(text: str) -> int | None:
    """The FSDP API a row's settings name (1: FullyShardedDataParallel and its sharding strategies, 2: fully_shard
    / FSDP2), or None where they name neither (or both)."""
    t = text.lower()
    two, one = bool(_FSDP2_NAMES.search(t)), bool(_FSDP1_NAMES.search(t))
    return 2 if two and not one else 1 if one and not two else None


def torch_version(text: str) -> tuple[int, int] | None:
    """`torch 1.13`, `pytorch==2.1.0`, `PyTorch 2.4` -> (major, minor)."""
    return _named_release(r"(?:torch|pytorch)", text)


# The newest transformers release each line of a Trainer-based framework allows (its requirements/framework.txt
# pin), for a row that names the framework's release and not transformers' own: ms-swift 1.x `transformers>=4.33,
# <4.37` (v1.5.0) ... `<4.39` (v1.7.3); 2.x `<4.41` (v2.0.0) ... `<4.48` (v2.6.1).
TRANSFORMERS_PINNED_BY = {("ms-swift", 1): (4, 38), ("ms-swift", 2): (4, 47)}


# The last transformers release of each year (PyPI's release dates): a run that names Hugging Face's model code and a
# year, but no release, ran at most that one.
TRANSFORMERS_LAST_OF_YEAR = {2020: (4, 1), 2021: (4, 15), 2022: (4, 25), 2023: (4, 36), 2024: (4, 47)}


def transformers_of_year(text: str) -> tuple[int, int] | None:
    """`HF GPT2, 2022`, `Hugging Face transformers (2023)` -> the newest transformers release of that year
    (TRANSFORMERS_LAST_OF_YEAR); the year must follow the name within one cell (`|` separates cells)."""
    m = re.search(r"\b(?:hf|hugging\s?face|transformers)\b[^|]*?\b(20\d\d)\b", text.lower())
    return TRANSFORMERS_LAST_OF_YEAR.get(int(m.group(1))) if m else None


def stated_date(text: str) -> tuple[int, int, int] | None:
    """The first calendar date a row's text states (`2024-05-13`, `2024/05/13`): when its run was reported, which
    names the source of a program versioned by date rather than by release (llm.c)."""
    m = re.search(r"\b(20\d\d)[-/](\d\d)[-/](\d\d)\b", text)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def stated_us_date(text: str) -> tuple[int, int, int] | None:
    """The first calendar date a row's text states month first (`10/20/2023`, as litgpt's tutorials date their
    tables); None where it states none."""
    m = re.search(r"(?<![\d/])(1[0-2]|0?[1-9])/(3[01]|[12]\d|0?[1-9])/(20\d\d)\b", text)
    return (int(m.group(3)), int(m.group(1)), int(m.group(2))) if m else None


def stated_month(text: str) -> tuple[int, int, int] | None:
    """The first calendar date a row's text states, to the month where it gives no day (`2024-12-26`, `2025-06`,
    a file name's `_202412_`): the first of that month. None where it states none."""
    full = stated_date(text)
    if full:
        return full
    m = re.search(r"(?<![\d.])(20\d\d)[-/_]?(0[1-9]|1[0-2])(?![\d.])", text)
    return (int(m.group(1)), int(m.group(2)), 1) if m else None


def unsloth_release(text: str) -> tuple[int, ...] | None:
    """The Unsloth release a row names: `unsloth 2024.12.4`, `unsloth==2025.3.14`, `Unsloth v2024.8` ->
    (year, month[, patch]) (Unsloth's releases are year.month.patch); else the month of a date the row states
    (`2024-12-26`, `2025-06`): the releases of that month, (year, month). None where it names neither."""
    m = re.search(r"unsloth\s*(?:==|=|v|version)?\s*(20\d\d)\.(\d{1,2})(?:\.(\d+))?\b", text.lower())
    if m:
        return tuple(int(g) for g in m.groups() if g is not None)
    month = stated_month(text)
    return month[:2] if month else None


def transformers_version(text: str) -> tuple[int, int] | None:
    """The transformers release a row ran: `transformers 4.36`, `transformers==4.36.2` -> (4, 36); else, for a
    named release line of a framework built on transformers' Trainer (`ms-swift v1.x`, `ms-swift/blob/v1.7.3`,
    `ms-swift 2.6`), the newest transformers its requirements allow (TRANSFORMERS_PINNED_BY)."""
    stated = _named_release("transformers", text)
    if stated:
        return stated
    t = text.lower()
    for (name, major), pinned in TRANSFORMERS_PINNED_BY.items():
        # the release after the name: "ms-swift v1.x", "ms-swift 2.6", a repository ref "ms-swift/blob/<v1.x>"
        pattern = re.escape(name) + r"(?:/(?:blob|tree)/)?[\s<@=]*v?(\d+)(?:\.(?:\d+|x))"
        for m in re.finditer(pattern, t):
            if int(m.group(1)) == major:
                return pinned
    return None


def stacks(text: str) -> tuple[int, int] | None:
    """An encoder-decoder model's layer cell: `24+24`, `12 + 12`, `6 enc / 6 dec` -> (encoder, decoder) blocks;
    a single number is each stack's (T5's num_decoder_layers defaults to num_layers); None without a number."""
    t = text.replace(",", "").lower()
    m = re.search(r"(\d+)\s*(?:enc\w*)?\s*(?:\+|/|and)\s*(\d+)", t)
    if m:
        return int(m.group(1)), int(m.group(2))
    n = annotated_int(t)
    return (n, n) if n else None


def target_length(text: str) -> int | None:
    """The decoder (target) length of an encoder-decoder run: `max_target_length=128`, `target length 128`,
    `decoder length: 64`, `labels truncated to 128 tokens`, `source/target 512/128`; None where not stated."""
    t = text.lower().replace(",", "")
    m = re.search(
        r"(?:target|decoder|label|output)s?[ _-]*(?:seq(?:uence)?[ _-]*)?(?:len(?:gth)?|tokens)\D{0,12}(\d+)", t
    )
    if m:
        return int(m.group(1))
    m = re.search(r"max[ _-]*(?:target|decoder|label|output)s?[ _-]*(?:len(?:gth)?)?\s*[=:]?\s*(\d+)", t)
    if m:
        return int(m.group(1))
    m = re.search(r"source\s*/\s*target\D{0,12}\d+\s*/\s*(\d+)", t)
    return int(m.group(1)) if m else None


def variable_lengths(text: str) -> bool:
    """Whether a sequence-length text states lengths that vary from batch to batch: a truncation limit
    (`max_length=2048`, `max_seq_length=512 truncation`, `<=512 (truncated)`), padding to the longest of a batch,
    or a longest sample (`1044 (longest Alpaca sample)`). A bare number, or packed/fixed sequences, is a fixed
    length."""
    t = text.lower()
    if re.search(r"\b(packed|packing|fixed)\b", t) and not re.search(r"\bunpacked\b", t):
        return False
    return bool(
        re.search(r"max[ _-]*(?:seq(?:uence)?[ _-]*)?len(?:gth)?\s*[=:]?\s*\d", t)
        or re.search(r"truncat|pad\w*\s+to\s+(?:the\s+)?longest|longest\b.*\bsample|\bvariable\b|<=\s*\d", t)
    )


def length_statistics(text: str) -> tuple[float, float] | None:
    """(mean, standard deviation) of the samples' lengths where a text states them as `MEAN±SD tokens` (or `+-`,
    `+/-`; thousands separators allowed); None where not stated."""
    t = text.lower().replace(",", "")
    m = re.search(r"(\d+(?:\.\d+)?)\s*(?:±|\+-|\+/-)\s*(\d+(?:\.\d+)?)\s*tokens?\b", t)
    return (float(m.group(1)), float(m.group(2))) if m else None
