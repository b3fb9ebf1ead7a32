"""The transition table: which events each scope state accepts, what handles them, and where
they may lead.

``TABLE[(state, event type)]`` is the ``Entry`` of every legal pair: the handler (in
``handlers``) and the states the scope may be in after it (``None``: the record is dropped, the
id is unknown again). ``None`` as the key's state stands for a scope that has not been submitted
yet. Events that name only a page (``DraftsVerified``, ``WriterClosed``, ``PageReused``,
``PageEvicted``, ``PageUnreferenced``) are keyed on
the state of the page's owner and are legal in every state of it. ``machine.dispatch`` is the
only reader that runs handlers: it looks the pair up, runs the entry's handler and refuses (as a
``TableViolationError``, discarding the step) a handler that leaves its scope in a state the
entry does not list. Any pair missing from ``TABLE`` is illegal and ``refusal`` builds the error
raised for it (the state is left untouched). Tests enumerate the full product of ``ScopeState``
(plus ``None``) and the event types; ``docs/protocol.md``'s state diagram is generated from this
table; mutants replace entries of it (``Table.patched``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import attrs

from retire_core import handlers as h
from retire_core.errors import (
    IllegalTransitionError,
    RetireError,
    ScopeCancelledError,
    ScopeExistsError,
    UnknownScopeError,
)
from retire_core.events import (
    PAGE_EVENTS,
    SCOPE_EVENTS,
    AdoptionReport,
    Cancel,
    DraftsVerified,
    Forget,
    FrameArrived,
    PageAllocated,
    PageEvicted,
    PageReused,
    PageUnreferenced,
    ParticipantStarted,
    Pause,
    Receipt,
    Submit,
    Supersede,
    Unpause,
    VersionFinished,
    VersionPreempted,
    WriteAttempted,
    WriterClosed,
)
from retire_core.state import ScopeState
from retire_core.txn import Txn

A, L, P, C = ScopeState.ACTIVE, ScopeState.ALIGNING, ScopeState.PAUSED, ScopeState.CANCELLED
F = ScopeState.FINISHED
LIVE = (A, L, P)
REVISABLE = (*LIVE, F)  # a finished scope can still be revised (cold) or cancelled
ALL = (A, L, P, C, F)

EVENT_TYPES = (*SCOPE_EVENTS, *PAGE_EVENTS)

Handler = Callable[[Txn, Any], None]
Key = tuple[ScopeState | None, type]


@attrs.frozen(slots=True)
class Entry:
    handler: Handler
    # A tuple, not a set: membership of an enum member in a short tuple is an identity check,
    # where a set would call ``Enum.__hash__`` (Python code) on every event.
    next: tuple[ScopeState | None, ...]


def _each(
    states: tuple[ScopeState, ...],
    event: type,
    handler: Handler,
    moves: Mapping[ScopeState, tuple[ScopeState | None, ...]] | None = None,
) -> dict[Key, Entry]:
    """``event`` handled by ``handler`` in each of ``states``: the scope stays where it was,
    or (``moves[state]``) may also go to the states listed."""
    moves = moves or {}
    return {(s, event): Entry(handler, (s, *moves.get(s, ()))) for s in states}


class Table(Mapping[Key, Entry]):
    """The table: a read-only mapping of (state, event type) to ``Entry``, and two indexes of
    it that ``machine.dispatch`` reads: ``rows``, the entries by event type and then by the
    state's value (``None``: not submitted), since a key holding an enum member is hashed by
    ``Enum.__hash__``, Python code, on every event, where a value string's hash is cached; and
    ``steady``. ``patched`` is the only way to change the table, and rebuilds both."""

    __slots__ = ("_entries", "rows", "steady")

    def __init__(self, entries: Mapping[Key, Entry]) -> None:
        self._set(dict(entries))

    def _set(self, entries: dict[Key, Entry]) -> None:
        self._entries = entries
        rows: dict[type, dict[str | None, Entry]] = {}
        for (state, event), entry in entries.items():
            rows.setdefault(event, {})[None if state is None else state.value] = entry
        self.rows = rows
        # Scope events legal in every state of a submitted scope, by one handler, that leave
        # the scope's state as it was (frames, write checks, allocations, launches): their
        # dispatch needs no lookup by state, and its check is one identity test.
        self.steady: dict[type, Handler] = {}
        for event, row in rows.items():
            handlers = {entry.handler for entry in row.values()}
            if (
                event in SCOPE_EVENTS
                and set(row) == {s.value for s in ScopeState}
                and len(handlers) == 1
                and all(entry.next == (ScopeState(v),) for v, entry in row.items())
            ):
                self.steady[event] = handlers.pop()

    def __getitem__(self, key: Key) -> Entry:
        return self._entries[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @contextlib.contextmanager
    def patched(self, entries: Mapping[Key, Entry]) -> Iterator[None]:
        """The table with ``entries`` in place of its own (mutants, tests), until the exit."""
        before = self._entries
        self._set({**before, **entries})
        try:
            yield
        finally:
            self._set(before)


# ALIGN completes (aligning -> active) wherever ``handoff.certify_prefix`` runs: on the
# revision itself (nothing to inherit), on a receipt or a writer closing (the last open page of
# the prefix), and on the byte check of the certificate (RESUME).
_ALIGNED = {L: (A,)}

TABLE = Table(
    {
        (None, Submit): Entry(h.on_submit, (A,)),
        **{(s, Supersede): Entry(h.on_supersede, (L, A)) for s in REVISABLE},
        (A, Pause): Entry(h.on_pause, (P,)),
        (P, Unpause): Entry(h.on_unpause, (A,)),
        **{(s, Cancel): Entry(h.on_cancel, (C,)) for s in REVISABLE},
        (C, Forget): Entry(h.on_forget, (None,)),
        **_each(ALL, ParticipantStarted, h.on_participant_started),
        **_each(ALL, Receipt, h.on_receipt, _ALIGNED),
        **_each(ALL, FrameArrived, h.on_frame),
        **_each(ALL, PageAllocated, h.on_page_allocated),
        **_each(ALL, WriteAttempted, h.on_write),
        **_each(ALL, DraftsVerified, h.on_drafts_verified),
        # a late report (a superseded or cancelled successor) is logged and changes nothing
        **_each(ALL, AdoptionReport, h.on_adoption_report, _ALIGNED),
        # every state: a late or repeated report of a version without authority is logged, not
        # refused; only the admitted current version of an active or paused scope finishes
        **_each(ALL, VersionFinished, h.on_version_finished, {A: (F,), P: (F,)}),
        # a preemption keeps the scope where it is; one of a version without authority is late
        **_each(ALL, VersionPreempted, h.on_version_preempted),
        **_each(ALL, WriterClosed, h.on_writer_closed, _ALIGNED),
        **_each(ALL, PageReused, h.on_page_reused),
        **_each(ALL, PageEvicted, h.on_page_evicted),
        # legal in every state: one of a version without authority is late (logged, no change)
        **_each(ALL, PageUnreferenced, h.on_page_unreferenced),
    }
)


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
