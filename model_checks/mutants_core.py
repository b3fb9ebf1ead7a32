"""Core mutants: seeded bugs in ``retire_core``'s decisions, and the whole core catalogue.

Each patches one decision of the core (``unittest.mock.patch`` on the gates, handoff,
reclamation, the batch path or a record method, or on the ``table.TABLE`` entries of an event:
``_handler``). The spec is left alone, so the explorer over the real core must find a refinement,
invariant or quiescence violation. ``CORE_MUTANTS`` is these and the command mutants. What does
not live here: the command mutants (``mutants_commands``: the core decides right but tells the
engine something else), the ``Mutant`` record (``mutant_kind``), spec mutants (``mutants_spec``)
and judging (``mutants``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

import retire_core as rc
from retire_checks.mutant_kind import CONFIGS, Mutant, patched
from retire_checks.mutants_commands import COMMAND_MUTANTS
from retire_core import connection, gates, handlers, handoff, machine, reclaim, table
from retire_core.state import evolve as evolve_record

# --- core mutants ----------------------------------------------------------------------------

_gate = gates.publication_gate
_write_gate = gates.write_gate
_verify = handoff.verify_adoption
_release = handoff.release_certificate
_candidates = handoff._candidates
_reclaim = reclaim.reclaim
_on_cancel = handlers.on_cancel
_certify = handoff.certify_prefix


def _stale_gate(kind: rc.FrameKind) -> Callable[..., tuple[bool, rc.DropReason | None]]:
    def gate(
        scope: rc.ScopeRecord, version: int, k: rc.FrameKind
    ) -> tuple[bool, rc.DropReason | None]:
        if k is kind and scope.state is not rc.ScopeState.CANCELLED:
            return True, None  # forgets the version check for this kind
        return _gate(scope, version, k)

    return gate


def _cancelled_gate(
    scope: rc.ScopeRecord, version: int, k: rc.FrameKind
) -> tuple[bool, rc.DropReason | None]:
    if scope.state is rc.ScopeState.CANCELLED and version == scope.epoch:
        return True, None
    return _gate(scope, version, k)


def _finished_gate(
    scope: rc.ScopeRecord, version: int, k: rc.FrameKind
) -> tuple[bool, rc.DropReason | None]:
    if scope.state is rc.ScopeState.FINISHED and version == scope.epoch:
        return True, None  # a finished version keeps publishing
    return _gate(scope, version, k)


def _finish_without_fence(txn: Any, ev: rc.VersionFinished) -> None:
    rec = txn.scopes[ev.scope]
    if not rec.has_authority(ev.version):
        return
    txn.scopes[ev.scope] = evolve_record(rec, state=rc.ScopeState.FINISHED)
    txn.record("finish", rc.Stage.RECLAIM, ev.scope, rec.epoch)
    _reclaim(txn, ev.scope)  # what still runs of the version is never told to stop


def _preempt_while_running(txn: Any, ev: rc.VersionPreempted) -> None:
    rec = txn.scopes[ev.scope]
    if not rec.has_authority(ev.version):
        return
    for p in list(txn.owned_pages(ev.scope)):  # without waiting for the version's receipts
        page = txn.rpages[p]
        if page.version == rec.epoch and page.held and not page.writer_open:
            txn.pages[p] = evolve_record(page, held=False)
    txn.record("preempt", rc.Stage.RECLAIM, ev.scope, rec.epoch)
    _reclaim(txn, ev.scope)


def _preempt_keeping_pages(txn: Any, ev: rc.VersionPreempted) -> None:
    rec = txn.scopes[ev.scope]
    if rec.has_authority(ev.version) and not rec.running(rec.epoch):
        txn.record("preempt", rc.Stage.RECLAIM, ev.scope, rec.epoch)  # but the pages stay held


def _unreference_ignored(txn: Any, ev: rc.PageUnreferenced) -> None:
    page = txn.rpages[ev.page]
    # logged, but the page keeps its reference: a sliding window passing frees nothing
    txn.record("unreference", rc.Stage.RECLAIM, page.owner, page.version, page=ev.page)


def _unreference_late_too(txn: Any, ev: rc.PageUnreferenced) -> None:
    page = txn.rpages[ev.page]
    if page.held and not page.writer_open and page.full:
        # a page of a superseded version whose participants may still run loses its reference
        txn.pages[ev.page] = evolve_record(page, held=False)
        txn.record(
            "unreference",
            rc.Stage.RECLAIM,
            page.owner,
            page.version,
            changed={"held": False},
            page=ev.page,
        )
        txn.emit(rc.ReleaseToCache((ev.page,)))
        _reclaim(txn, page.owner)
        return
    handlers.on_page_unreferenced(txn, ev)


def _forget_keeping_record(txn: Any, ev: rc.Forget) -> None:
    rec = txn.scopes[ev.scope]
    txn.record("forget", rc.Stage.CONTROL, ev.scope, rec.epoch)  # but the record stays


def _paused_launch_refused(txn: Any, ev: rc.ParticipantStarted) -> None:
    rec = txn.scopes.get(ev.scope)
    if rec is not None and rec.state is rc.ScopeState.PAUSED and ev.version == rec.epoch:
        raise rc.IllegalTransitionError(rec.state.value, "ParticipantStarted", "paused")
    handlers.on_participant_started(txn, ev)


def _pause_gate(
    scope: rc.ScopeRecord, version: int, k: rc.FrameKind
) -> tuple[bool, rc.DropReason | None]:
    if scope.state is rc.ScopeState.PAUSED:
        # a paused scope is treated as having lost authority
        return False, rc.DropReason.RETIRED_VERSION
    return _gate(scope, version, k)


def _write_gate_ignoring(field: str) -> Callable[..., tuple[bool, rc.FenceReason | None]]:
    def gate(
        page: rc.PageRecord | None, scope: str, version: int, participant: str
    ) -> tuple[bool, rc.FenceReason | None]:
        if page is not None and page.writer_open:
            if field == "version" and page.owner == scope:
                return True, None
            if field == "owner" and page.version == version:
                return True, None
        return _write_gate(page, scope, version, participant)

    return gate


def _candidates_open_writers(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    by_slot = _candidates(txn, scope, rec)
    for p, page in txn.pages.items():
        if (
            page.owner == scope
            and page.version < rec.epoch
            and page.writer_open
            and page.position < len(rec.context)
            and page.prefix == rec.context[page.position]
        ):
            fake = evolve_record(page, writer_open=False, full=True, digest=page.digest or "0")
            by_slot.setdefault((page.group, page.position), []).append((p, fake))
    return by_slot


def _candidates_any_prefix(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    by_slot: dict[tuple[int, int], list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.owner == scope
            and page.version < rec.epoch
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None  # ... but not whether it equals the revised context's
        ):
            by_slot.setdefault((page.group, page.position), []).append((p, page))
    return by_slot


def _candidates_any_scope(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    by_slot: dict[tuple[int, int], list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.version < rec.epoch  # any owner, any fingerprint: another tenant's pages too
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None
            and page.prefix == rec.context[page.position]
        ):
            by_slot.setdefault((page.group, page.position), []).append((p, page))
    return by_slot


def _verify_ignoring(field: str) -> Callable[[Any, rc.AdoptionReport], None]:
    def verify(txn: Any, ev: rc.AdoptionReport) -> None:
        rec = txn.scopes[ev.scope]
        cert = rec.certificate
        if field == "generation":
            entries = tuple(
                attrs.evolve(e, generation=txn.pages[e.page].generation)
                if e.page in txn.pages
                else e
                for e in cert.entries
            )
            txn.scopes[ev.scope] = attrs.evolve(
                rec, certificate=attrs.evolve(cert, entries=entries)
            )
        else:
            certified = {e.page: e.digest for e in cert.entries}
            ev = attrs.evolve(
                ev, digests=tuple(rc.PageDigest(d.page, certified[d.page]) for d in ev.digests)
            )
        _verify(txn, ev)

    return verify


def _reused_without_new_generation(txn: Any, ev: rc.PageReused) -> None:
    page = txn.pages.get(ev.page)
    if page is None or page.held or page.writer_open or not page.full:
        raise rc.PageInUseError(f"page {ev.page} is in use")
    txn.record("reuse_id", rc.Stage.RECLAIM, page.owner, page.version, page=ev.page)


def _reclaim_unpinning_drained(txn: Any, scope: str) -> None:
    rec = txn.scopes[scope]
    for p, page in list(txn.pages.items()):
        if page.owner == scope and page.pinned and rec.drained(page.version):
            txn.pages[p] = evolve_record(page, pinned=False)  # the pin goes before adoption
    _reclaim(txn, scope)


def _reclaim_ignoring_references(txn: Any, scope: str) -> None:
    rec = txn.scopes[scope]
    for p, page in list(txn.pages.items()):
        obsolete = rec.state is rc.ScopeState.CANCELLED or page.version < rec.epoch
        if page.owner == scope and obsolete and page.held:
            txn.pages[p] = evolve_record(page, held=False)  # frees under running readers
    _reclaim(txn, scope)


def _reclaim_one_receipt_short(txn: Any, scope: str) -> None:
    """RECLAIM counting one participant fewer: a retired version's pages lose their reference
    (and are freed) once all but one of its participants have delivered their receipts."""
    rec = txn.scopes[scope]
    ended = rec.state in (rc.ScopeState.CANCELLED, rc.ScopeState.FINISHED)
    for p, page in sorted(txn.pages.items()):
        if page.owner != scope or not page.held or page.writer_open:
            continue
        if not (ended or page.version < rec.epoch):
            continue
        mine = [r for r in rec.participants.values() if r.version == page.version]
        if sum(not r.closed for r in mine) == 1:
            txn.record(
                "unhold", rc.Stage.RECLAIM, scope, page.version, changed={"held": False}, page=p
            )
            txn.pages[p] = evolve_record(page, held=False)
    _reclaim(txn, scope)


def _partial_drained(self: rc.ScopeRecord, version: int) -> bool:
    mine = [r for r in self.participants.values() if r.version == version]
    return not mine or any(r.closed for r in mine)


def _cancel_with_successor(txn: Any, ev: rc.Cancel) -> None:
    _on_cancel(txn, ev)
    rec = txn.scopes[ev.scope]
    txn.scopes[ev.scope] = attrs.evolve(rec, epoch=rec.epoch + 1, admitted=True)


def _release_keeping_pins(txn: Any, scope: str, reason: rc.UnpinReason) -> None:
    if reason == rc.UnpinReason.SUPERSEDED_BEFORE_ADOPTION:
        rec = txn.scopes[scope]
        txn.scopes[scope] = attrs.evolve(rec, certificate=None)  # forgets the pins: a leak
        return
    _release(txn, scope, reason)


def _certify_cold_too(txn: Any, scope: str) -> None:
    rec = txn.scopes[scope]
    if not rec.contract.allows_reuse:
        txn.scopes[scope] = attrs.evolve(rec, contract=rc.DEFAULT_CONTRACT)
        _certify(txn, scope)
        after = txn.scopes[scope]
        txn.scopes[scope] = attrs.evolve(after, contract=rec.contract)
        return
    _certify(txn, scope)


def _candidates_any_owner(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    """ALIGN's candidates without the owner check (the fingerprint is still compared): a
    scope of the same tenant and model inherits another scope's pages."""
    by_slot: dict[tuple[int, int], list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.version < rec.epoch
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None
            and page.fingerprint == rec.fingerprint
            and page.prefix == rec.context[page.position]
        ):
            by_slot.setdefault((page.group, page.position), []).append((p, page))
    return by_slot


