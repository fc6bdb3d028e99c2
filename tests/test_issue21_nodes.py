"""Issue 21: HAS honours -C/--constraint and --exclusive in the plan, not only in job.sbatch.

The constraint grammar is slurmctld's (slurm/constraint.py); the nodes a job may use are has/nodes.py's."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError, NoFitError
from frenzy_slurm.has.nodes import nodes_for
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.backend import ComponentRequest, StartEstimate
from frenzy_slurm.slurm.cli import node_features, nodes_from_text
from frenzy_slurm.slurm.constraint import ConstraintError, parse_constraint
from frenzy_slurm.slurm.view import Job

from .helpers import LOCAL, fill, make_spec, plan


@pytest.mark.parametrize(
    ("text", "features", "expected"),
    [
        ("intel", {"intel"}, True),
        ("intel", {"amd"}, False),
        ("intel&gpu", {"intel"}, False),
        ("intel,gpu", {"intel", "gpu"}, True),  # slurmctld rewrites ',' as '&'
        ("intel|amd", {"amd"}, True),
        # strictly left to right, as sbatch(1) says: foo&bar|baz is (foo&bar)|baz, foo|bar&baz is (foo|bar)&baz
        ("foo&bar|baz", {"baz"}, True),
        ("foo|bar&baz", {"foo"}, False),
        ("foo|bar&baz", {"bar", "baz"}, True),
        ("foo&(bar|baz)", {"foo", "baz"}, True),
        ("foo&(bar|baz)", {"baz"}, False),
        ("[rack1|rack2]", {"rack2"}, True),
        ("[rack1|rack2]", {"rack3"}, False),
        ("[rack1*2&rack2*4]", set(), True),  # counts are asked of the job's nodes together, not of each
        ("graphics*4", set(), True),
        ("[(knl&snc4&flat)*4&haswell*1]", {"haswell"}, True),
    ],
)
def test_a_node_matches_as_slurmctld_reads_the_constraint(text, features, expected):
    assert parse_constraint(text).matches(features) is expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("a&", "ends with an operator"),
        ("|a", "without a feature before it"),
        ("(a", "not closed"),
        ("a)", "imbalanced parentheses"),
        ("((a))", "one level"),
        ("[a|b]&[c|d]", "brackets"),
        ("a*0", "positive whole number"),
        ("(a*2)", "outside parentheses"),
        ("a*2&b", "square brackets"),
        ("[a&b]", "node count on each side"),
        ("a b", "neither a feature name"),
        ("a;touch x", "neither a feature name"),
    ],
)
def test_constraints_slurmctld_refuses_are_refused_first(text, why):
    with pytest.raises(ConstraintError, match=why.replace("(", r"\(").replace("[", r"\[")):
        parse_constraint(text)


def test_matching_or_and_counts_are_named():
    c = parse_constraint("[rack1|rack2]&nvme")
    assert c.matching_or == ("rack1", "rack2") and not c.counted
    assert c.matches({"rack1", "nvme"}) and not c.matches({"rack1"})
    assert parse_constraint("[a*2&b*1]").counted


def test_model_yaml_and_flags_take_slurm_syntax_and_refuse_bad_constraints():
    assert make_spec(slurm={"constraint": "a100&(ib|roce)"}).slurm.constraint == "a100&(ib|roce)"
    with pytest.raises(InputError, match="--constraint: 'a&&b'"):
        SlurmOptions().overridden(constraint="a&&b")


def test_node_features_in_every_answer_shape():
    assert node_features("ib,nvme") == ["ib", "nvme"]  # 22.05 sinfo --json, pyslurm's string
    assert node_features(["ib", "nvme"]) == ["ib", "nvme"]  # scontrol --json (23.11+)
    assert node_features("(null)") == [] and node_features("") == []
    assert node_features(None) is None  # the answer does not say: not known
    # the text format does not ask for features: not known, and a constraint then keeps those nodes, saying so
    (n,) = nodes_from_text("n1|gpu|idle|0/16/0/16|64000|0|gpu:a100:4|gpu:a100:0(IDX:N/A)|none|\n")
    assert n.features is None
    view = synthetic(LOCAL)  # synthetic nodes carry no features either
    narrowed, notes = nodes_for(_req(constraint="ib"), view)
    assert narrowed is view and "not known here" in notes[0]


def _featured(view, features: dict[str, list[str]]):
    nodes = [n.model_copy(update={"features": features.get(n.name, [])}) for n in view.nodes]
    return view.model_copy(update={"nodes": nodes})


def _req(**kw) -> Requirements:
    return Requirements(name="t", global_batch=64, steps=100, **kw)


def test_the_constraint_leaves_out_nodes_without_the_features():
    view = _featured(synthetic(LOCAL), {"v100-1": ["ib"], "t4-1": ["ib"], "t4-2": ["ib"]})
    narrowed, notes = nodes_for(_req(constraint="ib"), view)
    assert sorted(n.name for n in narrowed.nodes) == ["t4-1", "t4-2", "v100-1"]
    assert {p.name: p.nodes for p in narrowed.partitions}["v100"] == ["v100-1"]
    assert notes == ["a100/a100_40gb: no node has the features -C ib asks for (its nodes have: none)"]
    # nothing asked: the view itself
    assert nodes_for(_req(), view)[0] is view


def test_has_plans_only_on_nodes_with_the_features():
    view = _featured(synthetic(LOCAL), {n: ["fast"] for n in ("t4-1", "t4-2", "t4-3", "t4-4")})
    free = plan(make_spec(model={"preset": "gpt2"}), view)
    assert free.chosen.components[0].partition != "t4"  # without -C the faster GPUs win
    on_t4 = plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "fast"}), view)
    assert {c.partition for c in on_t4.chosen.components} == {"t4"}
    with pytest.raises(NoFitError, match="no node has the features -C slow"):
        plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "slow"}), view)


def test_matching_or_is_planned_per_node_and_said():
    view = _featured(synthetic(LOCAL), {"v100-1": ["r1"], "v100-2": ["r2"]})
    _, notes = nodes_for(_req(constraint="[r1|r2]"), view)
    assert any("r1 or r2" in n and "left to Slurm" in n for n in notes)


def test_exclusive_counts_a_node_any_job_uses_as_busy_until_it_empties():
    view = synthetic(LOCAL)
    now = view.taken_at
    # v100-1: 2 of 8 GPUs used by a job ending in 30 min and a CPU-only job ending in 90 min; v100-2 idle
    nodes = [
        n.model_copy(update={"gpus_used": 2, "cpus_alloc": 3, "state": "mixed"}) if n.name == "v100-1" else n
        for n in view.nodes
    ]
    jobs = [
        Job(job_id=7, state="RUNNING", partition="v100", nodes=["v100-1"], node_count=1, gpu_type="v100_32gb",
            gpus_per_node=2, end_time=int(now + 1800)),
        Job(job_id=8, state="RUNNING", partition="v100", nodes=["v100-1"], node_count=1, end_time=int(now + 5400)),
    ]  # fmt: skip
    view = view.model_copy(update={"nodes": nodes, "jobs": jobs})
    whole, _ = nodes_for(_req(exclusive=True), view)
    v1 = next(n for n in whole.nodes if n.name == "v100-1")
    assert v1.gpus_free == 0
    (hold,) = [j for j in whole.jobs if "v100-1" in j.nodes]
    assert (hold.gpus_per_node, hold.end_time, hold.job_id) == (8, int(now + 5400), 8)
    # shared, the node has 6 GPUs free now; exclusive, a one-node job waits for the CPU-only job to end
    from frenzy_slurm.slurm.releases import ReleaseIndex

    start = ReleaseIndex(whole, now).start("v100", "v100_32gb", 2, 8, 600.0)
    assert start == pytest.approx(now + 5400)  # two whole nodes: v100-1 frees at the last job's end
    assert ReleaseIndex(view, now).start("v100", "v100_32gb", 1, 6, 600.0) == pytest.approx(now)


def test_exclusive_plans_take_whole_nodes():
    spec = make_spec(model={"preset": "gpt2"}, slurm={"exclusive": True})
    view = fill(synthetic(LOCAL), "a100", keep_free={"a100-1": 2})  # a100-1: 2 GPUs free beside another job
    d = plan(spec, view)
    for alloc in [d.chosen] + [a.allocation for a in d.alternatives if a.allocation is not None]:
        for c in alloc.components:
            if c.partition == "a100":
                assert alloc.start > view.taken_at  # the shared node is not free for an exclusive job
    # one candidate per pool and node count: a narrower plan on the same nodes is not offered as cheaper
    seen = [
        (tuple(c.partition for c in a.allocation.components), tuple(c.nodes for c in a.allocation.components))
        for a in d.alternatives
        if a.allocation is not None and not a.lost_because.startswith(("more than", "exceeds"))
    ]
    chosen = (tuple(c.partition for c in d.chosen.components), tuple(c.nodes for c in d.chosen.components))
    assert chosen not in seen


class _Recorder:
    """A backend whose only use is to record what HAS asks `sbatch --test-only`."""

    def __init__(self):
        self.asked: list[list[ComponentRequest]] = []

    def expected_start(self, components):
        self.asked.append(components)
        return StartEstimate(start=2e9, nodes=[], source="test-only")


def test_test_only_is_asked_with_the_constraint_and_exclusive():
    with_ib = {n: ["ib"] for n in ("a100-1", "a100-2", "v100-1", "v100-2", "t4-1")}
    view = fill(_featured(synthetic(LOCAL), with_ib), "a100")
    for part in ("v100", "t4"):
        view = fill(view, part)
    rec = _Recorder()
    plan(make_spec(model={"preset": "gpt2"}, slurm={"constraint": "ib", "exclusive": True}), view, backend=rec)
    assert rec.asked and all(c.constraint == "ib" and c.exclusive for comps in rec.asked for c in comps)


def test_cli_test_only_argv_carries_them(monkeypatch):
    from frenzy_slurm.slurm import cli as cli_mod

    seen = {}

    class Done(Exception):
        pass

    def fake_run(argv, **kw):
        seen["argv"] = argv
        raise Done

    monkeypatch.setattr(cli_mod, "run", fake_run)
    backend = cli_mod.SlurmCliBackend.__new__(cli_mod.SlurmCliBackend)
    backend.timeout = 5
    comp = ComponentRequest("a100", "a100", 1, 4, 60, constraint="ib&nvme", exclusive=True)
    with pytest.raises(Done):
        backend.expected_start([comp, comp])
    argv = seen["argv"]
    assert argv.count("--constraint=ib&nvme") == 2 and argv.count("--exclusive") == 2
