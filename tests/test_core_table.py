"""The transition table, enumerated: every scope state times every event kind, each legal step
ending in a next state its entry allows, and a handler that leaves them refused."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

import retire_core as rc
from retire_core import handlers, table
from retire_core.events import PAGE_EVENTS, SCOPE_EVENTS
from retire_core.table import TABLE
from retire_spec.actions import ActionInstance as A
from tests.helpers import UNI, lockstep_at

STATES: dict[str, rc.ScopeState | None] = {
    "unopened": None,
    "active": rc.ScopeState.ACTIVE,
    "aligning": rc.ScopeState.ALIGNING,
    "paused": rc.ScopeState.PAUSED,
    "cancelled": rc.ScopeState.CANCELLED,
    "finished": rc.ScopeState.FINISHED,
}


def _event(kind: type, state: rc.CoreState) -> Any:
    """A representative event of ``kind`` for scope s0 that is well-formed for ``state``."""
    rec = state.scopes.get("s0")
    epoch = rec.epoch if rec is not None else 0
    running = [q for q, r in rec.participants.items() if not r.closed] if rec else []
    makers: dict[type, Callable[[], Any]] = {
        rc.Submit: lambda: rc.Submit("s0", "t0", "0", (1, 2)),
        rc.Supersede: lambda: rc.Supersede("s0", (4, 5)),
        rc.Pause: lambda: rc.Pause("s0"),
        rc.Unpause: lambda: rc.Unpause("s0"),
        rc.Cancel: lambda: rc.Cancel("s0"),
        rc.Forget: lambda: rc.Forget("s0"),
        # A late launch (older version) where one exists, else a launch of the current version.
        rc.ParticipantStarted: lambda: rc.ParticipantStarted("s0", max(epoch - 1, 0), "q3"),
        rc.Receipt: lambda: (
            rc.Receipt("s0", rec.participants[running[0]].version, running[0])
            if running
            else rc.Receipt("s0", epoch, "q3")
        ),
        rc.FrameArrived: lambda: rc.FrameArrived(
            "s0", rec.participants[running[0]].version if running else epoch, 0, rc.FrameKind.TOKEN
        ),
        rc.PageAllocated: lambda: (
            rc.PageAllocated("s0", rec.participants[running[0]].version, running[0], 3, 1)
            if running
            else rc.PageAllocated("s0", epoch, "q3", 3, 1)
        ),
        rc.WriteAttempted: lambda: (
            rc.WriteAttempted("s0", rec.participants[running[0]].version, running[0], 2)
            if running
            else rc.WriteAttempted("s0", epoch, "q3", 2)
        ),
        rc.VersionFinished: lambda: rc.VersionFinished("s0", epoch),
        rc.VersionPreempted: lambda: rc.VersionPreempted("s0", epoch),
        rc.AdoptionReport: lambda: rc.AdoptionReport(
            "s0",
            epoch,
            tuple(
                rc.PageDigest(p, "1")
                for p in (rec.certificate.pages if rec is not None and rec.certificate else ())
            ),
        ),
    }
    return makers[kind]()


CASES = list(itertools.product(STATES, SCOPE_EVENTS))


def test_table_covers_every_pair_it_names() -> None:
    states = (None, *rc.ScopeState)
    for (state, kind), entry in TABLE.items():
        assert state in STATES.values()
        assert kind in SCOPE_EVENTS or kind in PAGE_EVENTS
        assert entry.handler is getattr(handlers, entry.handler.__name__)
        assert entry.handler.__name__.startswith("on_")
        assert entry.next and len(set(entry.next)) == len(entry.next)
        assert all(s in states for s in entry.next)
    # a page event is keyed on its page's owner: legal in every state of a submitted scope
    for kind in PAGE_EVENTS:
        assert {s for s, k in TABLE if k is kind} == set(rc.ScopeState)
    assert len(CASES) == len(STATES) * len(SCOPE_EVENTS) == 84


def test_the_next_states_are_the_moves_the_handlers_make() -> None:
    """Where a scope can go: ALIGN completes on the revision itself, a receipt, a writer
    closing and the byte check; only a cancelled scope is forgotten."""
    moves = {
        (state, kind, target)
        for (state, kind), entry in TABLE.items()
        for target in entry.next
        if target is not state
    }
    A, L, P, C, F = (
        rc.ScopeState.ACTIVE,
        rc.ScopeState.ALIGNING,
        rc.ScopeState.PAUSED,
        rc.ScopeState.CANCELLED,
        rc.ScopeState.FINISHED,
    )
    assert moves == {
        (None, rc.Submit, A),
        *((s, rc.Supersede, t) for s in (A, L, P, F) for t in (L, A) if t is not s),
        *((s, rc.Cancel, C) for s in (A, L, P, F)),
        (A, rc.Pause, P),
        (P, rc.Unpause, A),
        (A, rc.VersionFinished, F),
        (P, rc.VersionFinished, F),
        (C, rc.Forget, None),
        (L, rc.Receipt, A),
        (L, rc.AdoptionReport, A),
        (L, rc.WriterClosed, A),
    }


def test_a_writer_closing_completes_align() -> None:
    """The exit the old docs-only table missed: the prefix waits for its last open writer, and
    too short a prefix for the contract then admits the successor cold."""
    state = rc.step_many(
        rc.CoreState(),
        [
            rc.Submit("s0", "t0", "0", (1, 2)),
            rc.ParticipantStarted("s0", 0, "q"),
            rc.PageAllocated("s0", 0, "q", 7, 0),
            rc.WriteAttempted("s0", 0, "q", 7, True),
            rc.Supersede("s0", (1, 5), rc.Contract(min_reuse_blocks=2)),
        ],
    ).state
    assert state.scopes["s0"].state is rc.ScopeState.ALIGNING
    result = rc.step(state, rc.WriterClosed(7, "d7"))
    assert result.state.scopes["s0"].state is rc.ScopeState.ACTIVE
    assert [t.action for t in result.transitions] == ["close_writer", "resume"]


@pytest.mark.parametrize(("state_name", "kind"), CASES, ids=[f"{s}-{k.__name__}" for s, k in CASES])
def test_every_state_event_pair(state_name: str, kind: type) -> None:
    ls = lockstep_at(state_name)
    if kind is rc.FrameArrived and state_name not in ("unopened", "finished"):
        ls.env(A("emit", (0, 0, 0)))  # the frame must be in a queue before it can arrive
    before = ls.core
    snapshot = hash(before), before
    event = _event(kind, before)
    legal = (STATES[state_name], kind) in TABLE
    try:
        result = rc.step(before, event)
    except rc.RetireError:
        # Illegal pairs always raise; some legal pairs raise for a narrower reason (a report
        # with no pending certificate, a participant the scope does not know). Either way the
        # input state is bit-for-bit unchanged.
        assert ls.core is before and (hash(before), before) == snapshot
        if not legal:
            return
        assert kind in (
            rc.AdoptionReport,
            rc.Receipt,
            rc.PageAllocated,
            rc.WriteAttempted,
            rc.ParticipantStarted,
            rc.VersionFinished,  # the current version of an aligning scope was never admitted
            rc.VersionPreempted,  # ... or its participants still run, or none ever started
            rc.Forget,  # a cancelled scope whose participant has not delivered its receipt
        )
        return
    assert legal, f"{kind.__name__} was accepted in state {state_name}"
    after = result.state.scopes.get("s0")
    assert (after.state if after else None) in TABLE[(STATES[state_name], kind)].next
    # A legal step must be a spec step: replay it through the lock-step harness.
    ls.feed(event, None)
    assert ls.core == result.state


@pytest.mark.parametrize("state_name", [s for s in STATES if s != "unopened"])
def test_illegal_pairs_raise_the_documented_errors(state_name: str) -> None:
    ls = lockstep_at(state_name)
    state = STATES[state_name]
    for kind in SCOPE_EVENTS:
        if (state, kind) in TABLE:
            continue
        with pytest.raises(rc.RetireError) as err:
            rc.step(ls.core, _event(kind, ls.core))
        if state is rc.ScopeState.CANCELLED and kind is not rc.Submit:
            assert isinstance(err.value, rc.ScopeCancelledError)
        elif kind is rc.Submit:
            assert isinstance(err.value, rc.ScopeExistsError)
        else:
            assert isinstance(err.value, rc.IllegalTransitionError)


def test_unopened_scope_accepts_only_submit() -> None:
    core = rc.CoreState()
    for kind in SCOPE_EVENTS:
        if kind is rc.Submit:
            continue
        with pytest.raises(rc.UnknownScopeError):
            rc.step(core, _event(kind, core))
    assert UNI.scopes[0] == "s0"


def test_a_forgotten_scope_is_unknown_and_its_id_opens_a_new_scope() -> None:
    ls = lockstep_at("cancelled")
    with pytest.raises(rc.IllegalTransitionError):  # its participant still runs
        rc.step(ls.core, rc.Forget("s0"))
    ls.env(A("receipt", (0,)))
    before = ls.core.ledger
    ls.env(A("forget", (0,)))  # the spec takes the same step (lock-step harness)
    assert "s0" not in ls.core.scopes and not any(s == "s0" for s, _ in ls.core.ledger)
    assert len(before) >= len(ls.core.ledger)
    with pytest.raises(rc.UnknownScopeError):
        rc.step(ls.core, rc.Cancel("s0"))
    ls.env(A("open", (0, (1, 3), True)))
    assert ls.core.scopes["s0"].epoch == 0 and ls.core.scopes["s0"].state is rc.ScopeState.ACTIVE


def _paused_anyway(txn: Any, ev: Any) -> None:
    handlers.on_frame(txn, ev)
    handlers.on_pause(txn, rc.Pause(ev.scope))  # a bug: a frame moves the scope


def test_a_handler_leaving_its_allowed_states_is_refused_and_changes_nothing() -> None:
    """A handler that moves its scope where its table entry does not allow raises a
    ``TableViolationError`` (a bug of the core, not bad input) and the step is discarded: in
    ``step``, ``step_many`` and both ``Retire`` paths, the batch all or nothing."""
    core = rc.Retire(state=lockstep_at("active").core)
    before = core.state
    frame = rc.FrameArrived("s0", 0, 0, rc.FrameKind.TOKEN)
    assert rc.step(before, frame).state.scopes["s0"].state is rc.ScopeState.ACTIVE
    key = (rc.ScopeState.ACTIVE, rc.FrameArrived)
    bad = {key: table.Entry(_paused_anyway, TABLE[key].next)}
    with TABLE.patched(bad):
        with pytest.raises(rc.TableViolationError) as err:
            rc.step(before, frame)
        assert str(err.value) == (
            "FrameArrived in state active left the scope paused; the table allows active"
        )
        assert not isinstance(err.value, rc.RetireError)
        with pytest.raises(rc.TableViolationError):
            rc.step_many(before, [rc.Pause("s0"), rc.Unpause("s0"), frame])
        with pytest.raises(rc.TableViolationError):
            core.handle(frame)
        with pytest.raises(rc.TableViolationError):
            core.handle_batch([rc.Pause("s0"), rc.Unpause("s0"), frame])
        assert core.state is before
    # the same handler, once the table allows the move, is taken as written
    allowed = table.Entry(_paused_anyway, (*TABLE[key].next, rc.ScopeState.PAUSED))
    with TABLE.patched({key: allowed}):
        assert rc.step(before, frame).state.scopes["s0"].state is rc.ScopeState.PAUSED
    assert TABLE[key].handler is handlers.on_frame  # restored


def _forgotten_anyway(txn: Any, ev: Any) -> None:
    handlers.on_frame(txn, ev)
    del txn.scopes[ev.scope]  # a bug: a frame drops its scope


@pytest.mark.parametrize(
    ("handler", "moved"), [(_paused_anyway, "paused"), (_forgotten_anyway, "forgotten")]
)
def test_a_steady_handler_leaving_its_state_is_refused(handler: Any, moved: str) -> None:
    """The same check on dispatch's fast path: an event legal in every state by one handler
    that keeps the state (``TABLE.steady``) is checked by one identity test. A steady handler
    that moves its scope, or drops it, raises ``TableViolationError`` there too, and the step,
    the batch and both ``Retire`` paths change nothing."""
    core = rc.Retire(state=lockstep_at("active").core)
    before = core.state
    frame = rc.FrameArrived("s0", 0, 0, rc.FrameKind.TOKEN)
    bad: dict[table.Key, table.Entry] = {
        (s, rc.FrameArrived): table.Entry(handler, (s,)) for s in rc.ScopeState
    }
    with TABLE.patched(bad):
        assert TABLE.steady[rc.FrameArrived] is handler  # still on the fast path
        with pytest.raises(rc.TableViolationError) as err:
            rc.step(before, frame)
        assert str(err.value) == (
            f"FrameArrived in state active left the scope {moved}; the table allows active"
        )
        with pytest.raises(rc.TableViolationError):
            rc.step_many(before, [rc.Pause("s0"), rc.Unpause("s0"), frame])
        with pytest.raises(rc.TableViolationError):
            core.handle(frame)
        with pytest.raises(rc.TableViolationError):
            core.handle_batch([rc.Pause("s0"), rc.Unpause("s0"), frame])
        assert core.state is before
    assert TABLE.steady[rc.FrameArrived] is handlers.on_frame  # restored
