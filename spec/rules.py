"""The three rules of DESIGN.md §3, each stated once as a predicate over one moment.

These are the *properties*, written independently of the action guards in ``actions`` that
implement them: an action records whether its step obeyed the rule in a history column, and the
invariants require those columns to stay true. Keeping the rule text apart from the guard text is
deliberate: a seeded bug that weakens a guard must still be judged against the unweakened rule.
"""

from __future__ import annotations

from .expr import Interp, Val
from .schema import ACTIVE, PAUSED, SpecState


def current_version_publication(I: Interp, st: SpecState, f: Val) -> Val:
    """Rule 1: a frame may become visible only if its version is its scope's current version
    at this moment and the scope still holds authority (active or paused, never cancelled)."""
    s = I.get(st["frame_scope"], f)
    mode = I.get(st["scope_mode"], s)
    return I.and_(
        I.eq(I.get(st["frame_ver"], f), I.get(st["scope_epoch"], s)),
        I.or_(I.eq(mode, I.lit(ACTIVE)), I.eq(mode, I.lit(PAUSED))),
    )


def versioned_handoff(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
    """Rule 2: scope ``s``'s pending successor may consume page ``p`` only if the page's prefix
    and configuration match the successor's, its writer is closed, and its generation and bytes
    still equal what was certified for this very successor."""
    pos = I.get(st["page_pos"], p)
    return I.and_(
        I.get(st["page_alloc"], p),
        I.eq(I.get(st["page_owner"], p), s),
        I.get(st["page_full"], p),
        I.not_(I.get(st["page_writer"], p)),
        I.eq(I.get(st["page_tok"], p), I.get(I.get(st["scope_want"], s), pos)),
        I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
        I.eq(I.get(st["page_cert_scope"], p), s),
        I.eq(I.get(st["page_cert_ver"], p), I.get(st["scope_epoch"], s)),
        I.eq(I.get(st["page_gen"], p), I.get(st["page_cert_gen"], p)),
        I.eq(I.get(st["page_data"], p), I.get(st["page_cert_digest"], p)),
    )


def retired_state_isolation(I: Interp, st: SpecState, p: Val, q: Val) -> Val:
    """Rule 3: participant ``q`` may write page ``p`` only if ``q``'s own version owns the page
    and still holds its writer; old work never writes into a successor's or another scope's
    (hence another tenant's) page."""
    return I.and_(
        I.get(st["page_alloc"], p),
        I.eq(I.get(st["page_owner"], p), I.get(st["part_scope"], q)),
        I.eq(I.get(st["page_over"], p), I.get(st["part_ver"], q)),
        I.get(st["page_writer"], p),
    )


def coordinated_closure(I: Interp, st: SpecState, p: Val) -> Val:
    """Issue 17: page ``p`` may lose its execution reference (and so be freed, given back to
    the engine's cache, evicted or allocated to another owner) only once every participant of
    its version, on every rank, has delivered its receipt: none of them is still running. (The
    engine's ``unreference`` of one completed page is its word that no participant reads or
    writes that page any more, the same guarantee for one page: that action needs no receipt.)"""
    return version_closed(I, st, I.get(st["page_owner"], p), I.get(st["page_over"], p))


def version_closed(I: Interp, st: SpecState, s: Val, v: Val) -> Val:
    """``coordinated_closure`` for every page of version ``v`` of scope ``s`` at once: no
    participant of that version is still running."""
    return I.not_(
        I.exists(
            "Part",
            lambda q: I.and_(
                I.get(st["part_used"], q),
                I.eq(I.get(st["part_scope"], q), s),
                I.eq(I.get(st["part_ver"], q), v),
                I.not_(I.get(st["part_closed"], q)),
            ),
        )
    )
