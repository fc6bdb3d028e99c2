"""`fsbatch --replan` (model.yaml's slurm.replan): the job is rendered to run whichever planned shape it gets."""

from __future__ import annotations

import json

import yaml

from frenzy_slurm.render.shapes import SRUN_AS_GIVEN

from .helpers import EXAMPLES, run_cli

POOLS = [("short", "A100-40GB", 2, 4), ("long", "A100-40GB", 2, 4), ("t4", "T4", 4, 4)]


def _offline(tmp_path) -> list[str]:
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(POOLS).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site(POOLS).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(snap), "--site", str(site)]


def test_fsbatch_replan_renders_the_shape_flags_and_the_plain_job_has_none(tmp_path):
    args = [str(EXAMPLES / "tiny-cpu.yaml"), "--dry-run", "--json", *_offline(tmp_path)]
    shaped = run_cli("fsbatch", *args, "--replan")
    plain = run_cli("fsbatch", *args)
    assert shaped.returncode == 0 and plain.returncode == 0, shaped.stderr + plain.stderr
    assert f"srun {SRUN_AS_GIVEN}--kill-on-bad-exit=1" in json.loads(shaped.stdout)["script"]
    assert "SLURM_GPUS_ON_NODE" not in json.loads(plain.stdout)["script"]
