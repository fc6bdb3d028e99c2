"""The `--sbatch` flags are parsed as sbatch's getopt_long parses them: a flag frenzy-slurm sets itself is
refused however it is spelled (abbreviated, bundled, after another flag), one sbatch would misread is refused
with the reason, every other flag passes through; the option table is the vendored Slurm source's."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_spec_no_newlines import assert_header_intact, dry, offline, sbatch_header  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent

# ---- --sbatch flags parsed as sbatch's getopt_long parses them ----------------------------------------


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
