"""Batched handling: ``Retire.handle_batch`` / ``machine.step_many`` against one-by-one handling.

The event sequences are random walks of the lock-step harness (the environment's moves, checked
against the spec as they are made), recorded at the core's ``step``. Each walk is then replayed
into two fresh cores: one event at a time, and in random batches; final state, commands,
transitions and log lines must all agree. A bad event in a batch must raise its typed error and
leave everything as it was. A deliberately broken batch (one that drops the last event) must be
caught by the same comparison, so the comparison is known to be able to fail.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import pytest
import structlog
from structlog.testing import capture_logs

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_checks.environment import Budget, env_moves
from retire_checks.fuzz import BOUNDS
from retire_checks.lockstep import Lockstep
from retire_spec.actions import ActionInstance
from retire_spec.schema import NO_MATCH

SEEDS = range(60)


class ListLogger:
    """Records every ``info`` call (event name and fields) as a log line."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


def walk(seed: int, moves: int = 80) -> tuple[int, list[Any], list[Any]]:
    """A random walk; returns (ledger size, the events the core accepted in order, the events it
    rejected along the way)."""
    rng = random.Random(seed)
    ledger = rng.choice((1, 2, 8))
    accepted: list[Any] = []
    rejected: list[Any] = []

    def recording_step(state: rc.CoreState, event: Any) -> rc.Step:
        try:
            result = rc.step(state, event)
        except rc.RetireError:
            rejected.append(event)
            raise
        accepted.append(event)
        return result

    # odd seeds: both scopes of one tenant and model (equal fingerprints)
    bounds = BOUNDS if seed % 2 == 0 else attrs.evolve(BOUNDS, fingerprints=(0, 0))
    ls = Lockstep(Universe.of(bounds), step_fn=recording_step, ledger_size=ledger)
    budget = Budget(faults=2, partial_writes=True, drafts=seed % 3 == 0)
    for _ in range(moves):
        if ls.pending_reports and rng.random() < 0.3:
            ls.report(rng.choice(sorted(ls.pending_reports)))
            continue
        options = env_moves(ls, budget)
        if not options:
            break
        allocations = [m for m in options if m.name == "allocate"]
        if allocations and rng.random() < 0.3:
            # Fill a block: allocate it, complete it, close its writer (what revisions inherit).
            move = rng.choice(allocations)
            p, q, _ = move.args
            ls.env(move)
            ls.env(ActionInstance("attempt_write", (p, q, True)))
            ls.env(ActionInstance("close_writer", (p, NO_MATCH)))
            continue
        keep = [
            m
            for m in options
            if m.name == "supersede"
            and m.args[2]
            and m.args[1][0] == ls.spec["scope_want"][m.args[0]][0]
        ]
        if keep and rng.random() < 0.2:
            ls.env(rng.choice(keep))  # a revision that keeps the leading block, reuse allowed
            continue
        move = rng.choice(options)
        if move.name == "report":
            ls.report(move.args[0])
        else:
            ls.env(move)
    return ledger, accepted, rejected


def chunks(events: Sequence[Any], rng: random.Random) -> list[list[Any]]:
    out: list[list[Any]] = []
    i = 0
    while i < len(events):
        n = rng.choice((1, 2, 3, 5, 8, 13, len(events)))
        out.append(list(events[i : i + n]))
        i += n
    return out


BatchFn = Callable[[rc.Retire, list[Any]], list[rc.Command]]


def real_batch(core: rc.Retire, events: list[Any]) -> list[rc.Command]:
    return core.handle_batch(events)


