"""-C/--constraint as slurmctld reads it (slurm/constraint.py): which nodes match, what slurmctld refuses
(refused first, in model.yaml and on the command line), node features in every answer shape, and the
`sbatch --test-only` argv carrying the constraint and --exclusive."""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import InputError
from frenzy_slurm.has.nodes import nodes_for
from frenzy_slurm.has.requirements import Requirements
from frenzy_slurm.jobspec.job import SlurmOptions
from frenzy_slurm.sim.synthetic import synthetic
from frenzy_slurm.slurm.backend import ComponentRequest
from frenzy_slurm.slurm.cli import node_features, nodes_from_text
from frenzy_slurm.slurm.constraint import ConstraintError, parse_constraint

from .helpers import LOCAL, make_spec


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


def _req(**kw) -> Requirements:
    return Requirements(name="t", global_batch=64, steps=100, **kw)


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
