"""ALIGN and RESUME: which predecessor pages the successor may inherit, and installing them.

``certify_prefix`` finds the longest prefix of the revised context (the *cut*, in blocks) whose
every required page is a completed, full, writer-closed page of the scope's retired versions
with matching prefix identity and configuration fingerprint, and certifies those pages; it waits
while a matching page's writer is still open (FENCE will close it), skips pinning entirely when
the contract says reuse is not worth it (a cold successor), and otherwise pins the certificate
and asks the engine for a byte check. ``verify_adoption`` compares that check with the
certificate (generation and digest) and adopts the longest cut whose required pages are all
still valid; the rest is released and recomputed. With several KV cache groups
(``Contract.kv_windows``) a cut's required pages are, in a full-attention group, every block
before it, and in a sliding-window group of ``w`` blocks only the ``w`` blocks ending at it: its
layers read nothing earlier, so earlier blocks are not state a successor can observe
(``required_slots``, ``best_cut``). Rule 2 (versioned handoff) is decided here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Container

from retire_core.commands import Admit, Adopt, CertEntry, Certificate, PinCertified, Unpin
from retire_core.contract import ReusePolicy
from retire_core.errors import ReportMismatchError
from retire_core.events import AdoptionReport
from retire_core.ids import PageId, ScopeId
from retire_core.reasons import ReleaseReason, UnpinReason
from retire_core.state import PageRecord, ScopeRecord, ScopeState, evolve
from retire_core.transitions import Column, Stage
from retire_core.txn import Txn

_PINNED = (("pinned", True),)


#: A page's place in a successor's KV cache: (KV cache group, block position).
Slot = tuple[int, int]


def _candidates(
    txn: Txn, scope: ScopeId, rec: ScopeRecord
) -> dict[Slot, list[tuple[PageId, PageRecord]]]:
    by_slot: dict[Slot, list[tuple[PageId, PageRecord]]] = {}
    n = len(rec.context)
    pages = txn.read_pages()
    for p in txn.owned_pages(scope):
        page = pages[p]
        if (
            page.version < rec.epoch
            and not page.pinned
            and page.position < n
            and page.prefix is not None
            and page.fingerprint == rec.fingerprint
            and page.prefix == rec.context[page.position]
        ):
            by_slot.setdefault((page.group, page.position), []).append((p, page))
    return by_slot


def required_slots(windows: tuple[int, ...], cut: int) -> list[Slot]:
    """The slots a successor inheriting ``cut`` leading blocks reads, by position then group:
    every block before the cut in a full-attention group (window 0), the last ``w`` in a group
    with a sliding window of ``w`` blocks. (A page of a group the contract does not name is in
    no such slot.)"""
    lows = [max(0, cut - w) if w else 0 for w in windows]
    return [(g, i) for i in range(cut) for g, low in enumerate(lows) if i >= low]


def best_cut(present: Container[Slot], windows: tuple[int, ...], n: int) -> int:
    """The largest cut, at most ``n`` blocks, whose every required slot is ``present``."""
    limit = n
    for g, w in enumerate(windows):
        if not w:  # full attention: the cut stops at the group's first gap
            i = 0
            while i < limit and (g, i) in present:
                i += 1
            limit = i
    # per sliding-window group: its window, and how many present positions end at each one
    runs: list[tuple[int, list[int]]] = []
    for g, w in enumerate(windows):
        if w:
            run, length = [], 0
            for i in range(limit):
                length = length + 1 if (g, i) in present else 0
                run.append(length)
            runs.append((w, run))
    for cut in range(limit, 0, -1):
        if all(run[cut - 1] >= min(w, cut) for w, run in runs):
            return cut
    return 0


def longest_certifiable_prefix(
    txn: Txn, scope: ScopeId, rec: ScopeRecord
) -> tuple[int, list[tuple[PageId, PageRecord]], bool]:
    """The longest certifiable cut, its required pages (by position, then group), and whether
    a longer cut waits for a page whose writer is still open (then ALIGN must wait rather than
    cut the prefix short)."""
    by_slot = _candidates(txn, scope, rec)
    windows, n = rec.contract.kv_windows, len(rec.context)
    done: dict[Slot, tuple[PageId, PageRecord]] = {}
    maybe: set[Slot] = set()
    for slot, here in by_slot.items():
        complete = [(p, pg) for p, pg in here if pg.full and not pg.writer_open]
        if len(complete) == 1:  # the common case: one page per slot
            done[slot] = complete[0]
        elif complete:
            # Prefer the newest retired version's page, then the lowest id: deterministic.
            done[slot] = min(complete, key=lambda item: (-item[1].version, item[0]))
        if complete or any(pg.writer_open for _, pg in here):
            maybe.add(slot)
    cut = best_cut(done, windows, n)
    chain = [done[slot] for slot in required_slots(windows, cut)]
    return cut, chain, best_cut(maybe, windows, n) > cut


def admit(txn: Txn, scope: ScopeId, adopted_blocks: int, cold: bool) -> None:
    rec = txn.scopes[scope]
    txn.scopes[scope] = evolve(rec, state=ScopeState.ACTIVE, admitted=True, certificate=None)
    txn.emit(Admit(scope, rec.epoch, adopted_blocks, cold))
    txn.record(
        "resume",
        Stage.RESUME,
        scope,
        rec.epoch,
        changed={"state": ScopeState.ACTIVE, "admitted": True},
        adopted_blocks=adopted_blocks,
        cold=cold,
    )


def certify_prefix(txn: Txn, scope: ScopeId) -> None:
    """ALIGN for a scope whose successor is pending (no-op otherwise)."""
    rec = txn.read_scope(scope)
    if rec.state is not ScopeState.ALIGNING or rec.certificate is not None:
        return
    if not rec.contract.allows_reuse:
        admit(txn, scope, 0, cold=True)
        return
    cut, chain, pending = longest_certifiable_prefix(txn, scope, rec)
    if pending:
        return
    worth_it = cut >= (
        rec.contract.min_reuse_blocks if rec.contract.reuse is ReusePolicy.AUTO else 1
    )
    if not cut or not worth_it:
        admit(txn, scope, 0, cold=True)
        return
    entries = []
    for p, page in chain:
        assert page.digest is not None  # full and writer-closed pages carry their digest
        txn.pages[p] = evolve(page, pinned=True)
        entries.append(
            CertEntry(
                p,
                page.position,
                page.generation,
                page.prefix or 0,
                page.fingerprint,
                page.digest,
                page.group,
            )
        )
    txn.record_pages(
        "certify",
        Stage.ALIGN,
        scope,
        rec.epoch,
        tuple(p for p, _ in chain),
        _PINNED,
        (
            ("position", tuple(e.position for e in entries)),
            ("generation", tuple(e.generation for e in entries)),
            ("digest", tuple(e.digest for e in entries)),
            *_groups(entries),
        ),
    )
    certificate = Certificate(scope, rec.epoch, tuple(entries))
    txn.scopes[scope] = evolve(rec, certificate=certificate)
    txn.emit(PinCertified(certificate))


def _groups(entries: list[CertEntry]) -> tuple[Column, ...]:
    """The ``group`` column of a transition over these pages, if one of them is not in group 0
    (a page of group 0 has no ``group``)."""
    if not any(e.group for e in entries):
        return ()
    return (("group", tuple(e.group or None for e in entries)),)


def release_certificate(txn: Txn, scope: ScopeId, reason: UnpinReason) -> None:
    """Drop every pin of the scope's pending certificate (chain collapse, cancel)."""
    rec = txn.read_scope(scope)
    if rec.certificate is None:
        return
    released = []
    for entry in rec.certificate.entries:
        page = txn.pages.get(entry.page)
        if page is not None and page.pinned:
            txn.pages[entry.page] = evolve(page, pinned=False)
            released.append(entry.page)
    txn.scopes[scope] = evolve(rec, certificate=None)
    if released:
        txn.emit(Unpin(tuple(released), reason))


