"""What a refusal says: ``table.refusal`` for every illegal (state, event) pair names the event
(and the scope, where the state does not explain it) and the reason, with the right error type.
Mutation testing found these texts unchecked: a refusal saying ``None names scope ...`` passed
every other test."""

from __future__ import annotations

import pytest

import retire_core as rc
from retire_core.events import SCOPE_EVENTS
from retire_core.state import ScopeState
from retire_core.table import TABLE, refusal

A, L, P, C = ScopeState.ACTIVE, ScopeState.ALIGNING, ScopeState.PAUSED, ScopeState.CANCELLED
F = ScopeState.FINISHED

ILLEGAL = [
    (state, event)
    for state in (None, *ScopeState)
    for event in SCOPE_EVENTS
    if (state, event) not in TABLE
]


def test_every_illegal_pair_is_refused_with_a_message_naming_it() -> None:
    assert len(ILLEGAL) > 10
    for state, event in ILLEGAL:
        err = refusal(state, event, "agent-7")
        text = str(err)
        if event is rc.Submit and state is not None:
            assert isinstance(err, rc.ScopeExistsError)
            assert text == "scope 'agent-7' was already submitted"
            continue
        assert event.__name__ in text, (state, event, text)
        if state is None:
            assert isinstance(err, rc.UnknownScopeError)
            assert event.__name__ + " names scope 'agent-7', which was never submitted" in text
        elif state is C:
            assert isinstance(err, rc.ScopeCancelledError)
            assert text == f"{event.__name__}: scope 'agent-7' is cancelled and has no successor"
        else:
            assert isinstance(err, rc.IllegalTransitionError)
            assert text.startswith(f"{event.__name__} is not accepted in state {state.value}: ")


@pytest.mark.parametrize(
    ("state", "event", "why"),
    [
        (L, rc.Pause, "a revision is in progress; pause after its successor is admitted"),
        (P, rc.Pause, "the scope is already paused"),
        (A, rc.Unpause, "the scope is not paused"),
        (L, rc.Unpause, "the scope is not paused"),
        (F, rc.Pause, "the scope's version has finished: nothing runs that could be paused"),
        (F, rc.Unpause, "the scope is not paused"),
        (A, rc.Forget, "only a cancelled scope is forgotten"),
        (F, rc.Forget, "only a cancelled scope is forgotten"),
    ],
)
def test_illegal_transitions_say_why(state: ScopeState, event: type, why: str) -> None:
    err = refusal(state, event, "s")
    assert isinstance(err, rc.IllegalTransitionError)
    assert (err.state, err.event) == (state.value, event.__name__)
    assert str(err) == f"{event.__name__} is not accepted in state {state.value}: {why}"


def test_a_refusal_without_a_listed_reason_says_so() -> None:
    # No illegal pair of today's table lacks a reason; one the table would gain gets this text.
    err = refusal(ScopeState.ALIGNING, rc.Cancel, "s")
    assert str(err) == "Cancel is not accepted in state aligning: not a legal transition"
