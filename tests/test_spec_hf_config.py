"""A Hugging Face config.json that is not a usable architecture (not an object, values of the wrong kind, keys
missing, a device) is an input error naming the key, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.jobspec import load_job_spec, resolve_model
from frenzy_slurm.jobspec.hf import architecture_from_hf_config

ROOT = Path(__file__).resolve().parent.parent

EXAMPLES = ROOT / "examples"

GOOD = (EXAMPLES / "tiny-cpu.yaml").read_text()


def _input_error(fn, *args) -> str:
    with pytest.raises(InputError) as exc:
        fn(*args)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    return exc.value.message


# --- Hugging Face config.json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cfg,needle",
    [
        ("[1, 2]", "is a JSON object, not list"),
        ('{"num_hidden_layers": "abc", "hidden_size": 64}', "num_hidden_layers: 'abc' is not a whole number"),
        ('{"num_hidden_layers": 2, "hidden_size": 64.5, "num_attention_heads": 4, "vocab_size": 8}', "hidden_size"),
        (
            '{"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 8, '
            '"resid_pdrop": "x"}',
            "resid_pdrop: 'x' is not a number",
        ),
        ('{"hidden_size": 64}', "no key for layers, heads, vocab"),
        ('{"n_layer": -1, "n_embd": 64, "n_head": 4, "vocab_size": 8}', "n_layer: Input should be greater than 0"),
        ("[" * 100000 + "]" * 100000, "not a usable JSON config"),
    ],
)
def test_bad_hf_config_is_an_input_error(tmp_path, cfg, needle):
    path = tmp_path / "config.json"
    path.write_text(cfg)
    assert needle in _input_error(architecture_from_hf_config, path)


def test_hf_config_device_is_refused(write_yaml):
    path = write_yaml(
        GOOD.replace("model:\n  arch:\n", "model:\n  hf_config: /dev/zero\n  x:\n").split("  x:")[0]
        + "training:"
        + GOOD.split("training:")[1]
    )
    spec = load_job_spec(path)
    assert "not a regular file" in _input_error(resolve_model, spec, path.parent)
