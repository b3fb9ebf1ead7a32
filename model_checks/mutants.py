"""The mutant catalogue: seeded bugs in the core and in the spec, and the checks that kill them.

A check that cannot fail proves nothing, so every check of this package is run against bugs it
must find. *Core mutants* patch one decision of ``retire_core`` (``unittest.mock.patch`` on the
gates, handoff, reclamation or a record method, or on the ``table.TABLE`` entries of an event:
``_handler``) and leave the spec alone: the explorer over the real core must find a
refinement, invariant or quiescence violation. *Spec mutants* weaken one guard or effect of
``retire_spec.actions`` (an alternative action table, written in the same vocabulary, so Z3
reads it too): the spec explorer and the Z3 proofs must both fail on them. Hypothesis
(``retire_checks.fuzz``) is run on core mutants when it is installed and asked for. ``judge``
runs the checks on one mutant and ``run_catalogue`` on all; a survivor makes the catalogue
fail. Mutants name the bug kinds of issue 3 in their ``kind``; the explorer configurations each
one is judged in are small slices of the quick profile (a bug must show within them). What does
not live here: the checks themselves (``explorer``, ``proofs``, ``fuzz``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any
from unittest import mock

import attrs

import retire_core as rc
from retire_checks.explorer import QUICK, Config, Counterexample, explore, explore_spec
from retire_core import connection, gates, handlers, handoff, machine, reclaim, table
from retire_core.state import evolve as evolve_record
from retire_spec import actions as A
from retire_spec.expr import Interp, Val
from retire_spec.schema import ACTIVE, FINISHED, IN_FLIGHT, Bounds, SpecState

CONFIGS: dict[str, Config] = {c.name: c for c in QUICK.configs}

# Small spec-only worlds (the spec explorer enumerates every action instance, the core's
# decisions included, so it needs less room than the explorer over the core).
#: Examples the Hypothesis machine gets per core mutant (``judge(..., use_hypothesis=True)``).
#: From ``fuzz.FUZZ_SEED``, 1,000 kill all 41 core mutants (about 140 s for the whole catalogue,
#: since a run stops at its first failure); 60 left 7 of them alive.
HYPOTHESIS_EXAMPLES = 1000

SPEC_ONE = Config("spec-one", Bounds(1, 1, 1, 1, 1, 1, ((1,), (2,)), (0,)))
SPEC_TWO_PARTS = Config("spec-two-parts", Bounds(1, 2, 0, 1, 1, 1, ((1,), (2,)), (0,)))
SPEC_CHAIN = Config("spec-chain", Bounds(1, 1, 0, 1, 1, 2, ((1,), (2,)), (0,)))
SPEC_TENANTS = Config("spec-tenants", Bounds(2, 2, 0, 1, 1, 0, ((1,),), (0, 1)))
SPEC_TENANTS_REVISED = Config("spec-tenants-revised", Bounds(2, 1, 0, 1, 1, 1, ((1,),), (0, 1)))


@attrs.frozen(slots=True)
class Mutant:
    name: str
    kind: str  # the bug kind of issue 3 it seeds
    level: str  # "core" or "spec"
    description: str
    configs: tuple[Config, ...]
    patch: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
    actions: dict[str, A.Action] | None = None
    # the checks that must each find it (``judge`` runs them whatever it is asked for): the
    # explorer, and Z3 for spec mutants; Hypothesis alone for a bug of the batch path, which
    # only the Hypothesis machine drives (``fuzz.LockstepMachine.engine_step``)
    judged_by: tuple[str, ...] = ()

    @property
    def required(self) -> tuple[str, ...]:
        if self.judged_by:
            return self.judged_by
        return ("explorer",) if self.level == "core" else ("explorer", "z3")

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The core as this mutant has it (a no-op for spec mutants)."""
        if self.patch is None:
            yield
            return
        with self.patch():
            yield


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
    by_position = _candidates(txn, scope, rec)
    for p, page in txn.pages.items():
        if (
            page.owner == scope
            and page.version < rec.epoch
            and page.writer_open
            and page.position < len(rec.context)
            and page.prefix == rec.context[page.position]
        ):
            fake = evolve_record(page, writer_open=False, full=True, digest=page.digest or "0")
            by_position.setdefault(page.position, []).append((p, fake))
    return by_position


