"""What one block of lit-gpt's Oct 2023 LoRA model (commit 8641822, the resource tables' snapshot) saves for backward,
measured on the CPU, next to MARP's `layer_activation_bytes` for the same shapes.

    git -C LITGPT_GIT archive 8641822 lit_gpt | tar -x -C SRC
    python benchmarks/litgpt_2023_block_cpu.py SRC      # seconds
    python benchmarks/litgpt_2023_block_cpu.py SRC cuda # the same on a GPU, against MARP's GPU count

lit_gpt/utils.py and lit_gpt/__init__.py import lightning, which the block does not use: the script puts minimal
stand-ins for them (and for lightning_utilities' RequirementCache: flash-attn absent) ahead of SRC on the path, and
imports lit_gpt/model.py, config.py and lora.py as committed. The model is built as finetune/lora.py builds it
(bf16 default dtype, as under `fabric.init_module()`; then `model.max_seq_length = longest` outside it, so the
rebuilt cos/sin are fp32), with lora.py's hyperparameters (r=8, alpha=16, dropout 0.05 on query and value).
A Llama-style block (RMSNorm, SwiGLU, full rotary); MHA and GQA. Saved storages are counted once each
(parameters and buffers excluded); one block's bytes are the 2-layer model's minus the 1-layer model's.
docs/accuracy.md ("lit-gpt's 2023 rows: 0.7-1.3 GiB under") quotes the result.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from frenzy_slurm.jobspec import JobSpec, ResolvedModel
from frenzy_slurm.jobspec.arch import Architecture
from frenzy_slurm.marp import workload_from_spec
from frenzy_slurm.marp.memory_activations import layer_activation_bytes

H, HEADS, FFN, VOCAB, T, B = 256, 4, 688, 512, 64, 2
STANDINS = {
    "lightning_utilities/__init__.py": "",
    "lightning_utilities/core/__init__.py": "",
    "lightning_utilities/core/imports.py": (
        "class RequirementCache:\n    def __init__(self, *a, **k): pass\n    def __bool__(self): return False\n"
    ),
}
UTILS = (
    "def find_multiple(n, k):\n    return n if n % k == 0 else n + k - n % k\n\n"
    "def map_old_state_dict_weights(state_dict, mapping, prefix):\n    return state_dict\n"
)


def _load(src: Path) -> Any:
    """lit_gpt.lora from SRC, with the lightning imports it does not need replaced."""
    root = Path(tempfile.mkdtemp())
    for rel, text in STANDINS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    pkg = root / "lit_gpt"
    pkg.mkdir()
    for name in ("model.py", "config.py", "lora.py", "rmsnorm.py"):
        if (src / "lit_gpt" / name).exists():
            (pkg / name).write_text((src / "lit_gpt" / name).read_text())
    (pkg / "utils.py").write_text(UTILS)
    (pkg / "__init__.py").write_text("from lit_gpt.model import GPT\nfrom lit_gpt.config import Config\n")
    sys.path[:0] = [str(root)]
    import lit_gpt.lora  # type: ignore[import-not-found]

    return lit_gpt.lora


def _saved_bytes(lora: Any, layers: int, groups: int, device: str) -> int:
    cfg = lora.Config(
        name="tiny",
        block_size=128,
        vocab_size=VOCAB,
        padded_vocab_size=VOCAB,
        n_layer=layers,
        n_head=HEADS,
        n_embd=H,
        n_query_groups=groups,
        rotary_percentage=1.0,
        parallel_residual=False,
        bias=False,
        _norm_class="RMSNorm",
        _mlp_class="LLaMAMLP",
        intermediate_size=FFN,
        r=8,
        alpha=16,
        dropout=0.05,
        to_query=True,
        to_value=True,
    )
    torch.set_default_dtype(torch.bfloat16)  # fabric.init_module() under bf16-true
    with torch.device(device):
        model = lora.GPT(cfg)
    torch.set_default_dtype(torch.float32)
    with torch.device(device):
        model.max_seq_length = T  # train(): outside init_module, so cos/sin are rebuilt in fp32
    lora.mark_only_lora_as_trainable(model)
    own = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}

    def pack(x: torch.Tensor) -> torch.Tensor:
        st = x.untyped_storage()
        if st.data_ptr() not in own:
            seen[st.data_ptr()] = st.nbytes()
        return x.detach()  # keeps the storage alive, so no later tensor reuses its address

    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
        model(ids)
    return sum(seen.values())


def _predicted(groups: int, device: str) -> float:
    arch = Architecture(
        layers=2,
        hidden=H,
        heads=HEADS,
        kv_heads=groups,
        ffn=FFN,
        vocab=VOCAB,
        activation="swiglu",
        norm="rmsnorm",
        bias="none",
        position="rope",
    )
    spec = JobSpec.model_validate(
        {
            "name": "lit-gpt-2023",
            "model": {"arch": arch.model_dump(exclude_defaults=True)},
            "training": {
                "seq_len": T,
                "global_batch": B,
                "micro_batch": B,
                "steps": 1,
                "precision": "bf16-pure",
                "attention": "sdpa",
                "activation_checkpointing": "none",
                "method": "lora",
                "lora": {"rank": 8, "targets": ["q", "v"], "dropout": 0.05},
            },
            "parallel": {"sharding": "none", "tp": 1, "pp": 1},
            "entry": {
                "trainer": "script",
                "script": "finetune/lora.py",
                "framework": "litgpt",
                "framework_version": "2023.10.20",
            },
        }
    )
    w = workload_from_spec(spec, ResolvedModel(arch=arch, name="tiny-llama"), device=device)
    return layer_activation_bytes(w, 1, False, "none", False)


def main() -> None:
    lora = _load(Path(sys.argv[1]))
    device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
    for groups, label in ((HEADS, "MHA"), (2, "GQA 2 groups")):
        block = (_saved_bytes(lora, 2, groups, device) - _saved_bytes(lora, 1, groups, device)) / (B * T)
        marp = _predicted(groups, device)
        print(
            f"{label:>13}: lit-gpt 8641822 {block:7.0f} B/token ({block / H:5.2f} x hidden), "
            f"MARP {marp:7.0f} ({marp / H:5.2f} x hidden), {100 * (marp - block) / block:+.1f}%"
        )


if __name__ == "__main__":
    main()
