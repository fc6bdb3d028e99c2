"""The CLI backend's parsers against real answers of every Slurm release, 22.05 to 26.05.

Each tests/data/slurm-VERSION/ was written by contrib/devcluster/record-outputs on a devcluster of that
version in one fixed busy state (see that script): v100-1 held by a `--gres` job and v100-2 by a `--gpus`
job (8 GPUs each), t4-1 with a `--gpus=t4:2` job, a100-1 with 3 GPUs in use, a running hetjob (a100-2 and
t4-2, one GPU each), a pending `waits` job, a cancelled job, t4-4 drained for "maintenance". Every test is
parametrized over the recorded versions, so a new recording is tested by adding its directory.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frenzy_slurm.slurm import cli
from frenzy_slurm.slurm.backend import ComponentRequest
from frenzy_slurm.slurm.parse import SlurmUnexpected, parse_parsable, parse_test_only
from frenzy_slurm.slurm.run import Result, SlurmCommandError, SlurmUnavailable, raise_for_status
from frenzy_slurm.slurm.view import job_phase

DATA = Path(__file__).parent / "data"
VERSIONS = sorted(p.name.removeprefix("slurm-") for p in DATA.glob("slurm-*") if (p / "index.json").exists())
ALL_SIX = ["22.05", "23.11", "24.11", "25.05", "25.11", "26.05"]

# the busy state record-outputs creates: node -> (GPUs in use, GPUs in total)
GPU_USE = {
    "a100-1": (3, 4),
    "a100-2": (1, 4),
    "t4-1": (2, 4),
    "t4-2": (1, 4),
    "t4-3": (0, 4),
    "t4-4": (0, 4),
    "v100-1": (8, 8),
    "v100-2": (8, 8),
}


class Recording:
    def __init__(self, version: str):
        self.version = version
        self.dir = DATA / f"slurm-{version}"
        self.index = json.loads((self.dir / "index.json").read_text())

    def out(self, name: str) -> str:
        return (self.dir / f"{name}.out").read_text()

    def err(self, name: str) -> str:
        path = self.dir / f"{name}.err"
        return path.read_text() if path.exists() else ""

    def result(self, name: str) -> Result:
        cmd = self.index["commands"][name]
        path = self.dir / f"{name}.out"
        return Result(cmd["argv"], path.read_text() if path.exists() else "", self.err(name), cmd["rc"])

    def argv(self, name: str) -> list[str]:
        return self.index["commands"][name]["argv"]

    @property
    def first_job(self) -> int:
        """Jobs of earlier sessions may still be listed (MinJobAge): only those from this recording count."""
        return parse_parsable(self.out("sbatch-parsable"))[0]


@pytest.fixture(params=VERSIONS)
def rec(request) -> Recording:
    return Recording(request.param)


def test_every_supported_release_is_recorded():
    assert VERSIONS == ALL_SIX


def test_recording_is_of_its_version(rec):
    assert rec.index["slurm_version"].startswith(rec.version + ".")
    assert rec.out("version").strip().endswith(f" {rec.index['slurm_version']}")  # 'slurm-wlm 22.05.8' (Debian)
    assert cli.parse_version(rec.out("version")) == tuple(int(x) for x in rec.version.split("."))


def _nodes_by_command(rec: Recording) -> dict[tuple[str, ...], str]:
    return {("sinfo", "--json"): "sinfo", cli.SCONTROL_NODES: "scontrol-nodes"}


def test_feature_table_names_a_command_that_lists_the_nodes(rec):
    """The table is a record of facts: the command it picks must list every node in that release's answer."""
    feats = cli.features_for(cli.parse_version(rec.out("version")))
    assert feats.json
    name = _nodes_by_command(rec)[feats.nodes_json]
    assert rec.index["commands"][name]["rc"] == 0
    assert sorted(n["name"] for n in json.loads(rec.out(name))["nodes"]) == sorted(GPU_USE)
    # and where the table moves to scontrol, sinfo --json really no longer lists nodes
    if feats.nodes_json != ("sinfo", "--json"):
        assert "nodes" not in json.loads(rec.out("sinfo")) or not json.loads(rec.out("sinfo"))["nodes"]
    assert feats.numbers_are_objects == isinstance(
        json.loads(rec.out("squeue"))["jobs"][0]["job_id"], dict
    ) or feats.numbers_are_objects == isinstance(json.loads(rec.out("squeue"))["jobs"][0]["start_time"], dict)


def _json_nodes(rec: Recording):
    feats = cli.features_for(cli.parse_version(rec.out("version")))
    name = _nodes_by_command(rec)[feats.nodes_json]
    return {
        n.name: n
        for n in (cli.node_from_json(x) for x in cli.json_list(rec.out(name), "nodes", list(feats.nodes_json)))
    }


