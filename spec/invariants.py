"""The properties every reachable state must have, and those a quiescent state must have.

``INVARIANTS`` hold in every state: the three rules (through the history columns their actions
record), the page accounting rules, pause and cancel semantics. ``QUIESCENCE`` holds in a terminal
state of a bounded run (nothing left to do): no obsolete page, pin or participant is left, and
every live scope's final version has been admitted (progress once revisions stop). Each property is
one function of an interpretation, so the explorer evaluates it and Z3 proves it from this text.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from .expr import Concrete, Interp, Val
from .schema import (
    ACTIVE,
    CANCELLED,
    COMMIT,
    DROPPED,
    FINISHED,
    IN_FLIGHT,
    INSTALL,
    PAUSED,
    PUBLISHED,
    TOKEN,
    Bounds,
    SpecState,
)


@attrs.frozen(slots=True)
class Invariant:
    name: str
    text: str
    holds: Callable[[Interp, SpecState], Val]


def _publication(kind: int) -> Callable[[Interp, SpecState], Val]:
    def holds(I: Interp, st: SpecState) -> Val:
        state, k, ok = st["frame_state"], st["frame_kind"], st["frame_pub_ok"]
        return I.forall(
            "Frame",
            lambda f: I.implies(
                I.and_(I.eq(I.get(state, f), I.lit(PUBLISHED)), I.eq(I.get(k, f), I.lit(kind))),
                I.get(ok, f),
            ),
        )

    return holds


def _no_lost_frame(I: Interp, st: SpecState) -> Val:
    state, ok = st["frame_state"], st["frame_drop_ok"]
    return I.forall(
        "Frame", lambda f: I.implies(I.eq(I.get(state, f), I.lit(DROPPED)), I.get(ok, f))
    )


def _versioned_handoff(I: Interp, st: SpecState) -> Val:
    ok = st["page_adopt_ok"]
    return I.forall("Page", lambda p: I.get(ok, p))


def _isolation(I: Interp, st: SpecState) -> Val:
    ok = st["page_write_ok"]
    return I.forall("Page", lambda p: I.get(ok, p))


def _coordinated_closure(I: Interp, st: SpecState) -> Val:
    ok = st["page_release_ok"]
    return I.forall("Page", lambda p: I.get(ok, p))


def _no_free_while_pinned_or_held(I: Interp, st: SpecState) -> Val:
    alloc, pinned, held = st["page_alloc"], st["page_pinned"], st["page_held"]
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.not_(I.get(alloc, p)), I.and_(I.not_(I.get(pinned, p)), I.not_(I.get(held, p)))
        ),
    )


def _pins_belong_to_pending_successor(I: Interp, st: SpecState) -> Val:
    """A handoff pin is held only for the scope's *current* pending successor on a completed,
    writer-closed page of that scope: chain collapse and cancel leave no stale pin behind."""
    pinned, cs, cv = st["page_pinned"], st["page_cert_scope"], st["page_cert_ver"]
    epoch, admitted, mode = st["scope_epoch"], st["scope_admitted"], st["scope_mode"]

    def one(p: Val) -> Val:
        s = I.get(cs, p)
        return I.implies(
            I.get(pinned, p),
            I.and_(
                I.get(st["page_alloc"], p),
                I.eq(I.get(st["page_owner"], p), s),
                I.not_(I.get(st["page_writer"], p)),
                I.get(st["page_full"], p),
                I.eq(I.get(cv, p), I.get(epoch, s)),
                I.not_(I.get(admitted, s)),
                I.or_(I.eq(I.get(mode, s), I.lit(ACTIVE)), I.eq(I.get(mode, s), I.lit(PAUSED))),
            ),
        )

    return I.forall("Page", one)


def _current_pages_honest(I: Interp, st: SpecState) -> Val:
    """Every completed page the current version reads holds the bytes of its own context."""

    def one(p: Val) -> Val:
        s = I.get(st["page_owner"], p)
        return I.implies(
            I.and_(
                I.get(st["page_alloc"], p),
                I.get(st["page_held"], p),
                I.eq(I.get(st["page_over"], p), I.get(st["scope_epoch"], s)),
                I.not_(I.get(st["page_writer"], p)),
                I.get(st["page_full"], p),
            ),
            I.and_(
                I.eq(I.get(st["page_data"], p), I.get(st["page_tok"], p)),
                I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
            ),
        )

    return I.forall("Page", one)


def _certified_bytes_verified(I: Interp, st: SpecState) -> Val:
    """A certificate records only verified bytes: the digest certified for a pinned page is its
    prefix's honest content, never that of unverified or rolled-back draft tokens."""
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.and_(I.get(st["page_alloc"], p), I.get(st["page_pinned"], p)),
            I.eq(I.get(st["page_cert_digest"], p), I.get(st["page_tok"], p)),
        ),
    )


