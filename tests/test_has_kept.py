"""What HAS keeps between decisions is an object its caller owns, keyed by the values that decide a search."""

from __future__ import annotations

from frenzy_slurm.has import Requirements
from frenzy_slurm.has.decide import decide
from frenzy_slurm.has.kept import PROCESS_KEPT, Kept, SearchKey
from frenzy_slurm.jobspec import resolve_model
from frenzy_slurm.marp import search_space_from_spec, workload_from_spec
from frenzy_slurm.marp.candidates import SearchSpace
from frenzy_slurm.sim.synthetic import synthetic, synthetic_site

from .helpers import LOCAL, make_spec


def _inputs():
    spec = make_spec()
    w = workload_from_spec(spec, resolve_model(spec, "."))
    return Requirements.from_spec(spec), w, search_space_from_spec(spec)


def test_a_decision_keeps_its_search_and_index_in_the_callers_kept_alone():
    req, w, space = _inputs()
    view, site = synthetic(LOCAL), synthetic_site(LOCAL)
    PROCESS_KEPT.forget()
    mine = Kept()
    first = decide(req, w, view, site, space, kept=mine)
    assert len(mine.searches) == 1 and mine.index is not None
    assert not PROCESS_KEPT.searches and PROCESS_KEPT.index is None
    again = decide(req, w, view, site, space, kept=mine)  # from what `mine` kept: the same decision
    assert again.chosen == first.chosen and len(mine.searches) == 1
    assert decide(req, w, view, site, space).chosen == first.chosen  # the process's own, filled now
    assert len(PROCESS_KEPT.searches) == 1


def test_search_keys_compare_the_settings_not_their_spelling():
    req, w, space = _inputs()
    key = SearchKey.of(w, [], req.global_batch, req.max_gpus, space)
    reordered = SearchSpace(**{**vars(space), "pinned": dict(reversed(list(space.pinned.items())))})
    assert SearchKey.of(w, [], req.global_batch, req.max_gpus, reordered) == key
    assert hash(SearchKey.of(w, [], req.global_batch, req.max_gpus, reordered)) == hash(key)
    # one grouped setting of the workload makes another shape
    assert SearchKey.of(w.with_(loss_chunks=4), [], req.global_batch, req.max_gpus, space) != key
    assert SearchKey.of(w, [], req.global_batch * 2, req.max_gpus, space) != key