_on_write = handlers.on_write
_on_drafts_verified = handlers.on_drafts_verified


def _closed_keeping_drafts(txn: Any, ev: rc.WriterClosed) -> None:
    """The writer closes as before drafts existed: a block filled by unverified drafts stays
    complete (the drafts are forgotten, not rolled back), so ALIGN may certify it."""
    page = txn.pages.get(ev.page)
    if page is None or not page.writer_open or not page.draft:
        handlers.on_writer_closed(txn, ev)
        return
    txn.pages[ev.page] = evolve_record(page, draft=False)
    handlers.on_writer_closed(txn, ev)


def _write_ignoring_drafts(txn: Any, ev: rc.WriteAttempted) -> None:
    _on_write(txn, attrs.evolve(ev, draft=False))  # drafts handled as verified tokens


def _verify_ignoring_rejection(txn: Any, ev: rc.DraftsVerified) -> None:
    _on_drafts_verified(txn, attrs.evolve(ev, completes=True))  # rejected drafts complete it


def _name_after_revision(txn: Any, page: rc.PageRecord, full: bool) -> bool:
    """The authority check forgotten: a name that arrives after a revision still counts."""
    return full and page.prefix is None


def _name_incomplete(txn: Any, page: rc.PageRecord, full: bool) -> bool:
    """A name counts for a block its writer never filled."""
    return _may_name(txn, page, True)