def _closed_writer_holds_no_drafts(I: Interp, st: SpecState) -> Val:
    """Drafts live only under an open writer: closing it settles them (rolls them back)."""
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.and_(I.get(st["page_alloc"], p), I.not_(I.get(st["page_writer"], p))),
            I.not_(I.get(st["page_draft"], p)),
        ),
    )


def _pause_keeps_authority(I: Interp, st: SpecState) -> Val:
    mode, epoch, at = st["scope_mode"], st["scope_epoch"], st["scope_pause_epoch"]
    return I.forall(
        "Scope",
        lambda s: I.implies(
            I.eq(I.get(mode, s), I.lit(PAUSED)), I.eq(I.get(epoch, s), I.get(at, s))
        ),
    )


def _cancel_no_successor(I: Interp, st: SpecState) -> Val:
    mode, epoch, at, admitted = (
        st["scope_mode"],
        st["scope_epoch"],
        st["scope_cancel_epoch"],
        st["scope_admitted"],
    )
    scope_ok = I.forall(
        "Scope",
        lambda s: I.implies(
            I.eq(I.get(mode, s), I.lit(CANCELLED)),
            I.and_(I.eq(I.get(epoch, s), I.get(at, s)), I.not_(I.get(admitted, s))),
        ),
    )
    parts_ok = I.forall(
        "Part",
        lambda q: I.implies(
            I.and_(
                I.get(st["part_used"], q),
                I.eq(I.get(mode, I.get(st["part_scope"], q)), I.lit(CANCELLED)),
            ),
            I.le(I.get(st["part_ver"], q), I.get(at, I.get(st["part_scope"], q))),
        ),
    )
    return I.and_(scope_ok, parts_ok)


def _no_future_work(I: Interp, st: SpecState) -> Val:
    """Authority is single: no participant, frame or page carries a version beyond the current."""
    epoch = st["scope_epoch"]
    parts = I.forall(
        "Part",
        lambda q: I.implies(
            I.get(st["part_used"], q),
            I.le(I.get(st["part_ver"], q), I.get(epoch, I.get(st["part_scope"], q))),
        ),
    )
    pages = I.forall(
        "Page",
        lambda p: I.implies(
            I.get(st["page_alloc"], p),
            I.le(I.get(st["page_over"], p), I.get(epoch, I.get(st["page_owner"], p))),
        ),
    )
    return I.and_(parts, pages)


INVARIANTS: tuple[Invariant, ...] = (
    Invariant(
        "publication_token",
        "A token frame is published only while its version is current.",
        _publication(TOKEN),
    ),
    Invariant(
        "publication_commit",
        "A scheduler commit is applied only while its version is current.",
        _publication(COMMIT),
    ),
    Invariant(
        "publication_install",
        "Transferred state is installed only while its version is current.",
        _publication(INSTALL),
    ),
    Invariant(
        "no_lost_frame",
        "A frame is dropped only if its version is no longer current: nothing is silently lost.",
        _no_lost_frame,
    ),
    Invariant(
        "versioned_handoff",
        "Every adopted page matched prefix and configuration, was writer-closed, and still had "
        "its certified generation and bytes.",
        _versioned_handoff,
    ),
    Invariant(
        "retired_state_isolation",
        "Every page write came from the owning version's open writer.",
        _isolation,
    ),
    Invariant(
        "no_free_while_pinned_or_referenced",
        "A free page carries no handoff pin and no live reference.",
        _no_free_while_pinned_or_held,
    ),
    Invariant(
        "coordinated_closure",
        "No page loses its execution reference (a page is freed, given back to the engine's "
        "cache, evicted or reallocated only after that) while any participant of its version, "
        "on any rank, has not delivered its receipt (or, for one completed page, reported that "
        "none of them references it any more: a sliding window passed it).",
        _coordinated_closure,
    ),
    Invariant(
        "pins_belong_to_pending_successor",
        "Handoff pins exist only on completed, writer-closed pages for the current pending "
        "successor of a live (active or paused) scope.",
        _pins_belong_to_pending_successor,
    ),
    Invariant(
        "current_pages_honest",
        "Every completed page a current version references holds its own context's bytes.",
        _current_pages_honest,
    ),
    Invariant(
        "certified_bytes_verified",
        "A certificate records only verified bytes: a pinned page's certified digest equals its "
        "prefix identity, so no page holding unverified or rolled-back draft tokens is ever "
        "certified.",
        _certified_bytes_verified,
    ),
    Invariant(
        "closed_writer_holds_no_drafts",
        "A page whose writer has closed holds no unverified draft tokens.",
        _closed_writer_holds_no_drafts,
    ),
    Invariant(
        "pause_keeps_authority",
        "A paused scope keeps the version it had when paused.",
        _pause_keeps_authority,
    ),
    Invariant(
        "cancel_no_successor",
        "A cancelled scope never gains a successor or admits work.",
        _cancel_no_successor,
    ),
    Invariant(
        "no_future_work",
        "No participant or page carries a version beyond its scope's current one.",
        _no_future_work,
    ),
)


