"""Issue 19 (second audit), engineer D's items: what frenzy-slurm starts, and what it accepts as input.

- 2: every Python process frenzy-slurm starts that is not the user's own script runs with `-P` from a safe
  directory, so a module planted in the working directory (a `pynvml.py`) is never imported.
- 8: no validator accepts a trailing newline (or a carriage return): every string that reaches job.sbatch.
- 13: the `--sbatch` reserved-flag guard parses flags as sbatch's getopt_long does.
- 15: non-finite floats, duplicate YAML keys, relative entry.data and out-of-range site values.
- 17: `--trace-factory` imports only the user's own files or the site's allow-list.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PLANTED = "import pathlib\npathlib.Path(__file__).with_name('PLANTED-RAN').write_text('imported')\n"


def _plant(directory: Path, module: str = "pynvml") -> Path:
    """A module file that leaves PLANTED-RAN beside itself when imported."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{module}.py").write_text(PLANTED)
    return directory / "PLANTED-RAN"


# ---- item 2: -P and a safe working directory ----------------------------------------------------------------


class _RecordingBackend:
    """The Slurm seam's run_step, recording the probe command instead of starting srun."""

    def __init__(self) -> None:
        self.argv: list[str] | None = None

    def run_step(self, pool, gpus, argv, timeout):
        self.argv = list(argv)
        return ""


