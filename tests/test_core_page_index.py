"""The core's page index (``txn.PageDict``, ``txn.build_index``) against a plain-dict model.

Next to its page map the core keeps an index (``CoreState.page_index``): per scope the ids of
its pages (``owned``) and how many of them have each (version, ``held``) pair (``kinds``); a
thawed map also counts the writes that could make a page obsolete or unheld (``changes``, the
key of RECLAIM's memo of clean scopes). RECLAIM, ALIGN and the classification of late frames
read the index instead of the pages, so an index that drifts from the pages is a silent
protocol bug: a page never freed, a scope wrongly found clean, a late frame misclassified.

The walk check of ``tests/test_core_batch.py`` compares only which (version, ``held``) pairs a
scope has; the mutation run of issue 14 (``docs/mutation-report.json``) showed what that leaves
unchecked: the counts themselves, ``build_index``'s counts, the change counter, the owner-change
path, a scope that gains and loses a page before the map is sealed, ``get``'s default. Here:

* ``PageDict`` as a data structure, against a model that is a plain dict of pages (Hypothesis
  draws the starting pages and a list of operations: set a page to a new or changed owner,
  version, ``held`` flag or only its digest; delete one; ``get`` with and without a default;
  ``owned_ids``; whole-map reads; ``finish`` and thaw again from the sealed index). After every
  operation the counts (no zero count, no scope without pages), the change counter (a write
  counts when it adds a page or changes its owner, version or ``held``; a deletion never counts)
  and the pages agree with the model; at each ``owned_ids`` and ``finish`` so do the ids; a
  sealed index equals ``build_index`` of its own pages and the model, and is never changed by
  the maps thawed from it later;
* the real core, stepped (``step`` and ``step_many``) through engine-shaped traces from
  ``retire_checks.event_fuzz``'s generator, some steps starting from a state that carries no
  index (the core builds one): after every step the new state's index describes its own page
  map exactly, as computed here from ``state.pages``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from typing import Any

import attrs
import hypothesis.strategies as st
from hypothesis import HealthCheck, given, settings

import retire_core as rc
from retire_checks.event_fuzz import Plan, Tally, _Trace
from retire_core.frozen import PageMap
from retire_core.state import CoreState, PageIndex, PageRecord
from retire_core.txn import PageDict, build_index

PAGES = range(6)
SCOPES = ("a", "b", "c")
VERSIONS = (0, 1, 2)

Owned = dict[str, set[int]]
Kinds = dict[str, dict[tuple[int, bool], int]]


def page(owner: str, version: int = 0, held: bool = True, digest: str = "d0") -> PageRecord:
    return PageRecord(owner, version, "q", 0, 0, None, "f", digest=digest, held=held)


def expected(pages: Mapping[int, PageRecord]) -> tuple[Owned, Kinds]:
    """The index of ``pages``, by the definition: each owner's ids, and per owner a count of
    its pages by (version, held); a scope without pages has no entry in either."""
    owned: Owned = {}
    kinds: dict[str, Counter[tuple[int, bool]]] = {}
    for p, record in pages.items():
        owned.setdefault(record.owner, set()).add(p)
        kinds.setdefault(record.owner, Counter())[(record.version, record.held)] += 1
    return owned, {scope: dict(counts) for scope, counts in kinds.items()}


def observed(index: PageIndex) -> tuple[dict[int, PageRecord], Owned, Kinds]:
    """A sealed index as plain values: its pages, ids and counts."""
    pages, owned, kinds = index
    return (
        dict(pages.items()),
        {scope: set(ids) for scope, ids in owned.items()},
        {scope: dict(counts) for scope, counts in kinds.items()},
    )


def counted(pd: PageDict) -> Kinds:
    return {scope: dict(counts) for scope, counts in pd.kinds.items()}


# --- PageDict against the model ------------------------------------------------------------

records = st.builds(
    page,
    st.sampled_from(SCOPES),
    st.sampled_from(VERSIONS),
    st.booleans(),
    st.sampled_from(("d0", "d1")),
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(PAGES), records),
        st.tuples(st.just("set"), st.sampled_from(PAGES), records),  # writes dominate
        st.tuples(st.just("delete"), st.sampled_from(PAGES)),
        st.tuples(st.just("get"), st.sampled_from(PAGES)),
        st.tuples(st.just("owned_ids"), st.sampled_from(SCOPES)),
        st.tuples(st.just("read")),
        st.tuples(st.just("finish")),
    ),
    max_size=40,
)
DEFAULT = page("default-owner", 99)


def check_sealed(index: PageIndex, model: dict[int, PageRecord]) -> None:
    want = (model, *expected(model))
    assert observed(index) == want
    assert observed(build_index(index[0])) == want  # the scan agrees with the sealed index


@settings(
    max_examples=400,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(start=st.dictionaries(st.sampled_from(PAGES), records, max_size=4), ops=operations)
def test_page_dict_follows_a_plain_dict_model(
    start: dict[int, PageRecord], ops: list[tuple[Any, ...]]
) -> None:
    model = dict(start)
    index = build_index(PageMap(start))
    check_sealed(index, model)
    sealed: list[tuple[PageIndex, dict[int, PageRecord]]] = [(index, dict(model))]
    frozen_ids: list[tuple[Any, set[int]]] = []  # maps owned_ids handed out, and their ids
    pd = PageDict(index)
    changes = 0
    for op in ops:
        kind = op[0]
        if kind == "set":
            _, p, record = op
            old = model.get(p)
            if old is None or (old.owner, old.version, old.held) != (
                record.owner,
                record.version,
                record.held,
            ):
                changes += 1  # a new page, or a new owner, version or held flag
            pd[p] = record
            model[p] = record
        elif kind == "delete":
            p = op[1]
            if p in model:
                del pd[p]
                del model[p]  # never counted: a removal cannot make a clean scope unclean
            else:
                try:
                    del pd[p]
                except KeyError:
                    pass
                else:
                    raise AssertionError(f"deleting absent page {p} did not raise")
        elif kind == "get":
            p = op[1]
            assert pd.get(p) == model.get(p)
            assert pd.get(p, DEFAULT) == model.get(p, DEFAULT)
            assert pd.get(p, None) == model.get(p)
        elif kind == "owned_ids":
            scope = op[1]
            ids = pd.owned_ids(scope)
            want = {p for p, r in model.items() if r.owner == scope}
            assert set(ids) == want
            frozen_ids.append((ids, want))
        elif kind == "read":
            assert dict(pd.items()) == model
            assert set(pd) == set(pd.keys()) == set(model)
            assert sorted(pd.values()) == sorted(model.values())
            assert {p: pd[p] for p in model} == model
        else:  # finish: seal the index for the next state, then thaw a new map from it
            index = pd.finish()
            check_sealed(index, model)
            # the sealed map still answers reads (a Txn's read views keep pointing at it)
            assert {s: set(pd.owned_ids(s)) for s in SCOPES} == {
                s: {p for p, r in model.items() if r.owner == s} for s in SCOPES
            }
            assert all(pd.get(p) == model.get(p) for p in PAGES)
            sealed.append((index, dict(model)))
            pd = PageDict(index)
            changes = 0
        assert pd.changes == changes, op
        assert counted(pd) == expected(model)[1], op  # no zero count, no scope without pages
        assert len(pd) == len(model)
        assert all((p in pd) == (p in model) for p in PAGES)
    check_sealed(pd.finish(), model)
    # copy-on-write: no map thawed later changed an index sealed, or ids handed out, earlier
    for index, then in sealed:
        check_sealed(index, then)
    for ids, want in frozen_ids:
        assert set(ids) == want


def test_a_scope_that_gains_and_loses_a_page_before_the_seal_has_no_entry() -> None:
    """Within one map (one step): a new scope's page allocated and freed, a page moved to a new
    owner and back, a scope's last page deleted and a new one added. Sealing must leave no
    entry for a scope without pages, and must not trip over one that never had an entry."""
    base = build_index(PageMap({1: page("a"), 2: page("a", 1, held=False)}))
    pd = PageDict(base)
    pd[3] = page("b")
    del pd[3]
    pd[1] = page("c")
    pd[1] = page("a")
    del pd[2]
    pd[2] = page("a", 2)
    assert pd.changes == 4  # the deletions do not count
    index = pd.finish()
    model = {1: page("a"), 2: page("a", 2)}
    check_sealed(index, model)
    assert set(index[1]) == set(index[2]) == {"a"}
    check_sealed(base, {1: page("a"), 2: page("a", 1, held=False)})  # untouched
    # the same through owned_ids, which seals one scope's ids before the step ends
    pd = PageDict(index)
    pd[4] = page("b")
    del pd[4]
    assert set(pd.owned_ids("b")) == set()
    assert "b" not in pd.owned and "b" not in pd.kinds
    check_sealed(pd.finish(), model)


def test_counts_are_counts() -> None:
    """Two pages of one kind count two: deleting one leaves the kind, deleting both removes
    it (and the scope); counts built by a scan and counts kept by writes agree."""
    pages = {1: page("a"), 2: page("a"), 3: page("a", 1, held=False)}
    for index in (build_index(PageMap(pages)), _written(pages)):
        assert index[2] == {"a": {(0, True): 2, (1, False): 1}}
        pd = PageDict(index)
        del pd[1]
        assert counted(pd) == {"a": {(0, True): 1, (1, False): 1}}
        pd[3] = page("a")  # unheld -> held: the kind moves
        assert counted(pd) == {"a": {(0, True): 2}}
        pd[4] = page("a")
        assert counted(pd) == {"a": {(0, True): 3}}
        for p in (2, 3, 4):
            del pd[p]
        assert counted(pd) == {} and pd.owned_ids("a") == PageMap()


def _written(pages: dict[int, PageRecord]) -> PageIndex:
    pd = PageDict((PageMap(), {}, {}))
    for p, record in pages.items():
        pd[p] = record
    return pd.finish()


# --- the real core: every state's index describes its pages ------------------------------


def index_matches(state: CoreState) -> bool:
    """Check the state's index against its pages; False when it carries none."""
    index = state.page_index
    if index is None:
        return False
    assert index[0] is state.pages, "the index describes another page map"
    pages = dict(state.pages.items())
    assert observed(index) == (pages, *expected(pages))
    return True