def mismatches(seed: int, batch: BatchFn = real_batch) -> list[str]:
    """Replay one walk one by one and in random batches; describe every difference."""
    ledger, events, _ = walk(seed)
    one_log, many_log = ListLogger(), ListLogger()
    one = rc.Retire(ledger_size=ledger, logger=one_log)
    many = rc.Retire(ledger_size=ledger, logger=many_log)
    one_commands: list[rc.Command] = []
    one_transitions: list[rc.Transition] = []
    for event in events:
        one_commands += one.handle(event)
        one_transitions += one.last_transitions
    many_commands: list[rc.Command] = []
    many_transitions: list[rc.Transition] = []
    problems = []
    for part in chunks(events, random.Random(seed * 7919 + 1)):
        try:
            many_commands += batch(many, part)
        except rc.RetireError as err:
            problems.append(f"raised {type(err).__name__}")
            break
        many_transitions += many.last_transitions
    if one.state != many.state or hash(one.state) != hash(many.state):
        problems.append("final state")
    if one_commands != many_commands:
        problems.append("commands")
    if one_transitions != many_transitions:
        problems.append("transitions")
    if one_log.lines != many_log.lines:
        problems.append("log lines")
    return problems


@pytest.mark.parametrize("seed", SEEDS)
def test_batch_equals_one_by_one(seed: int) -> None:
    assert mismatches(seed) == []


def test_walks_are_long_and_varied() -> None:
    # The comparison means something only if the walks reach the interesting transitions.
    actions: set[str] = set()
    total = 0
    for seed in SEEDS:
        ledger, events, _ = walk(seed)
        core = rc.Retire(ledger_size=ledger, logger=ListLogger())
        core.handle_batch(events)
        total += len(events)
        actions |= {t.action for t in core.last_transitions}
    assert total > 20 * len(SEEDS)
    assert {"publish", "drop", "certify", "adopt", "free", "fence", "resume"} <= actions


@pytest.mark.parametrize("seed", range(12))
def test_step_many_is_a_fold_of_step(seed: int) -> None:
    ledger, events, _ = walk(seed)
    state = rc.CoreState(ledger_size=ledger)
    commands: list[rc.Command] = []
    transitions: list[rc.Transition] = []
    counts: list[int] = []
    for event in events:
        result = rc.step(state, event)
        state = result.state
        commands += result.commands
        transitions += result.transitions
        counts.append(len(result.transitions))
    batch = rc.step_many(rc.CoreState(ledger_size=ledger), events)
    assert batch.state == state
    assert list(batch.commands) == commands
    assert list(batch.transitions) == transitions
    assert list(batch.counts) == counts


def test_a_skipped_event_is_caught() -> None:
    # Seeded bug: a batch that silently drops its last event must fail the comparison.
    def broken(core: rc.Retire, events: list[Any]) -> list[rc.Command]:
        return core.handle_batch(events[:-1])

    caught = [seed for seed in range(10) if mismatches(seed, broken)]
    assert caught == list(range(10))


def test_reordered_events_are_caught() -> None:
    # Seeded bug: handling a batch's events in reverse order must fail the comparison too.
    def reversed_batch(core: rc.Retire, events: list[Any]) -> list[rc.Command]:
        return core.handle_batch(events[::-1])

    assert any(mismatches(seed, reversed_batch) for seed in range(10))