def test_nodes_json_gpu_use_states_and_drain(rec):
    nodes = _json_nodes(rec)
    assert {name: (n.gpus_used, n.gpus_total) for name, n in nodes.items()} == GPU_USE
    assert {name: n.gpu_type for name, n in nodes.items()} == {name: name.split("-")[0] for name in GPU_USE}
    assert nodes["t4-4"].state == "drained" and "DRAIN" in nodes["t4-4"].flags and nodes["t4-4"].reason == "maintenance"
    assert not nodes["t4-4"].available
    assert nodes["t4-3"].state == "idle" and nodes["t4-3"].reason is None
    assert nodes["a100-1"].state == "mixed" and nodes["a100-1"].cpus == 16 and nodes["a100-1"].memory_mb == 64000
    assert all("PLANNED" not in n.flags for n in nodes.values())
    assert nodes["v100-2"].gpus_free == 0 and nodes["t4-1"].gpus_free == 2  # --gpus jobs counted


def test_nodes_text_agree_with_json(rec):
    assert rec.argv("sinfo-text")[-1] == cli.SINFO_TEXT_FIELDS
    text = {n.name: n for n in cli.nodes_from_text(rec.out("sinfo-text"))}
    js = _json_nodes(rec)
    assert text.keys() == js.keys()
    for name, n in js.items():
        t = text[name]
        assert (t.state, t.gpu_type, t.gpus_total, t.gpus_used, t.cpus, t.cpus_alloc, t.memory_mb, t.reason) == (
            n.state,
            n.gpu_type,
            n.gpus_total,
            n.gpus_used,
            n.cpus,
            n.cpus_alloc,
            n.memory_mb,
            n.reason,
        ), name
        assert "DRAIN" in t.flags if name == "t4-4" else "DRAIN" not in t.flags


def _jobs(rec: Recording, text: bool = False):
    jobs = (
        cli.jobs_from_text(rec.out("squeue-text"))
        if text
        else [cli.job_from_json(j) for j in cli.json_list(rec.out("squeue"), "jobs", ["squeue", "--json"])]
    )
    return {j.job_id: j for j in jobs if j.job_id >= rec.first_job}


def _by_name(jobs) -> dict[str, list]:
    out: dict[str, list] = {}
    for j in sorted(jobs.values(), key=lambda j: j.job_id):
        out.setdefault(j.name, []).append(j)
    return out


@pytest.mark.parametrize("text", [False, True], ids=["json", "text"])
def test_jobs(rec, text):
    if text:
        assert rec.argv("squeue-text")[-1] == cli.SQUEUE_TEXT_FORMAT
    jobs = _by_name(_jobs(rec, text))
    (gres,), (gpus,) = jobs["hold-gres"], jobs["hold-gpus"]
    assert (gres.state, gres.partition, gres.gpu_type, gres.gpus_per_node, gres.nodes) == (
        "RUNNING",
        "v100",
        "v100",
        8,
        ["v100-1"],
    )
    # a --gpus job's GPUs are in tres_per_job, which JSON has and squeue's -o format cannot print (%b is per node);
    # node GPU use (gres_used) counts them either way
    gpus_of_gpus_job = (None, 0) if text else ("v100", 8)
    assert (gpus.state, (gpus.gpu_type, gpus.gpus_per_node), gpus.nodes) == ("RUNNING", gpus_of_gpus_job, ["v100-2"])
    (part,) = jobs["part-gpus"]
    assert (part.gpus_per_node, part.nodes, part.time_limit_min) == (0 if text else 2, ["t4-1"], 30)
    leader, member = jobs["het"]
    assert leader.het_job_id == leader.job_id and leader.het_job_offset == 0 and leader.partition == "a100"
    assert member.het_job_id == leader.job_id and member.het_job_offset == 1 and member.partition == "t4"
    assert (leader.gpus_per_node, member.gpus_per_node, member.nodes) == (1, 1, ["t4-2"])
    (waits,) = jobs["waits"]
    assert (waits.state, waits.reason, waits.nodes, waits.phase) == ("PENDING", "Resources", [], "pending")
    assert waits.start_time is not None and waits.start_time > rec.index["recorded_at"] - 600
    assert jobs["cancelled"][0].state == "CANCELLED" and jobs["done-gres"][0].state == "COMPLETED"
    assert gres.reason is None and gres.start_time is not None and gres.user == "root"


def test_jobs_text_agree_with_json(rec):
    js, text = _jobs(rec), _jobs(rec, text=True)
    running = {i for i, j in js.items() if j.phase in ("running", "pending")}
    assert running and running <= text.keys()
    for i in running:
        a, b = js[i], text[i]
        if b.gpus_per_node == 0 and a.name.endswith("gpus"):  # --gpus jobs: see test_jobs
            continue
        assert (
            a.state,
            a.partition,
            a.gpu_type,
            a.gpus_per_node,
            a.nodes,
            a.het_job_id,
            a.het_job_offset,
            a.start_time,
            a.time_limit_min,
        ) == (
            b.state,
            b.partition,
            b.gpu_type,
            b.gpus_per_node,
            b.nodes,
            b.het_job_id,
            b.het_job_offset,
            b.start_time,
            b.time_limit_min,
        ), i