def _candidates_any_prefix(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    by_position: dict[int, list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.owner == scope
            and page.version < rec.epoch
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None  # ... but not whether it equals the revised context's
        ):
            by_position.setdefault(page.position, []).append((p, page))
    return by_position


def _candidates_any_scope(txn: Any, scope: str, rec: rc.ScopeRecord) -> Any:
    by_position: dict[int, list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.version < rec.epoch  # any owner, any fingerprint: another tenant's pages too
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None
            and page.prefix == rec.context[page.position]
        ):
            by_position.setdefault(page.position, []).append((p, page))
    return by_position


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
    by_position: dict[int, list[Any]] = {}
    for p, page in txn.pages.items():
        if (
            page.version < rec.epoch
            and not page.pinned
            and page.position < len(rec.context)
            and page.prefix is not None
            and page.fingerprint == rec.fingerprint
            and page.prefix == rec.context[page.position]
        ):
            by_position.setdefault(page.position, []).append((p, page))
    return by_position


def _p(target: Any, name: str, value: Any) -> Callable[[], Any]:
    return lambda: mock.patch.object(target, name, value)


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


# --- command mutants: the core decides right but tells the engine something else ----------------

_dispatch = machine.dispatch
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


def _commands(edit: Callable[[Any, Any], list[Any]]) -> Callable[[], Any]:
    """A mutant that runs every event as the core does and then rewrites the commands it
    emits (``edit(txn, commands)`` returns the new list); the core's state and transitions are
    left alone, so only the check of the commands against the engine's books can see it."""

    def apply(txn: Any, event: Any) -> None:
        _dispatch(txn, event)
        if txn.commands:
            txn.commands[:] = edit(txn, list(txn.commands))

    return _p(machine, "dispatch", apply)


def _without(cls: type) -> Callable[[], Any]:
    return _commands(lambda txn, cmds: [c for c in cmds if not isinstance(c, cls)])


def _mapped(cls: type, fn: Callable[[Any, Any], Any]) -> Callable[[], Any]:
    return _commands(lambda txn, cmds: [fn(txn, c) if isinstance(c, cls) else c for c in cmds])


def _fence_first_only(txn: Any, c: rc.Fence) -> rc.Fence:
    return attrs.evolve(c, participants=c.participants[:1])


def _admit_next_version(txn: Any, c: rc.Admit) -> rc.Admit:
    return attrs.evolve(c, version=c.version + 1)


def _admit_claiming_blocks(txn: Any, c: rc.Admit) -> rc.Admit:
    blocks = len(txn.scopes[c.scope].context)
    return attrs.evolve(c, adopted_blocks=blocks, cold=False)


def _adopt_previous_version(txn: Any, c: rc.Adopt) -> rc.Adopt:
    return attrs.evolve(c, version=c.version - 1)


def _drop_as_publish(txn: Any, c: rc.Drop) -> rc.Publish:
    return rc.Publish(c.frame, c.scope, c.version, c.kind)


def _fence_write_as_allow(txn: Any, c: rc.FenceWrite) -> rc.AllowWrite:
    return rc.AllowWrite(c.page, c.participant)


def _free_with_pinned(txn: Any, cmds: list[Any]) -> list[Any]:
    pinned = tuple(p for p, page in txn.pages.items() if page.pinned)
    return [
        attrs.evolve(c, pages=c.pages + tuple(p for p in pinned if p not in c.pages))
        if isinstance(c, rc.Free) and pinned
        else c
        for c in cmds
    ]


_C = CONFIGS
CORE_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "stale_token_published",
        "stale publication (token)",
        "core",
        "the publication gate forgets the version check for token frames",
        (_C["chain"],),
        _p(handlers, "publication_gate", _stale_gate(rc.FrameKind.TOKEN)),
    ),
    Mutant(
        "stale_commit_applied",
        "stale publication (commit gate)",
        "core",
        "the scheduler commit gate forgets the version check",
        (_C["control"],),
        _p(handlers, "publication_gate", _stale_gate(rc.FrameKind.COMMIT)),
    ),
    Mutant(
        "stale_state_installed",
        "stale publication (install gate)",
        "core",
        "the state install gate forgets the version check",
        (_C["control"],),
        _p(handlers, "publication_gate", _stale_gate(rc.FrameKind.INSTALL)),
    ),
    Mutant(
        "cancelled_scope_publishes",
        "stale publication (cancel)",
        "core",
        "frames of a cancelled scope's last version still publish",
        (_C["control"],),
        _p(handlers, "publication_gate", _cancelled_gate),
    ),
    Mutant(
        "open_writer_page_adopted",
        "adopting an open-writer page",
        "core",
        "ALIGN certifies pages whose writer is still open",
        (_C["chain"],),
        _p(handoff, "_candidates", _candidates_open_writers),
    ),
    Mutant(
        "prefix_mismatch_adopted",
        "prefix mismatch",
        "core",
        "ALIGN certifies a page whatever prefix it covers",
        (_C["chain"],),
        _p(handoff, "_candidates", _candidates_any_prefix),
    ),
    Mutant(
        "foreign_fingerprint_adopted",
        "fingerprint mismatch",
        "core",
        "ALIGN certifies matching-prefix pages of any owner and configuration fingerprint",
        (_C["tenants"],),
        _p(handoff, "_candidates", _candidates_any_scope),
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
        _p(handoff, "verify_adoption", _verify_ignoring("generation")),
    ),
    Mutant(
        "digest_ignored",
        "digest ignored",
        "core",
        "the adoption check ignores the content digest",
        (_C["chain"],),
        _p(handoff, "verify_adoption", _verify_ignoring("digest")),
    ),
    Mutant(
        "pin_released_before_adoption",
        "handoff pin released before adoption",
        "core",
        "RECLAIM drops a certified page's handoff pin once its version drained",
        (_C["chain"],),
        _p(reclaim, "reclaim", _reclaim_unpinning_drained),
    ),
    Mutant(
        "freed_while_referenced",
        "free while referenced",
        "core",
        "RECLAIM drops an obsolete version's references without waiting for its receipts",
        (_C["chain"],),
        _p(reclaim, "reclaim", _reclaim_ignoring_references),
    ),
    Mutant(
        "retired_writer_overwrites_successor",
        "retired writer overwriting the successor's page",
        "core",
        "the write gate lets any version of the owning scope write an open page",
        (_C["chain"],),
        _p(handlers, "write_gate", _write_gate_ignoring("version")),
    ),
    Mutant(
        "cross_tenant_write",
        "cross-tenant write",
        "core",
        "the write gate lets any scope write an open page of the same version number",
        (_C["tenants"],),
        _p(handlers, "write_gate", _write_gate_ignoring("owner")),
    ),
    Mutant(
        "closed_on_partial_receipts",
        "closing a version on a partial set of receipts",
        "core",
        "a version counts as drained once any one of its participants has closed",
        (_C["chain"],),
        _p(rc.ScopeRecord, "drained", _partial_drained),
    ),
    Mutant(
        "pause_loses_authority",
        "pause losing authority",
        "core",
        "the publication gate drops frames of a paused scope's current version",
        (_C["control"],),
        _p(handlers, "publication_gate", _pause_gate),
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
        _p(handoff, "release_certificate", _release_keeping_pins),
    ),
    Mutant(
        "align_takes_same_tenant_page",
        "ALIGN page owner ignored",
        "core",
        "ALIGN certifies matching pages of another scope of the same tenant and model",
        (_C["twins"],),
        _p(handoff, "_candidates", _candidates_any_owner),
    ),
    Mutant(
        "fence_dropped",
        "command dropped (Fence)",
        "core",
        "the core fences retired participants in its state but never tells the engine",
        (_C["chain"],),
        _without(rc.Fence),
    ),
    Mutant(
        "fence_partial",
        "command distorted (Fence)",
        "core",
        "a Fence names only the first of the retired version's running participants",
        (_C["chain"],),
        _mapped(rc.Fence, _fence_first_only),
    ),
    Mutant(
        "admit_dropped",
        "command dropped (Admit)",
        "core",
        "the core admits a version but never tells the engine to start it",
        (_C["chain"],),
        _without(rc.Admit),
    ),
    Mutant(
        "admit_wrong_version",
        "command distorted (Admit)",
        "core",
        "Admit names the version after the one admitted",
        (_C["chain"],),
        _mapped(rc.Admit, _admit_next_version),
    ),
    Mutant(
        "admit_claims_adoption",
        "command distorted (Admit)",
        "core",
        "Admit tells the engine every block of the context was adopted",
        (_C["chain"],),
        _mapped(rc.Admit, _admit_claiming_blocks),
    ),
    Mutant(
        "pin_certified_dropped",
        "command dropped (PinCertified)",
        "core",
        "ALIGN pins the certificate in the core's state but never asks the engine to pin",
        (_C["chain"],),
        _without(rc.PinCertified),
    ),
    Mutant(
        "adopt_dropped",
        "command dropped (Adopt)",
        "core",
        "RESUME adopts pages in the core's state but never hands them to the engine",
        (_C["chain"],),
        _without(rc.Adopt),
    ),
    Mutant(
        "adopt_wrong_version",
        "command distorted (Adopt)",
        "core",
        "Adopt hands the pages to the predecessor's version instead of the successor's",
        (_C["chain"],),
        _mapped(rc.Adopt, _adopt_previous_version),
    ),
    Mutant(
        "unpin_dropped",
        "command dropped (Unpin)",
        "core",
        "released handoff pins are never released in the engine",
        (_C["chain"],),
        _without(rc.Unpin),
    ),
    Mutant(
        "free_dropped",
        "command dropped (Free)",
        "core",
        "RECLAIM forgets pages but never gives them back to the engine",
        (_C["chain"],),
        _without(rc.Free),
    ),
    Mutant(
        "free_pinned_page",
        "command distorted (Free)",
        "core",
        "a Free also names every page that still carries a handoff pin",
        (_C["handoff"],),
        _commands(_free_with_pinned),
    ),
    Mutant(
        "drop_published",
        "command distorted (Drop)",
        "core",
        "a frame the gate dropped is sent to the engine as Publish",
        (_C["chain"],),
        _mapped(rc.Drop, _drop_as_publish),
    ),
    Mutant(
        "publish_dropped",
        "command dropped (Publish)",
        "core",
        "a frame the gate published never reaches the engine",
        (_C["chain"],),
        _without(rc.Publish),
    ),
    Mutant(
        "fence_write_allowed",
        "command distorted (FenceWrite)",
        "core",
        "a write the isolation gate fenced is sent to the engine as AllowWrite",
        (_C["chain"],),
        _mapped(rc.FenceWrite, _fence_write_as_allow),
    ),
    Mutant(
        "allow_write_dropped",
        "command dropped (AllowWrite)",
        "core",
        "a write the gate allowed is never answered",
        (_C["chain"],),
        _without(rc.AllowWrite),
    ),
    Mutant(
        "batch_loses_last_event",
        "batch path (handle_batch)",
        "core",
        "Retire.handle_batch leaves out the last event of a batch of several",
        (),
        _p(connection, "run_batch", _batch_losing_last_event),
        judged_by=("hypothesis",),
    ),
    Mutant(
        "finished_version_publishes",
        "stale publication (finish)",
        "core",
        "frames of a version that ran to its end still publish",
        (_C["control"],),
        _p(handlers, "publication_gate", _finished_gate),
    ),
    Mutant(
        "finished_version_keeps_pages",
        "leak (finish)",
        "core",
        "RECLAIM treats a finished scope's version as live: its pages never go back",
        (_C["control"],),
        _p(reclaim, "_ENDED", (rc.ScopeState.CANCELLED,)),
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
        "release_to_cache_dropped",
        "command dropped (ReleaseToCache)",
        "core",
        "a finished version's pages are never given back to the engine's cache",
        (_C["control"],),
        _without(rc.ReleaseToCache),
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
        _p(handoff, "certify_prefix", _certify_cold_too),
    ),
)


