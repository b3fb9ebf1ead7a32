"""The transition table: which events each scope state accepts, and why the others are refused.

``TABLE[(state, event type)]`` names the handler of every legal pair; ``None`` stands for a scope
that has not been submitted yet. Any pair missing from ``TABLE`` is illegal and ``refusal`` builds
the error raised for it (the state is left untouched). ``NEXT_STATE`` gives the possible next
states where they differ from the current one (``WriterClosed`` can also complete ALIGN: aligning
-> active). Tests enumerate the full product of ``ScopeState`` (plus ``None``) and
``SCOPE_EVENTS``; ``docs/protocol.md``'s state diagram is generated from this table. Events that
name only a page (``WriterClosed``, ``PageReused``, ``PageEvicted``) are dispatched on the page's
owner and are legal in every state of it.
"""

from __future__ import annotations

from retire_core.errors import (
    IllegalTransitionError,
    RetireError,
    ScopeCancelledError,
    ScopeExistsError,
    UnknownScopeError,
)
from retire_core.events import (
    AdoptionReport,
    Cancel,
    Forget,
    FrameArrived,
    PageAllocated,
    ParticipantStarted,
    Pause,
    Receipt,
    Submit,
    Supersede,
    Unpause,
    VersionFinished,
    WriteAttempted,
)
from retire_core.state import ScopeState

A, L, P, C = ScopeState.ACTIVE, ScopeState.ALIGNING, ScopeState.PAUSED, ScopeState.CANCELLED
F = ScopeState.FINISHED
LIVE = (A, L, P)
REVISABLE = (*LIVE, F)  # a finished scope can still be revised (cold) or cancelled
ALL = (A, L, P, C, F)

# handler names; the handlers live in ``machine``.
TABLE: dict[tuple[ScopeState | None, type], str] = {
    (None, Submit): "on_submit",
    **{(s, Supersede): "on_supersede" for s in REVISABLE},
    (A, Pause): "on_pause",
    (P, Unpause): "on_unpause",
    **{(s, Cancel): "on_cancel" for s in REVISABLE},
    (C, Forget): "on_forget",
    **{(s, ParticipantStarted): "on_participant_started" for s in ALL},
    **{(s, Receipt): "on_receipt" for s in ALL},
    **{(s, FrameArrived): "on_frame" for s in ALL},
    **{(s, PageAllocated): "on_page_allocated" for s in ALL},
    **{(s, WriteAttempted): "on_write" for s in ALL},
    **{(s, AdoptionReport): "on_adoption_report" for s in ALL},
    # every state: a late or repeated report of a version without authority is logged, not
    # refused; only the admitted current version of an active or paused scope finishes
    **{(s, VersionFinished): "on_version_finished" for s in ALL},
}

# Where the next state of a legal pair can be read off the table alone (for the state diagram).
NEXT_STATE: dict[tuple[ScopeState | None, type], str] = {
    (None, Submit): "active",
    # A cold successor (or one with nothing to inherit) is admitted in the same step.
    **{(s, Supersede): "aligning | active" for s in REVISABLE},
    (A, Pause): "paused",
    (P, Unpause): "active",
    **{(s, Cancel): "cancelled" for s in REVISABLE},
    (L, AdoptionReport): "active",
    (A, VersionFinished): "finished",
    (P, VersionFinished): "finished",
    (C, Forget): "[*]",  # the record is dropped: the id is unknown again
}


def refusal(state: ScopeState | None, event: type, scope: str) -> RetireError:
    """The typed error for an illegal (state, event) pair."""
    name = event.__name__
    if state is None:
        return UnknownScopeError(f"{name} names scope {scope!r}, which was never submitted")
    if event is Submit:
        return ScopeExistsError(f"scope {scope!r} was already submitted")
    if state is C:
        return ScopeCancelledError(f"{name}: scope {scope!r} is cancelled and has no successor")
    if event is Forget:
        return IllegalTransitionError(state.value, name, "only a cancelled scope is forgotten")
    reasons: dict[tuple[ScopeState, type], str] = {
        (L, Pause): "a revision is in progress; pause after its successor is admitted",
        (P, Pause): "the scope is already paused",
        (A, Unpause): "the scope is not paused",
        (L, Unpause): "the scope is not paused",
        (F, Pause): "the scope's version has finished: nothing runs that could be paused",
        (F, Unpause): "the scope is not paused",
    }
    why = reasons.get((state, event), "not a legal transition")
    return IllegalTransitionError(state.value, name, why)
