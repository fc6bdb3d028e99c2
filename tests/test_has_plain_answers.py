"""No silent wrong answers from planning: what fsbatch and fsinfo say instead of answering wrongly.

- a site-file pool whose partition Slurm does not have is named (never dropped without a word);
- an unknown limits.gpu_types entry is refused as bad input (exit 2), naming the known types;
- a -t shorter than the predicted run time gets a note (the job reaches its limit, checkpoints and requeues);
- a run whose --time is above every partition's MaxTime names the real fix, a shorter -t, with the arithmetic.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, EXIT_NO_FIT, InputError, NoFitError
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.planning import SiteFile
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

from .helpers import EXAMPLES, LOCAL, make_spec, plan, planned, run_cli

# LOCAL plus a pool whose partition the cluster does not have (a typo of the site admin's)
TYPO = ("gpu-a100", "A100-40GB", 2, 4)
LONG = {"training__steps": 200_000}  # gpt2-medium for hours on LOCAL's GPUs


def _capped(view, minutes: int):
    """The view with every partition's MaxTime at `minutes`."""
    parts = [p.model_copy(update={"max_time_min": minutes}) for p in view.partitions]
    return view.model_copy(update={"partitions": parts})


@pytest.fixture
def offline(tmp_path):
    """A static snapshot of LOCAL and a site file describing LOCAL plus TYPO; (argv, site path)."""
    snap, site = tmp_path / "snap.json", tmp_path / "site.yaml"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    site.write_text(yaml.safe_dump(synthetic_site([*LOCAL, TYPO]).model_dump(mode="json")))
    return ["--backend", "static", "--snapshot", str(snap), "--site", str(site)], site


def _job_yaml(tmp_path, **limits) -> str:
    path = tmp_path / "model.yaml"
    spec = {
        "name": "k21",
        "model": {"preset": "gpt2-medium"},
        "training": {"seq_len": 1024, "global_batch": 64, "steps": 100, "precision": "bf16-mixed"},
    }
    if limits:
        spec["limits"] = limits
    path.write_text(yaml.safe_dump(spec))
    return str(path)


# 1. site pools naming partitions Slurm does not have


def test_site_pool_without_partition_is_listed_in_the_decision():
    d = plan(make_spec(), synthetic(LOCAL), site=synthetic_site([*LOCAL, TYPO]))
    dropped = [a for a in d.alternatives if a.description == "gpu-a100/a100_40gb"]
    assert len(dropped) == 1 and dropped[0].allocation is None
    assert "Slurm has no partition gpu-a100 (Slurm has: a100, t4, v100)" in dropped[0].lost_because


def test_site_pool_without_partition_is_a_note_naming_the_site_file(tmp_path):
    site = SiteFile(synthetic_site([*LOCAL, TYPO]), tmp_path / "site.yaml")
    req = planned(make_spec(), synthetic(LOCAL), job_dir=tmp_path / "job", site=site)
    assert req.notes == (
        f"gpu-a100/a100_40gb: site file {tmp_path / 'site.yaml'} has a pool partition=gpu-a100 gres_type=a100_40gb, "
        "but Slurm has no partition gpu-a100 (Slurm has: a100, t4, v100); the pool is not used",
    )
    assert req.as_json()["notes"] == list(req.notes)
    assert "notes" not in planned(make_spec(), synthetic(LOCAL), job_dir=tmp_path / "j2").as_json()


def test_only_missing_partitions_is_no_fit_naming_them():
    with pytest.raises(NoFitError, match="Slurm has no partition gpu-a100 \\(Slurm has: a100, t4, v100\\)"):
        plan(make_spec(), synthetic(LOCAL), site=synthetic_site([TYPO]))


def test_fsbatch_and_fsinfo_say_so_on_stderr(offline, tmp_path):
    argv, site = offline
    res = run_cli("fsbatch", _job_yaml(tmp_path), "--dry-run", "--explain", *argv, "--job-dir", str(tmp_path / "j"))
    assert res.returncode == 0, res.stderr
    assert f"fsbatch: note: gpu-a100/a100_40gb: site file {site} has a pool partition=gpu-a100" in res.stderr
    assert "(Slurm has: a100, t4, v100)" in res.stderr
    assert "gpu-a100/a100_40gb: " in res.stdout  # --explain's table lists the pool left out
    info = run_cli("fsinfo", *argv, "--json")
    assert info.returncode == 0, info.stderr
    assert f"fsinfo: note: gpu-a100/a100_40gb: site file {site} has a pool" in info.stderr
    assert "Slurm has: a100, t4, v100" in info.stderr
    json.loads(info.stdout)  # stdout stays a snapshot


# 2. unknown limits.gpu_types


def test_unknown_gpu_type_is_bad_input_naming_the_known_ones():
    with pytest.raises(InputError) as err:
        plan(make_spec(limits={"gpu_types": ["a100", "a1OO"]}), synthetic(LOCAL))
    assert err.value.exit_code == EXIT_BAD_INPUT
    assert err.value.message.startswith("limits.gpu_types: a1oo is not a GPU type of this cluster or its site file.")
    assert "GRES types: a100_40gb, t4, v100_32gb; GPU models: A100-40GB, T4, V100-32GB" in err.value.message


def test_gpu_types_naming_nothing_here_is_bad_input_not_no_fit():
    with pytest.raises(InputError, match="limits.gpu_types: h200 is not a GPU type"):
        plan(make_spec(limits={"gpu_types": ["H200"]}), synthetic(LOCAL))