_may_name = handlers._may_name


def _handler(
    event: type, fn: Callable[[Any, Any], None], also: tuple[rc.ScopeState | None, ...] = ()
) -> Callable[[], Any]:
    """A mutant of ``event``'s handler: every ``table.TABLE`` entry of ``event`` runs ``fn``
    instead. ``also`` adds next states to those entries, for a bug that moves a scope where
    the table does not allow: the table is then wrong too, so that the checks, not the
    machine's own check of the table, must find it."""

    def patch() -> Any:
        entries = {
            key: table.Entry(fn, (*entry.next, *(s for s in also if s not in entry.next)))
            for key, entry in table.TABLE.items()
            if key[1] is event
        }
        return table.TABLE.patched(entries)

    return patch


_run_batch = machine.run_batch


def _batch_losing_last_event(state: Any, events: Any, counts: list[int] | None = None) -> Any:
    """``run_batch`` that leaves out the last event of a batch of several (its count stays, as
    zero, so that the logged path's bookkeeping still lines up)."""
    events = list(events)
    if len(events) < 2:
        return _run_batch(state, events, counts)
    txn = _run_batch(state, events[:-1], counts)
    if counts is not None:
        counts.append(0)
    return txn


def _cut_reads_first_group(windows: tuple[int, ...], cut: int) -> list[tuple[int, int]]:
    return [(0, i) for i in range(max(0, cut - windows[0]) if windows[0] else 0, cut)]


