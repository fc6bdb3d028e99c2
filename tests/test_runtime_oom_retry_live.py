"""A planned job that runs out of memory is submitted again once, on the next plan, and resumes its checkpoint.

On the dev cluster, with the built-in trainer on the CPU: the runtime's test-only hook (jobdir/oom.py,
`FRENZY_TEST_GPU_MEMORY_GIB`) makes every rank whose planned peak is above a device size raise a real
`torch.OutOfMemoryError` once it has trained a few steps. The size is set between the chosen plan's peak and
its fallback's, so the first job fails after its checkpoint and the fallback (fsbatch chose it: has/fallback.py)
fits. The job's own epilogue (frenzy_slurm/runtime/oom_retry.py) must submit the fallback once, which must resume from
that checkpoint on its wider plan and finish every step; fsqueue says what happened, and calibration sees the
measured peak.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, fsbatch_json, run_cli, wait_done

pytestmark = [pytest.mark.slow]
pytest.importorskip("deepspeed", reason="training tests need the train extra (pip install -e '.[dev]')")

CPU_SITE = ROOT / "site_configs" / "devcluster-cpu.yaml"


def _spec(tmp_path: Path) -> Path:
    spec = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    spec["name"] = "oom-retry"
    # one A100 with two micro-batches per step; its fallback is two A100s, data parallel, ZeRO 0 (loads the
    # checkpoint as it is): what fsbatch plans for this job on the dev cluster's CPU site
    spec["training"].update(global_batch=2, micro_batch=1, steps=8, checkpoint_interval=2)
    spec["limits"] = {"gpu_types": ["a100"]}
    path = tmp_path / "oom-retry.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_job_out_of_memory_resumes_on_its_fallback_plan(live_jobs_dir, tmp_path, monkeypatch):
    built = Path.home() / ".cache" / "torch_extensions" / "py311_cpu"
    if built.is_dir():  # DeepSpeed's shared-memory op, built by an earlier run: minutes on a loaded machine
        monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(built))
    path = _spec(tmp_path)
    planned = fsbatch_json(str(path), "--site", str(CPU_SITE), "--dry-run")["decision"]
    chosen_peak = planned["chosen"]["components"][0]["peak_gib"]
    fallback = next(f for f in planned["oom_fallbacks"] if f["resumes"])["allocation"]
    fallback_peak = max(c["peak_gib"] for c in fallback["components"])
    assert fallback_peak < chosen_peak
    monkeypatch.setenv("FRENZY_TEST_GPU_MEMORY_GIB", str((chosen_peak + fallback_peak) / 2))
    monkeypatch.setenv("FRENZY_TEST_OOM_FROM_STEP", "4")  # after the checkpoint of step 4
    out = fsbatch_json(str(path), "--site", str(CPU_SITE))
    job, job_dir = int(out["job_id"]), Path(out["job_dir"])
    first = wait_done(job, timeout=900)
    log = (job_dir / f"slurm-{job}.out").read_text()
    assert first["state"] == "FAILED", log[-3000:]
    assert "torch.OutOfMemoryError" in log
    record = json.loads((job_dir / "oom.json").read_text())
    assert record["kind"] == "cuda" and record["from_step"] == 4, record
    retry, retry_dir = record["retry_job"], Path(record["retry_dir"])
    assert retry_dir == job_dir.with_name(job_dir.name + ".2")
    assert f"submitted again once as job {retry}" in log
    rank = json.loads((job_dir / "oom-0.json").read_text())
    assert rank["peak_gib"] == pytest.approx(chosen_peak)  # on the CPU, the hook's: the plan's peak it lacked
    # the successor: the fallback plan, after this job, continuing its training
    plan = json.loads((retry_dir / "plan.json").read_text())
    assert plan["decision"]["chosen"]["plan"] == fallback["plan"]
    assert plan["moved_from"]["job_id"] == job and plan["moved_from"]["reason"] == "out of memory"
    done = wait_done(retry, timeout=900)
    assert done["state"] == "COMPLETED", (retry_dir / f"slurm-{retry}.out").read_text()[-3000:]
    m = json.loads((retry_dir / "metrics.json").read_text())
    assert m["resumed_from_step"] == 4 and m["step"] == 8
    assert len(m["ranks"]) == fallback["components"][0]["gpus_per_node"] * fallback["components"][0]["nodes"]
    assert not (retry_dir / "oom.json").exists()
    # fsqueue says what became of the first job
    shown = json.loads(run_cli("fsqueue", str(job), "--json").stdout)
    assert any(f"submitted again as job {retry}" in n for n in shown["notes"]), shown["notes"]
    # and calibration reads the failed run's measured peak against its plan
    from frenzy_slurm.calibration.observe import observe
    from frenzy_slurm.site.config import load_site

    obs = observe(job_dir, load_site(CPU_SITE))
    assert not isinstance(obs, str), obs
    assert obs.memory == [(pytest.approx(chosen_peak), pytest.approx(chosen_peak))]
