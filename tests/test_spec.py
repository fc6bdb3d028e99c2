"""model.yaml validation: examples load; bad input gives file, line, field and fix with exit code 2."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.jobspec import load_job_spec, parse_slurm_time, resolve_model

from .helpers import EXAMPLES, run_cli

GOOD = """\
name: t
model:
  preset: llama-2-7b
training:
  seq_len: 2048
  global_batch: 64
  steps: 10
"""


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_examples_load(path):
    spec = load_job_spec(path)
    model = resolve_model(spec, path.parent)
    assert model.arch.layers > 0


def test_defaults_are_explicit():
    spec = load_job_spec(EXAMPLES / "llama2-7b.yaml")
    assert spec.training.precision == "bf16-mixed"
    assert spec.training.total_steps == -(-1_000_000_000 // (256 * 4096))


BAD = [
    # (yaml text, expected line, expected substring)
    (GOOD + "colour: blue\n", 8, "colour: unknown field"),
    (GOOD.replace("seq_len: 2048", "seq_len: long"), 5, "training.seq_len"),
    (GOOD.replace("seq_len: 2048", "seq_len: -1"), 5, "greater than 0"),
    (GOOD.replace("  steps: 10\n", "  steps: 10\n  micro_batch: 128\n"), 4, "micro_batch(128) > global_batch(64)"),
    (GOOD.replace("preset: llama-2-7b", "preset: llama-9"), 2, "unknown preset 'llama-9'"),
    (
        GOOD.replace("  preset: llama-2-7b\n", "  arch: {layers: 2, hidden: 100, heads: 3, ffn: 10, vocab: 10}\n"),
        3,
        "heads(3) must divide hidden(100)",
    ),
    (
        GOOD.replace(
            "  preset: llama-2-7b\n", "  arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 3, ffn: 10, vocab: 10}\n"
        ),
        3,
        "kv_heads(3) must divide heads(4)",
    ),
    (GOOD.replace("  steps: 10\n", ""), 4, "give exactly one of steps or tokens"),
    (
        GOOD.replace("  steps: 10\n", "  steps: 10\n  precision: bf16\n"),
        8,
        "'fp32', 'bf16-mixed', 'fp16-mixed' or 'bf16-pure'",
    ),
    (GOOD.replace("  steps: 10\n", "  steps: 10\n  optimizer: lion\n"), 8, "training.optimizer"),
    (GOOD + "slurm:\n  time: soon\n", 9, "not a Slurm time"),
    (GOOD + "slurm:\n  extra: ['reservation=x']\n", 9, "is not an sbatch flag"),
    (GOOD + "entry:\n  trainer: script\n", 8, "trainer: script needs script"),
    (GOOD + "entry:\n  env: {'1BAD': x}\n", 8, "not a valid shell variable name"),
    (GOOD.replace("  steps: 10\n", "  steps: 10\n  method: lora\n"), 1, "needs entry.trainer: script"),
    (GOOD.replace("name: t", "name: 'a b'"), 1, "name"),
    (GOOD.replace("  preset: llama-2-7b\n", "  preset: llama-2-7b\n  hf_config: x.json\n"), 2, "exactly one of preset"),
    (
        GOOD.replace(
            "  preset: llama-2-7b\n",
            "  factory: 'not a path'\n  factory_arch: {layers: 1, hidden: 8, heads: 1, ffn: 8, vocab: 8}\n",
        ),
        2,
        "package.module:function",
    ),
]


@pytest.mark.parametrize("text,line,needle", BAD, ids=[b[2][:30] for b in BAD])
def test_bad_input_message(write_yaml, text, line, needle):
    path = write_yaml(text)
    with pytest.raises(InputError) as err:
        load_job_spec(path)
    msg = err.value.message
    assert f"{path}:{line}:" in msg, msg
    assert needle in msg, msg


@pytest.mark.parametrize(
    "text,needle",
    [
        ("name: [unclosed\n", "not valid YAML"),
        ("", "the file is empty"),
        ("- a\n- b\n", "must be a mapping"),
    ],
)
def test_unparseable_files(write_yaml, text, needle):
    with pytest.raises(InputError, match=needle):
        load_job_spec(write_yaml(text))


def test_cli_bad_input_exit_code_and_no_traceback(write_yaml):
    path = write_yaml(GOOD.replace("seq_len: 2048", "seq_len: long"))
    res = run_cli("fsbatch", str(path), "--dry-run")
    assert res.returncode == 2
    assert "Traceback" not in res.stderr
    assert f"fsbatch: error: {path}:5: training.seq_len" in res.stderr


def test_missing_file_exit_code(tmp_path):
    res = run_cli("frenzy-slurm", "memory", str(tmp_path / "nope.yaml"))
    assert res.returncode == 2 and "cannot read file" in res.stderr and "Traceback" not in res.stderr


def test_hf_config(write_yaml, tmp_path):
    (tmp_path / "config.json").write_text(
        '{"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,'
        ' "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256, "hidden_act": "silu",'
        ' "max_position_embeddings": 8192, "tie_word_embeddings": false}'
    )
    path = write_yaml(GOOD.replace("preset: llama-2-7b", "hf_config: config.json"))
    from frenzy_slurm.jobspec import presets

    assert resolve_model(load_job_spec(path), tmp_path).arch == presets()["llama-3-8b"].arch


def test_hf_config_bad_json(write_yaml, tmp_path):
    (tmp_path / "config.json").write_text('{"num_hidden_layers": 2,\n oops}')
    path = write_yaml(GOOD.replace("preset: llama-2-7b", "hf_config: config.json"))
    with pytest.raises(InputError, match=r"config.json:2: not valid JSON"):
        resolve_model(load_job_spec(path), tmp_path)


@pytest.mark.parametrize(
    "text,minutes", [("30", 30), ("1:30", 2), ("2:00:00", 120), ("1-00", 1440), ("1-2:30:00", 1590), (45, 45)]
)
def test_slurm_time(text, minutes):
    assert parse_slurm_time(text) == minutes


def test_reference_doc_is_current():
    from frenzy_slurm.jobspec.reference import SECTIONS, render

    from .helpers import ROOT

    assert (ROOT / "docs" / "model-yaml.md").read_text() == render(), (
        "run: frenzy-slurm spec-reference > docs/model-yaml.md"
    )
    for _, model in SECTIONS:
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no description"
