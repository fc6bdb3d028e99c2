"""Parsers, table-driven, on strings and JSON captured from the local Slurm 22.05 cluster."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from frenzy_slurm.slurm.cli import (
    features_for,
    job_from_json,
    jobs_from_text,
    node_from_json,
    nodes_from_text,
    parse_version,
    partitions_from_scontrol,
)
from frenzy_slurm.slurm.parse import (
    SlurmUnexpected,
    expand_hostlist,
    num,
    parse_gpu_gres,
    parse_test_only,
    parse_time_minutes,
)
from frenzy_slurm.slurm.view import ClusterView, job_phase

DATA = (
    Path(__file__).parent / "data" / "slurm-22.05" / "earlier"
)  # hand-made 22.05 captures; all releases: test_seam_slurm_versions.py


@pytest.mark.parametrize(
    "text,expected",
    [
        ("gpu:a100:4", ("a100", 4)),
        ("gpu:a100:3(IDX:0-2)", ("a100", 3)),
        ("gpu:a100:0(IDX:N/A)", ("a100", 0)),
        ("gres:gpu:a100:3", ("a100", 3)),
        ("gres/gpu:v100=2", ("v100", 2)),
        ("gpu:2", (None, 2)),
        ("gpu", (None, 1)),
        ("gpu:h100:4(S:0-1),mps:100", ("h100", 4)),
        ("gpu:a100:2(IDX:0,2),gpu:a100:1(IDX:3)", ("a100", 3)),
        ("(null)", (None, 0)),
        ("", (None, 0)),
    ],
)
def test_gres(text, expected):
    assert parse_gpu_gres(text) == expected


@pytest.mark.parametrize(
    "text,expected",
    [
        ("a100-[1-2]", ["a100-1", "a100-2"]),
        ("a100-1,t4-[1-2]", ["a100-1", "t4-1", "t4-2"]),
        ("node[01-03]", ["node01", "node02", "node03"]),
        ("t4-[1,3-4]", ["t4-1", "t4-3", "t4-4"]),
        ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
        ("", []),
        (None, []),
        ("(null)", []),
    ],
)
def test_hostlist(text, expected):
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize(
    "text,minutes",
    [
        ("5:00", 5),
        ("10", 10),
        ("1:00:00", 60),
        ("2-00:00:00", 2880),
        ("UNLIMITED", None),
        ("INFINITE", None),
        ("00:10:00", 10),
        ("0:30", 1),
    ],
)
def test_times(text, minutes):
    assert parse_time_minutes(text) == minutes


def test_time_garbage():
    with pytest.raises(SlurmUnexpected):
        parse_time_minutes("soon")


def test_test_only_single_and_het():
    start, nodes, part = parse_test_only((DATA / "test-only-single.txt").read_text())
    assert nodes == ["a100-1"] and part == "a100"
    assert time.localtime(start).tm_year == 2026
    start2, nodes2, part2 = parse_test_only((DATA / "test-only-het.txt").read_text())
    assert nodes2 == ["a100-1", "t4-1", "t4-2"] and part2 is None
    # local time without a zone: reading it back in local time gives the printed wall clock
    assert time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(start2)) == "2026-12-02T11:43:25"


def test_test_only_refusal():
    with pytest.raises(SlurmUnexpected, match="no start estimate"):
        parse_test_only("sbatch: error: Batch job submission failed: Requested node configuration is not available")


def test_versions():
    assert parse_version("slurm-wlm 22.05.8") == (22, 5)
    assert parse_version("slurm 24.11.1") == (24, 11)
    assert features_for((20, 11)).json is False
    assert features_for((22, 5)).json and not features_for((22, 5)).numbers_are_objects
    assert features_for((24, 11)).numbers_are_objects


def test_numbers_new_style():
    assert num({"set": True, "infinite": False, "number": 5}) == 5
    assert num({"set": False, "infinite": False, "number": 0}) is None
    assert num({"set": True, "infinite": True, "number": 0}) is None
    assert num(7) == 7


def test_captured_json_view():
    nodes = [node_from_json(n) for n in json.loads((DATA / "sinfo-22.05.json").read_text())["nodes"]]
    jobs = [job_from_json(j) for j in json.loads((DATA / "squeue-22.05.json").read_text())["jobs"]]
    parts = partitions_from_scontrol((DATA / "scontrol-partitions-22.05.txt").read_text())
    view = ClusterView(backend="cli", nodes=nodes, jobs=jobs, partitions=parts)
    by = {n.name: n for n in nodes}
    assert by["a100-1"].gpus_used == 4 and by["a100-1"].gpus_free == 0
    assert by["t4-4"].state == "drained" and not by["t4-4"].available and by["t4-4"].gpus_free == 0
    assert by["t4-1"].gpus_used == 1
    pools = {p.partition: p for p in view.pools()}
    assert (pools["t4"].gpus_total, pools["t4"].gpus_free, pools["t4"].nodes_down) == (16, 10, 1)
    assert pools["a100"].gpus_pending == 2  # the pending 'waiting' job
    het = [j for j in jobs if j.name == "het"]
    assert sorted(j.display_id for j in het) == ["11+0", "11+1"]
    assert {j.partition: j.gpus for j in het} == {"v100": 2, "t4": 2}
    assert parts[0].name == "a100" and parts[0].is_default and parts[0].default_time_min == 10
    assert parts[0].max_time_min is None and parts[0].nodes == ["a100-1", "a100-2"]


def test_captured_text_equals_json():
    nodes_j = sorted(
        (node_from_json(n) for n in json.loads((DATA / "sinfo-22.05.json").read_text())["nodes"]), key=lambda n: n.name
    )
    nodes_t = sorted(nodes_from_text((DATA / "sinfo-text-22.05.txt").read_text()), key=lambda n: n.name)
    # the same but for the features, which the text format does not read (None: not known; JSON: [] for none)
    assert [n.features for n in nodes_j] == [[]] * len(nodes_j) and {n.features for n in nodes_t} == {None}
    assert [n.model_copy(update={"features": None}) for n in nodes_j] == nodes_t
    jobs_j = sorted(
        (job_from_json(j) for j in json.loads((DATA / "squeue-22.05.json").read_text())["jobs"]), key=lambda j: j.job_id
    )
    jobs_t = sorted(jobs_from_text((DATA / "squeue-text-22.05.txt").read_text()), key=lambda j: j.job_id)
    skip = {"start_time", "end_time", "workdir"}  # the captured text predates the %Z column
    assert [_without(j, skip) for j in jobs_j] == [_without(j, skip) for j in jobs_t]


def test_new_style_json_shapes():
    """Slurm 23.02+ JSON: state lists and number objects."""
    n = node_from_json(
        {
            "name": "g1",
            "state": ["IDLE", "DRAIN"],
            "partitions": ["p"],
            "gres": "gpu:h100:8",
            "gres_used": "gpu:h100:0(IDX:N/A)",
            "cpus": {"set": True, "infinite": False, "number": 64},
            "alloc_cpus": 0,
            "real_memory": 1000,
            "alloc_memory": 0,
        }
    )
    assert n.state == "drained" and not n.available and n.cpus == 64
    j = job_from_json(
        {
            "job_id": 5,
            "job_state": ["RUNNING"],
            "het_job_id": {"set": True, "number": 5},
            "het_job_offset": {"set": True, "number": 0},
            "tres_per_node": "gres/gpu:h100:4",
            "time_limit": {"set": True, "infinite": False, "number": 60},
            "node_count": {"set": True, "number": 2},
            "start_time": {"set": True, "number": 1700000000},
            "name": "x",
            "partition": "p",
            "nodes": "g[1-2]",
        }
    )
    assert (j.phase, j.display_id, j.gpus_per_node, j.gpus, j.time_limit_min) == ("running", "5+0", 4, 8, 60)


@pytest.mark.parametrize(
    "state,phase",
    [
        ("RUNNING", "running"),
        ("PENDING", "pending"),
        ("OUT_OF_MEMORY", "failed"),
        ("COMPLETING", "running"),
        ("NODE_FAIL", "failed"),
        ("BRAND_NEW", "unknown"),
        ("", "unknown"),
        ("CANCELLED by 0", "cancelled"),
    ],
)
def test_job_state_table(state, phase):
    assert job_phase(state) == phase


def _without(job, skip: set[str]) -> dict:
    return {k: v for k, v in dataclasses.asdict(job).items() if k not in skip}
