"""A Mixture-of-Experts config.json is refused (exit 2, naming file and key), never planned as dense."""

from __future__ import annotations

import json

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec.hf import architecture_from_hf_config

DENSE = {
    "model_type": "llama",
    "num_hidden_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 172,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}


@pytest.mark.parametrize(
    "extra,key,value",
    [
        ({"model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}, "num_local_experts", 8),
        ({"model_type": "qwen2_moe", "num_experts": 60, "num_experts_per_tok": 4}, "num_experts", 60),
        ({"model_type": "deepseek_v2", "n_routed_experts": 64, "n_shared_experts": 2}, "n_routed_experts", 64),
        ({"ffn_config": {"moe_num_experts": 16, "moe_top_k": 4}}, "ffn_config.moe_num_experts", 16),  # DBRX
        ({"text_config": {"num_local_experts": 16}}, "text_config.num_local_experts", 16),
        ({"some_new_family_experts": 4}, "some_new_family_experts", 4),
    ],
)
def test_moe_config_is_refused_naming_file_and_key(tmp_path, extra, key, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DENSE, **extra}))
    with pytest.raises(InputError) as exc:
        architecture_from_hf_config(path)
    assert exc.value.exit_code == EXIT_BAD_INPUT == 2
    msg = exc.value.message
    assert msg.startswith(f"{path}: {key}: {value}: ")
    assert "Mixture-of-Experts" in msg and "MoE models are not modelled yet" in msg


@pytest.mark.parametrize("extra", [{}, {"num_experts": 1}, {"num_local_experts": None}, {"use_experts": True}])
def test_dense_configs_still_read(tmp_path, extra):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**DENSE, **extra}))
    arch = architecture_from_hf_config(path)
    assert (arch.layers, arch.hidden, arch.ffn) == (2, 64, 172)


def test_fsbatch_dry_run_refuses_a_mixtral_config_with_exit_2(tmp_path):
    from click.testing import CliRunner

    from frenzy_slurm.cli.fsbatch import main

    model_dir = tmp_path / "mixtral"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        json.dumps({**DENSE, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2})
    )
    spec = tmp_path / "model.yaml"
    spec.write_text(
        "name: moe\nmodel:\n  hf_config: mixtral/config.json\ntraining: {seq_len: 64, global_batch: 4, steps: 1}\n"
    )
    res = CliRunner().invoke(main, [str(spec), "--dry-run"])
    assert res.exit_code == 2, res.output
    assert "num_local_experts: 8" in res.stderr and "MoE models are not modelled yet" in res.stderr
    assert "Traceback" not in res.output
