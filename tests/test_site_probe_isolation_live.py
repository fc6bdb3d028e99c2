"""On the real local cluster: `frenzy-slurm site detect` run from a directory holding a planted
`pynvml.py` (as an admin might, as root) never imports it on the compute node."""

from __future__ import annotations

from .helpers import run_cli

PLANTED = "import pathlib\npathlib.Path(__file__).with_name('PLANTED-RAN').write_text('imported')\n"


def test_site_detect_never_imports_pynvml_from_the_working_directory(tmp_path, clean_queue):
    cwd = tmp_path / "admin-cwd"
    cwd.mkdir()
    (cwd / "pynvml.py").write_text(PLANTED)
    res = run_cli("frenzy-slurm", "site", "detect", "--dry-run", "--partition", "t4", "--timeout", "60", cwd=cwd)
    assert res.returncode == 0, res.stderr
    assert not (cwd / "PLANTED-RAN").exists(), "the probe step imported the planted pynvml.py"
    # the probe ran on the node and answered (the dev cluster's GPUs are fake, so NVML is absent or sees none)
    assert "t4/t4:" in res.stdout + res.stderr, res.stdout + res.stderr
    assert "printed no JSON" not in res.stderr and "probe step failed" not in res.stderr, res.stderr