def test_site_detect_probe_does_not_import_a_planted_pynvml(tmp_path):
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.site.detect import probe_pools

    view = synthetic([("a100", "A100-40GB", 1, 4)])
    backend = _RecordingBackend()
    probe_pools(backend, view, sys.executable, 30)
    assert backend.argv is not None and backend.argv[:3] == [sys.executable, "-P", "-m"], backend.argv
    # run exactly that command where an attacker planted pynvml.py: the working directory (and an empty
    # PYTHONPATH entry, which means the working directory) must not be searched
    marker = _plant(tmp_path / "cwd")
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:")  # frenzy_slurm from the checkout; the trailing ':' is ''
    res = subprocess.run(backend.argv, cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the probe imported pynvml.py from its working directory"
    answer = json.loads(res.stdout.strip().splitlines()[-1])
    assert answer["host"]  # the real probe ran (with or without NVML on this machine)


def test_probe_drops_the_working_directory_even_when_started_without_P(tmp_path):
    marker = _plant(tmp_path / "cwd")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-m", "frenzy_slurm.runtime.nvml_probe"],
        cwd=tmp_path / "cwd",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert not marker.exists()


def test_site_probe_step_runs_from_root_directory(monkeypatch):
    """`srun --chdir=/`: the step never starts in the admin's directory (or /tmp, srun's fallback)."""
    from frenzy_slurm.slurm import cli as slurm_cli
    from frenzy_slurm.slurm.view import PoolKey

    seen: list[list[str]] = []

    class _Done:
        stdout = "{}"

    monkeypatch.setattr(slurm_cli, "run", lambda argv, timeout: seen.append(list(argv)) or _Done())
    backend = slurm_cli.SlurmCliBackend.__new__(slurm_cli.SlurmCliBackend)
    backend.run_step(PoolKey("a100", "a100"), 1, ["python", "-P", "-m", "x"], 30)
    srun = seen[0]
    assert "--chdir=/" in srun and srun.index("--chdir=/") < srun.index("python"), srun


def test_nvml_sampler_starts_with_P_from_root(tmp_path, monkeypatch):
    import subprocess as sp

    from frenzy_slurm.runtime import nvml_sampler

    started: list[tuple[list[str], dict]] = []
    job = tmp_path / "job"
    job.mkdir()
    with monkeypatch.context() as m:
        m.setattr(sp, "Popen", lambda argv, **kw: started.append((list(argv), kw)))
        nvml_sampler.start_beside(job)
    argv, kw = started[0]
    assert argv[:4] == [sys.executable, "-P", "-m", "frenzy_slurm.runtime.nvml_sampler"], argv
    assert kw.get("cwd") == "/", kw
    # and that command, started where pynvml.py was planted, does not import it (a dead pid: it stops at once)
    marker = _plant(tmp_path / "cwd")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = gone.pid  # a process that has exited: the sampler stops after one sample
    cmd = nvml_sampler.sampler_argv(job, dead, 0.1)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:")
    res = subprocess.run(cmd, cwd=tmp_path / "cwd", env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert not marker.exists(), "the sampler imported pynvml.py from its working directory"


def test_no_frenzy_python_child_without_P():
    """Every `sys.executable` the package starts passes -P (the user's own script, exec'd as a script, aside)."""
    import re

    offenders = []
    for path in (ROOT / "frenzy_slurm").rglob("*.py"):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\[\s*(sys\.executable|python)\s*,\s*\"-[mc]\"", line):
                offenders.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not offenders, offenders


# ---- shared: fsbatch --dry-run on a static cluster ------------------------------------------------------------

POOLS = [("a100", "A100-40GB", 2, 4), ("t4", "T4", 2, 4)]
TINY = ROOT / "examples" / "tiny-cpu.yaml"


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """A saved cluster view and a site file for it: fsbatch --dry-run needs no Slurm."""
    from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

    d = tmp_path_factory.mktemp("audit2-offline")
    (d / "snap.json").write_text(synthetic(POOLS).model_dump_json())
    (d / "site.yaml").write_text(yaml.safe_dump(synthetic_site(POOLS).model_dump(mode="json")))
    return d


def dry(offline: Path, *args: str, model: Path = TINY, site: Path | None = None, env: dict | None = None):
    """fsbatch MODEL --dry-run --json ARGS -> (exit code, output, the rendered script or None). Never a traceback."""
    from click.testing import CliRunner

    from frenzy_slurm.cli.fsbatch import main as fsbatch

    argv = [
        str(model),
        "--dry-run",
        "--json",
        "--backend",
        "static",
        "--snapshot",
        str(offline / "snap.json"),
        "--site",
        str(site or offline / "site.yaml"),
        *args,
    ]
    if "--job-dir" not in args:
        argv += ["--job-dir", str(offline / "job")]
    res = CliRunner().invoke(fsbatch, argv, env=env, catch_exceptions=True)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        import traceback

        pytest.fail("fsbatch crashed: " + "".join(traceback.format_exception(res.exception))[-3000:])
    out = res.stdout + res.stderr
    script = json.loads(res.stdout)["script"] if res.exit_code == 0 else None
    return res.exit_code, out, script


def sbatch_header(script: str) -> list[str]:
    """The #SBATCH directives sbatch reads: every line up to the first one that is neither blank nor a comment."""
    out = []
    for line in script.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH"):
            out.append(stripped)
    return out


def assert_header_intact(script: str) -> None:
    header = sbatch_header(script)
    for needed in ("--requeue", "--signal=USR2@", "--partition=", "--gres=gpu:", "--comment=frenzy:", "--chdir="):
        assert any(line.startswith(f"#SBATCH {needed}") for line in header), (needed, header)
    assert "\r" not in script, "a carriage return reached job.sbatch"


# ---- item 8: no trailing newline (or \r) reaches job.sbatch ---------------------------------------------------

BREAKERS = ["x\n", "x\r", "x\r\n", "x\n#SBATCH --uid=0", "\nx"]
FLAG_NAMES = {
    "-J": "--job-name",
    "-A": "--account",
    "-q": "--qos",
    "-C": "--constraint",
    "-o": "--output",
    "-e": "--error",
    "--mail-user": "--mail-user",
    "--mail-type": "--mail-type",
    "-t": "--time",
    "--sbatch": "--sbatch",
}


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("flag", list(FLAG_NAMES))
def test_flags_with_a_newline_are_refused(offline, flag, value):
    given = {"-t": value.replace("x", "60"), "--sbatch": value.replace("x", "--reservation=big")}.get(flag, value)
    code, out, _ = dry(offline, flag, given)
    assert code == 2, out
    assert FLAG_NAMES[flag] in out and "Traceback" not in out, out


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
def test_job_dir_with_a_newline_is_refused(offline, tmp_path, value):
    code, out, _ = dry(offline, "--job-dir", str(tmp_path / value))
    assert code == 2 and "job directory" in out and "Traceback" not in out, out
    from frenzy_slurm.render import _SAFE_PATH  # the same check guards $FRENZY_JOBS_DIR's default directories

    assert not _SAFE_PATH.match(str(tmp_path / value)), "render's path check accepts a newline"


MODEL_FIELDS = [
    ("name",),
    ("slurm", "account"),
    ("slurm", "qos"),
    ("slurm", "constraint"),
    ("slurm", "mail_type"),
    ("slurm", "mail_user"),
    ("slurm", "job_name"),
    ("slurm", "output"),
    ("slurm", "error"),
    ("slurm", "time"),
    ("slurm", "extra"),
    ("entry", "env-name"),
    ("entry", "script"),
]


def _model_with(field: tuple[str, ...], value: str) -> dict:
    spec = yaml.safe_load(TINY.read_text())
    section, key = (field + ("",))[:2]
    if field == ("name",):
        spec["name"] = "tiny" + value
    elif key == "extra":
        spec.setdefault("slurm", {})["extra"] = ["--reservation=big" + value]
    elif key == "time":
        spec.setdefault("slurm", {})["time"] = "60" + value
    elif key == "env-name":
        spec.setdefault("entry", {})["env"] = {"FOO" + value: "1"}
    elif key == "script":
        spec["entry"] = {"trainer": "script", "script": "train" + value + ".py"}
        spec["training"]["method"] = "full"
    else:
        spec.setdefault(section, {})[key] = "x" + value
    return spec


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("field", MODEL_FIELDS, ids=".".join)
def test_model_yaml_strings_with_a_newline_are_refused(offline, tmp_path, field, value):
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(_model_with(field, value)))
    code, out, _ = dry(offline, model=model)
    assert code == 2, out
    assert str(model) in out and "Traceback" not in out, out
    shown = field[-1].replace("env-name", "env")
    assert shown in out, (field, out)


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
def test_quoted_strings_with_a_newline_keep_the_sbatch_header(offline, tmp_path, value):
    """entry.env values and entry.args are shell-quoted after the header: a newline stays inside its quotes."""
    spec = yaml.safe_load(TINY.read_text())
    spec["entry"] = {
        "trainer": "script",
        "script": "train.py",
        "args": ["--x", "a" + value],
        "env": {"TOKEN": "t" + value},
    }
    model = tmp_path / "model.yaml"
    model.write_text(yaml.safe_dump(spec))
    (tmp_path / "train.py").write_text("")
    code, out, script = dry(offline, model=model)
    if code == 0:
        assert_header_intact(script) if "\r" not in value else None
        assert subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True).returncode == 0
    else:
        assert code == 2 and "Traceback" not in out, out