@pytest.mark.parametrize("seed", range(20))
def test_bad_event_in_the_middle_changes_nothing(seed: int) -> None:
    ledger, events, rejected = walk(seed)
    rng = random.Random(seed)
    log = ListLogger()
    core = rc.Retire(ledger_size=ledger, logger=log)
    head, tail = events[: len(events) // 2], events[len(events) // 2 :]
    core.handle_batch(head)
    cut = rng.randint(0, len(tail))
    # Where the bad event goes, the state is what the events before it leave.
    there = rc.step_many(core.state, tail[:cut]).state
    # A bad event: one the walk saw rejected, if it is still bad there, else a receipt of a
    # participant that never started.
    bad: Any = rc.Receipt("s0", 0, "nobody-started-this")
    for candidate in rejected:
        try:
            rc.step(there, candidate)
        except rc.RetireError:
            bad = candidate
            break
    with pytest.raises(rc.RetireError) as one_by_one:
        rc.step(there, bad)
    before, lines, last = core.state, list(log.lines), core.last_transitions
    with pytest.raises(rc.RetireError) as batched:
        core.handle_batch([*tail[:cut], bad, *tail[cut:]])
    assert type(batched.value) is type(one_by_one.value)
    assert str(batched.value) == str(one_by_one.value)
    assert core.state is before
    assert log.lines == lines and core.last_transitions == last
    # ... and the core carries on exactly as if the bad batch had never been offered.
    core.handle_batch(tail)
    reference = rc.Retire(ledger_size=ledger, logger=ListLogger())
    for event in events:
        reference.handle(event)
    assert core.state == reference.state


def test_not_an_event_in_a_batch_changes_nothing() -> None:
    core = rc.Retire(logger=ListLogger())
    core.handle(rc.Submit("s", "t", "f", (1,)))
    before = core.state
    with pytest.raises(TypeError):
        core.handle_batch([rc.ParticipantStarted("s", 0, "a"), object()])  # type: ignore[list-item]
    assert core.state is before


def test_empty_batch() -> None:
    core = rc.Retire(logger=ListLogger())
    before = core.state
    assert core.handle_batch([]) == []
    assert core.state is before and core.last_transitions == ()


def test_batch_log_lines_through_structlog() -> None:
    events = [
        rc.Submit("s", "t", "f", (1,)),
        rc.ParticipantStarted("s", 0, "a"),
        rc.FrameArrived("s", 0, 1, rc.FrameKind.TOKEN),
        rc.Supersede("s", (2,)),
    ]
    one = rc.Retire(logger=structlog.get_logger("test"))
    many = rc.Retire(logger=structlog.get_logger("test"))
    with capture_logs() as one_logs:
        for event in events:
            one.handle(event)
    with capture_logs() as many_logs:
        many.handle_batch(events)
    assert one_logs == many_logs
    assert [e["trigger"] for e in many_logs] == [
        "Submit",
        "ParticipantStarted",
        "FrameArrived",
        "Supersede",
        "Supersede",
        "Supersede",
    ]
    assert [e["seq"] for e in many_logs] == [1, 2, 3, 4, 5, 6]


def test_filtered_logger_gets_no_calls_but_keeps_counting() -> None:
    import logging

    calls: list[str] = []

    class Quiet:
        def is_enabled_for(self, level: int) -> bool:
            return level >= logging.WARNING

        def info(self, event: str, **fields: Any) -> None:
            calls.append(event)

    core = rc.Retire(logger=Quiet())
    core.handle_batch([rc.Submit("s", "t", "f", (1,)), rc.ParticipantStarted("s", 0, "a")])
    assert calls == []
    # Sequence numbers still advance, so a later enabled logger would see the same numbers.
    assert core._seq == 2


def test_an_unlogged_batch_bounds_the_ledger_after_every_event() -> None:
    """A batch nobody logs (``run_batch`` without per-event counts) bounds the ledger after
    each event, as ``step`` does: with room for one drained version, version 0 has expired by
    the time version 1 drains, and a late frame of version 0 later in the same batch is
    classified ``retired_expired``, as one by one, not ``retired_drained``."""
    import logging

    class Quiet:
        def is_enabled_for(self, level: int) -> bool:
            return level >= logging.WARNING

        def info(self, event: str, **fields: Any) -> None:
            raise AssertionError("a quiet logger got a line")

    events = [
        rc.Submit("s", "t", "f", (1,)),
        rc.ParticipantStarted("s", 0, "a"),
        rc.Supersede("s", (2,)),
        rc.Receipt("s", 0, "a"),  # version 0 drains: the ledger holds (s, 0)
        rc.ParticipantStarted("s", 1, "b"),
        rc.Supersede("s", (3,)),
        rc.Receipt("s", 1, "b"),  # version 1 drains: (s, 1) pushes (s, 0) out
        rc.FrameArrived("s", 0, 5, rc.FrameKind.TOKEN),
    ]
    one = rc.Retire(ledger_size=1, logger=Quiet())
    transitions: list[rc.Transition] = []
    for event in events:
        one.handle(event)
        transitions += one.last_transitions
    many = rc.Retire(ledger_size=1, logger=Quiet())
    many.handle_batch(events)
    assert transitions[-1].reason is rc.DropReason.RETIRED_EXPIRED
    assert list(many.last_transitions) == transitions
    assert many.state == one.state and many.state.ledger == (("s", 1),)


def test_reconfigured_structlog_is_followed() -> None:
    # The resolved logger is reused, but a new structlog configuration (capture_logs) is seen.
    core = rc.Retire(logger=structlog.get_logger("test"))
    with capture_logs() as first:
        core.handle(rc.Submit("s", "t", "f", (1,)))
    with capture_logs() as second:
        core.handle_batch([rc.ParticipantStarted("s", 0, "a")])
    assert [e["transition"] for e in first] == ["open"]
    assert [e["transition"] for e in second] == ["launch"]


# --- the reclaim shortcut against the full scan it replaces ------------------------------------


def reference_reclaim(txn: Any, scope: str) -> None:
    """RECLAIM as it was written before the shortcut: scan every page, every time."""

    from retire_core.frozen import FrozenMap

    rec = txn.scopes[scope]
    cancelled = rec.state in (rc.ScopeState.CANCELLED, rc.ScopeState.FINISHED)
    finished = rec.state is rc.ScopeState.FINISHED
    freed, cached = [], []
    for p in sorted(p for p, page in txn.pages.items() if page.owner == scope):
        page = txn.pages[p]
        obsolete = cancelled or page.version < rec.epoch
        # a finished version's completed pages go back to the engine's cache, still tracked
        keep = finished and page.version == rec.epoch
        if page.held and obsolete and not page.writer_open and rec.drained(page.version):
            page = page._replace(held=False)
            txn.pages[p] = page
            txn.record(
                "unhold", rc.Stage.RECLAIM, scope, page.version, changed={"held": False}, page=p
            )
            if keep and page.full and page.prefix is not None and not page.pinned:
                cached.append(p)
                continue
        inheritable = page.full and page.prefix is not None
        if not page.held and not page.pinned and not (keep and inheritable):
            del txn.pages[p]
            freed.append(p)
            txn.record("free", rc.Stage.RECLAIM, scope, page.version, page=p)
    if freed:
        txn.emit(rc.Free(tuple(freed)))
    if cached:
        txn.emit(rc.ReleaseToCache(tuple(cached)))
    rec = txn.scopes[scope]
    live = {page.version for page in txn.pages.values() if page.owner == scope}
    gone = sorted(
        v
        for v in {r.version for r in rec.participants.values()}
        if (cancelled or v < rec.epoch) and rec.drained(v) and v not in live
    )
    if gone:
        participants = FrozenMap(
            (q, r) for q, r in rec.participants.items() if r.version not in gone
        )
        txn.scopes[scope] = attrs.evolve(rec, participants=participants)
        for v in gone:
            txn.ledger.append((scope, v))


def test_reclaim_shortcut_matches_the_full_scan() -> None:
    from retire_core import reclaim
    from retire_core.txn import Txn

    checked = 0
    for seed in range(40):
        ledger, events, _ = walk(seed)
        state = rc.CoreState(ledger_size=ledger)
        for event in events:
            state = rc.step(state, event).state
            for scope in state.scopes:
                fast, full = Txn(state), Txn(state)
                reclaim.reclaim(fast, scope)
                reference_reclaim(full, scope)
                assert fast.freeze() == full.freeze(), (seed, event, scope)
                assert fast.commands == full.commands and fast.transitions == full.transitions
                checked += 1
    assert checked > 1000


# --- the lean paths against what they spell out -------------------------------------------------


def test_lean_publish_equals_the_attrs_constructor() -> None:
    core = rc.Retire(logger=ListLogger())
    core.handle(rc.Submit("s", "t", "f", (1,)))
    (published,) = core.handle(rc.FrameArrived("s", 0, 7, rc.FrameKind.COMMIT))
    reference = rc.Publish(7, "s", 0, rc.FrameKind.COMMIT)
    assert type(published) is rc.Publish
    assert published == reference and hash(published) == hash(reference)
    assert repr(published) == repr(reference)
    with pytest.raises(AttributeError):
        published.frame = 8  # type: ignore[misc]  # still frozen


def test_allow_write_instances_are_shared_but_equal() -> None:
    core = rc.Retire(logger=ListLogger())
    core.handle(rc.Submit("s", "t", "f", (1,)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    core.handle(rc.PageAllocated("s", 0, "a", 3, 0))
    first = core.handle(rc.WriteAttempted("s", 0, "a", 3, False))
    second = core.handle(rc.WriteAttempted("s", 0, "a", 3, True))
    assert first == second == [rc.AllowWrite(3, "a")]


def test_reclaim_memo_sees_writes_made_through_the_page_map() -> None:
    """RECLAIM remembers, within one ``Txn``, that a scope was clean; any write through
    ``txn.pages`` that could make it unclean (as the checks' mutants make) must invalidate that."""
    from retire_core import reclaim
    from retire_core.state import evolve
    from retire_core.txn import Txn

    core = rc.Retire(logger=ListLogger())
    core.handle(rc.Submit("s", "t", "f", (1, 2)))
    core.handle(rc.ParticipantStarted("s", 0, "a"))
    for page, pos in ((1, 0), (2, 1)):
        core.handle_batch(
            [
                rc.PageAllocated("s", 0, "a", page, pos),
                rc.WriteAttempted("s", 0, "a", page, True),
                rc.WriterClosed(page, f"d{page}"),
            ]
        )
    txn = Txn(core.state)
    reclaim.reclaim(txn, "s")
    assert "s" in txn.clean and not txn.commands
    reclaim.reclaim(txn, "s")  # a memo hit: still nothing to do
    assert not txn.commands
    # A closure-like write (same owner, version, held) keeps the memo ...
    page = txn.pages[1]
    txn.pages[1] = evolve(page, digest="other")
    reclaim.reclaim(txn, "s")
    assert not txn.commands
    # ... a write that makes a page obsolete (a mutant's relabel to an older version, drained:
    # it has no participant) does not: the page must be unheld and freed.
    txn.pages[2] = evolve(txn.pages[2], version=-1)
    reclaim.reclaim(txn, "s")
    assert txn.commands == [rc.Free((2,))]
    assert [t.action for t in txn.transitions] == ["unhold", "free"]


def test_batched_prefill_closures_match_one_by_one() -> None:
    """Many writer closures in one batch (a prefill) reuse RECLAIM's memo between events."""
    events: list[Any] = [rc.Submit("s", "t", "f", tuple(range(12))), rc.Submit("u", "t", "f", (9,))]
    events += [rc.ParticipantStarted("s", 0, "a"), rc.ParticipantStarted("u", 0, "b")]
    for p in range(12):
        events += [rc.PageAllocated("s", 0, "a", p, p), rc.WriteAttempted("s", 0, "a", p, True)]
    events += [rc.PageAllocated("u", 0, "b", 50, 0), rc.WriteAttempted("u", 0, "b", 50, True)]
    events += [rc.WriterClosed(p, f"d{p}") for p in range(6)]
    events += [rc.Supersede("s", (*range(6), 99)), rc.Receipt("s", 0, "a")]
    events += [rc.WriterClosed(p, f"d{p}") for p in range(6, 12)]
    events += [rc.WriterClosed(50, "d50")]
    one, many = rc.Retire(logger=ListLogger()), rc.Retire(logger=ListLogger())
    one_commands = [c for event in events for c in one.handle(event)]
    many_commands = many.handle_batch(events)
    assert many_commands == one_commands
    assert many.state == one.state
    assert many._log.lines == one._log.lines


def index_problems(state: rc.CoreState) -> list[str]:
    """Where a state's per-scope page index (``PageDict.owned`` and ``kinds``) disagrees with
    its pages."""
    from retire_core.txn import Txn

    pages = state.pages
    txn = Txn(state)
    problems = []
    for scope in {page.owner for page in pages.values()} | set(state.scopes):
        want = {p for p, page in pages.items() if page.owner == scope}
        got = set(txn.owned_pages(scope))
        if got != want:
            problems.append(f"{scope}: index {sorted(got)} != pages {sorted(want)}")
        kinds = {(page.version, page.held) for page in pages.values() if page.owner == scope}
        if set(txn.page_kinds(scope)) != kinds:
            problems.append(f"{scope}: kinds {set(txn.page_kinds(scope))} != pages {kinds}")
    index = state.page_index
    if index is not None and index[0] is pages:  # no entry for a scope that owns no page
        owners = {page.owner for page in pages.values()}
        for name, part in (("ids", index[1]), ("kinds", index[2])):
            if set(part) - owners:
                problems.append(f"{name} of scopes without pages: {sorted(set(part) - owners)}")
    return problems


@pytest.mark.parametrize("seed", range(40))
def test_page_index_follows_every_state_of_a_walk(seed: int) -> None:
    """Every state the core reaches, one by one and in batches, has an index that names exactly
    each scope's pages, and stepping on never changes an earlier state's index."""
    ledger, events, _ = walk(seed, moves=120)
    state = rc.CoreState(ledger_size=ledger)
    seen: list[tuple[rc.CoreState, list[str]]] = []
    for event in events:
        state = rc.step(state, event).state
        assert index_problems(state) == []
        seen.append((state, [repr(sorted(state.pages))]))
    for old, before in seen:  # copy-on-write: later steps left the earlier indexes alone
        assert index_problems(old) == [] and [repr(sorted(old.pages))] == before
    batched = rc.step_many(rc.CoreState(ledger_size=ledger), events).state
    assert batched == state and index_problems(batched) == []


def _count_index_scans(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count the scans that (re)build a page index of a non-empty page map."""
    from retire_core import txn as txn_module

    scans: list[int] = []
    real = txn_module.build_index

    def counting(pages: Any) -> Any:
        if pages:
            scans.append(len(pages))
        return real(pages)

    monkeypatch.setattr(txn_module, "build_index", counting)
    return scans


def _walk_states(seed: int) -> int:
    ledger, events, _ = walk(seed, moves=120)
    state = rc.CoreState(ledger_size=ledger)
    for event in events:
        state = rc.step(state, event).state
    return len(events)


def test_steps_carry_the_page_index_instead_of_scanning_every_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step's cost must not grow with the engine's page count: every state a step builds
    carries its index on, so no step ever scans the whole page map to rebuild it."""
    scans = _count_index_scans(monkeypatch)
    assert sum(_walk_states(seed) for seed in range(20)) > 500
    assert scans == []


def test_a_state_that_drops_its_page_index_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug: ``freeze`` forgets the index; the check above sees the scans."""

    from retire_core.txn import Txn

    scans = _count_index_scans(monkeypatch)
    real = Txn.freeze

    def forgetful_freeze(self: Txn) -> rc.CoreState:
        return attrs.evolve(real(self), page_index=None)

    monkeypatch.setattr(Txn, "freeze", forgetful_freeze)
    for seed in range(20):
        _walk_states(seed)
    assert len(scans) > 100


def test_a_stale_page_index_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug: an index that does not forget freed pages. The walk check above must fail."""
    from retire_core.txn import PageDict

    def forgetful_delete(self: PageDict, key: int) -> None:
        del self._m[key]  # the ids and counts never hear of it

    monkeypatch.setattr(PageDict, "__delitem__", forgetful_delete)
    failures = 0
    for seed in range(40):
        try:
            test_page_index_follows_every_state_of_a_walk(seed)
        except (AssertionError, KeyError):  # a wrong answer, or the core tripping over it
            failures += 1
    assert failures > 0


def test_stale_page_kinds_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug: the per-scope (version, held) counts never forget a page's old kind (a page
    that became unheld, moved to the successor or was freed still counts as before)."""
    from retire_core.txn import PageDict

    real = PageDict._count

    def count_only_up(self: PageDict, scope: str, kind: Any, delta: int) -> None:
        if delta > 0:
            real(self, scope, kind, delta)

    monkeypatch.setattr(PageDict, "_count", count_only_up)
    failures = 0
    for seed in range(40):
        try:
            test_page_index_follows_every_state_of_a_walk(seed)
        except AssertionError:
            failures += 1
    assert failures > 0


def test_hand_built_and_unpickled_states_get_an_index() -> None:
    import pickle

    from retire_core.frozen import PageMap
    from retire_core.state import PageRecord
    from retire_core.txn import Txn

    for seed in range(40):  # the first walk that ends with pages left
        ledger, events, _ = walk(seed, moves=60)
        state = rc.step_many(rc.CoreState(ledger_size=ledger), events).state
        if state.pages:
            break
    assert state.pages, "no walk left pages"
    # a state built by hand from a plain dict: the index is built when a step needs it
    plain = rc.CoreState(state.scopes, PageMap(dict(state.pages)), state.generations)
    assert plain.page_index is None and index_problems(plain) == []
    # an evolved state keeps the old index object, which does not describe its new page map
    first = next(iter(state.pages))
    evolved = attrs.evolve(state, pages=state.pages.delete(first))
    assert evolved.page_index is state.page_index and index_problems(evolved) == []
    txn = Txn(plain)
    page = plain.pages[first]
    txn.pages[999] = PageRecord(page.owner, page.version, page.participant, 0, 9, None, "f")
    assert 999 in txn.owned_pages(page.owner)
    assert index_problems(pickle.loads(pickle.dumps(state))) == []


def test_record_pages_over_one_page_builds_the_transition_record_builds() -> None:
    """``Txn.record_pages`` over one page (ALIGN, RESUME and RECLAIM on a single page) is the
    per-page transition ``Txn.record`` builds: the same transition, field for field."""
    from retire_core.transitions import Stage
    from retire_core.txn import Txn

    fast, slow = Txn(rc.CoreState()), Txn(rc.CoreState())
    fast.record_pages(
        "certify",
        Stage.ALIGN,
        "s",
        2,
        (7,),
        (("pinned", True),),
        (("position", (3,)), ("digest", ("d",))),
    )
    slow.record(
        "certify", Stage.ALIGN, "s", 2, changed={"pinned": True}, page=7, position=3, digest="d"
    )
    fast.record_pages("free", Stage.RECLAIM, "s", 1, (9,))
    slow.record("free", Stage.RECLAIM, "s", 1, page=9)
    assert fast.transitions == slow.transitions
    assert [t.as_log() for t in fast.transitions] == [t.as_log() for t in slow.transitions]


def _fenced_scope(blocks: int) -> rc.Retire:
    """A scope whose version 0 holds ``blocks`` closed pages and was just superseded with
    nothing shared: its two participants owe their receipts."""
    core = rc.Retire()
    core.handle(rc.Submit("s", "t", "fp", tuple(f"k{i}" for i in range(blocks))))
    for q in ("q/rank0", "q"):
        core.handle(rc.ParticipantStarted("s", 0, q))
    for p in range(blocks):
        core.handle_batch(
            [
                rc.PageAllocated("s", 0, "q", p, p),
                rc.WriteAttempted("s", 0, "q", p, True),
                rc.WriterClosed(p, f"d{p}"),
            ]
        )
    core.handle(rc.Supersede("s", tuple(f"n{i}" for i in range(blocks))))
    return core


def test_a_receipt_before_the_last_reads_no_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a fence is in progress (receipts still due, every page held), RECLAIM has nothing
    to release, and must see that without reading the scope's pages: a long context would
    pay a pass over all of them per receipt. The last receipt does read them, and frees them."""
    from retire_core.txn import Txn

    core = _fenced_scope(16)
    reads: list[str] = []
    real = Txn.owned_pages

    def counting(self: Txn, scope: str) -> Any:
        reads.append(scope)
        return real(self, scope)

    monkeypatch.setattr(Txn, "owned_pages", counting)
    assert core.handle(rc.Receipt("s", 0, "q/rank0")) == []
    assert reads == []
    (free,) = core.handle(rc.Receipt("s", 0, "q"))
    assert isinstance(free, rc.Free) and sorted(free.pages) == list(range(16))
    assert reads == ["s"]


def test_reading_pages_during_a_fence_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Seeded bug: RECLAIM without its early exit (it always scans); the test above must fail."""
    from retire_core import reclaim as reclaim_module

    monkeypatch.setattr(reclaim_module, "_nothing_drained", lambda *_: False)
    with pytest.raises(AssertionError):
        test_a_receipt_before_the_last_reads_no_page(monkeypatch)


def test_lockstep_batches_are_checked_against_one_at_a_time() -> None:
    """``Lockstep.batch`` (what the Hypothesis machine's ``engine_step`` drives): a batch that
    equals its events one at a time goes through, a refused one leaves both sides as they were,
    and a ``handle_batch`` that loses an event is caught."""
    from retire_checks.lockstep import RefinementError
    from retire_checks.mutants import MUTANTS

    def started() -> Lockstep:
        ls = Lockstep(Universe.of(BOUNDS))
        ls.env(ActionInstance("open", (0, (1, 2), True)))
        ls.env(ActionInstance("launch", (0, 0, 0)))
        return ls

    step = [
        ActionInstance("allocate", (0, 0, 0)),
        ActionInstance("attempt_write", (0, 0, True)),
        ActionInstance("allocate", (1, 0, 1)),
    ]
    for logged in (True, False):
        ls = started()
        out = ls.batch(step, logged=logged)
        assert [t.action for t in out.transitions] == ["allocate", "write", "allocate"]
        assert sorted(ls.core.pages) == [0, 1]
        before = ls.snapshot()
        again = ls.batch([ActionInstance("attempt_write", (0, 0, True)), step[2]])
        assert again.transitions == () and again.commands == ()  # page 1 is in use: refused
        assert ls.core is before[0] and ls.spec is before[1]
    with MUTANTS["batch_loses_last_event"].active():
        for logged in (True, False):
            with pytest.raises(RefinementError, match="not the same as one at a time"):
                started().batch(step, logged=logged)


def test_the_page_index_forgets_scopes_that_hold_no_page() -> None:
    """Scopes come and go on a server for hours: once a scope's pages are freed and the scope is
    forgotten, nothing of it is left in the page index (which each step copies), so the index
    is as long as the scopes that own pages now, not every scope that ever did."""
    core = rc.Retire(logger=ListLogger())
    for i in range(50):
        scope, q = f"s{i}", f"q{i}"
        core.handle_batch(
            [
                rc.Submit(scope, "t", "f", (i,)),
                rc.ParticipantStarted(scope, 0, q),
                rc.PageAllocated(scope, 0, q, i % 7, 0),
                rc.WriteAttempted(scope, 0, q, i % 7, True),
                rc.WriterClosed(i % 7, f"d{i}"),
            ]
        )
        commands = core.handle_batch([rc.Cancel(scope), rc.Receipt(scope, 0, q)])
        assert any(isinstance(c, rc.Free) for c in commands)
        core.handle(rc.Forget(scope))
        index = core.state.page_index
        assert index is not None and index[0] is core.state.pages
        assert len(core.state.pages) == 0 and index[1] == {} and index[2] == {}
    assert len(core.state.scopes) == 0