def verify_adoption(txn: Txn, event: AdoptionReport) -> None:
    """RESUME: adopt the longest prefix whose generation and bytes still match the certificate."""
    scope = event.scope
    rec = txn.scopes[scope]
    certificate = rec.certificate
    assert certificate is not None
    reported = {d.page: d.digest for d in event.digests}
    if len(reported) != len(event.digests) or set(reported) != set(certificate.pages):
        raise ReportMismatchError(
            f"the report for {scope}@{event.version} must give one digest for each certified "
            f"page {sorted(certificate.pages)}, got {sorted(d.page for d in event.digests)}"
        )
    # The first failure in the certificate's order names why the rest is released.
    failure: ReleaseReason | None = None
    valid: set[Slot] = set()
    for entry in certificate.entries:
        page = txn.pages.get(entry.page)
        if page is None or not page.pinned:
            problem: ReleaseReason | None = ReleaseReason.PAGE_LOST
        elif page.generation != entry.generation:
            problem = ReleaseReason.GENERATION_CHANGED
        elif reported[entry.page] != entry.digest:
            problem = ReleaseReason.DIGEST_MISMATCH
        else:
            problem = None
            valid.add((entry.group, entry.position))
        failure = failure or problem
    windows = rec.contract.kv_windows
    cut = best_cut(valid, windows, len(rec.context))
    kept = set(required_slots(windows, cut))
    adopted: list[CertEntry] = []
    released: list[CertEntry] = []
    for entry in certificate.entries:
        page = txn.pages.get(entry.page)
        if page is None:
            continue
        if (entry.group, entry.position) in kept:
            txn.pages[entry.page] = evolve(page, version=rec.epoch, held=True, pinned=False)
            adopted.append(entry)
        elif page.pinned:
            txn.pages[entry.page] = evolve(page, pinned=False)
            released.append(entry)
    # the bytes the engine reported: trace validation checks an adopted page's against the
    # digest its writer closed with, independently of the comparison above
    txn.record_pages(
        "adopt",
        Stage.RESUME,
        scope,
        rec.epoch,
        tuple(e.page for e in adopted),
        (("version", rec.epoch), ("held", True), ("pinned", False)),
        (
            ("position", tuple(e.position for e in adopted)),
            ("digest", tuple(reported[e.page] for e in adopted)),
            *_groups(adopted),
        ),
    )
    if adopted:
        txn.emit(Adopt(scope, rec.epoch, tuple(e.page for e in adopted)))
    txn.record_pages(
        "release",
        Stage.RESUME,
        scope,
        rec.epoch,
        tuple(e.page for e in released),
        (("pinned", False),),
        (
            ("position", tuple(e.position for e in released)),
            ("digest", tuple(reported[e.page] for e in released)),
        ),
        failure,
    )
    if released and failure is not None:  # a page is released only once a failure is found
        txn.emit(Unpin(tuple(e.page for e in released), failure))
    admit(txn, scope, cut, cold=False)