@pytest.mark.parametrize("value", BREAKERS, ids=repr)
@pytest.mark.parametrize("key", ["partition", "gres_type"])
def test_site_names_with_a_newline_are_refused(offline, tmp_path, key, value):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["pools"][0][key] += value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and f"pools.0.{key}" in out and str(path) in out, out


def test_job_name_pattern_refuses_a_trailing_newline():
    """pydantic's `pattern` (Rust regex: `$` is the end of the text) refuses it; Python's re.match with `$` would
    not."""
    import re

    from pydantic import ValidationError

    from frenzy_slurm.jobspec.job import JobSpec

    pattern = JobSpec.model_fields["name"].metadata[0].pattern
    assert re.match(pattern, "x\n"), "the pattern is only safe under the Rust engine"
    for bad in ("x\n", "x\r", "x\r\n"):
        with pytest.raises(ValidationError):
            JobSpec.model_validate(
                {
                    "name": bad,
                    "model": {"preset": "gpt2-medium"},
                    "training": {"seq_len": 8, "global_batch": 1, "steps": 1},
                }
            )


def test_every_validator_pattern_ends_at_the_end_of_the_text():
    """No regex in the job spec or the renderer ends in a bare `$` (which also matches before a final newline)."""
    import re

    from frenzy_slurm import render
    from frenzy_slurm.jobspec import job
    from frenzy_slurm.site import config as site

    for module in (job, render, site):
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                assert not value.match(_sample_for(value) + "\n"), (
                    f"{module.__name__}.{name} accepts a trailing newline"
                )


def _sample_for(pattern) -> str:
    """A string the pattern accepts (each of ours accepts one of these)."""
    for sample in ("60", "a", "/tmp/a", "1-00:00:00"):
        if pattern.match(sample):
            return sample
    return "a"


# ---- item 13: --sbatch flags parsed as sbatch's getopt_long parses them ----------------------------------------


