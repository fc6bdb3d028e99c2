"""model.yaml's numbers are finite, each key is given once (merge keys may still override), and a relative
entry.data is relative to model.yaml (the job runs in its job directory)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from .test_spec_no_newlines import dry, offline  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

TINY = ROOT / "examples" / "tiny-cpu.yaml"

# ---- finite numbers, keys once, paths relative to model.yaml --------------------


@pytest.mark.parametrize(
    "text,where",
    [
        ("  learning_rate: .inf\n", "training.learning_rate"),
        ("  learning_rate: -.Inf\n", "training.learning_rate"),
        ("  learning_rate: .nan\n", "training.learning_rate"),
        ("  learning_rate: '1e999'\n", "training.learning_rate"),
        ("  learning_rate: 1.0e+999\n", "training.learning_rate"),
    ],
)
def test_non_finite_numbers_in_model_yaml_are_refused(offline, tmp_path, text, where):
    base = TINY.read_text()
    assert "  learning_rate: 0.003\n" in base
    model = tmp_path / "model.yaml"
    model.write_text(base.replace("  learning_rate: 0.003\n", text, 1))
    code, out, _ = dry(offline, model=model)
    assert code == 2 and str(model) in out and where in out, out
    assert "is not a finite number" in out or "finite number" in out.replace(str(model), ""), out


def test_learning_rate_inf_never_reaches_plan_json_as_null(tmp_path):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.jobspec import load_job_spec

    model = tmp_path / "model.yaml"
    model.write_text(TINY.read_text().replace("  learning_rate: 0.003\n", "  learning_rate: .inf\n", 1))
    with pytest.raises(InputError, match=r"model\.yaml:\d+: training\.learning_rate: \.inf is not a finite number"):
        load_job_spec(model)


def test_non_finite_factory_kwargs_are_refused(tmp_path):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.jobspec import load_job_spec

    model = tmp_path / "model.yaml"
    model.write_text("""\
name: f
model:
  factory: mymodels:build
  factory_kwargs: {scale: .nan}
  factory_arch: {layers: 2, hidden: 64, heads: 4, ffn: 172, vocab: 256}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    with pytest.raises(InputError, match=r"model\.yaml:4: model\.factory_kwargs\.scale: \.nan is not a finite"):
        load_job_spec(model)


def test_duplicate_keys_are_refused_with_file_line_and_key(offline, tmp_path):
    model = tmp_path / "model.yaml"
    model.write_text(TINY.read_text().replace("training:\n", "training:\n  steps: 1\n", 1))
    code, out, _ = dry(offline, model=model)
    assert code == 2, out
    first = next(i for i, line in enumerate(model.read_text().splitlines(), 1) if line.strip().startswith("steps:"))
    second = [i for i, line in enumerate(model.read_text().splitlines(), 1) if line.strip().startswith("steps:")][1]
    assert f"{model}:{second}: training.steps: the key 'steps' is given twice (first on line {first})" in out, out


def test_merge_keys_may_still_override(tmp_path):
    from frenzy_slurm.core.yamlfile import read_yaml

    path = tmp_path / "x.yaml"
    path.write_text("base: &b {a: 1, b: 2}\nuse:\n  <<: *b\n  b: 3\n")
    assert read_yaml(path)[0]["use"] == {"a": 1, "b": 3}


def test_relative_entry_data_is_relative_to_model_yaml(tmp_path, monkeypatch):
    """The job runs in its job directory: a relative entry.data must already name model.yaml's neighbour."""
    from frenzy_slurm.jobspec import load_job_spec

    spec = yaml.safe_load(TINY.read_text())
    spec.setdefault("entry", {})["data"] = "tokens/train.bin"
    project = tmp_path / "project"
    project.mkdir()
    model = project / "model.yaml"
    model.write_text(yaml.safe_dump(spec))
    monkeypatch.chdir(tmp_path)  # the directory fsbatch runs in is neither model.yaml's nor the job's
    loaded = load_job_spec(model)
    assert loaded.entry.data == str(project / "tokens" / "train.bin")
    # what plan.json and the job directory's model.yaml carry (the trainer reads it there)
    assert loaded.model_dump(mode="json")["entry"]["data"] == str(project / "tokens" / "train.bin")
    absolute = tmp_path / "elsewhere.bin"
    spec["entry"]["data"] = str(absolute)
    model.write_text(yaml.safe_dump(spec))
    assert load_job_spec(model).entry.data == str(absolute)
