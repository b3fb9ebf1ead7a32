"""The transition table, enumerated: every scope state times every scope event kind."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

import retire_core as rc
from retire_core.events import SCOPE_EVENTS
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
    for (state, kind), handler in TABLE.items():
        assert state in STATES.values()
        assert kind in SCOPE_EVENTS
        assert handler.startswith("on_")
    assert len(CASES) == len(STATES) * len(SCOPE_EVENTS) == 78


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
            rc.Forget,  # a cancelled scope whose participant has not delivered its receipt
        )
        return
    assert legal, f"{kind.__name__} was accepted in state {state_name}"
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