@pytest.mark.parametrize(
    "flag,reads_as",
    [
        ("-vt1", "--time"),
        ("-t1", "--time"),
        ("-Dx", "--chdir"),
        ("-vvp", "--partition"),
        ("--ch=/", "--chdir"),
        ("--ou=x", "--output"),
        ("--er=x", "--error"),
        ("--jo=x", "--job-name"),
        ("--si=USR1@1", "--signal"),
        ("--op=truncate", "--open-mode"),
        ("--comm=x", "--comment"),
        ("--no-r", "--no-requeue"),
        ("--req", "--requeue"),
        ("--gpus-per-n=2", "--gpus-per-node"),
        ("--ntasks-per-no=1", "--ntasks-per-node"),
        ("-W", "--wait"),
        ("--reservation=big --chdir=/", "--chdir"),
        ("--spank-opt --output=x", "--output"),
        ("-Hc 4", "--cpus-per-task"),
    ],
)
def test_reserved_flags_are_refused_however_spelled(offline, flag, reads_as):
    code, out, _ = dry(offline, f"--sbatch={flag}")
    assert code == 2 and "frenzy-slurm sets this itself" in out, out
    assert reads_as in out, out


@pytest.mark.parametrize(
    "flag,needle",
    [
        ("-A", "needs a value in the same flag"),  # sbatch would take the next line's --partition=... as the account
        ("--mem", "needs a value in the same flag"),
        ("-A hetjob", "hetjob separator"),
        ("--ex=x", "cannot tell which option --ex abbreviates"),
        ("-- -x", "'--' ends sbatch's options"),
        ("--hold=yes", "takes no value"),
        ("--constraint='a b'", "write the flag without quotes"),
        ("--begin=now #later", "write the flag without quotes"),
        ("-X", "-X is not an sbatch option"),
        ("--mem 4G extra", "neither an sbatch flag nor a flag's value"),
    ],
)
def test_flags_sbatch_would_misread_are_refused(offline, flag, needle):
    code, out, _ = dry(offline, f"--sbatch={flag}")
    assert code == 2 and needle in out and "--sbatch" in out, out


@pytest.mark.parametrize(
    "flag",
    [
        "--reservation=big",
        "--gres-flags=enforce-binding",
        "--mem 4G",
        "-Afoo",
        "--exclusive=user",
        "-k",
        "--hold",
        "--nice=5",
        "--x11=batch",
        "--mem-per-gpu=10G",
        "--time-min=60",
        "--spank-plugin-opt=1",
    ],
)
def test_other_flags_still_pass_through(offline, flag):
    code, out, script = dry(offline, f"--sbatch={flag}")
    assert code == 0, out
    assert f"#SBATCH {flag}" in sbatch_header(script)
    assert_header_intact(script)


def test_option_table_matches_the_vendored_slurm_source():
    """The table is sbatch's common_options[] (src/common/slurm_opt.c) of the vendored releases: every option of
    the newest one is in it, with its argument kind, and every short letter maps to its option."""
    import re
    import tarfile

    from frenzy_slurm.jobspec.sbatch_flags import SBATCH_LONG_OPTIONS, SBATCH_SHORT_OPTIONS

    tarball = ROOT.parent / "shared" / "vendor" / "slurm" / "slurm-25.11.7.tar.xz"
    if not tarball.exists():
        pytest.skip(f"no vendored Slurm source at {tarball}")
    with tarfile.open(tarball) as tar:
        src = tar.extractfile("slurm-25.11.7/src/common/slurm_opt.c").read().decode()
    blocks = {
        m.group(1): dict(re.findall(r"\.(\w+)\s*=\s*([^,\n]+),", m.group(2)))
        for m in re.finditer(r"static slurm_cli_opt_t (slurm_opt_\w+) = \{(.*?)\n\};", src, re.S)
    }
    listed = re.findall(r"&(slurm_opt_\w+)", re.search(r"common_options\[\] = \{(.*?)\};", src, re.S).group(1))
    kinds = {"no_argument": "no", "required_argument": "required", "optional_argument": "optional"}
    seen = 0
    for ident in listed:
        f = blocks[ident]
        name = f.get("name", "NULL").strip()
        if not name.startswith('"') or not ({"set_func", "set_func_sbatch"} & set(f)):
            continue  # an environment-only option, or one sbatch does not take
        name = name.strip('"')
        seen += 1
        assert name in SBATCH_LONG_OPTIONS, name
        if name not in ("requeue", "get-user-env"):  # argument kind changed between releases: "optional"
            assert SBATCH_LONG_OPTIONS[name] == kinds[f["has_arg"].strip()], name
        val = f["val"].strip()
        if val.startswith("'"):
            assert SBATCH_SHORT_OPTIONS[val[1]] == name
    assert seen > 100