# --- spec mutants: one guard or effect weakened ----------------------------------------------


def _replace(name: str, **changes: Any) -> dict[str, A.Action]:
    table = dict(A.ACTION_BY_NAME)
    table[name] = attrs.evolve(table[name], **changes)
    return table


def _publish_stale(kind: int) -> A.Guard:
    def guard(I: Interp, st: SpecState, f: Val) -> Val:
        stale = I.and_(
            I.eq(I.get(st["frame_state"], f), I.lit(IN_FLIGHT)),
            I.eq(I.get(st["frame_kind"], f), I.lit(kind)),
        )
        return I.or_(A.publish_guard(I, st, f), stale)

    return guard


def _handoff_guard(skip: str) -> Callable[[Interp, SpecState, Val, Val], Val]:
    """The adopt guard with one of its checks left out (``skip``)."""

    def guard(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
        pos = I.get(st["page_pos"], p)
        checks = {
            "mode": A._mode_is(I, st, s, ACTIVE),
            "pending": I.not_(I.get(st["scope_admitted"], s)),
            "pinned": I.get(st["page_pinned"], p),
            "cert_scope": I.eq(I.get(st["page_cert_scope"], p), s),
            "cert_ver": I.eq(I.get(st["page_cert_ver"], p), I.get(st["scope_epoch"], s)),
            "owner": I.eq(I.get(st["page_owner"], p), s),
            "alloc": I.get(st["page_alloc"], p),
            "writer": I.not_(I.get(st["page_writer"], p)),
            "full": I.get(st["page_full"], p),
            "generation": I.eq(I.get(st["page_gen"], p), I.get(st["page_cert_gen"], p)),
            "digest": I.eq(I.get(st["page_data"], p), I.get(st["page_cert_digest"], p)),
            "prefix": I.eq(I.get(st["page_tok"], p), I.get(I.get(st["scope_want"], s), pos)),
            "fingerprint": I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
        }
        return I.and_(*(v for k, v in checks.items() if k != skip))

    return guard


def _certify_guard(skip: str | tuple[str, ...]) -> Callable[[Interp, SpecState, Val, Val], Val]:
    """The certify guard with one of its checks left out (``skip``)."""

    def guard(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
        pos = I.get(st["page_pos"], p)
        checks = {
            "mode": A._mode_is(I, st, s, ACTIVE),
            "pending": I.not_(I.get(st["scope_admitted"], s)),
            "reuse": I.get(st["scope_reuse"], s),
            "alloc": I.get(st["page_alloc"], p),
            "owner": I.eq(I.get(st["page_owner"], p), s),
            "retired": I.lt(I.get(st["page_over"], p), I.get(st["scope_epoch"], s)),
            "writer": I.not_(I.get(st["page_writer"], p)),
            "full": I.get(st["page_full"], p),
            "unpinned": I.not_(I.get(st["page_pinned"], p)),
            "prefix": I.eq(I.get(st["page_tok"], p), I.get(I.get(st["scope_want"], s), pos)),
            "fingerprint": I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
        }
        skipped = (skip,) if isinstance(skip, str) else skip
        return I.and_(*(v for k, v in checks.items() if k not in skipped))

    return guard


def _write_guard(skip: str) -> Callable[[Interp, SpecState, Val, Val, Val], Val]:
    def guard(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> Val:
        checks = {
            "running": A._running(I, st, q),
            "alloc": I.get(st["page_alloc"], p),
            "owner": I.eq(I.get(st["page_owner"], p), I.get(st["part_scope"], q)),
            "version": I.eq(I.get(st["page_over"], p), I.get(st["part_ver"], q)),
            "writer": I.get(st["page_writer"], p),
        }
        return I.and_(*(v for k, v in checks.items() if k != skip))

    return guard


def _free_pinned_guard(I: Interp, st: SpecState, p: Val) -> Val:
    return I.and_(I.get(st["page_alloc"], p), I.not_(I.get(st["page_held"], p)))


def _supersede_keeping_pins(
    I: Interp, st: SpecState, s: Val, ctx: Val, reuse: Val
) -> dict[str, Val]:
    effect = A.supersede_effect(I, st, s, ctx, reuse)
    del effect["page_pinned"]  # chain collapse forgets the previous successor's pins
    return effect


def _publish_after_finish(I: Interp, st: SpecState, f: Val) -> Val:
    s = I.get(st["frame_scope"], f)
    finished = I.and_(
        I.eq(I.get(st["frame_state"], f), I.lit(IN_FLIGHT)),
        I.eq(I.get(st["frame_ver"], f), I.get(st["scope_epoch"], s)),
        I.eq(I.get(st["scope_mode"], s), I.lit(FINISHED)),
    )
    return I.or_(A.publish_guard(I, st, f), finished)


def _pause_advancing(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    effect = A.pause_effect(I, st, s)
    epoch = I.get(st["scope_epoch"], s)
    effect["scope_epoch"] = I.store(st["scope_epoch"], s, I.add(epoch, I.lit(1)))
    return effect


def _cancel_admitting(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    effect = A.cancel_effect(I, st, s)
    epoch = I.get(st["scope_epoch"], s)
    effect["scope_epoch"] = I.store(st["scope_epoch"], s, I.add(epoch, I.lit(1)))
    effect["scope_admitted"] = I.store(st["scope_admitted"], s, I.lit(True))
    return effect


SPEC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "spec_stale_token_published",
        "stale publication (token)",
        "spec",
        "publish is enabled for any in-flight token frame",
        (SPEC_ONE,),
        actions=_replace("publish", guard=_publish_stale(0)),
    ),
    Mutant(
        "spec_stale_commit_applied",
        "stale publication (commit gate)",
        "spec",
        "publish is enabled for any in-flight scheduler commit",
        (SPEC_ONE,),
        actions=_replace("publish", guard=_publish_stale(1)),
    ),
    Mutant(
        "spec_stale_state_installed",
        "stale publication (install gate)",
        "spec",
        "publish is enabled for any in-flight state install",
        (SPEC_ONE,),
        actions=_replace("publish", guard=_publish_stale(2)),
    ),
    Mutant(
        "spec_open_writer_adopted",
        "adopting an open-writer page",
        "spec",
        "certify and adopt no longer require the page's writer to be closed",
        (SPEC_ONE,),
        actions={
            **_replace("certify", guard=_certify_guard("writer")),
            "adopt": attrs.evolve(A.ACTION_BY_NAME["adopt"], guard=_handoff_guard("writer")),
        },
    ),
    Mutant(
        "spec_prefix_mismatch_adopted",
        "prefix mismatch",
        "spec",
        "certify and adopt no longer compare the page's prefix with the successor's context",
        (SPEC_ONE,),
        actions={
            **_replace("certify", guard=_certify_guard("prefix")),
            "adopt": attrs.evolve(A.ACTION_BY_NAME["adopt"], guard=_handoff_guard("prefix")),
        },
    ),
    Mutant(
        "spec_foreign_page_certified",
        "fingerprint mismatch",
        "spec",
        "certify takes matching-prefix pages of any owner and configuration fingerprint",
        (SPEC_TENANTS_REVISED,),
        actions=_replace("certify", guard=_certify_guard(("owner", "fingerprint"))),
    ),
    Mutant(
        "spec_generation_ignored",
        "generation reuse",
        "spec",
        "adopt no longer compares the ownership generation with the certificate",
        (SPEC_ONE,),
        actions=_replace("adopt", guard=_handoff_guard("generation")),
    ),
    Mutant(
        "spec_digest_ignored",
        "digest ignored",
        "spec",
        "adopt no longer compares the page's bytes with the certified digest",
        (SPEC_ONE,),
        actions=_replace("adopt", guard=_handoff_guard("digest")),
    ),
    Mutant(
        "spec_retired_writer_overwrites",
        "retired writer overwriting the successor's page",
        "spec",
        "a write lands whatever version of the owning scope the writer belongs to",
        (SPEC_TWO_PARTS,),
        actions=_replace("write", guard=_write_guard("version")),
    ),
    Mutant(
        "spec_cross_tenant_write",
        "cross-tenant write",
        "spec",
        "a write lands in an open page of any scope",
        (SPEC_TENANTS,),
        actions=_replace("write", guard=_write_guard("owner")),
    ),
    Mutant(
        "spec_free_while_pinned",
        "free while referenced",
        "spec",
        "free no longer waits for the handoff pin",
        (SPEC_ONE,),
        actions=_replace("free", guard=_free_pinned_guard),
    ),
    Mutant(
        "spec_evict_pinned",
        "free while referenced",
        "spec",
        "the engine may evict a cached page a successor has pinned",
        (SPEC_ONE,),
        actions=_replace("evict", guard=_free_pinned_guard),
    ),
    Mutant(
        "spec_chain_collapse_leaks",
        "chain collapse that leaks",
        "spec",
        "a revision keeps the pending successor's handoff pins",
        (SPEC_CHAIN,),
        actions=_replace("supersede", effect=_supersede_keeping_pins),
    ),
    Mutant(
        "spec_pause_loses_authority",
        "pause losing authority",
        "spec",
        "pause moves the scope to a new version",
        (SPEC_ONE,),
        actions=_replace("pause", effect=_pause_advancing),
    ),
    Mutant(
        "spec_finished_publishes",
        "stale publication (finish)",
        "spec",
        "publish stays enabled for the current version after it finished",
        (SPEC_ONE,),
        actions=_replace("publish", guard=_publish_after_finish),
    ),
    Mutant(
        "spec_cancel_creates_successor",
        "cancel creating a successor",
        "spec",
        "cancel moves the scope to a new, admitted version",
        (SPEC_ONE,),
        actions=_replace("cancel", effect=_cancel_admitting),
    ),
)

MUTANTS: dict[str, Mutant] = {m.name: m for m in CORE_MUTANTS + SPEC_MUTANTS}


# --- judging ------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Verdict:
    mutant: Mutant
    killed_by: tuple[str, ...]  # "explorer", "z3", "hypothesis"
    detail: dict[str, str]  # check -> what it found (or why it did not)
    counterexample: Counterexample | None
    seconds: float

    @property
    def killed(self) -> bool:
        return all(check in self.killed_by for check in self.mutant.required)


def z3_verdict(report: Any) -> str:
    """What Z3 said about a mutant's spec. Only a refutation kills: a query Z3 answered with a
    model (an initiation failure or a counterexample to induction: the mutant's invariants are
    no longer inductive) or a BMC trace from the initial state. A query that timed out or came
    back ``unknown`` kills nothing, however many of them there are."""
    refuted = report.refuted
    undecided = [c.name for c in report.checks if c.status == "unknown"]
    if report.bmc_status == "unknown":
        undecided.append("bmc")
    if refuted:
        return f"refuted (a model breaks it): {list(refuted[:4])}" + (
            f"; {len(undecided)} undecided" if undecided else ""
        )
    if undecided:
        return f"NOT refuted: {len(undecided)} queries unknown/timed out {undecided[:4]}"
    return "every invariant still proved"


def judge(
    mutant: Mutant,
    *,
    use_z3: bool = True,
    use_hypothesis: bool = False,
    max_states: int = 200_000,
    z3_timeout_ms: int = 10_000,
    bmc_depth: int = 0,
) -> Verdict:
    """Run the checks on one mutant. The explorer is always run (over the core for a core
    mutant, over the spec for a spec mutant); Z3 on spec mutants; Hypothesis on core mutants
    when asked."""
    t0 = time.perf_counter()
    killed: list[str] = []
    detail: dict[str, str] = {}
    cex: Counterexample | None = None
    for config in mutant.configs:
        capped = attrs.evolve(config, max_states=max_states)
        if mutant.level == "core":
            with mutant.active():
                result = explore(capped)
        else:
            result = explore_spec(capped, mutant.actions, max_states=max_states)
        if result.violation is not None:
            cex = result.violation
            killed.append("explorer")
            detail["explorer"] = (
                f"{config.name}: {len(cex.moves)} steps, {result.states:,} states: {cex.error}"
            )
            break
        detail["explorer"] = f"survived {config.name} ({result.states:,} states)"
    if use_z3 and mutant.level == "spec":
        from retire_checks.proofs import prove

        assert mutant.actions is not None
        # A model is its own witness of satisfiability, so the vacuity queries add nothing to
        # a kill; they are skipped here (``retire check`` runs them on the real spec).
        report = prove(
            actions=tuple(mutant.actions.values()),
            timeout_ms=z3_timeout_ms,
            bmc_depth=bmc_depth,
            check_vacuity=False,
        )
        detail["z3"] = z3_verdict(report)
        if report.refuted:
            killed.append("z3")
    if (use_hypothesis or "hypothesis" in mutant.required) and mutant.level == "core":
        try:
            from retire_checks.fuzz import run_machine
        except ModuleNotFoundError as err:  # hypothesis is a dev extra
            detail["hypothesis"] = f"not run ({err})"
        else:
            with mutant.active():
                failure = run_machine(max_examples=HYPOTHESIS_EXAMPLES)
            if failure is not None:
                killed.append("hypothesis")
                detail["hypothesis"] = f"{type(failure).__name__}"
            else:
                detail["hypothesis"] = f"survived {HYPOTHESIS_EXAMPLES} examples"
    return Verdict(mutant, tuple(killed), detail, cex, time.perf_counter() - t0)


def run_catalogue(
    names: list[str] | None = None,
    *,
    use_z3: bool = True,
    use_hypothesis: bool = False,
    progress: Callable[[Verdict], None] | None = None,
) -> list[Verdict]:
    """Judge the named mutants (all by default), in catalogue order."""
    verdicts = []
    for name in names or list(MUTANTS):
        verdict = judge(MUTANTS[name], use_z3=use_z3, use_hypothesis=use_hypothesis)
        if progress is not None:
            progress(verdict)
        verdicts.append(verdict)
    return verdicts


__all__ = [
    "CORE_MUTANTS",
    "MUTANTS",
    "SPEC_MUTANTS",
    "Mutant",
    "Verdict",
    "judge",
    "run_catalogue",
]