def drive(seed: int, length: int) -> Counter[str]:
    """Step one engine-shaped trace of ``length`` events through ``step`` and ``step_many``
    (refused events are skipped), checking the index after every step."""
    rng = random.Random(seed)
    plan = Plan(
        seed=seed,
        length=length,
        scopes=rng.randint(1, 4),
        pages=rng.choice((4, 12, 24)),
        mutate=0.0,
        batch=0.0,
        ledger=rng.choice((1, 2, 8)),
    )
    trace = _Trace(plan, Tally())
    state = trace.core.state
    seen: Counter[str] = Counter()
    while seen["events"] < length:
        if rng.random() < 0.05:
            state = attrs.evolve(state, page_index=None)  # as a hand-built state comes
            seen["unindexed"] += 1
        trace.core.restore(state)  # the generator reads the core it was made with
        events = [trace.plausible() for _ in range(rng.choice((1, 1, 1, 2, 4)))]
        seen["events"] += len(events)
        try:
            if len(events) == 1:
                state = rc.step(state, events[0]).state
            else:
                state = rc.step_many(state, events).state
        except rc.RetireError:
            seen["refused"] += 1
            continue
        seen["steps"] += 1
        if index_matches(state):
            seen["checked"] += 1
            owners = {record.owner for record in state.pages.values()}
            seen["several scopes' pages"] += len(owners) > 1
            seen["unheld pages"] += any(not record.held for record in state.pages.values())
            seen["a scope with two kinds"] += any(
                len(k) > 1 for k in expected(state.pages)[1].values()
            )
    return seen


def test_every_state_of_a_trace_carries_an_exact_index() -> None:
    seen: Counter[str] = Counter()
    for seed in range(12):
        seen.update(drive(seed, 1000))
    # deep enough: thousands of states checked, many with pages of several scopes, with unheld
    # pages, with a scope whose pages are of two kinds; hundreds of steps from a state that
    # came without an index
    assert seen["checked"] > 4000, seen
    assert seen["several scopes' pages"] > 300 and seen["unheld pages"] > 50, seen
    assert seen["a scope with two kinds"] > 300 and seen["unindexed"] > 200, seen