def _no_leak(I: Interp, st: SpecState) -> Val:
    """Every allocated page belongs to a live scope's current version (not a cancelled one;
    a finished version's pages are given back: no execution references them, the engine's
    cache may keep them for a later revision), and no pin remains."""

    def one(p: Val) -> Val:
        s = I.get(st["page_owner"], p)
        return I.implies(
            I.get(st["page_alloc"], p),
            I.and_(
                I.eq(I.get(st["page_over"], p), I.get(st["scope_epoch"], s)),
                I.not_(I.eq(I.get(st["scope_mode"], s), I.lit(CANCELLED))),
                I.implies(
                    I.eq(I.get(st["scope_mode"], s), I.lit(FINISHED)),
                    I.not_(I.get(st["page_held"], p)),
                ),
                I.not_(I.get(st["page_pinned"], p)),
            ),
        )

    return I.forall("Page", one)


def _obsolete_closed(I: Interp, st: SpecState) -> Val:
    def one(q: Val) -> Val:
        s = I.get(st["part_scope"], q)
        obsolete = I.or_(
            I.lt(I.get(st["part_ver"], q), I.get(st["scope_epoch"], s)),
            I.eq(I.get(st["scope_mode"], s), I.lit(CANCELLED)),
            I.eq(I.get(st["scope_mode"], s), I.lit(FINISHED)),
        )
        return I.implies(I.and_(I.get(st["part_used"], q), obsolete), I.get(st["part_closed"], q))

    return I.forall("Part", one)


def _finals_admitted(I: Interp, st: SpecState) -> Val:
    mode, admitted = st["scope_mode"], st["scope_admitted"]
    return I.forall(
        "Scope",
        lambda s: I.implies(I.eq(I.get(mode, s), I.lit(ACTIVE)), I.get(admitted, s)),
    )


def _queues_drained(I: Interp, st: SpecState) -> Val:
    state = st["frame_state"]
    return I.forall("Frame", lambda f: I.not_(I.eq(I.get(state, f), I.lit(IN_FLIGHT))))


QUIESCENCE: tuple[Invariant, ...] = (
    Invariant("no_leak", "No obsolete page or handoff pin outlives quiescence.", _no_leak),
    Invariant(
        "obsolete_closed", "Every obsolete participant has delivered its receipt.", _obsolete_closed
    ),
    Invariant(
        "finals_admitted",
        "Once revisions stop, every live scope's final version is admitted.",
        _finals_admitted,
    ),
    Invariant("queues_drained", "No frame is left in flight.", _queues_drained),
)
INVARIANT_BY_NAME: dict[str, Invariant] = {i.name: i for i in INVARIANTS + QUIESCENCE}


def check_invariants(
    st: SpecState, bounds: Bounds, invariants: tuple[Invariant, ...] = INVARIANTS
) -> list[str]:
    """Names of the invariants that fail in ``st`` (empty when all hold)."""
    I = Concrete(bounds.sizes())
    return [inv.name for inv in invariants if not inv.holds(I, st)]
