"""RECLAIM: releasing what retired versions no longer need, and forgetting drained versions.

A page of a retired (or cancelled) version loses its execution reference once every participant
of that version has delivered its receipt and its writer is closed; a page with neither reference
nor handoff pin is freed. A retired version with no participant running and no page left is
moved to the bounded ledger, so that the core's state stays small while late events for it can
still be classified. Reclamation never waits in the successor's path: it runs whenever a receipt,
writer closure or adoption makes progress possible, and never frees a pinned or referenced page.
"""

from __future__ import annotations

import attrs

from retire_core.commands import Free
from retire_core.frozen import FrozenMap
from retire_core.ids import ScopeId
from retire_core.state import ScopeState
from retire_core.transitions import Stage
from retire_core.txn import Txn


def reclaim(txn: Txn, scope: ScopeId) -> None:
    rec = txn.scopes[scope]
    cancelled = rec.state is ScopeState.CANCELLED
    epoch = rec.epoch
    if (
        not cancelled
        and all(r.version >= epoch for r in rec.participants.values())
        and not any(
            page.owner == scope and (page.version < epoch or not page.held)
            for page in txn.read_pages().values()
        )
    ):
        # Nothing of this scope is obsolete (no retired version has a participant or a page)
        # and every page of it is held: the full pass below would unhold, free and forget
        # nothing, in any state. Skip it, and leave the page map unthawed.
        return
    pages = txn.pages
    mine = sorted(p for p, page in pages.items() if page.owner == scope)
    freed = []
    for p in mine:
        page = pages[p]
        obsolete = cancelled or page.version < epoch
        if page.held and obsolete and not page.writer_open and rec.drained(page.version):
            page = attrs.evolve(page, held=False)
            pages[p] = page
            txn.record(
                "unhold", Stage.RECLAIM, scope, page.version, changed={"held": False}, page=p
            )
        if not page.held and not page.pinned:
            del pages[p]
            freed.append(p)
            txn.record("free", Stage.RECLAIM, scope, page.version, page=p)
    if freed:
        txn.emit(Free(tuple(freed)))
    _forget_drained_versions(txn, scope, {pages[p].version for p in mine if p in pages})


def _forget_drained_versions(txn: Txn, scope: ScopeId, live_versions: set[int]) -> None:
    """Move drained retired versions of ``scope`` with no page left (``live_versions``: the
    versions of the scope's remaining pages) to the ledger."""
    rec = txn.scopes[scope]
    cancelled = rec.state is ScopeState.CANCELLED
    versions = {r.version for r in rec.participants.values()}
    gone = sorted(
        v
        for v in versions
        if (cancelled or v < rec.epoch) and rec.drained(v) and v not in live_versions
    )
    if not gone:
        return
    participants = FrozenMap((q, r) for q, r in rec.participants.items() if r.version not in gone)
    txn.scopes[scope] = attrs.evolve(rec, participants=participants)
    for v in gone:
        txn.ledger.append((scope, v))
