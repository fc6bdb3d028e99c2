"""NVML probe and sampler against recorded nvidia-ml-py answers; site detection's interpretation and merge."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from frenzy_slurm.core.units import GiB
from frenzy_slurm.runtime.nvml_probe import NVML_CALLS, probe
from frenzy_slurm.runtime.nvml_sampler import SAMPLER_CALLS, Sampler, merge_metrics
from frenzy_slurm.site.config import SiteConfig
from frenzy_slurm.site.detect import interpret, merge_site
from tests.nvml_fake import FakeNvml


def test_fake_implements_every_call_the_code_uses():
    for name in NVML_CALLS + SAMPLER_CALLS:
        assert callable(getattr(FakeNvml("no-driver.json"), name)), name


def test_probe_dgx_a100():
    ans = probe(FakeNvml("dgx-a100-80gb.json"))
    assert ans["nvml"] and ans["driver_version"] == "535.161.08" and ans["cuda_version"] == "12.2"
    assert len(ans["gpus"]) == 8 and ans["gpus"][0]["memory_total_bytes"] == 80 * GiB
    assert ans["gpus"][3]["nvlink"] == {"active_links": 12, "generation": 3, "peers": ["nvswitch"]}
    assert ans["topology"][0][1] == "pcie-switches" and ans["topology"][0][7] == "cross-socket"
    det = interpret("gpu", "a100", 8, ans)
    assert (det.gpu.name, det.gpus_per_node, det.intra_node, det.problems) == ("A100-80GB", 8, "nvlink3", [])


def test_probe_pcie_without_nvlink():
    ans = probe(FakeNvml("pcie-4xa10.json"))
    assert all(g["nvlink"]["active_links"] == 0 for g in ans["gpus"])
    det = interpret("inf", "a10", 4, ans)
    assert (det.gpu.name, det.intra_node, round(det.memory_gib, 2)) == ("A10", "pcie4", 22.49)


def test_no_driver_is_reported_per_pool_and_slurm_describes_it():
    ans = probe(FakeNvml("no-driver.json"))
    assert ans["nvml"] is False and "NVMLError_LibraryNotFound" in ans["error"]
    det = interpret("t4", "t4", 4, ans)
    assert det.source == "slurm" and "no NVML" in det.problems[0]
    text, changes = merge_site(None, "c", [det], "2026-12-02")
    site = SiteConfig.model_validate(yaml.safe_load(text))
    assert (site.pools[0].gpu, site.pools[0].gpus_per_node) == ("T4", 4)
    assert site.pools[0].unconfirmed == ["gpu", "intra_node"]  # named by Slurm, not measured
    assert "no NVML answer" in text and changes == ["t4/t4: added (T4, 4 per node, pcie3; source slurm)"]


def test_mig_is_reported():
    data = json.loads((Path(__file__).parent / "data" / "nvml" / "dgx-a100-80gb.json").read_text())
    data["devices"][0]["mig"] = 1
    ans = probe(FakeNvml(data))
    assert ans["gpus"][0]["mig_enabled"] and not ans["gpus"][1]["mig_enabled"]
    assert any("MIG is enabled" in p for p in interpret("gpu", "a100", 8, ans).problems)


def test_unknown_model_and_count_mismatch_are_reported():
    data = json.loads((Path(__file__).parent / "data" / "nvml" / "pcie-4xa10.json").read_text())
    for d in data["devices"]:
        d["name"] = "NVIDIA Hypothetical X9"
    det = interpret("p", "x9", 8, probe(FakeNvml(data)))
    assert det.gpu is None
    assert any("matches no catalog GPU" in p for p in det.problems)
    assert any("NVML sees 4 GPU(s)" in p for p in det.problems)


def test_merge_keeps_comments_and_admin_overrides_and_reports_changes():
    text = (
        "# our cluster\ncluster: c\npools:\n  - partition: gpu   # the big one\n    gres_type: a100\n"
        "    gpu: A100-40GB\n    gpus_per_node: 4\n    intra_node: pcie4\n    cpus_per_gpu: 8   # site policy\n"
        "    overrides: {bf16: 280}\n"
    )
    det = interpret("gpu", "a100", 8, probe(FakeNvml("dgx-a100-80gb.json")))
    out, changes = merge_site(text, "c", [det], "2026-12-02")
    assert "# our cluster" in out and "# site policy" in out
    site = SiteConfig.model_validate(yaml.safe_load(out))
    p = site.pools[0]
    assert (p.gpu, p.gpus_per_node, p.intra_node, p.cpus_per_gpu, p.overrides.bf16) == (
        "A100-80GB",
        8,
        "nvlink3",
        8,
        280,
    )
    assert sorted(changes) == [
        "gpu/a100: gpu A100-40GB -> A100-80GB (NVML on " + det.host + ")",
        "gpu/a100: gpus_per_node 4 -> 8 (NVML on " + det.host + ")",
        "gpu/a100: intra_node pcie4 -> nvlink3 (NVML on " + det.host + ")",
    ]


def test_sampler_peaks_only_this_jobs_processes_and_merges_metrics(tmp_path):
    fake = FakeNvml(
        "pcie-4xa10.json", processes={0: [(100, 6 * int(GiB))], 1: [(200, 3 * int(GiB))]}, utilisation={0: 90, 1: 50}
    )
    owner = {100: "42", 200: "7"}  # pid 200 belongs to another job
    s = Sampler(fake, "42", job_of=owner.get)
    s.sample()
    fake.processes[0] = [(100, 9 * int(GiB))]
    s.sample()
    rep = s.report("node1", 1.0)
    assert [d["index"] for d in rep["devices"]] == [0]
    d = rep["devices"][0]
    assert (d["peak_process_gib"], d["peak_used_gib"], d["max_util_pct"], d["mean_util_pct"]) == (9.0, 9.0, 90, 90)
    (tmp_path / "nvml-node1.json").write_text(json.dumps(rep))
    (tmp_path / "plan.json").write_text(
        json.dumps(
            {
                "decision": {
                    "chosen": {
                        "components": [{"gpu_model": "A10", "gpu_type": "a10", "partition": "inf", "peak_gib": 8.5}]
                    }
                }
            }
        )
    )
    m = merge_metrics(tmp_path)
    assert m["source"] == "nvml-sampler"
    r = m["ranks"][0]
    assert (r["host"], r["gpu_model"], r["peak_gib"], r["predicted_gib"], r["metric"]) == (
        "node1",
        "A10",
        9.0,
        8.5,
        "device (nvml)",
    )
    (tmp_path / "metrics.json").write_text(json.dumps({"source": "trainer", "ranks": []}))
    assert merge_metrics(tmp_path) is None  # the built-in trainer's own metrics win


def test_sampler_run_follows_the_watched_process_then_writes_metrics(tmp_path, monkeypatch):
    import subprocess

    from frenzy_slurm.runtime.nvml_sampler import run

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    proc = subprocess.Popen(["sleep", "0.6"])
    fake = FakeNvml("pcie-4xa10.json", processes={2: [(proc.pid, 5 * int(GiB))]}, utilisation={2: 70})
    assert run(tmp_path, proc.pid, 0.1, fake) == 0
    proc.wait()
    nodes = list(tmp_path.glob("nvml-*.json"))
    assert len(nodes) == 1 and json.loads(nodes[0].read_text())["samples"] >= 3
    m = json.loads((tmp_path / "metrics.json").read_text())
    assert [(r["gpu_index"], r["peak_gib"]) for r in m["ranks"]] == [(2, 5.0)]


def test_probe_dgx_h100_name_without_memory_technology():
    det = interpret("h100", "h100", 8, probe(FakeNvml("dgx-h100.json")))
    assert (det.gpu.name, det.intra_node, det.cuda, det.problems) == ("H100-SXM", "nvlink4", "12.4", [])


def test_probe_pools_through_the_seam_with_a_busy_pool():
    """The seam's run_step answers with the probe's JSON; a pool with no free node fails fast and says so."""
    from frenzy_slurm.sim.synthetic import synthetic
    from frenzy_slurm.site.detect import probe_pools
    from frenzy_slurm.slurm.backend import BatchJob, ComponentRequest
    from frenzy_slurm.slurm.fake import FakeSlurm
    from frenzy_slurm.slurm.view import PoolKey

    slurm = FakeSlurm(synthetic([("a100", "A100-80GB", 1, 8), ("t4", "T4", 1, 4)], now=0.0))
    slurm.step_output[PoolKey("a100", "a100_80gb")] = "motd line\n" + json.dumps(probe(FakeNvml("dgx-a100-80gb.json")))
    # the only t4 node is taken by a running job
    slurm.submit(
        BatchJob(script=Path("/dev/null"), workdir=Path("/tmp"), components=[ComponentRequest("t4", "t4", 1, 4, 60)])
    )
    found = {d.where: d for d in probe_pools(slurm, slurm.load(), "python3", 30)}
    a100, t4 = found["a100/a100_80gb"], found["t4/t4"]
    assert (a100.source, a100.gpu.name, a100.intra_node) == ("nvml", "A100-80GB", "nvlink3")
    assert t4.source == "slurm" and "probe step failed" in t4.problems[0] and "busy" in t4.problems[0]