# ---- item 15: finite numbers, keys once, paths relative to model.yaml, bounded site values --------------------


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


def test_duplicate_keys_in_a_site_file_are_refused(offline, tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text((offline / "site.yaml").read_text() + "max_job_share: 0.5\nmax_job_share: 1.0\n")
    code, out, _ = dry(offline, site=site)
    assert code == 2 and str(site) in out and "the key 'max_job_share' is given twice" in out, out


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


@pytest.mark.parametrize(
    "pool_field,value,needle",
    [
        ("intra_node", 0, "is not a link speed"),
        ("intra_node", -5, "is not a link speed"),
        ("intra_node", float("inf"), "not a finite number"),
        ("intra_node", float("nan"), "not a finite number"),
        ("overrides", {"memory_gib": float("inf")}, "not a finite number"),
        ("overrides", {"memory_gib": 1e300}, "less than or equal to 16384"),
        ("overrides", {"bf16": float("inf")}, "not a finite number"),
        ("overrides", {"efficiency": 1e-300}, "greater than or equal to 0.01"),
        ("overrides", {"step_overhead_s": float("inf")}, "not a finite number"),
        ("inter_node_gbs", float("inf"), "not a finite number"),
        ("gpus_per_node", 10**9, "less than or equal to 256"),
        ("cpus_per_gpu", 10**9, "less than or equal to 1024"),
    ],
)
def test_site_values_out_of_range_are_refused(offline, tmp_path, pool_field, value, needle):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["pools"][0][pool_field] = value
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and str(path) in out and f"pools.0.{pool_field}" in out and needle in out, out


# ---- item 17: --trace-factory runs only the user's own code or the site's trusted_factories -------------------


def _module(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.py"
    path.write_text("import pathlib\npathlib.Path(__file__).with_name(__name__ + '-RAN').write_text('ran')\n" + body)
    return directory / f"{name}-RAN"


@pytest.fixture(autouse=True)
def _fresh_modules(monkeypatch):
    """Each test imports its own copies of these test modules (an earlier test's are in other directories)."""
    for name in ("hubby", "mymodels", "sharedmodels", "theirmodels", "projmodels"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield
    for name in ("hubby", "mymodels", "sharedmodels", "theirmodels", "projmodels"):
        sys.modules.pop(name, None)


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """A directory that counts as installed software (a site-packages), holding `hubby.load`, which runs what
    it is given (as torch.hub.load does), and a user's directory with a module re-exporting it."""
    from frenzy_slurm.marp import trace

    site_dir = tmp_path / "site-packages"
    marker = _module(site_dir, "hubby", "def load(repo_or_dir='.', **kw):\n    return repo_or_dir\n")
    real = trace._installed_dirs
    monkeypatch.setattr(trace, "_installed_dirs", lambda: [*real(), site_dir.resolve()])
    monkeypatch.syspath_prepend(str(site_dir))
    return marker


def test_factory_from_installed_software_is_refused_before_import(installed):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    with pytest.raises(InputError) as err:
        load_factory("hubby:load", {"repo_or_dir": "/tmp/evil"})
    assert "is installed software" in str(err.value) and "trusted_factories" in str(err.value)
    assert not installed.exists(), "the module was imported before it was refused"


def test_a_users_module_re_exporting_installed_code_is_refused(installed, tmp_path, monkeypatch):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    mine = tmp_path / "mine"
    _module(mine, "mymodels", "from hubby import load as build\n")
    monkeypatch.syspath_prepend(str(mine))
    with pytest.raises(InputError, match=r"model.factory 'mymodels:build': .*hubby.py is installed software"):
        load_factory("mymodels:build", {})


def test_site_allow_list_admits_an_installed_factory(installed):
    from frenzy_slurm.marp.trace import load_factory

    assert load_factory("hubby:load", {}, allowed=["hubby:load"])() == "."
    assert installed.exists()
    assert load_factory("hubby:load", {}, allowed=["hubby"]) is not None
    from frenzy_slurm.core.errors import InputError

    with pytest.raises(InputError):
        load_factory("hubby:load", {}, allowed=["hubby:other", "hubbyx"])


def test_factory_in_a_world_writable_directory_is_refused(tmp_path, monkeypatch):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    shared = tmp_path / "shared"
    marker = _module(shared, "sharedmodels", "def build():\n    return None\n")
    shared.chmod(0o777)
    monkeypatch.syspath_prepend(str(shared))
    with pytest.raises(InputError, match="is writable by other users"):
        load_factory("sharedmodels:build", {})
    assert not marker.exists()


def test_factory_owned_by_another_user_is_refused(tmp_path, monkeypatch, other_user):
    from frenzy_slurm.core.errors import InputError
    from frenzy_slurm.marp.trace import load_factory

    theirs = tmp_path / "theirs"
    marker = _module(theirs, "theirmodels", "def build():\n    return None\n")
    os.chown(theirs / "theirmodels.py", other_user.uid, other_user.gid)
    monkeypatch.syspath_prepend(str(theirs))
    with pytest.raises(InputError, match=f"belongs to uid {other_user.uid}, not to you"):
        load_factory("theirmodels:build", {})
    assert not marker.exists()


def test_users_own_factory_still_works(tmp_path, monkeypatch):
    """The user's own files (the repository's tests/tiny_factory.py, a module beside model.yaml) are traced."""
    pytest.importorskip("torch")
    from frenzy_slurm.cli.plan_view import load
    from frenzy_slurm.marp.trace import count_factory_parameters

    assert count_factory_parameters("tests.tiny_factory:build", {"layers": 2}) > 0
    project = tmp_path / "project"
    _module(project, "projmodels", "from tests.tiny_factory import build\n")
    (project / "model.yaml").write_text("""\
name: traced
model:
  factory: projmodels:build
  factory_kwargs: {layers: 2}
  factory_arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    monkeypatch.syspath_prepend(str(ROOT))
    monkeypatch.syspath_prepend(str(project))
    monkeypatch.delenv("FRENZY_SITE", raising=False)
    _, model = load(project / "model.yaml", trace=True)
    assert model.exact_params and model.exact_params > 0


def test_torch_hub_is_refused_and_the_site_can_allow_it(tmp_path, offline):
    """The audit's case: model.factory torch.hub:load with --trace-factory; then the same with the site's
    allow-list (it passes the check and fails later, in torch.hub itself, as an input error)."""
    pytest.importorskip("torch")
    model = tmp_path / "model.yaml"
    model.write_text("""\
name: hub
model:
  factory: torch.hub:load
  factory_kwargs: {repo_or_dir: /tmp/nowhere, model: x, source: local}
  factory_arch: {layers: 2, hidden: 64, heads: 4, kv_heads: 2, ffn: 172, vocab: 256, max_positions: 128}
training: {seq_len: 64, global_batch: 4, steps: 1}
entry: {trainer: script, script: train.py}
""")
    (tmp_path / "train.py").write_text("")
    code, out, _ = dry(offline, "--trace-factory", model=model)
    assert code == 2 and "torch.hub:load" in out and "installed software" in out, out
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["trusted_factories"] = ["torch.hub:load"]
    allowing = tmp_path / "site.yaml"
    allowing.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, "--trace-factory", model=model, site=allowing)
    assert code == 2 and "installed software" not in out and "model.factory" in out, out


def test_trace_factory_help_says_it_runs_arbitrary_code():
    from click.testing import CliRunner

    from frenzy_slurm.cli.admin import main as admin
    from frenzy_slurm.cli.fsbatch import main as fsbatch

    for command, args in ((fsbatch, ["--help"]), (admin, ["memory", "--help"])):
        text = " ".join(CliRunner().invoke(command, args).output.split())
        assert "RUNS ARBITRARY CODE" in text, text


def test_trusted_factories_entries_are_checked(offline, tmp_path):
    site = yaml.safe_load((offline / "site.yaml").read_text())
    site["trusted_factories"] = ["torch.hub:load; rm -rf /"]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    code, out, _ = dry(offline, site=path)
    assert code == 2 and "trusted_factories" in out and "not a factory or module name" in out, out
