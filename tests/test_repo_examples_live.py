"""The example scripts (examples/scripts/) train on the local Slurm cluster: fsbatch plans them with the CPU site
file, Slurm runs them through the runtime, and each logs its loss for every planned step and exits 0.

- hf_trainer_full: HF Trainer + DeepSpeed, ds_config.json in HF's "auto" form, the plan as TrainingArguments flags;
- peft_lora: PEFT LoRA on the HF Trainer, the plan read from FRENZY_* variables;
- torch_ddp: a plain torch loop; USR2 mid-run makes it checkpoint and requeue itself (frenzy_slurm.in_job), and
  the requeued run resumes from that checkpoint and finishes.

Each trains a tiny random model (no download, no network) in well under two minutes on this machine.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from .helpers import EXAMPLES, ROOT, fsbatch_json, wait_done
from .slurm_fixture import release_requeued, sh, wait_for

pytest.importorskip("deepspeed", reason="the examples need the train extra (pip install -e '.[dev]')")
pytest.importorskip("transformers", reason="the examples need the examples extra (pip install -e '.[dev]')")
pytest.importorskip("peft", reason="the examples need the examples extra (pip install -e '.[dev]')")

pytestmark = [pytest.mark.live, pytest.mark.slow]

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"
SCRIPTS = EXAMPLES / "scripts"


@pytest.fixture(autouse=True)
def built_ops_cache(monkeypatch):
    """live_jobs_dir points XDG_CACHE_HOME at the test's directory, and torch keeps the shared-memory op DeepSpeed
    builds on first use (about a minute here) under it: keep the user's build cache instead, which the job inherits."""
    cache = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(cache))


def example(tmp_path: Path, name: str, limits: dict | None = None, **training) -> Path:
    """examples/scripts/NAME.yaml with the script named absolutely (the copy lives in tmp_path), `training`
    changed and `limits` set."""
    data = yaml.safe_load((SCRIPTS / f"{name}.yaml").read_text())
    data["entry"]["script"] = str(SCRIPTS / data["entry"]["script"])
    data["training"].update(training)
    if limits:
        data["limits"] = limits
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


def output_of(out: dict) -> str:
    return (Path(out["job_dir"]) / f"slurm-{out['job_id']}.out").read_text()


def summary(out: dict) -> dict:
    """What the script's rank 0 wrote when it ended: JOBDIR/example-result.json (steps, max_steps, losses)."""
    path = Path(out["job_dir"]) / "example-result.json"
    assert path.exists(), output_of(out)[-3000:]
    return json.loads(path.read_text())


def submit_and_finish(spec: Path, timeout: float = 240) -> tuple[dict, str]:
    out = fsbatch_json(str(spec), "--site", str(CPU_SITE))
    done = wait_done(out["job_id"], timeout=timeout)
    text = output_of(out)
    assert done["state"] == "COMPLETED", text[-3000:]
    finished = json.loads((Path(out["job_dir"]) / "finished.json").read_text())
    assert finished["exit_code"] == 0
    return out, text


def trained(s: dict, steps: int) -> None:
    assert s["step"] == steps, s
    assert len(s["loss"]) == steps and all(math.isfinite(x) and 0 < x < 10 for x in s["loss"]), s


def test_hf_trainer_deepspeed_full_finetune(live_jobs_dir, tmp_path):
    """On two ranks (min_gpus 2): data parallel with the ZeRO stage the plan chose, in HF's config form."""
    out, text = submit_and_finish(example(tmp_path, "hf_trainer_full", limits={"min_gpus": 2}))
    plan = out["decision"]["chosen"]["plan"]
    assert (plan["dp"], plan["tp"], plan["pp"]) == (2, 1, 1), plan
    ds = json.loads((Path(out["job_dir"]) / "ds_config.json").read_text())
    assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["zero_optimization"]["stage"] == plan["zero"]
    s = summary(out)
    trained(s, 6)
    assert "frenzy-example: step 6/6" in text
    assert s["deepspeed"] is True, "the Trainer ran with the rendered DeepSpeed config"
    assert "mismatch" not in text.lower().replace("gradient accumulation steps mismatch", "")


def test_peft_lora(live_jobs_dir, tmp_path):
    out, text = submit_and_finish(example(tmp_path, "peft_lora"))
    trained(summary(out), 6)
    assert re.search(r"trainable params: [\d,]+ \|\| all params", text), "PEFT wrapped the model"


def test_torch_loop_checkpoints_and_requeues_at_usr2(live_jobs_dir, tmp_path):
    steps = 120
    out = fsbatch_json(str(example(tmp_path, "torch_ddp", steps=steps)), "--site", str(CPU_SITE))
    job, job_dir = out["job_id"], Path(out["job_dir"])
    log = job_dir / f"slurm-{job}.out"
    wait_for(
        lambda: re.search(rf"step 1\d/{steps} ", log.read_text()) if log.exists() else None,
        timeout=180,
        interval=0.5,
        what="ten steps",
    )
    sh("scancel", "--signal=USR2", str(job))  # what Slurm sends 300 s before the time limit, to every task
    release_requeued(job)  # Slurm holds a requeue
    done = wait_done(job, timeout=240)
    text = log.read_text()
    assert done["state"] == "COMPLETED", text[-3000:]
    tags = sorted(int(p.name[4:]) for p in (job_dir / "checkpoints").glob("step*"))
    assert len(tags) == 2 and tags[0] < steps - 1 and tags[1] == steps - 1, tags
    assert "requeued after SIGUSR2" in text
    assert f"at step {tags[0] + 1}" in text, "the requeued run resumed after the USR2 checkpoint"
    s = summary(out)  # the second run's: the steps after the checkpoint
    assert s["step"] == steps and len(s["loss"]) == steps - tags[0] - 1
    assert all(math.isfinite(x) for x in s["loss"]) and s["loss"][-1] < 5.0, "it learned (random: ln 256 = 5.5)"