def test_catalog_model_absent_here_is_a_note(tmp_path):
    """A model.yaml may list the GPUs of several clusters: a real GPU model this one lacks is said, not refused."""
    req = planned(make_spec(limits={"gpu_types": ["T4", "H200"]}), synthetic(LOCAL), job_dir=tmp_path / "j")
    assert {c.gpu_model for c in req.decision.chosen.components} == {"T4"}
    assert req.notes == ("limits.gpu_types: h200 is a GPU model this cluster does not have (not used here)",)


def test_fsbatch_exits_2_for_unknown_gpu_type(offline, tmp_path):
    res = run_cli("fsbatch", _job_yaml(tmp_path, gpu_types=["v100", "tesla"]), "--dry-run", *offline[0])
    assert res.returncode == EXIT_BAD_INPUT, res.stderr
    assert "fsbatch: error: limits.gpu_types: tesla is not a GPU type" in res.stderr
    assert "Traceback" not in res.stderr


# 3. -t shorter than the predicted run time


def test_short_time_gets_a_note(tmp_path):
    spec = make_spec(**LONG)
    req = planned(spec, synthetic(LOCAL), job_dir=tmp_path / "j", options=SlurmOptions(time="60"))
    run_min = req.decision.chosen.run_time_s / 60
    assert req.decision.chosen.time_min == 60 and run_min > 120
    (note,) = req.notes
    assert note.startswith("--time 60 min (-t/slurm.time) is shorter than the predicted run time ")
    assert "the job will reach its time limit" in note and "checkpoints and requeues itself" in note
    assert f"about {-(-req.decision.chosen.run_time_s // (60 * 60 - 420)):.0f} runs" in note
    assert planned(spec, synthetic(LOCAL), job_dir=tmp_path / "k").notes == ()  # HAS's own --time covers the run
    long_enough = SlurmOptions(time=str(int(run_min) + 1))
    assert planned(spec, synthetic(LOCAL), job_dir=tmp_path / "l", options=long_enough).notes == ()


def test_fsbatch_prints_the_short_time_note_without_explain(offline, tmp_path):
    path = tmp_path / "long.yaml"
    spec = yaml.safe_load(open(_job_yaml(tmp_path)))
    spec["training"]["steps"] = 200_000
    path.write_text(yaml.safe_dump(spec))
    res = run_cli("fsbatch", str(path), "--dry-run", "-t", "60", *offline[0], "--job-dir", str(tmp_path / "j"))
    assert res.returncode == 0, res.stderr
    assert "fsbatch: note: --time 60 min (-t/slurm.time) is shorter than the predicted run time" in res.stderr


# 4. a run longer than every partition's MaxTime


def test_run_longer_than_every_max_time_names_a_shorter_time():
    view = _capped(synthetic(LOCAL), 120)
    with pytest.raises(NoFitError) as err:
        plan(make_spec(**LONG), view)
    msg = err.value.message
    assert err.value.exit_code == EXIT_NO_FIT
    assert "above MaxTime 120 min of partition" in msg and "the longest of the partitions it fits" in msg
    assert "To fix: give a shorter time, `fsbatch -t 120` or less (or slurm.time), and let the job run in pieces" in msg
    assert "USR2 300 s before the limit" in msg and "raise limits.max_gpus" not in msg
    assert "(the prediction x 1.25 + 10 min)" in msg
    # the fix works: the same job with -t 120 is planned, with the note of part 3
    assert plan(make_spec(**LONG), view, time="120").chosen.time_min == 120


def test_max_time_message_has_the_arithmetic():
    with pytest.raises(NoFitError) as err:
        plan(make_spec(**LONG), _capped(synthetic(LOCAL), 120))
    m = re.search(r"predicted to run ([\d.]+) h \((\d+) min\) and the --time it needs is (\d+) min", err.value.message)
    assert m is not None, err.value.message
    hours, run_min, needs = float(m[1]), int(m[2]), int(m[3])
    assert abs(hours * 60 - run_min) <= 3 and abs(needs - (run_min * 1.25 + 10)) <= 2 and needs > 120
    # the fastest allocation HAS found for the job is the one named
    d = plan(make_spec(**LONG), synthetic(LOCAL))
    found = [d.chosen] + [a.allocation for a in d.alternatives if a.allocation is not None]
    assert run_min <= round(min(a.run_time_s for a in found) / 60)


def test_time_above_max_time_for_a_short_run_names_only_the_shorter_time():
    with pytest.raises(NoFitError) as err:
        plan(make_spec(), _capped(synthetic(LOCAL), 60), time="120")
    msg = err.value.message
    assert "-t/slurm.time asks for 120 min, above MaxTime 60 min" in msg
    assert msg.endswith("To fix: give a shorter time, `fsbatch -t 60` or less (or slurm.time).")


def test_example_with_catalog_types_still_plans(offline, tmp_path):
    """examples/qwen2-1.5b-qlora.yaml lists V100-16GB, a model this cluster lacks: planned, and said."""
    res = run_cli("fsbatch", str(EXAMPLES / "qwen2-1.5b-qlora.yaml"), "--dry-run", "--json", *offline[0])
    assert res.returncode == 0, res.stderr
    assert "limits.gpu_types: v100-16gb is a GPU model this cluster does not have" in res.stderr
