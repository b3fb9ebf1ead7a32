"""The per-event handlers of the state machine: what each legal (state, event) pair does.

Each ``on_*`` handler runs on a ``Txn`` for an event that ``table.TABLE`` has already accepted
in the state of its scope, and ``machine`` checks afterwards that the scope is in one of the next
states the table entry allows. Handlers implement ADVANCE, FENCE, launches, receipts, frames,
page events and reports; they call ``gates`` for the two gates, ``handoff`` for ALIGN/RESUME and
``reclaim`` for RECLAIM, and classify late events of retired versions instead of failing on
them. They raise a ``RetireError`` for input that is wrong beyond its (state, event) pair.
"""

from __future__ import annotations

from retire_core import handoff, reclaim
from retire_core.commands import (
    Admit,
    AllowWrite,
    Drop,
    Fence,
    FenceWrite,
    Publish,
    ReleaseToCache,
)
from retire_core.errors import (
    ContractError,
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
from retire_core.gates import publication_gate, write_gate
from retire_core.ids import ScopeId, Version
from retire_core.ledger import classify_late
from retire_core.reasons import DropReason, FenceReason, UnpinReason
from retire_core.state import (
    PageRecord,
    ParticipantRecord,
    ScopeRecord,
    ScopeState,
    evolve,
)
from retire_core.transitions import Stage, transition
from retire_core.txn import Txn

# Enum members read through the class cost an attribute lookup on the enum type each time.
_PUBLISH_STAGE, _RUN_STAGE, _FENCE_STAGE = Stage.PUBLISH, Stage.RUN, Stage.FENCE

# ``AllowWrite`` is immutable and the same (page, participant) pair is allowed over and over
# (every write of a block being filled): hand out one instance per pair (bounded).
_ALLOW_WRITE: dict[tuple[int, str], AllowWrite] = {}
_ALLOW_WRITE_MAX = 1 << 14


# An inlined copy of ``Publish(frame, scope, version, kind)`` (attrs' ``__init__`` without its
# per-field ``object.__setattr__``: the same frozen instance, set through the slots' own
# setters), for the core's most frequent command. It pays: ``on_frame`` on a fresh ``Txn``
# took 1,320 ns with the constructor and 1,105 ns with this copy (best of 36 runs of 50,000
# frames, CPU time). ``transition`` is not inlined: that saved 30 ns, within the noise.
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


def _late_report(
    txn: Txn, rec: ScopeRecord, ev: VersionFinished | VersionPreempted, late: str
) -> bool:
    """Whether this report of a version's end or preemption concerns a version without
    authority (logged as ``late``, with the reason, and nothing else changes). Raises for a
    version from the future, and for the current version of an aligning scope: never admitted,
    it never ran."""
    name = type(ev).__name__
    _no_future(rec, ev.scope, ev.version, name)
    if rec.has_authority(ev.version):
        return False
    if ev.version == rec.epoch and rec.state is ScopeState.ALIGNING:
        raise IllegalTransitionError(
            rec.state.value, name, f"version {ev.version} was never admitted"
        )
    why = classify_late(txn, ev.scope, ev.version)
    txn.record(late, Stage.RECLAIM, ev.scope, ev.version, reason=why)
    return True


def on_version_finished(txn: Txn, ev: VersionFinished) -> None:
    """The current version ran to its end: it loses authority (nothing of it publishes any
    more), anything of it still running is fenced, and RECLAIM gives its pages back once its
    receipts are in. A report for a version that no longer holds authority (superseded,
    cancelled, already finished: a late or repeated report) changes nothing."""
    rec = txn.scopes[ev.scope]
    if _late_report(txn, rec, ev, "late_finish"):
        return
    txn.scopes[ev.scope] = evolve(rec, state=ScopeState.FINISHED)
    txn.record("finish", Stage.RECLAIM, ev.scope, rec.epoch, changed={"state": ScopeState.FINISHED})
    _fence_running(txn, ev.scope, below=rec.epoch + 1)
    reclaim.reclaim(txn, ev.scope)


def on_version_preempted(txn: Txn, ev: VersionPreempted) -> None:
    """The engine preempted the current version's work and dropped its references to the
    version's pages: they lose their execution reference and are freed (with those of them the
    engine's cache kept), the version keeps its authority and runs again as new participants.
    Legal once every participant of the version has delivered its receipt (at least one started)
    and every writer of its pages has closed: the engine vouches that nothing of it reads or
    writes them any more. A report for a version without authority changes nothing (late: its
    pages are reclaimed as usual)."""
    rec = txn.scopes[ev.scope]
    if _late_report(txn, rec, ev, "late_preempt"):
        return
    version = rec.epoch
    if not any(r.version == version for r in rec.participants.values()):
        raise IllegalTransitionError(
            rec.state.value, "VersionPreempted", f"version {version} has no participant"
        )
    running = rec.running(version)
    if running:
        raise IllegalTransitionError(
            rec.state.value,
            "VersionPreempted",
            f"participants {list(running)} of version {version} have delivered no receipt",
        )
    view = txn.rpages
    mine = [p for p in txn.owned_pages(ev.scope) if view[p].version == version and view[p].held]
    open_writers = sorted(p for p in mine if view[p].writer_open)
    if open_writers:
        raise IllegalTransitionError(
            rec.state.value,
            "VersionPreempted",
            f"pages {open_writers} of version {version} still have open writers",
        )
    for p in mine:
        txn.pages[p] = evolve(view[p], held=False)
    txn.record("preempt", Stage.RECLAIM, ev.scope, version, unheld=len(mine))
    # and the pages of it the engine's cache kept (a sliding window passed them): the version's
    # next run computes everything again, so no prefix of this run stays to be hit
    of_version = [p for p in txn.owned_pages(ev.scope) if view[p].version == version]
    reclaim.free_current(txn, ev.scope, version, of_version)
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
        frame = ev.frame
        command = _new_object(Publish)  # Publish(frame, scope, version, kind), see _SET_FRAME
        _SET_FRAME(command, frame)
        _SET_SCOPE(command, scope)
        _SET_VERSION(command, version)
        _SET_KIND(command, kind)
        txn.commands.append(command)
        txn.transitions.append(
            transition(
                "publish", _PUBLISH_STAGE, scope, version, (("frame", frame), ("kind", kind))
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
    group = ev.group
    if group >= len(rec.contract.kv_windows):
        raise ContractError(
            f"page {p} is in KV cache group {group}, but the contract of {scope} names "
            f"{len(rec.contract.kv_windows)} group(s)"
        )
    authority = rec.has_authority(version) and rec.admitted
    prefix = rec.context[position] if authority and position < len(rec.context) else None
    generations = txn.generations
    generation = generations.get(p, 0) + 1
    generations[p] = generation
    txn.pages[p] = PageRecord(
        scope, version, q, generation, position, prefix, rec.fingerprint, group=group
    )
    args: tuple[tuple[str, object], ...] = (
        ("page", p),
        ("participant", q),
        ("position", position),
        ("inheritable", prefix is not None),
    )
    if group:  # one group (the common engine) logs no group: its logs read as before groups
        args += (("group", group),)
    txn.transitions.append(
        transition("allocate", _RUN_STAGE, scope, version, args, (("generation", generation),))
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
    draft = ev.draft
    if page.full != completes or page.draft != draft:  # else the record would not change
        txn.pages[p] = evolve(page, full=completes, draft=draft)
    txn.commands.append(_allow_write(p, q))
    if draft:
        txn.transitions.append(
            transition(
                "write_draft",
                _RUN_STAGE,
                scope,
                version,
                (("page", p), ("participant", q), ("completes", completes)),
                (("full", completes), ("draft", True)),
            )
        )
        return
    txn.transitions.append(
        transition(
            "write",
            _RUN_STAGE,
            scope,
            version,
            (("page", p), ("participant", q), ("completes", completes)),
            (("full", completes),) if not page.draft else (("full", completes), ("draft", False)),
        )
    )


def on_drafts_verified(txn: Txn, ev: DraftsVerified) -> None:
    """The verification of a page's drafts: the accepted tokens complete it or not. A
    verification that finds no drafts (repeated, or after the writer closed and rolled them
    back) changes nothing."""
    p, completes = ev.page, ev.completes
    page = txn.rpages.get(p)
    if page is None:
        _tracked_page(txn, p, "DraftsVerified")  # raises
        return
    if not page.draft or not page.writer_open:
        txn.record(
            "stale_verify", _RUN_STAGE, page.owner, page.version, page=p, completes=completes
        )
        return
    txn.pages[p] = evolve(page, full=completes, draft=False)
    txn.transitions.append(
        transition(
            "verify_drafts",
            _RUN_STAGE,
            page.owner,
            page.version,
            (("page", p), ("completes", completes)),
            (("full", completes), ("draft", False)),
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


def _may_name(txn: Txn, page: PageRecord, full: bool) -> bool:
    """May the engine name the prefix identity of this page's block at its writer's close? Only
    a completed block past its version's context (the version's own output: the context names
    every block before it), written while the version holds authority and was admitted, as
    ``on_page_allocated`` requires of an inheritable context page. A name arriving after a
    revision is dropped: the page stays uninheritable, which is never unsafe."""
    if not full or page.prefix is not None:
        return False
    rec = txn.rscopes.get(page.owner)
    return (
        rec is not None
        and rec.has_authority(page.version)
        and rec.admitted
        and page.position >= len(rec.context)
    )


def on_writer_closed(txn: Txn, ev: WriterClosed) -> None:
    p, digest = ev.page, ev.digest
    pages = txn.pages
    page = pages.get(p)
    if page is None:
        _tracked_page(txn, p, "WriterClosed")  # raises
        return
    if not page.writer_open:
        raise IllegalTransitionError("writer_closed", "WriterClosed", f"page {p} is already closed")
    owner, version = page.owner, page.version
    # Closing a writer with unverified drafts rolls them back: the page is then incomplete, so
    # speculative bytes are never certified.
    full = page.full and not page.draft
    args: tuple[tuple[str, object], ...] = (("page", p), ("full", full), ("digest", digest))
    named = ev.prefix
    if named is None:
        pages[p] = evolve(page, writer_open=False, full=full, draft=False, digest=digest)
    else:
        prefix = named if _may_name(txn, page, full) else page.prefix
        pages[p] = evolve(
            page, writer_open=False, full=full, draft=False, digest=digest, prefix=prefix
        )
        args += (("named", named), ("inheritable", prefix is not None))
    txn.transitions.append(
        transition(
            "close_writer",
            _FENCE_STAGE,
            owner,
            version,
            args,
            (("writer_open", False),)
            if not page.draft
            else (("writer_open", False), ("full", full), ("draft", False)),
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
    txn.record("evict", Stage.RECLAIM, page.owner, page.version, page=ev.page)
    reclaim.reclaim(txn, page.owner)


def on_page_unreferenced(txn: Txn, ev: PageUnreferenced) -> None:
    """The engine dropped every reference to a completed, writer-closed page of a version that
    still runs (a sliding window passed it): the page loses its execution reference and goes
    back to the engine's cache (``ReleaseToCache``), as vLLM keeps a passed block's hash, where
    a revision may still certify it and the engine may evict it. A report for a version without
    authority changes nothing (late: its pages are reclaimed once its receipts are in)."""
    p = ev.page
    page = _tracked_page(txn, p, "PageUnreferenced")
    if not page.held or page.writer_open or not page.full:
        why = (
            "is not referenced"
            if not page.held
            else "still has an open writer"
            if page.writer_open
            else "is not a completed page"
        )
        raise PageInUseError(
            f"PageUnreferenced for page {p} of {page.owner}@{page.version}, which {why}"
        )
    rec = txn.read_scope(page.owner)
    if not rec.has_authority(page.version):
        txn.record("late_unreference", Stage.RECLAIM, page.owner, page.version, page=p)
        return
    txn.pages[p] = evolve(page, held=False)
    txn.record(
        "unreference", Stage.RECLAIM, page.owner, page.version, changed={"held": False}, page=p
    )
    txn.emit(ReleaseToCache((p,)))
    reclaim.reclaim(txn, page.owner)
