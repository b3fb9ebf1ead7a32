"""RECLAIM: releasing what retired versions no longer need, and forgetting drained versions.

A page of a retired version (or of a cancelled or finished scope's own version) loses its execution
reference once every participant of that version has delivered its receipt and its writer is closed;
a page with neither reference nor handoff pin is freed, except the current version's pages the
engine's cache keeps (a finished version's completed pages, and those the engine stopped
referencing while the version runs: ``PageUnreferenced``), which stay tracked until a revision
certifies or frees them, a cancel frees them, or the engine evicts them (a preempted version's
pages are freed at once: ``free_current``). A retired version with no participant running and no
page left is moved to the bounded ledger, so that the core's state stays small while late events
for it can still be classified. Reclamation never waits in the successor's path: it runs whenever a
receipt, writer closure or adoption makes progress possible, and never frees a pinned or
referenced page.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable

from retire_core.commands import Free, ReleaseToCache
from retire_core.frozen import FrozenMap
from retire_core.ids import PageId, ScopeId, Version
from retire_core.state import PageRecord, ScopeRecord, ScopeState, evolve
from retire_core.transitions import Stage
from retire_core.txn import PageDict, Txn

# scopes whose current version has lost authority too: its pages are reclaimed like a retired one's
_ENDED = (ScopeState.CANCELLED, ScopeState.FINISHED)
_FINISHED = ScopeState.FINISHED
_RECLAIM = Stage.RECLAIM
_UNHELD = (("held", False),)


def reclaim(txn: Txn, scope: ScopeId) -> None:
    rec = txn.read_scope(scope)
    pages = txn.rpages
    changes = pages.changes if isinstance(pages, PageDict) else 0
    memo = txn.clean.get(scope)
    if memo is not None and memo[0] is rec and memo[1] is pages and memo[2] == changes:
        # Checked clean earlier in this step (or batch), and since then neither the scope's
        # record nor any page's owner, version or ``held`` flag has changed, and no page has
        # been added: it is still clean (a batch of writer closures pays the scan once).
        return
    ended = rec.state in _ENDED
    epoch = rec.epoch
    kinds = txn.page_kinds(scope)
    if (
        not ended
        and all(r.version >= epoch for r in rec.participants.values())
        and all(v >= epoch for v, _ in kinds)
    ):
        # Nothing of this scope is obsolete (no retired version has a participant or a page)
        # and every page of it is the current version's, held or in the engine's cache: the
        # full pass below would unhold, free and forget nothing, in any state. Skip it, and
        # leave the page map unthawed.
        txn.clean[scope] = (rec, pages, changes)
        return
    drained: dict[int, bool] = {}  # ``rec.drained(v)``, asked once per version
    if _nothing_drained(rec, kinds, drained):
        return
    finished = rec.state is _FINISHED
    # per version, in page order: the pages this pass unholds, and those it frees
    unheld: dict[Version, list[PageId]] = {}
    freed: dict[Version, list[PageId]] = {}
    cached: list[int] = []
    live: set[int] = set()  # the versions of the pages that stay
    # Each page is read once, from the view as it was before the pass (a page the pass has not
    # reached yet is the same there); the page map is thawed only when a page changes.
    view = txn.rpages
    for p in sorted(txn.owned_pages(scope)):
        page = view[p]
        if page.held and (ended or page.version < epoch) and not page.writer_open:
            v = page.version
            done = drained.get(v)
            if done is None:
                done = drained[v] = rec.drained(v)
            if done:
                unheld.setdefault(v, []).append(p)
                if page.pinned or (finished and v == epoch and _inheritable(page)):
                    # pinned: the successor's; a finished version's completed page: back to
                    # the engine's cache, where a later revision may still have it certified
                    txn.pages[p] = evolve(page, held=False)
                    if not page.pinned:
                        cached.append(p)
                    live.add(v)
                    continue
                # unheld and unpinned: freed right away (the unheld copy would never be read)
                del txn.pages[p]
                freed.setdefault(v, []).append(p)
                continue
        if (
            not page.held
            and not page.pinned
            and (page.version != epoch or (ended and not finished))
        ):
            del txn.pages[p]
            freed.setdefault(page.version, []).append(p)
            continue
        live.add(page.version)
    # Every unhold before every free: a page is freed only once unheld, and the per-page steps
    # of different pages commute (each touches its own page).
    for v in sorted(unheld):
        txn.record_pages("unhold", _RECLAIM, scope, v, tuple(unheld[v]), _UNHELD)
    for v in sorted(freed):
        txn.record_pages("free", _RECLAIM, scope, v, tuple(freed[v]))
    if freed:
        txn.emit(Free(tuple(sorted(p for pages in freed.values() for p in pages))))
    if cached:
        txn.emit(ReleaseToCache(tuple(cached)))
    _forget_drained_versions(txn, scope, rec, live, drained)


def _inheritable(page: PageRecord) -> bool:
    """A completed page holding a block of its version's context (one a successor could have
    certified)."""
    return page.full and page.prefix is not None


def _nothing_drained(
    rec: ScopeRecord, kinds: Collection[tuple[int, bool]], drained: dict[int, bool]
) -> bool:
    """Would RECLAIM's full pass find nothing to do, without reading a page? True when every
    page is held or a live scope's current version's in the engine's cache (nothing to free)
    and no retired version has drained (nothing to unhold or forget): a fence in progress, its
    receipts still due. ``drained`` gets what it learns."""
    ended = rec.state in _ENDED
    epoch = rec.epoch
    # an unheld page of a live scope's current version is in the engine's cache: nothing to do
    if not all(held or (v == epoch and not ended) for v, held in kinds):
        return False
    retired = {v for v, _ in kinds if ended or v < epoch}
    retired.update(r.version for r in rec.participants.values() if ended or r.version < epoch)
    for v in retired:
        drained[v] = rec.drained(v)
        if drained[v]:
            return False
    return True


def _forget_drained_versions(
    txn: Txn, scope: ScopeId, rec: ScopeRecord, live_versions: set[int], drained: dict[int, bool]
) -> None:
    """Move drained retired versions of ``scope`` with no page left (``live_versions``: the
    versions of the scope's remaining pages) to the ledger. ``rec`` is the scope's record
    (RECLAIM changes no scope before this), ``drained`` what it already knows of
    ``rec.drained``."""
    ended = rec.state in _ENDED
    epoch = rec.epoch
    gone = []
    for v in sorted({r.version for r in rec.participants.values()}):
        if (ended or v < epoch) and v not in live_versions:
            done = drained.get(v)
            if done is None:
                done = drained[v] = rec.drained(v)
            if done:
                gone.append(v)
    if not gone:
        return
    participants = FrozenMap((q, r) for q, r in rec.participants.items() if r.version not in gone)
    txn.scopes[scope] = evolve(rec, participants=participants)
    for v in gone:
        txn.ledger.append((scope, v))


def free_current(txn: Txn, scope: ScopeId, version: Version, pages: Iterable[PageId]) -> None:
    """Free unheld, unpinned ``pages`` of ``scope``'s current version: a preempted version's,
    which its next run computes again (RECLAIM keeps the current version's unheld pages, as the
    engine's cache does)."""
    freed = tuple(sorted(pages))
    if not freed:
        return
    for p in freed:
        del txn.pages[p]
    txn.record_pages("free", _RECLAIM, scope, version, freed)
    txn.emit(Free(freed))
