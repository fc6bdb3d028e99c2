"""A cluster (snapshot or live) and a site file that disagree on GPU types are refused (exit 2), never planned on.

The README's offline snapshot once named its GPUs a100_40gb and v100_32gb while the site file it is paired with says
a100 and v100: every A100 and V100 pool was skipped as "not described" and Llama-2-7B was planned on 16 T4s for 23
days. What counts as a disagreement: the site file describes a partition, Slurm shows typed GPUs there, and none of
the site's GRES types for it is one Slurm shows. A partition the site file does not name, untyped GPUs it does not
map, and an extra GRES type beside one it describes stay as they were: not used, with a note.
"""

from __future__ import annotations

import pytest

from frenzy_slurm.core.errors import EXIT_BAD_INPUT, InputError
from frenzy_slurm.has.pools import type_disagreements
from frenzy_slurm.planning import SiteFile
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site
from frenzy_slurm.site.config import Pool, SiteConfig, load_site

from .helpers import DEV_SITE, EXAMPLES, LOCAL, make_spec, planned, run_cli

DEV_GRES = {p: p for p, *_ in LOCAL}  # the dev cluster names its GRES types after the partitions


def test_the_offline_example_and_its_site_file_agree():
    from frenzy_slurm.slurm import open_backend

    view = open_backend("static", EXAMPLES / "offline" / "cluster.json").load()
    assert type_disagreements(view, load_site(DEV_SITE)) == []


def test_catalog_named_gres_against_the_dev_site_is_refused_with_exit_2(tmp_path):
    snap = tmp_path / "cluster.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())  # gpu:a100_40gb, gpu:v100_32gb, gpu:t4
    res = run_cli(
        "fsbatch", str(EXAMPLES / "llama2-7b.yaml"), "--dry-run", "--backend", "static", "--snapshot", str(snap),
        "--site", str(DEV_SITE), "--job-dir", str(tmp_path / "job"),
    )  # fmt: skip
    assert res.returncode == EXIT_BAD_INPUT
    assert res.stdout == ""  # no plan at all
    err = res.stderr
    assert err.startswith(f"fsbatch: error: snapshot {snap} and site file {DEV_SITE} disagree on GPU types: ")
    assert "partition a100: the cluster has gpu:a100_40gb, the site file describes gpu:a100" in err
    assert "partition v100: the cluster has gpu:v100_32gb, the site file describes gpu:v100" in err
    assert "partition t4" not in err  # t4 agrees
    assert "Fix: give each pool of" in err and "gres_type" in err and "Traceback" not in err


def test_a_live_cluster_that_disagrees_is_named_as_the_cluster():
    from frenzy_slurm.jobspec import resolve_model
    from frenzy_slurm.jobspec.job import SlurmOptions
    from frenzy_slurm.planning import JobFile, PlanOptions, plan_job
    from frenzy_slurm.slurm.fake import FakeSlurm

    view = synthetic(LOCAL).model_copy(update={"cluster": "frenzydev"})
    spec = make_spec()
    job = JobFile(EXAMPLES / "m.yaml", spec, resolve_model(spec, "."))
    site = SiteFile(synthetic_site(LOCAL).model_copy(update={"pools": _pools(DEV_GRES)}))
    with pytest.raises(InputError) as exc:
        plan_job(job, site, FakeSlurm(view), PlanOptions(slurm=SlurmOptions(), now=view.taken_at))
    assert exc.value.message.startswith("Slurm cluster frenzydev and the site file disagree on GPU types")


def _pools(gres: dict[str, str | None]) -> list[Pool]:
    """synthetic_site(LOCAL)'s pools with these GRES types per partition (None: untyped)."""
    out = []
    for p in synthetic_site(LOCAL).pools:
        typed = gres.get(p.partition, p.gres_type)
        out.append(p.model_copy(update={"gres_type": typed, "untyped": typed is None}))
    return out


def _site(gres: dict[str, str | None], drop: tuple[str, ...] = ()) -> SiteConfig:
    pools = [p for p in _pools(gres) if p.partition not in drop]
    return synthetic_site(LOCAL).model_copy(update={"pools": pools})


def test_site_untyped_where_slurm_has_types_is_a_disagreement():
    (d,) = type_disagreements(synthetic(LOCAL), _site({"t4": None}))
    assert (d.partition, d.cluster_types, d.site_types) == ("t4", ("t4",), (None,))
    assert d.line() == "partition t4: the cluster has gpu:t4, the site file describes untyped gpu"


def test_a_partition_the_site_does_not_name_is_not_a_disagreement():
    """A site file may describe only the partitions frenzy-slurm is to use: the others are left out, as before."""
    view = synthetic(LOCAL)
    site = _site({}, drop=("v100",))
    assert type_disagreements(view, site) == []
    request = planned(make_spec(), view, site=site)
    assert {c.partition for c in request.decision.chosen.components} <= {"a100", "t4"}


def test_an_extra_gres_type_beside_a_described_one_is_a_note_not_an_error():
    """Partition a100 gains nodes of another type the site file does not know yet: the a100 pool still plans."""
    view = synthetic(LOCAL)
    h100 = view.nodes[0].model_copy(update={"name": "a100-3", "gpu_type": "h100_sxm"})
    parts = [p.model_copy(update={"nodes": [*p.nodes, "a100-3"]}) if p.name == "a100" else p for p in view.partitions]
    view = view.model_copy(update={"nodes": [*view.nodes, h100], "partitions": parts})
    site = SiteFile(_site({}))
    assert type_disagreements(view, site.config) == []
    request = planned(make_spec(), view, site=site)
    assert any(
        n.startswith("a100/h100_sxm: partition a100 has 4 GPUs of GRES type h100_sxm, which the site file does not")
        for n in request.notes
    ), request.notes


def test_untyped_gpus_the_site_does_not_map_stay_a_note():
    """test_site_untyped.py's rule is kept: unmapped untyped GPUs are named with the fix, the rest plans."""
    view = synthetic(LOCAL)
    nodes = [n.model_copy(update={"gpu_type": None}) if n.partitions == ["v100"] else n for n in view.nodes]
    view = view.model_copy(update={"nodes": nodes})
    site = SiteFile(_site({}, drop=("v100",)))
    assert type_disagreements(view, site.config) == []
    request = planned(make_spec(), view, site=site)
    assert any("partition v100 has 16 GPUs whose GRES has no type" in n for n in request.notes)


def test_fsinfo_shows_the_disagreement_and_exits_0(tmp_path):
    snap = tmp_path / "cluster.json"
    snap.write_text(synthetic(LOCAL).model_dump_json())
    res = run_cli("fsinfo", "--backend", "static", "--snapshot", str(snap), "--site", str(DEV_SITE))
    assert res.returncode == 0
    assert (
        f"fsinfo: note: site file {DEV_SITE} disagrees with the cluster on GPU types: partition a100: the cluster "
        "has gpu:a100_40gb, the site file describes gpu:a100"
    ) in res.stderr
    assert "A100-40GB (not in site file)" in res.stdout
