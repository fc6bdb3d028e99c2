"""The GPU a measurement names (`measurement.gpu`, free text as its source writes it), read onto the product's GPU
catalog (core/gpus.py): the model first named and the memory size stated, nothing else.

`A100 80GB`, `A100 (80GB)`, `NVIDIA A100-SXM4-80GB` and `Tesla V100-SXM2 16GB` each pin one catalog entry; a bare
`A100` (40 and 80 GB exist), `A100, 40 vs 80 GB`, a memory size no catalog entry of that model has (`H100 SXM
96GB`) and a model the catalog lacks (`RTX PRO 6000`) pin none. A size is the stated GB/GiB figure, matched to the
nearest entry of the model within `SIZE_TOLERANCE` (the catalog holds what CUDA reports, below the marketed
figure: an A10G's 24 GB is 22.49 GiB). Entries of equal memory (H100 SXM and PCIe) are told apart by a stated form
factor, else the SXM one: the benchmark scores memory, which they share.
"""

from __future__ import annotations

import re

from frenzy_slurm.core.gpus import GpuSpec, catalog

# a stated size matches an entry whose CUDA-reported GiB lie within this fraction of it (A10G: 22.49 of 24 is 6.3 %
# below; the next size of any model in the catalog is at least a third away)
SIZE_TOLERANCE = 0.10
_BRANDS = re.compile(r"\b(?:nvidia|tesla|geforce)\b")
_SIZE = r"(\d+(?:\.\d+)?)\s*(?:gb|gib|g)\b"
# alternatives written around one unit: `40 vs 80 GB`, `40 or 80 GB`, `40/80GB`
_SIZES = re.compile(r"(\d+(?:\.\d+)?)\s*(?:gb|gib|g)?\s*(?:vs\.?|or|/)\s*" + _SIZE)


def _model(name: str) -> str:
    """A catalog name's model, its memory and form factor dropped: 'A100-80GB' -> 'a100', 'RTX-A6000' -> 'rtxa6000'."""
    t = re.sub(r"-?\d+gb\b|-(?:sxm|pcie)\b", "", name.lower())
    return re.sub(r"[^a-z0-9]", "", t)


def _first_model(text: str) -> str | None:
    """The catalog model the text names first, as a word or two adjacent words ('RTX 4090', 'rtx-a6000'); an RTX
    card's number without its `RTX` ('A6000', '4090'), as its users shorten it."""
    words = [(m.start(), m.group()) for m in re.finditer(r"[a-z0-9]+", text)]
    models = {_model(n) for n in catalog()}
    for i, (_, word) in enumerate(words):
        pair = word + words[i + 1][1] if i + 1 < len(words) else ""
        for candidate in (pair, word, "rtx" + word):  # the pair first: 'rtx 4090' before a lone word
            if candidate in models and (candidate != "rtx" + word or re.fullmatch(r"a?\d{4}", word)):
                return candidate
    return None


def stated_sizes(text: str) -> set[float]:
    """Every memory size the text states, in GB as written, alternatives included ('40 vs 80 GB': 40 and 80)."""
    sizes = {float(m.group(1)) for m in re.finditer(_SIZE, text)}
    for m in _SIZES.finditer(text):
        sizes |= {float(m.group(1)), float(m.group(2))}
    return sizes


def catalog_gpu(text: str) -> GpuSpec | None:
    """The catalog entry the measured GPU's description pins (module docstring), or None: no catalog model named,
    a size no entry of it has, or several entries of different memory left open."""
    t = _BRANDS.sub(" ", text.lower())
    model = _first_model(t)
    if model is None:
        return None
    entries = [s for s in catalog().values() if _model(s.name) == model]
    sizes = stated_sizes(t)
    if sizes:
        entries = [s for s in entries if any(abs(s.memory_gib - gb) <= SIZE_TOLERANCE * gb for gb in sizes)]
    if len({s.memory_gib for s in entries}) != 1:
        return None
    form = "pcie" if "pcie" in t else "sxm"
    return max(entries, key=lambda s: form in s.name.lower())
