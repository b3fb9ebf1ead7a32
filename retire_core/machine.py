"""The state machine: ``step(state, event)``, ``step_many`` and the one dispatch behind them.

``step`` is a pure function: ``dispatch`` looks the (scope state, event type) pair up in
``table.TABLE``, runs the entry's handler (``handlers``) on a ``Txn`` and checks that the scope
ended in a state the entry allows; ``step`` returns the new ``CoreState`` with the commands for
the engine and the transitions taken. Any error raised on the way leaves the input state as it
was (the ``Txn`` is thrown away). ``step_many`` / ``run_batch`` feed several events through one
``Txn``, each through the same ``dispatch``; ``Retire.handle`` and ``Retire.handle_batch`` too.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from retire_core.commands import Command
from retire_core.errors import TableViolationError
from retire_core.events import PAGE_EVENTS, Event
from retire_core.handlers import _tracked_page
from retire_core.state import CoreState, ScopeRecord, ScopeState
from retire_core.table import EVENT_TYPES, TABLE, refusal
from retire_core.transitions import Transition
from retire_core.txn import Txn


class Step(NamedTuple):
    state: CoreState
    commands: tuple[Command, ...]
    transitions: tuple[Transition, ...]


_tuple_new = tuple.__new__
_PAGE_EVENTS = frozenset(PAGE_EVENTS)


def dispatch(txn: Txn, event: Event) -> None:
    """Run one event: look its (scope state, event type) pair up in ``TABLE`` (refused if it is
    not there), run the entry's handler, and refuse the step if the scope is left in a state
    the entry does not list. The scope is the event's, or for a page event the page's owner."""
    cls = type(event)
    steady = TABLE.steady.get(cls)
    if steady is not None:  # ``TABLE.steady``: legal in any state, which the handler keeps
        scope: str = event.scope  # type: ignore[union-attr]
        try:
            state = txn.rscopes[scope].state
        except KeyError:
            raise refusal(None, cls, scope) from None
        steady(txn, event)
        after = txn.rscopes.get(scope)
        if after is None or after.state is not state:
            raise _violation(state, cls, None if after is None else after.state, (state,))
        return
    row = TABLE.rows.get(cls)
    if row is None:
        cls = next((c for c in EVENT_TYPES if isinstance(event, c)), None)  # type: ignore[assignment]
        if cls is None:
            raise TypeError(f"not a Retire event: {event!r}")
        row = TABLE.rows.get(cls, {})
    if cls in _PAGE_EVENTS:
        p = event.page  # type: ignore[union-attr]
        page = txn.rpages.get(p)
        if page is None:
            page = _tracked_page(txn, p, cls.__name__)  # raises: an unknown or freed page
        scope = page.owner
    else:
        scope = event.scope  # type: ignore[union-attr]
    try:  # a subscript, not ``.get``: no method call on the hot path
        rec: ScopeRecord | None = txn.rscopes[scope]
    except KeyError:
        rec = None
    # ``_value_``: the member's value without the ``value`` property's descriptor call
    entry = row.get(None if rec is None else rec.state._value_)
    if entry is None:
        raise refusal(None if rec is None else rec.state, cls, scope)
    entry.handler(txn, event)
    try:
        moved = txn.rscopes[scope].state
    except KeyError:
        moved = None
    if moved not in entry.next:
        raise _violation(None if rec is None else rec.state, cls, moved, entry.next)


def _violation(
    state: ScopeState | None,
    cls: type,
    moved: ScopeState | None,
    allowed: tuple[ScopeState | None, ...],
) -> TableViolationError:
    def name(s: ScopeState | None) -> str:
        return "forgotten" if s is None else s.value

    return TableViolationError(
        "none" if state is None else state.value,
        cls.__name__,
        name(moved),
        tuple(name(s) for s in allowed),
    )


def step(state: CoreState, event: Event) -> Step:
    """Feed one event; return the next state, the commands and the transitions taken."""
    txn = Txn(state)
    dispatch(txn, event)
    return _tuple_new(Step, (txn.freeze(), tuple(txn.commands), tuple(txn.transitions)))


class BatchStep(NamedTuple):
    """What ``step_many`` did: the state after the last event, every command and transition in
    order, and how many of those transitions each event took (``counts[i]`` for ``events[i]``)."""

    state: CoreState
    commands: tuple[Command, ...]
    transitions: tuple[Transition, ...]
    counts: tuple[int, ...]


def run_batch(state: CoreState, events: Iterable[Event], counts: list[int] | None = None) -> Txn:
    """The work of ``step_many``, for ``Retire.handle_batch``: feed the events in order into one
    ``Txn`` and return it unfrozen (``counts``, when given, receives the number of transitions
    of each event). Raises (and the caller discards the ``Txn``) if any event does."""
    txn = Txn(state)
    # ``step`` bounds the ledger after every event: only a ledger the batch has touched (or a
    # hand-built state's over-long one) can need it.
    trim = len(state.ledger) > state.ledger_size
    if counts is None:
        for event in events:
            dispatch(txn, event)
            if trim or txn._ledger is not None:
                txn.trim_ledger()
        return txn
    transitions = txn.transitions
    before = 0
    for event in events:
        dispatch(txn, event)
        if trim or txn._ledger is not None:
            txn.trim_ledger()
        after = len(transitions)
        counts.append(after - before)
        before = after
    return txn


def step_many(state: CoreState, events: Iterable[Event]) -> BatchStep:
    """Feed several events in order, exactly as ``step`` one after the other would (same final
    state, commands, transitions), building one ``Txn`` for all of them. If any event raises,
    the error propagates and nothing of the batch takes effect (``state`` is untouched)."""
    counts: list[int] = []
    txn = run_batch(state, events, counts)
    return _tuple_new(
        BatchStep,
        (txn.freeze(), tuple(txn.commands), tuple(txn.transitions), tuple(counts)),
    )


__all__ = ["BatchStep", "Step", "dispatch", "run_batch", "step", "step_many"]
