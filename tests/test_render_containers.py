"""A job in a container image (entry.environment.container): the model.yaml block, the srun line rendered for
Apptainer/Singularity and for pyxis/enroot, and what fsbatch checks before submitting (the image, the runtime
command or plugin, the image's Python)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.render.environment import check_environment, probe
from frenzy_slurm.sim.synthetic import synthetic

from .helpers import LOCAL, ROOT, fill, make_spec, planned

JOB_DIR = Path("/scratch/jobs/ctr-0001")
STANDIN = ROOT / "tests" / "payloads" / "apptainer"


def spec_with(container: dict, **entry):
    return make_spec(entry={"environment": {"container": container}, **entry})


def srun_line(script: str) -> list[str]:
    (line,) = [ln for ln in script.splitlines() if ln.startswith("srun ")]
    return shlex.split(line)


def port_line(script: str) -> list[str]:
    (line,) = [ln for ln in script.splitlines() if ln.startswith("MASTER_PORT=$(")]
    return shlex.split(line.removeprefix("MASTER_PORT=$(").removesuffix(") ||"))


def test_apptainer_launch_line(tmp_path):
    image = tmp_path / "train.sif"
    image.write_bytes(b"sif")
    spec = spec_with({"runtime": "apptainer", "image": str(image), "mounts": ["/scratch/data:/data:ro"]})
    req = planned(spec, synthetic(LOCAL), JOB_DIR)
    binds = f"{JOB_DIR},/scratch/data:/data:ro"
    assert srun_line(req.script) == [
        "srun", "--kill-on-bad-exit=1", "--label",
        "apptainer", "exec", "--nv", "--bind", binds, "--pwd", str(JOB_DIR), str(image),
        "python3", "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(JOB_DIR),
    ]  # fmt: skip
    assert port_line(req.script) == [
        "apptainer", "exec", "--bind", binds, "--pwd", str(JOB_DIR), str(image),
        "python3", "-P", "-m", "frenzy_slurm.runtime.dist", "free-port",
    ]  # fmt: skip
    assert req.plan.command[:1] == ["python3"]  # plan.json records what runs in the image


def test_singularity_without_gpus_and_with_options(tmp_path):
    spec = spec_with(
        {"runtime": "singularity", "image": "docker://nvcr.io/nvidia/pytorch:24.05-py3", "gpus": False,
         "options": ["--cleanenv"], "python": "/opt/conda/bin/python", "workdir": "/workspace"}
    )  # fmt: skip
    argv = srun_line(planned(spec, synthetic(LOCAL), JOB_DIR).script)
    assert argv[3:12] == [
        "singularity", "exec", "--bind", str(JOB_DIR), "--pwd", "/workspace", "--cleanenv",
        "docker://nvcr.io/nvidia/pytorch:24.05-py3", "/opt/conda/bin/python",
    ]  # fmt: skip


def test_pyxis_launch_line_registry_image():
    spec = spec_with({"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3",
                      "options": ["--container-remap-root"]})  # fmt: skip
    req = planned(spec, synthetic(LOCAL), JOB_DIR)
    flags = [
        "--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
        f"--container-mounts={JOB_DIR}:{JOB_DIR}",
        f"--container-workdir={JOB_DIR}",
        "--container-remap-root",
    ]
    assert srun_line(req.script) == [
        "srun", "--kill-on-bad-exit=1", "--label", *flags,
        "python3", "-P", "-m", "frenzy_slurm.runtime", "--job-dir", str(JOB_DIR),
    ]  # fmt: skip
    assert port_line(req.script) == [
        "srun", "--nodes=1", "--ntasks=1", "--kill-on-bad-exit=1", *flags,
        "python3", "-P", "-m", "frenzy_slurm.runtime.dist", "free-port",
    ]  # fmt: skip


def test_pyxis_squashfs_path_is_taken_from_model_yaml_dir_and_hetjob_keeps_groups(tmp_path):
    """A hetjob (a100 full, one free V100 and T4 pair: test_render's shape) runs every component in the image."""
    view = fill(fill(fill(synthetic(LOCAL), "a100"), "v100", {"v100-2": 2}), "t4", {"t4-4": 2})
    spec = make_spec(
        model={"arch": {"layers": 16, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000}},
        training={"seq_len": 512, "global_batch": 8, "steps": 2, "precision": "fp32", "micro_batch": 1},
        entry={"environment": {"container": {"runtime": "pyxis", "image": "./img/train.sqsh"}}},
    )
    req = planned(spec, view, JOB_DIR, spec_path=tmp_path / "model.yaml")
    assert req.kind == "heterogeneous"
    argv = srun_line(req.script)
    assert argv[1] == "--het-group=0,1"
    assert f"--container-image={tmp_path}/img/train.sqsh" in argv


def test_script_directory_is_mounted(tmp_path):
    script = tmp_path / "code" / "train.py"
    spec = spec_with({"runtime": "apptainer", "image": "/img/t.sif"}, trainer="script", script=str(script))
    argv = srun_line(planned(spec, synthetic(LOCAL), JOB_DIR).script)
    assert argv[argv.index("--bind") + 1] == f"{JOB_DIR},{script.parent}"
    assert argv[-3:] == ["--script", str(script), "--"]


@pytest.mark.parametrize(
    ("container", "words"),
    [
        ({"runtime": "docker", "image": "x"}, "runtime"),
        ({"runtime": "apptainer", "image": "a b.sif"}, "space"),
        ({"runtime": "apptainer", "image": "/i.sif", "mounts": ["data:/data"]}, "SRC[:DST[:FLAGS]]"),
        ({"runtime": "apptainer", "image": "/i.sif", "mounts": ["/a,/b"]}, "no ','"),
        ({"runtime": "pyxis", "image": "x", "options": ["--ntasks=9"]}, "pyxis flag"),
        ({"runtime": "pyxis", "image": "x", "options": ["--container-image=y"]}, "container.image"),
        ({"runtime": "apptainer", "image": "/i.sif", "options": ["; rm -rf /"]}, "one flag"),
        ({"runtime": "pyxis", "image": "x", "gpus": False}, "--nv"),
        ({"runtime": "apptainer", "image": "/i.sif", "workdir": "rel"}, "absolute"),
    ],
)
def test_bad_container_blocks_are_refused(container, words):
    with pytest.raises(ValidationError, match=None) as err:
        spec_with(container)
    assert words in str(err.value)


def test_container_and_venv_are_one_too_many():
    with pytest.raises(ValidationError, match="container.python"):
        make_spec(
            entry={"trainer": "script", "script": "t.py",
                   "environment": {"venv": "/v", "container": {"runtime": "apptainer", "image": "/i.sif"}}}
        )  # fmt: skip


# ---- the checks before submitting ----


@pytest.fixture
def standin_path(tmp_path, monkeypatch):
    """`apptainer` on PATH: the stand-in, which runs the command after the image on the host."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").symlink_to(STANDIN)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    probe.cache_clear()
    return bin_dir


def test_missing_image_refuses_and_is_a_note_under_dry_run(tmp_path, standin_path):
    spec = spec_with({"runtime": "apptainer", "image": "gone.sif"})
    with pytest.raises(InputError, match=rf"container.image {tmp_path}/gone.sif does not exist"):
        check_environment(spec, tmp_path, "refuse")
    (note,) = check_environment(spec, tmp_path, "note")
    assert "does not exist" in note and "refuses" in note
    assert check_environment(spec, tmp_path, "off") == []


def test_runtime_command_missing_refuses_unless_a_module_may_provide_it(tmp_path, monkeypatch):
    (tmp_path / "i.sif").write_bytes(b"x")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    spec = spec_with({"runtime": "apptainer", "image": "i.sif"})
    with pytest.raises(InputError, match="`apptainer` .* is not on this login node's PATH"):
        check_environment(spec, tmp_path, "refuse")
    moduled = make_spec(entry={"environment": {"modules": ["apptainer/1.3"],
                                               "container": {"runtime": "apptainer", "image": "i.sif"}}})  # fmt: skip
    (note,) = check_environment(moduled, tmp_path, "refuse")
    assert "modules may provide it" in note


def test_image_python_is_asked_through_apptainer(tmp_path, standin_path, monkeypatch):
    """With the stand-in `apptainer exec IMAGE PY` is PY on the host: this venv's Python finds every package;
    a Python without deepspeed is refused, naming it."""
    (tmp_path / "i.sif").write_bytes(b"x")
    monkeypatch.setenv("FRENZY_STANDIN_LOG", str(tmp_path / "calls.jsonl"))
    good = spec_with({"runtime": "apptainer", "image": "i.sif", "python": sys.executable})
    pytest.importorskip("deepspeed")
    assert check_environment(good, tmp_path, "refuse") == []
    call = (tmp_path / "calls.jsonl").read_text().splitlines()[0]
    assert call.startswith(f'["exec", "{tmp_path}/i.sif", "{sys.executable}", "-P", "-c"')
    bare = tmp_path / "bare"
    bare.mkdir()
    empty_python = bare / "python"
    empty_python.write_text('#!/bin/sh\nexec /usr/bin/python3 -I "$@"\n')  # no site-packages: no frenzy_slurm
    empty_python.chmod(0o755)
    bad = spec_with({"runtime": "apptainer", "image": "i.sif", "python": str(empty_python)})
    with pytest.raises(InputError, match="cannot find frenzy_slurm, torch, deepspeed"):
        check_environment(bad, tmp_path, "refuse")


def _fake_srun(tmp_path: Path, monkeypatch, help_text: str, code: int = 0) -> None:
    bin_dir = tmp_path / "srunbin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    to = " >&2" if code else ""  # srun's help on stdout, its errors on stderr
    srun.write_text(f"#!/bin/sh\ncat{to} <<'EOF'\n{help_text}\nEOF\nexit {code}\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


PYXIS = {"runtime": "pyxis", "image": "nvcr.io#nvidia/pytorch:24.05-py3"}


def test_pyxis_plugin_found_in_srun_help(tmp_path, monkeypatch):
    _fake_srun(
        tmp_path, monkeypatch, "Usage: srun [OPTIONS...]\n      --container-image=[USER@][REGISTRY#]IMAGE[:TAG]|PATH"
    )
    notes = check_environment(spec_with(PYXIS), tmp_path, "refuse")
    assert any("registry reference" in n for n in notes)
    assert any("not asked" in n for n in notes) and not any("pyxis (--container-image) was not" in n for n in notes)


def test_srun_without_pyxis_refuses(tmp_path, monkeypatch):
    _fake_srun(tmp_path, monkeypatch, "Usage: srun [OPTIONS...]\n  -N, --nodes=N")
    with pytest.raises(InputError, match="srun has no --container-image option: the pyxis SPANK plugin"):
        check_environment(spec_with(PYXIS), tmp_path, "refuse")


def test_srun_unusable_is_a_note(tmp_path, monkeypatch):
    _fake_srun(tmp_path, monkeypatch, "srun: fatal: Could not establish a configuration source", code=1)
    notes = check_environment(spec_with(PYXIS), tmp_path, "refuse")
    assert any("was not checked: `srun --help` failed (exit 1: srun: fatal" in n for n in notes)


def test_pyxis_squashfs_file_checked(tmp_path, monkeypatch):
    _fake_srun(tmp_path, monkeypatch, "--container-image=IMAGE")
    with pytest.raises(InputError, match="img.sqsh does not exist"):
        check_environment(spec_with({"runtime": "pyxis", "image": "./img.sqsh"}), tmp_path, "refuse")
    (tmp_path / "img.sqsh").write_bytes(b"hsqs")
    notes = check_environment(spec_with({"runtime": "pyxis", "image": "./img.sqsh"}), tmp_path, "refuse")
    assert not any("registry" in n for n in notes)


def test_custom_launch_template_must_run_the_container(tmp_path):
    for name in ("_header.j2", "_component.j2", "homogeneous.sbatch.j2", "heterogeneous.sbatch.j2"):
        (tmp_path / name).write_text((ROOT / "templates" / name).read_text())
    old = (ROOT / "templates" / "_launch.j2").read_text().split("{% if container %}")[0]
    (tmp_path / "_launch.j2").write_text(old + "srun {{ command | map('shquote') | join(' ') }}\n")
    tmp_path.chmod(0o700)
    spec = spec_with({"runtime": "apptainer", "image": "/img/t.sif"})
    with pytest.raises(InputError, match="does not launch entry.environment.container"):
        planned(spec, synthetic(LOCAL), JOB_DIR, templates=tmp_path)