_C = CONFIGS
CORE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "stale_token_published",
        "stale publication (token)",
        "core",
        "the publication gate forgets the version check for token frames",
        (_C["chain"],),
        patched(handlers, "publication_gate", _stale_gate(rc.FrameKind.TOKEN)),
    ),
    Mutant(
        "stale_commit_applied",
        "stale publication (commit gate)",
        "core",
        "the scheduler commit gate forgets the version check",
        (_C["control"],),
        patched(handlers, "publication_gate", _stale_gate(rc.FrameKind.COMMIT)),
    ),
    Mutant(
        "stale_state_installed",
        "stale publication (install gate)",
        "core",
        "the state install gate forgets the version check",
        (_C["control"],),
        patched(handlers, "publication_gate", _stale_gate(rc.FrameKind.INSTALL)),
    ),
    Mutant(
        "cancelled_scope_publishes",
        "stale publication (cancel)",
        "core",
        "frames of a cancelled scope's last version still publish",
        (_C["control"],),
        patched(handlers, "publication_gate", _cancelled_gate),
    ),
    Mutant(
        "open_writer_page_adopted",
        "adopting an open-writer page",
        "core",
        "ALIGN certifies pages whose writer is still open",
        (_C["chain"],),
        patched(handoff, "_candidates", _candidates_open_writers),
    ),
    Mutant(
        "prefix_mismatch_adopted",
        "prefix mismatch",
        "core",
        "ALIGN certifies a page whatever prefix it covers",
        (_C["chain"],),
        patched(handoff, "_candidates", _candidates_any_prefix),
    ),
    Mutant(
        "foreign_fingerprint_adopted",
        "fingerprint mismatch",
        "core",
        "ALIGN certifies matching-prefix pages of any owner and configuration fingerprint",
        (_C["tenants"],),
        patched(handoff, "_candidates", _candidates_any_scope),
    ),
    Mutant(
        "generation_reused",
        "generation reuse",
        "core",
        "a recycled block id keeps its ownership generation",
        (_C["chain"],),
        _handler(rc.PageReused, _reused_without_new_generation),
    ),
    Mutant(
        "generation_ignored",
        "generation reuse (not checked)",
        "core",
        "the adoption check ignores the ownership generation",
        (_C["chain"],),
        patched(handoff, "verify_adoption", _verify_ignoring("generation")),
    ),
    Mutant(
        "digest_ignored",
        "digest ignored",
        "core",
        "the adoption check ignores the content digest",
        (_C["chain"],),
        patched(handoff, "verify_adoption", _verify_ignoring("digest")),
    ),
    Mutant(
        "pin_released_before_adoption",
        "handoff pin released before adoption",
        "core",
        "RECLAIM drops a certified page's handoff pin once its version drained",
        (_C["chain"],),
        patched(reclaim, "reclaim", _reclaim_unpinning_drained),
    ),
    Mutant(
        "freed_while_referenced",
        "free while referenced",
        "core",
        "RECLAIM drops an obsolete version's references without waiting for its receipts",
        (_C["chain"],),
        patched(reclaim, "reclaim", _reclaim_ignoring_references),
    ),
    Mutant(
        "retired_writer_overwrites_successor",
        "retired writer overwriting the successor's page",
        "core",
        "the write gate lets any version of the owning scope write an open page",
        (_C["chain"],),
        patched(handlers, "write_gate", _write_gate_ignoring("version")),
    ),
    Mutant(
        "cross_tenant_write",
        "cross-tenant write",
        "core",
        "the write gate lets any scope write an open page of the same version number",
        (_C["tenants"],),
        patched(handlers, "write_gate", _write_gate_ignoring("owner")),
    ),
    Mutant(
        "freed_one_receipt_short",
        "closing a version on a partial set of receipts",
        "core",
        "RECLAIM frees a retired version's pages once all but one of its participants (ranks) "
        "have delivered their receipts",
        (_C["chain"],),
        patched(reclaim, "reclaim", _reclaim_one_receipt_short),
    ),
    Mutant(
        "closed_on_partial_receipts",
        "closing a version on a partial set of receipts",
        "core",
        "a version counts as drained once any one of its participants has closed",
        (_C["chain"],),
        patched(rc.ScopeRecord, "drained", _partial_drained),
    ),
    Mutant(
        "pause_loses_authority",
        "pause losing authority",
        "core",
        "the publication gate drops frames of a paused scope's current version",
        (_C["control"],),
        patched(handlers, "publication_gate", _pause_gate),
    ),
    Mutant(
        "cancel_creates_successor",
        "cancel creating a successor",
        "core",
        "cancel moves the scope to a new, admitted version",
        (_C["control"],),
        _handler(rc.Cancel, _cancel_with_successor),
    ),
    Mutant(
        "chain_collapse_leaks_pins",
        "chain collapse that leaks",
        "core",
        "a revision during a pending handoff forgets the certificate without unpinning",
        (_C["chain"],),
        patched(handoff, "release_certificate", _release_keeping_pins),
    ),
    Mutant(
        "align_takes_same_tenant_page",
        "ALIGN page owner ignored",
        "core",
        "ALIGN certifies matching pages of another scope of the same tenant and model",
        (_C["twins"],),
        patched(handoff, "_candidates", _candidates_any_owner),
    ),
    Mutant(
        "cut_ignores_other_groups",
        "KV group cut",
        "core",
        "ALIGN and RESUME take only the first KV cache group's pages for a cut: the successor "
        "starts without the other groups' blocks",
        (_C["groups"],),
        patched(handoff, "required_slots", _cut_reads_first_group),
    ),
    Mutant(
        "batch_loses_last_event",
        "batch path (handle_batch)",
        "core",
        "Retire.handle_batch leaves out the last event of a batch of several",
        (),
        patched(connection, "run_batch", _batch_losing_last_event),
        judged_by=("hypothesis",),
    ),
    Mutant(
        "finished_version_publishes",
        "stale publication (finish)",
        "core",
        "frames of a version that ran to its end still publish",
        (_C["control"],),
        patched(handlers, "publication_gate", _finished_gate),
    ),
    Mutant(
        "finished_version_keeps_pages",
        "leak (finish)",
        "core",
        "RECLAIM treats a finished scope's version as live: its pages never go back",
        (_C["control"],),
        patched(reclaim, "_ENDED", (rc.ScopeState.CANCELLED,)),
    ),
    Mutant(
        "finish_without_fence",
        "finish without fence",
        "core",
        "a version reported finished while a participant of it still runs is not fenced",
        (_C["control"],),
        _handler(rc.VersionFinished, _finish_without_fence),
    ),
    Mutant(
        "preempt_while_running",
        "preempt before receipts",
        "core",
        "a preemption report drops the version's pages while a participant of it still runs",
        (_C["control"],),
        _handler(rc.VersionPreempted, _preempt_while_running),
    ),
    Mutant(
        "preempt_keeps_pages",
        "leak (preempt)",
        "core",
        "a preempted version's pages keep their reference: vLLM's preemption frees nothing",
        (_C["control"],),
        _handler(rc.VersionPreempted, _preempt_keeping_pages),
    ),
    Mutant(
        "unreference_ignored",
        "leak (passed window)",
        "core",
        "a page the engine stopped referencing keeps its reference: a sliding window passing "
        "frees nothing",
        (_C["output"],),
        _handler(rc.PageUnreferenced, _unreference_ignored),
    ),
    Mutant(
        "unreference_late_accepted",
        "unreference without authority",
        "core",
        "a report that the engine stopped referencing a page of a superseded version drops its "
        "reference while that version's participants may still run",
        (_C["output"],),
        _handler(rc.PageUnreferenced, _unreference_late_too),
    ),
    Mutant(
        "forgotten_scope_kept",
        "forget (record kept)",
        "core",
        "Forget logs the scope as forgotten but keeps its record: the id can never open again",
        (),
        _handler(rc.Forget, _forget_keeping_record, also=(rc.ScopeState.CANCELLED,)),
        judged_by=("hypothesis",),
    ),
    Mutant(
        "paused_launch_refused",
        "late launch refused",
        "core",
        "an admitted request that reaches the engine after a pause overtook it is refused (the "
        "engine core would fail in add_request)",
        (_C["control"],),
        _handler(rc.ParticipantStarted, _paused_launch_refused),
    ),
    Mutant(
        "cold_successor_pins",
        "cold successor inheriting",
        "core",
        "ALIGN certifies and pins even when the contract says reuse is not worth it",
        (_C["chain"],),
        patched(handoff, "certify_prefix", _certify_cold_too),
    ),
    Mutant(
        "drafts_not_rolled_back",
        "certifying unverified drafts",
        "core",
        "a writer closing over unverified drafts keeps the page complete (certifiable)",
        (_C["drafts"],),
        _handler(rc.WriterClosed, _closed_keeping_drafts),
    ),
    Mutant(
        "draft_write_as_verified",
        "certifying unverified drafts",
        "core",
        "a write of draft tokens is taken as a write of verified ones",
        (_C["drafts"],),
        _handler(rc.WriteAttempted, _write_ignoring_drafts),
    ),
    Mutant(
        "rejected_drafts_complete",
        "certifying rejected drafts",
        "core",
        "a verification that rejects a page's drafts still marks the page complete",
        (_C["drafts"],),
        _handler(rc.DraftsVerified, _verify_ignoring_rejection),
    ),
    Mutant(
        "late_name_kept",
        "inheriting retired work",
        "core",
        "a block named at its writer's close after its version was revised becomes inheritable",
        (_C["output"],),
        patched(handlers, "_may_name", _name_after_revision),
    ),
    Mutant(
        "incomplete_block_named",
        "inheriting an incomplete block",
        "core",
        "a name counts for a block of the version's output that was never completed",
        (_C["output"],),
        patched(handlers, "_may_name", _name_incomplete),
    ),
    *COMMAND_MUTANTS,
)
