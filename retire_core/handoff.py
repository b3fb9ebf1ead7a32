"""ALIGN and RESUME: which predecessor pages the successor may inherit, and installing them.

``certify_prefix`` walks the revised context block by block and certifies the longest prefix of
completed, full, writer-closed pages of the scope's retired versions whose prefix identity and
configuration fingerprint match; it waits while a matching page's writer is still open (FENCE
will close it), skips pinning entirely when the contract says reuse is not worth it (a cold
successor), and otherwise pins the certificate and asks the engine for a byte check.
``verify_adoption`` compares that check with the certificate (generation and digest) and adopts
the longest still-valid prefix; the rest is released and recomputed. Rule 2 (versioned handoff)
is decided here and nowhere else.
"""

from __future__ import annotations

from retire_core.commands import Admit, Adopt, CertEntry, Certificate, PinCertified, Unpin
from retire_core.contract import ReusePolicy
from retire_core.errors import ReportMismatchError
from retire_core.events import AdoptionReport
from retire_core.ids import PageId, ScopeId
from retire_core.reasons import ReleaseReason, UnpinReason
from retire_core.state import PageRecord, ScopeRecord, ScopeState, evolve
from retire_core.transitions import Stage
from retire_core.txn import Txn

_PINNED = (("pinned", True),)


def _candidates(
    txn: Txn, scope: ScopeId, rec: ScopeRecord
) -> dict[int, list[tuple[PageId, PageRecord]]]:
    by_position: dict[int, list[tuple[PageId, PageRecord]]] = {}
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
            by_position.setdefault(page.position, []).append((p, page))
    return by_position


def longest_certifiable_prefix(
    txn: Txn, scope: ScopeId, rec: ScopeRecord
) -> tuple[list[tuple[PageId, PageRecord]], bool]:
    """The chain of certifiable pages from block 0, and whether it stopped at a page whose
    writer is still open (then ALIGN must wait rather than cut the prefix short)."""
    by_position = _candidates(txn, scope, rec)
    chain: list[tuple[PageId, PageRecord]] = []
    for i in range(len(rec.context)):
        here = by_position.get(i, [])
        done = [(p, pg) for p, pg in here if pg.full and not pg.writer_open]
        if len(done) == 1:  # the common case: one page per position
            chain.append(done[0])
            continue
        if done:
            # Prefer the newest retired version's page, then the lowest id: deterministic.
            chain.append(min(done, key=lambda item: (-item[1].version, item[0])))
            continue
        return chain, any(pg.writer_open for _, pg in here)
    return chain, False


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
    chain, pending = longest_certifiable_prefix(txn, scope, rec)
    if pending:
        return
    worth_it = len(chain) >= (
        rec.contract.min_reuse_blocks if rec.contract.reuse is ReusePolicy.AUTO else 1
    )
    if not chain or not worth_it:
        admit(txn, scope, 0, cold=True)
        return
    entries = []
    for p, page in chain:
        assert page.digest is not None  # full and writer-closed pages carry their digest
        txn.pages[p] = evolve(page, pinned=True)
        entry = CertEntry(
            p, page.position, page.generation, page.prefix or 0, page.fingerprint, page.digest
        )
        entries.append(entry)
        txn.record_page(
            "certify",
            Stage.ALIGN,
            scope,
            rec.epoch,
            p,
            _PINNED,
            (("position", page.position), ("generation", page.generation), ("digest", page.digest)),
        )
    certificate = Certificate(scope, rec.epoch, tuple(entries))
    txn.scopes[scope] = evolve(rec, certificate=certificate)
    txn.emit(PinCertified(certificate))


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
    adopted: list[PageId] = []
    released: list[PageId] = []
    failure: ReleaseReason | None = None
    for entry in certificate.entries:
        page = txn.pages.get(entry.page)
        if failure is None:
            if page is None or not page.pinned:
                failure = ReleaseReason.PAGE_LOST
            elif page.generation != entry.generation:
                failure = ReleaseReason.GENERATION_CHANGED
            elif reported[entry.page] != entry.digest:
                failure = ReleaseReason.DIGEST_MISMATCH
        if page is None:
            continue
        if failure is None:
            txn.pages[entry.page] = evolve(page, version=rec.epoch, held=True, pinned=False)
            adopted.append(entry.page)
            txn.record_page(
                "adopt",
                Stage.RESUME,
                scope,
                rec.epoch,
                entry.page,
                (("version", rec.epoch), ("held", True), ("pinned", False)),
                # the bytes the engine reported: trace validation checks them against the
                # digest the page's writer closed with, independently of this comparison
                (("position", entry.position), ("digest", reported[entry.page])),
            )
        elif page.pinned:
            txn.pages[entry.page] = evolve(page, pinned=False)
            released.append(entry.page)
            txn.record(
                "release",
                Stage.RESUME,
                scope,
                rec.epoch,
                reason=failure,
                changed={"pinned": False},
                page=entry.page,
                position=entry.position,
                digest=reported[entry.page],
            )
    if adopted:
        txn.emit(Adopt(scope, rec.epoch, tuple(adopted)))
    if released and failure is not None:  # a page is released only once a failure is found
        txn.emit(Unpin(tuple(released), failure))
    admit(txn, scope, len(adopted), cold=False)
