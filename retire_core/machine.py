"""The state machine: ``step(state, event)`` and its per-event handlers.

``step`` is a pure function: it looks the (scope state, event type) pair up in ``table.TABLE``,
runs the handler on a ``Txn``, and returns the new ``CoreState`` with the commands for the engine
and the transitions taken. Any ``RetireError`` raised on the way leaves the input state as it
was (the ``Txn`` is thrown away). Handlers implement ADVANCE, FENCE, launches, receipts, frames,
page events and reports; they call ``gates`` for the two gates, ``handoff`` for ALIGN/RESUME and
``reclaim`` for RECLAIM, and classify late events of retired versions instead of failing on them.
``step_many`` / ``run_batch`` feed several events through one ``Txn``. The hot handlers (frames,
write checks, allocations) spell out what ``txn.emit``/``txn.record`` would do; events that
``TABLE`` accepts in every state of a submitted scope are dispatched without the table lookup
(the mapping is read off ``TABLE`` at import, and handlers are still looked up by name in
``_SCOPE_HANDLERS`` on every event).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from retire_core import handoff, reclaim
from retire_core.commands import Admit, AllowWrite, Command, Drop, Fence, FenceWrite, Publish
from retire_core.errors import (
    DoubleFreeError,
    DuplicateParticipantError,
    DuplicateReceiptError,
    FutureVersionError,
    IllegalTransitionError,
    PageInUseError,
    UnknownPageError,
    UnknownParticipantError,
)
from retire_core.events import (
    SCOPE_EVENTS,
    AdoptionReport,
    Cancel,
    Event,
    Forget,
    FrameArrived,
    PageAllocated,
    PageEvicted,
    PageReused,
    ParticipantStarted,
    Pause,
    Receipt,
    Submit,
    Supersede,
    Unpause,
    VersionFinished,
    WriteAttempted,
    WriterClosed,
)
from retire_core.gates import publication_gate, write_gate
from retire_core.ids import ScopeId, Version
from retire_core.ledger import classify_late
from retire_core.reasons import DropReason, FenceReason, UnpinReason
from retire_core.state import (
    CoreState,
    PageRecord,
    ParticipantRecord,
    ScopeRecord,
    ScopeState,
    evolve,
)
from retire_core.table import TABLE, refusal
from retire_core.transitions import Stage, Transition
from retire_core.txn import Txn


class Step(NamedTuple):
    state: CoreState
    commands: tuple[Command, ...]
    transitions: tuple[Transition, ...]


_tuple_new = tuple.__new__
# Enum members read through the class cost an attribute lookup on the enum type each time.
_PUBLISH_STAGE, _RUN_STAGE, _FENCE_STAGE = Stage.PUBLISH, Stage.RUN, Stage.FENCE

# ``AllowWrite`` is immutable and the same (page, participant) pair is allowed over and over
# (every write of a block being filled): hand out one instance per pair (bounded).
_ALLOW_WRITE: dict[tuple[int, str], AllowWrite] = {}
_ALLOW_WRITE_MAX = 1 << 14


# ``Publish(frame, scope, version, kind)`` without the attrs ``__init__`` (no validators, no
# hooks: the same frozen instance, field by field through the slots' own setters). One per
# frame of the current version: the core's most frequent command.
_new_object = object.__new__
_SET_FRAME, _SET_SCOPE, _SET_VERSION, _SET_KIND = (
    Publish.__dict__[name].__set__ for name in ("frame", "scope", "version", "kind")
)


def _allow_write(page: int, participant: str) -> AllowWrite:
    key = (page, participant)
    command = _ALLOW_WRITE.get(key)
    if command is None:
        if len(_ALLOW_WRITE) >= _ALLOW_WRITE_MAX:
            _ALLOW_WRITE.clear()
        command = _ALLOW_WRITE[key] = AllowWrite(page, participant)
    return command


def _no_future(rec: ScopeRecord, scope: ScopeId, version: Version, what: str) -> None:
    if version > rec.epoch:
        raise FutureVersionError(
            f"{what} for {scope}@{version}, but the current version is {rec.epoch}"
        )


def _set_participant(txn: Txn, scope: ScopeId, q: str, record: ParticipantRecord) -> None:
    rec = txn.scopes[scope]
    txn.scopes[scope] = evolve(rec, participants=rec.participants.set(q, record))


# --- user requests ----------------------------------------------------------------------


def on_submit(txn: Txn, ev: Submit) -> None:
    txn.scopes[ev.scope] = ScopeRecord(
        tenant=ev.tenant,
        fingerprint=ev.fingerprint,
        state=ScopeState.ACTIVE,
        epoch=0,
        admitted=True,
        context=ev.context,
        contract=ev.contract,
    )
    txn.emit(Admit(ev.scope, 0, 0, cold=True))
    txn.record(
        "open",
        Stage.SUBMIT,
        ev.scope,
        0,
        changed={"state": ScopeState.ACTIVE, "admitted": True},
        tenant=ev.tenant,
        fingerprint=ev.fingerprint,
        context=ev.context,
        reuse=ev.contract.allows_reuse,
    )


def on_supersede(txn: Txn, ev: Supersede) -> None:
    rec = txn.scopes[ev.scope]
    old = rec.epoch
    handoff.release_certificate(txn, ev.scope, UnpinReason.SUPERSEDED_BEFORE_ADOPTION)
    rec = txn.scopes[ev.scope]
    txn.scopes[ev.scope] = evolve(
        rec,
        state=ScopeState.ALIGNING,
        epoch=old + 1,
        admitted=False,
        context=ev.context,
        contract=ev.contract,
    )
    txn.record(
        "supersede",
        Stage.ADVANCE,
        ev.scope,
        old + 1,
        changed={"epoch": old + 1, "state": ScopeState.ALIGNING, "admitted": False},
        previous=old,
        context=ev.context,
        reuse=ev.contract.allows_reuse,
    )
    _fence_running(txn, ev.scope, below=old + 1)
    handoff.certify_prefix(txn, ev.scope)
    reclaim.reclaim(txn, ev.scope)


def _fence_running(txn: Txn, scope: ScopeId, below: Version) -> None:
    """FENCE: ask the engine to stop every running participant of versions older than ``below``."""
    rec = txn.scopes[scope]
    for v in sorted({r.version for r in rec.participants.values() if r.version < below}):
        running = rec.running(v)
        if running:
            txn.emit(Fence(scope, v, running))
            txn.record("fence", Stage.FENCE, scope, v, participants=running)


def on_pause(txn: Txn, ev: Pause) -> None:
    rec = txn.scopes[ev.scope]
    txn.scopes[ev.scope] = evolve(rec, state=ScopeState.PAUSED)
    txn.record("pause", Stage.CONTROL, ev.scope, rec.epoch, changed={"state": ScopeState.PAUSED})


def on_unpause(txn: Txn, ev: Unpause) -> None:
    rec = txn.scopes[ev.scope]
    txn.scopes[ev.scope] = evolve(rec, state=ScopeState.ACTIVE)
    txn.record("unpause", Stage.CONTROL, ev.scope, rec.epoch, changed={"state": ScopeState.ACTIVE})


def on_cancel(txn: Txn, ev: Cancel) -> None:
    handoff.release_certificate(txn, ev.scope, UnpinReason.CANCELLED)
    rec = txn.scopes[ev.scope]
    txn.scopes[ev.scope] = evolve(rec, state=ScopeState.CANCELLED, admitted=False)
    txn.record(
        "cancel",
        Stage.ADVANCE,
        ev.scope,
        rec.epoch,
        changed={"state": ScopeState.CANCELLED, "admitted": False},
    )
    _fence_running(txn, ev.scope, below=rec.epoch + 1)
    reclaim.reclaim(txn, ev.scope)


def on_version_finished(txn: Txn, ev: VersionFinished) -> None:
    """The current version ran to its end: it loses authority (nothing of it publishes any
    more), anything of it still running is fenced, and RECLAIM gives its pages back once its
    receipts are in. A report for a version that no longer holds authority (superseded,
    cancelled, already finished: a late or repeated report) changes nothing."""
    rec = txn.scopes[ev.scope]
    _no_future(rec, ev.scope, ev.version, "VersionFinished")
    if not rec.has_authority(ev.version):
        if ev.version == rec.epoch and rec.state is ScopeState.ALIGNING:
            raise IllegalTransitionError(
                rec.state.value, "VersionFinished", f"version {ev.version} was never admitted"
            )
        why = classify_late(txn, ev.scope, ev.version)
        txn.record("late_finish", Stage.RECLAIM, ev.scope, ev.version, reason=why)
        return
    txn.scopes[ev.scope] = evolve(rec, state=ScopeState.FINISHED)
    txn.record("finish", Stage.RECLAIM, ev.scope, rec.epoch, changed={"state": ScopeState.FINISHED})
    _fence_running(txn, ev.scope, below=rec.epoch + 1)
    reclaim.reclaim(txn, ev.scope)


def on_forget(txn: Txn, ev: Forget) -> None:
    """Drop a cancelled scope that has nothing left: its record and its versions in the ledger
    (the id may open a new scope later, at version 0)."""
    rec = txn.scopes[ev.scope]
    running = [q for q, r in rec.participants.items() if not r.closed]
    pages = len(txn.owned_pages(ev.scope))
    if running or pages:
        raise IllegalTransitionError(
            rec.state.value,
            "Forget",
            f"scope {ev.scope!r} still has {len(running)} participants running and {pages} pages",
        )
    del txn.scopes[ev.scope]
    ledger = txn.ledger
    ledger[:] = [entry for entry in ledger if entry[0] != ev.scope]
    txn.record("forget", Stage.CONTROL, ev.scope, rec.epoch, changed={"state": None})


# --- engine observations ---------------------------------------------------------------------


def on_participant_started(txn: Txn, ev: ParticipantStarted) -> None:
    rec = txn.scopes[ev.scope]
    _no_future(rec, ev.scope, ev.version, "ParticipantStarted")
    if ev.participant in rec.participants:
        raise DuplicateParticipantError(
            f"participant {ev.participant!r} of {ev.scope} already started"
        )
    current = ev.version == rec.epoch
    if current and rec.state is ScopeState.ALIGNING:
        raise IllegalTransitionError(
            rec.state.value, "ParticipantStarted", f"version {ev.version} is not admitted yet"
        )
    # Classify before registering: the new participant itself must not make its version look
    # like one that is still draining.
    late = None if rec.has_authority(ev.version) else classify_late(txn, ev.scope, ev.version)
    _set_participant(txn, ev.scope, ev.participant, ParticipantRecord(ev.version))
    txn.record("launch", Stage.RUN, ev.scope, ev.version, participant=ev.participant)
    if late is not None:
        # A launch that raced a revision or a cancel: it starts fenced.
        txn.emit(Fence(ev.scope, ev.version, (ev.participant,)))
        txn.record(
            "fence",
            Stage.FENCE,
            ev.scope,
            ev.version,
            reason=late,
            participants=(ev.participant,),
        )


def on_receipt(txn: Txn, ev: Receipt) -> None:
    rec = txn.scopes[ev.scope]
    _no_future(rec, ev.scope, ev.version, "Receipt")
    part = rec.participants.get(ev.participant)
    if part is None:
        if (ev.scope, ev.version) in txn.ledger:
            raise DuplicateReceiptError(
                f"{ev.participant!r} of {ev.scope}@{ev.version}: that version already drained"
            )
        raise UnknownParticipantError(f"{ev.participant!r} never started in {ev.scope}")
    if part.version != ev.version:
        raise UnknownParticipantError(
            f"{ev.participant!r} started under version {part.version}, not {ev.version}"
        )
    if part.closed:
        raise DuplicateReceiptError(f"{ev.participant!r} of {ev.scope}@{ev.version} already closed")
    _set_participant(txn, ev.scope, ev.participant, ParticipantRecord(ev.version, closed=True))
    txn.record(
        "receipt",
        Stage.FENCE,
        ev.scope,
        ev.version,
        changed={"closed": True},
        participant=ev.participant,
    )
    handoff.certify_prefix(txn, ev.scope)
    reclaim.reclaim(txn, ev.scope)


def on_frame(txn: Txn, ev: FrameArrived) -> None:
    scope, version, kind = ev.scope, ev.version, ev.kind
    rec = txn.rscopes[scope]
    if version > rec.epoch:
        _no_future(rec, scope, version, "FrameArrived")
    publish, reason = publication_gate(rec, version, kind)
    if publish:
        # The hottest path of all (every frame of the current version): ``txn.emit`` and
        # ``txn.record("publish", ..., frame=..., kind=...)`` spelled out.
        frame = ev.frame
        command = _new_object(Publish)  # Publish(frame, scope, version, kind), spelled out
        _SET_FRAME(command, frame)
        _SET_SCOPE(command, scope)
        _SET_VERSION(command, version)
        _SET_KIND(command, kind)
        txn.commands.append(command)
        txn.transitions.append(
            _tuple_new(
                Transition,
                (
                    "publish",
                    _PUBLISH_STAGE,
                    scope,
                    version,
                    (("frame", frame), ("kind", kind)),
                    (),
                    None,
                ),
            )
        )
        return
    why = classify_late(txn, scope, version) if reason == DropReason.RETIRED_VERSION else reason
    assert why is not None
    txn.emit(Drop(ev.frame, scope, version, kind, why))
    txn.record("drop", Stage.PUBLISH, scope, version, reason=why, frame=ev.frame, kind=kind)


def _running_participant(txn: Txn, scope: ScopeId, version: Version, q: str, what: str) -> None:
    part = txn.read_scope(scope).participants.get(q)
    if part is None or part.version != version:
        raise UnknownParticipantError(f"{what}: {q!r} is not a participant of {scope}@{version}")
    if part.closed:
        raise IllegalTransitionError(
            "closed", what, f"participant {q!r} of {scope}@{version} has already closed"
        )


def on_page_allocated(txn: Txn, ev: PageAllocated) -> None:
    scope, version, q, p, position = ev.scope, ev.version, ev.participant, ev.page, ev.position
    rec = txn.rscopes[scope]  # read only: the scope record does not change
    if version > rec.epoch:
        _no_future(rec, scope, version, "PageAllocated")
    part = rec.participants._d.get(q)
    if part is None or part.version != version or part.closed:
        _running_participant(txn, scope, version, q, "PageAllocated")  # raises
    owner = txn.rpages.get(p)
    if owner is not None:
        raise PageInUseError(f"page {p} is still allocated to {owner.owner}@{owner.version}")
    authority = rec.has_authority(version) and rec.admitted
    prefix = rec.context[position] if authority and position < len(rec.context) else None
    generations = txn.generations
    generation = generations.get(p, 0) + 1
    generations[p] = generation
    txn.pages[p] = PageRecord(scope, version, q, generation, position, prefix, rec.fingerprint)
    # ``txn.record("allocate", ..., changed={"generation": ...}, page=..., participant=...,
    # position=..., inheritable=...)`` spelled out
    txn.transitions.append(
        _tuple_new(
            Transition,
            (
                "allocate",
                _RUN_STAGE,
                scope,
                version,
                (
                    ("page", p),
                    ("participant", q),
                    ("position", position),
                    ("inheritable", prefix is not None),
                ),
                (("generation", generation),),
                None,
            ),
        )
    )


def on_write(txn: Txn, ev: WriteAttempted) -> None:
    scope, version, q, p = ev.scope, ev.version, ev.participant, ev.page
    rec = txn.rscopes[scope]
    if version > rec.epoch:
        _no_future(rec, scope, version, "WriteAttempted")
    part = rec.participants._d.get(q)
    if part is None or part.version != version or part.closed:
        _running_participant(txn, scope, version, q, "WriteAttempted")  # raises
    page = txn.rpages.get(p)
    allowed, reason = write_gate(page, scope, version, q)
    completes = ev.completes
    if not allowed or page is None:
        txn.emit(FenceWrite(p, q, reason or FenceReason.PAGE_NOT_ALLOCATED))
        txn.record(
            "fence_write",
            Stage.FENCE,
            scope,
            version,
            reason=reason,
            page=p,
            participant=q,
            completes=completes,
        )
        return
    if page.full != completes:  # else the record would not change: leave the map alone
        txn.pages[p] = PageRecord(  # evolve(page, full=completes), spelled out
            page.owner,
            page.version,
            page.participant,
            page.generation,
            page.position,
            page.prefix,
            page.fingerprint,
            page.writer_open,
            completes,
            page.digest,
            page.held,
            page.pinned,
        )
    # ``txn.emit(AllowWrite(...))`` and ``txn.record("write", ..., changed={"full": ...},
    # page=..., participant=..., completes=...)`` spelled out.
    txn.commands.append(_allow_write(p, q))
    txn.transitions.append(
        _tuple_new(
            Transition,
            (
                "write",
                _RUN_STAGE,
                scope,
                version,
                (("page", p), ("participant", q), ("completes", completes)),
                (("full", completes),),
                None,
            ),
        )
    )


def on_adoption_report(txn: Txn, ev: AdoptionReport) -> None:
    rec = txn.scopes[ev.scope]
    _no_future(rec, ev.scope, ev.version, "AdoptionReport")
    if ev.version < rec.epoch or rec.state is ScopeState.CANCELLED:
        # The byte check of a successor that was itself superseded or cancelled: nothing to do,
        # its pins were already released by the revision that retired it.
        txn.record(
            "late_report",
            Stage.RESUME,
            ev.scope,
            ev.version,
            reason=classify_late(txn, ev.scope, ev.version),
        )
        return
    if rec.certificate is None:
        raise IllegalTransitionError(
            rec.state.value, "AdoptionReport", f"no certificate is pending for {ev.scope}"
        )
    handoff.verify_adoption(txn, ev)
    reclaim.reclaim(txn, ev.scope)


def _tracked_page(txn: Txn, page: int, what: str) -> PageRecord:
    record = txn.pages.get(page)
    if record is not None:
        return record
    if page in txn.generations:
        raise DoubleFreeError(f"{what} for page {page}, which was already freed")
    raise UnknownPageError(f"{what} for page {page}, which was never allocated")


def on_writer_closed(txn: Txn, ev: WriterClosed) -> None:
    p, digest = ev.page, ev.digest
    pages = txn.pages
    page = pages.get(p)
    if page is None:
        _tracked_page(txn, p, "WriterClosed")  # raises
        return
    if not page.writer_open:
        raise IllegalTransitionError("writer_closed", "WriterClosed", f"page {p} is already closed")
    owner, version, full = page.owner, page.version, page.full
    pages[p] = PageRecord(  # evolve(page, writer_open=False, digest=digest), spelled out
        owner,
        version,
        page.participant,
        page.generation,
        page.position,
        page.prefix,
        page.fingerprint,
        False,
        full,
        digest,
        page.held,
        page.pinned,
    )
    # ``txn.record("close_writer", ..., changed={"writer_open": False}, page=..., full=...,
    # digest=...)`` spelled out
    txn.transitions.append(
        _tuple_new(
            Transition,
            (
                "close_writer",
                _FENCE_STAGE,
                owner,
                version,
                (("page", p), ("full", full), ("digest", digest)),
                (("writer_open", False),),
                None,
            ),
        )
    )
    handoff.certify_prefix(txn, owner)
    reclaim.reclaim(txn, owner)


def on_page_reused(txn: Txn, ev: PageReused) -> None:
    page = _tracked_page(txn, ev.page, "PageReused")
    if page.held or page.writer_open or not page.full:
        raise PageInUseError(
            f"page {ev.page} is in use by {page.owner}@{page.version}; only a retained "
            "(completed, unreferenced) page can be recycled underneath the core"
        )
    generation = txn.generations.get(ev.page, 0) + 1
    txn.generations[ev.page] = generation
    txn.pages[ev.page] = evolve(page, generation=generation)
    txn.record(
        "reuse_id",
        Stage.RECLAIM,
        page.owner,
        page.version,
        changed={"generation": generation},
        page=ev.page,
    )


def on_page_evicted(txn: Txn, ev: PageEvicted) -> None:
    """The engine evicted a page the core gave back to its cache: the core forgets it (its
    generation stays, so an old reference to the block is recognised as gone)."""
    page = _tracked_page(txn, ev.page, "PageEvicted")
    if page.held or page.pinned:
        raise PageInUseError(
            f"page {ev.page} of {page.owner}@{page.version} is "
            f"{'referenced' if page.held else 'pinned for a successor'}; only a page given back "
            "to the cache can be evicted"
        )
    del txn.pages[ev.page]
    txn.record_page("evict", Stage.RECLAIM, page.owner, page.version, ev.page)
    reclaim.reclaim(txn, page.owner)


_SCOPE_HANDLERS: dict[str, Callable[[Txn, Any], None]] = {
    name: fn for name, fn in globals().items() if name.startswith("on_") and callable(fn)
}


_EVENT_TYPES = (*SCOPE_EVENTS, WriterClosed, PageReused, PageEvicted)


_SCOPE_EVENT_TYPES = frozenset(SCOPE_EVENTS)


def _legal_in_every_state() -> dict[type, str]:
    """Scope events that ``TABLE`` accepts in every state of a submitted scope, with their
    handler's name: for those the table lookup (keyed on an enum, whose hash is computed in
    Python every time) can be skipped once the scope is known to exist."""
    out: dict[type, str] = {}
    for cls in SCOPE_EVENTS:
        names = {TABLE.get((s, cls)) for s in ScopeState}
        if len(names) == 1 and None not in names and (None, cls) not in TABLE:
            out[cls] = names.pop()  # type: ignore[assignment]
    return out


_EVERY_STATE: dict[type, str] = _legal_in_every_state()


def _apply(txn: Txn, event: Event) -> None:
    """Dispatch one event on the (scope state, event type) table and run its handler."""
    cls = type(event)
    name = _EVERY_STATE.get(cls)
    if name is not None:  # the common case: legal in any state of a submitted scope
        scope: str = event.scope  # type: ignore[union-attr]
        if scope in txn.rscopes:
            _SCOPE_HANDLERS[name](txn, event)
            return
        raise refusal(None, cls, scope)
    if cls in _SCOPE_EVENT_TYPES:
        scope = event.scope  # type: ignore[union-attr]
        rec = txn.scope_record(scope)
        key = (rec.state if rec is not None else None, cls)
        handler = TABLE.get(key)
        if handler is None:
            raise refusal(key[0], cls, scope)
        _SCOPE_HANDLERS[handler](txn, event)
        return
    if cls is WriterClosed:
        on_writer_closed(txn, event)  # type: ignore[arg-type]
        return
    if not isinstance(event, _EVENT_TYPES):
        raise TypeError(f"not a Retire event: {event!r}")
    if not isinstance(event, WriterClosed | PageReused | PageEvicted):
        rec = txn.scope_record(event.scope)
        key = (rec.state if rec is not None else None, cls)
        handler = TABLE.get(key)
        if handler is None:
            raise refusal(key[0], cls, event.scope)
        _SCOPE_HANDLERS[handler](txn, event)
    elif isinstance(event, WriterClosed):
        on_writer_closed(txn, event)
    elif isinstance(event, PageReused):
        on_page_reused(txn, event)
    else:
        on_page_evicted(txn, event)


def step(state: CoreState, event: Event) -> Step:
    """Feed one event; return the next state, the commands and the transitions taken."""
    txn = Txn(state)
    _apply(txn, event)
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
        every, handlers = _EVERY_STATE, _SCOPE_HANDLERS
        for event in events:
            # ``_apply``'s common case spelled out (the facade's frames and write checks)
            name = every.get(type(event))
            if name is not None and event.scope in txn.rscopes:  # type: ignore[union-attr]
                handlers[name](txn, event)
            else:
                _apply(txn, event)
            if trim or txn._ledger is not None:
                txn.trim_ledger()
        return txn
    transitions = txn.transitions
    before = 0
    for event in events:
        _apply(txn, event)
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


__all__ = ["BatchStep", "Step", "run_batch", "step", "step_many"]