def test_partitions(rec):
    parts = {p.name: p for p in cli.partitions_from_scontrol(rec.out("scontrol-partitions-text"))}
    assert sorted(parts) == ["a100", "t4", "v100"]
    assert parts["a100"].is_default and not parts["t4"].is_default
    assert parts["t4"].nodes == ["t4-1", "t4-2", "t4-3", "t4-4"] and parts["v100"].default_time_min == 10
    assert parts["v100"].max_time_min is None and parts["v100"].state == "UP"


def test_cluster_name(rec):
    assert cli.cluster_name_from_config(rec.out("scontrol-config-text")) == "frenzydev"


@pytest.mark.parametrize(
    "name, later, partition",
    [
        ("test-only-now", False, "t4"),
        ("test-only-later", True, "v100"),
        ("test-only-cluster", False, "t4"),
        ("test-only-het", True, None),
        ("test-only-het-now", False, None),
    ],
)
def test_test_only(rec, name, later, partition):
    assert rec.index["commands"][name]["rc"] == 0
    start, nodes, part = parse_test_only(rec.err(name))
    at = rec.index["recorded_at"]
    if later:  # the v100 nodes are held for 30 minutes, and the pending job goes first
        assert at + 20 * 60 < start < at + 70 * 60
    else:
        assert at - 180 < start < at + 60
    assert part == partition
    assert (
        nodes
        == {
            "test-only-now": ["t4-1"],
            "test-only-cluster": ["t4-1"],
            "test-only-later": ["v100-1"],
            "test-only-het": ["a100-1", "v100-1"],
            "test-only-het-now": ["a100-1", "t4-1"],
        }[name]
    )


def test_test_only_argv_is_the_backends(rec, monkeypatch):
    seen = []

    def fake_run(argv, timeout=30.0, check=True, input_text=None, env=None):
        seen.append((argv, env))
        return Result(argv, "", rec.err("test-only-het"), 0)

    monkeypatch.setattr(cli, "run", fake_run)
    est = cli.SlurmCliBackend().expected_start(
        [ComponentRequest("a100", "a100", 1, 1, 10), ComponentRequest("v100", "v100", 1, 4, 10)]
    )
    assert seen[0][0] == rec.argv("test-only-het") and seen[0][1]["SLURM_TIME_FORMAT"] == "standard"
    assert est.nodes == ["a100-1", "v100-1"]


def test_parsable(rec):
    assert parse_parsable(rec.out("sbatch-parsable")) == (rec.first_job, None)
    job, cluster = parse_parsable(rec.out("sbatch-parsable-cluster"))
    assert job == rec.first_job + 1 and cluster == "frenzydev"


def test_sacct(rec):
    assert rec.argv("sacct")[-1] == "JobIDRaw,JobID,State,ExitCode,Start,End,ElapsedRaw"
    recs = cli.parse_sacct(rec.out("sacct"))
    first = rec.first_job
    done = recs[first]
    assert done.state == "COMPLETED" and done.exit_code == "0:0" and done.elapsed_s == done.end - done.start
    assert recs[first + 1].state == "COMPLETED"
    states = {r.state for r in recs.values()}
    assert {"COMPLETED", "CANCELLED", "PENDING", "RUNNING"} <= states
    het = [int(line.split("|")[0]) for line in rec.out("sacct").splitlines() if "+1|" in line]
    assert het and recs[het[0] - 1].state == "RUNNING"  # the hetjob, filed under its leader's id
    assert json.loads(rec.out("sacct-json"))["jobs"], "sacct --json lists the jobs"
    assert "gres/gpu:v100=8" in rec.out("sacct-tres")


@pytest.mark.parametrize(
    "name, words",
    [
        ("error-bad-partition", "invalid partition"),
        ("error-sbatch-bad-partition", "invalid partition"),
        ("error-bad-gres", "requested node configuration is not available"),
        ("error-too-many-gpus", "requested node configuration is not available"),
    ],
)
def test_refusals_are_command_errors(rec, name, words):
    res = rec.result(name)
    assert res.returncode != 0
    with pytest.raises(SlurmCommandError) as info:
        raise_for_status(res)
    assert words in info.value.stderr.lower()


@pytest.mark.parametrize("name", ["down-sinfo", "down-squeue", "down-sbatch"])
def test_controller_down_is_unavailable(rec, name):
    res = rec.result(name)
    with pytest.raises(SlurmUnavailable):
        raise_for_status(res)
        # 22.05's --json answers exit 0 with an errors list and nothing else
        key = "nodes" if name == "down-sinfo" else "jobs"
        cli.json_list(res.stdout, key, res.argv)


def test_unknown_job_state_is_unknown_not_a_crash(rec):
    raw = json.loads(rec.out("squeue"))["jobs"][0]
    raw = dict(raw, job_state=["SOMETHING_NEW"] if isinstance(raw["job_state"], list) else "SOMETHING_NEW")
    job = cli.job_from_json(raw)
    assert job.state == "SOMETHING_NEW" and job.phase == "unknown" and job_phase("") == "unknown"
    assert cli.job_from_json(dict(raw, job_state=[])).phase == "unknown"


def test_version_text_unreadable():
    with pytest.raises(SlurmUnexpected):
        cli.parse_version("slurm")
