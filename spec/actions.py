"""The actions of the Retire protocol: one guard and one effect each, in the spec vocabulary.

Every way the abstract state may change is listed in ``ACTIONS``: what a user asks for (open,
supersede, pause, unpause, cancel, forget), what the engine does on its own (launch, emit, write
attempts of verified or of speculative draft tokens, the verification of drafts, receipts, a version
running to its end or preempted, cache evictions, page faults) and what the protocol decides
(publish or drop a frame, fence a write, certify, adopt, release, resume, unhold, free). Guards and
effects are functions of an interpretation, so the same text is evaluated concretely (refinement,
trace validation, the explorers) and symbolically (the Z3 proofs). The rules they must respect are
stated separately in ``rules`` and ``invariants``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from . import rules
from .expr import Concrete, Interp, Val
from .schema import (
    ACTIVE,
    BEYOND,
    CANCELLED,
    DRAFT,
    DROPPED,
    FINISHED,
    FRAME_KINDS,
    GARBAGE,
    IN_FLIGHT,
    NO_FRAME,
    NO_MATCH,
    PAUSED,
    PUBLISHED,
    UNOPENED,
    Bounds,
    SpecState,
)

Guard = Callable[..., Val]
Effect = Callable[..., dict[str, Val]]

# Parameter types: the four sorts plus small finite choices offered by the bounds.
PARAM_TYPES = ("Scope", "Part", "Frame", "Page", "Pos", "Ctx", "Bool", "FrameKind", "Ver", "Name")


@attrs.frozen(slots=True)
class Action:
    name: str
    actor: str  # "user", "engine" or "core": who causes the step in a real deployment
    params: tuple[tuple[str, str], ...]
    guard: Guard
    effect: Effect


@attrs.frozen(slots=True, cache_hash=True)
class ActionInstance:
    """An action with concrete arguments (element numbers, a context tuple, a bool...)."""

    name: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        return f"{self.name}({', '.join(map(str, self.args))})"


def _mode_is(I: Interp, st: SpecState, s: Val, *modes: int) -> Val:
    m = I.get(st["scope_mode"], s)
    return I.or_(*(I.eq(m, I.lit(x)) for x in modes))


def _release_pins_of(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    """Drop every handoff pin held for scope ``s``'s pending successor (chain collapse, cancel)."""
    cert_scope = st["page_cert_scope"]
    return {
        "page_pinned": I.update_where(
            st["page_pinned"],
            "Page",
            lambda p, pinned: I.and_(pinned, I.not_(I.eq(I.get(cert_scope, p), s))),
        )
    }


def _running(I: Interp, st: SpecState, q: Val) -> Val:
    return I.and_(I.get(st["part_used"], q), I.not_(I.get(st["part_closed"], q)))


# --- user requests ----------------------------------------------------------------------


def open_guard(I: Interp, st: SpecState, s: Val, ctx: Val, reuse: Val) -> Val:
    return _mode_is(I, st, s, UNOPENED)


def open_effect(I: Interp, st: SpecState, s: Val, ctx: Val, reuse: Val) -> dict[str, Val]:
    return {
        "scope_mode": I.store(st["scope_mode"], s, I.lit(ACTIVE)),
        "scope_admitted": I.store(st["scope_admitted"], s, I.lit(True)),
        "scope_want": I.store(st["scope_want"], s, ctx),
        "scope_reuse": I.store(st["scope_reuse"], s, reuse),
    }


def supersede_guard(I: Interp, st: SpecState, s: Val, ctx: Val, reuse: Val) -> Val:
    return _mode_is(I, st, s, ACTIVE, PAUSED, FINISHED)


def supersede_effect(I: Interp, st: SpecState, s: Val, ctx: Val, reuse: Val) -> dict[str, Val]:
    epoch = I.get(st["scope_epoch"], s)
    return {
        "scope_epoch": I.store(st["scope_epoch"], s, I.add(epoch, I.lit(1))),
        "scope_mode": I.store(st["scope_mode"], s, I.lit(ACTIVE)),
        "scope_admitted": I.store(st["scope_admitted"], s, I.lit(False)),
        "scope_want": I.store(st["scope_want"], s, ctx),
        "scope_reuse": I.store(st["scope_reuse"], s, reuse),
        **_release_pins_of(I, st, s),
    }


def pause_guard(I: Interp, st: SpecState, s: Val) -> Val:
    """Only a running version can be paused; a revision in progress finishes (or is superseded)."""
    return I.and_(_mode_is(I, st, s, ACTIVE), I.get(st["scope_admitted"], s))


def pause_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    return {
        "scope_mode": I.store(st["scope_mode"], s, I.lit(PAUSED)),
        "scope_pause_epoch": I.store(st["scope_pause_epoch"], s, I.get(st["scope_epoch"], s)),
    }


def unpause_guard(I: Interp, st: SpecState, s: Val) -> Val:
    return _mode_is(I, st, s, PAUSED)


def unpause_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    return {"scope_mode": I.store(st["scope_mode"], s, I.lit(ACTIVE))}


def cancel_guard(I: Interp, st: SpecState, s: Val) -> Val:
    return _mode_is(I, st, s, ACTIVE, PAUSED, FINISHED)


def cancel_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    return {
        "scope_mode": I.store(st["scope_mode"], s, I.lit(CANCELLED)),
        "scope_admitted": I.store(st["scope_admitted"], s, I.lit(False)),
        "scope_cancel_epoch": I.store(st["scope_cancel_epoch"], s, I.get(st["scope_epoch"], s)),
        **_release_pins_of(I, st, s),
    }


def forget_guard(I: Interp, st: SpecState, s: Val) -> Val:
    """A cancelled scope with nothing left: every participant closed, no page, and no frame of
    it in flight (the caller vouches for that part: the core cannot see frames on their way)."""
    return I.and_(
        _mode_is(I, st, s, CANCELLED),
        I.forall(
            "Part",
            lambda q: I.implies(
                I.and_(I.get(st["part_used"], q), I.eq(I.get(st["part_scope"], q), s)),
                I.get(st["part_closed"], q),
            ),
        ),
        I.forall(
            "Page",
            lambda p: I.implies(
                I.get(st["page_alloc"], p), I.not_(I.eq(I.get(st["page_owner"], p), s))
            ),
        ),
        I.forall(
            "Frame",
            lambda f: I.implies(
                I.eq(I.get(st["frame_state"], f), I.lit(IN_FLIGHT)),
                I.not_(I.eq(I.get(st["frame_scope"], f), s)),
            ),
        ),
    )


def forget_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    """The scope is unopened again: a later open starts over at version 0; its participants'
    slots are free."""
    return {
        "scope_mode": I.store(st["scope_mode"], s, I.lit(UNOPENED)),
        "scope_epoch": I.store(st["scope_epoch"], s, I.lit(0)),
        "scope_admitted": I.store(st["scope_admitted"], s, I.lit(False)),
        "scope_cancel_epoch": I.store(st["scope_cancel_epoch"], s, I.lit(0)),
        "part_used": I.update_where(
            st["part_used"],
            "Part",
            lambda q, used: I.and_(used, I.not_(I.eq(I.get(st["part_scope"], q), s))),
        ),
    }


# --- the engine -----------------------------------------------------------------------------


def launch_guard(I: Interp, st: SpecState, q: Val, s: Val, v: Val) -> Val:
    """A participant starts for version ``v``: the current, admitted version of an active or
    paused scope (an admitted request reaches the engine after a pause that overtook it: it
    starts, and the pause withholds it from steps), or (a launch racing a revision, a cancel or
    the version's end) a version already without authority, which FENCE then closes."""
    epoch = I.get(st["scope_epoch"], s)
    return I.and_(
        I.not_(I.get(st["part_used"], q)),
        I.not_(_mode_is(I, st, s, UNOPENED)),
        I.le(I.lit(0), v),
        I.or_(
            I.lt(v, epoch),
            I.and_(I.eq(v, epoch), _mode_is(I, st, s, CANCELLED, FINISHED)),
            _current_and_admitted(I, st, s, v),
        ),
    )


def launch_effect(I: Interp, st: SpecState, q: Val, s: Val, v: Val) -> dict[str, Val]:
    return {
        "part_used": I.store(st["part_used"], q, I.lit(True)),
        "part_scope": I.store(st["part_scope"], q, s),
        "part_ver": I.store(st["part_ver"], q, v),
        "part_closed": I.store(st["part_closed"], q, I.lit(False)),
    }


def finish_guard(I: Interp, st: SpecState, s: Val) -> Val:
    """The admitted current version of a live scope runs to its end (its request completed)."""
    return I.and_(_mode_is(I, st, s, ACTIVE, PAUSED), I.get(st["scope_admitted"], s))


def finish_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    return {"scope_mode": I.store(st["scope_mode"], s, I.lit(FINISHED))}


def preempt_guard(I: Interp, st: SpecState, s: Val) -> Val:
    """The engine preempted the admitted current version's work to make room: it dropped every
    reference to the version's pages and will compute the version again as new participants.
    It says so once every participant of the version has delivered its receipt (one at least
    had started) and every writer of the version's pages has closed."""
    v = I.get(st["scope_epoch"], s)
    return I.and_(
        _mode_is(I, st, s, ACTIVE, PAUSED),
        I.get(st["scope_admitted"], s),
        _version_drained(I, st, s, v),
        I.exists("Part", lambda q: _part_of(I, st, q, s, v)),
        I.forall(
            "Page",
            lambda p: I.not_(I.and_(_of_version(I, st, p, s, v), I.get(st["page_writer"], p))),
        ),
    )


def _of_version(I: Interp, st: SpecState, p: Val, s: Val, v: Val) -> Val:
    return I.and_(
        I.get(st["page_alloc"], p),
        I.eq(I.get(st["page_owner"], p), s),
        I.eq(I.get(st["page_over"], p), v),
    )


def preempt_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    """The version's pages lose their execution reference (RECLAIM may free them); the version
    keeps its authority."""
    v = I.get(st["scope_epoch"], s)
    ok = rules.version_closed(I, st, s, v)  # the rule, for every page the step drops

    def dropped(p: Val) -> Val:
        return I.and_(_of_version(I, st, p, s, v), I.get(st["page_held"], p))

    return {
        "page_held": I.update_where(
            st["page_held"], "Page", lambda p, held: I.and_(held, I.not_(dropped(p)))
        ),
        "page_release_ok": I.update_where(
            st["page_release_ok"],
            "Page",
            lambda p, was: I.and_(was, I.implies(dropped(p), ok)),
        ),
    }


def unreference_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """The engine no longer references page ``p`` from any participant of its version, which
    still runs (vLLM's sliding window passed the block: no layer reads it again, and vLLM gives
    the block back to its pool). Only a completed page whose writer has closed, of the admitted
    current version of an active or paused scope; the engine vouches that no rank reads or
    writes it any more, as its receipts do for a whole version."""
    s = I.get(st["page_owner"], p)
    return I.and_(
        I.get(st["page_alloc"], p),
        I.get(st["page_held"], p),
        I.not_(I.get(st["page_writer"], p)),
        I.get(st["page_full"], p),
        _current_and_admitted(I, st, s, I.get(st["page_over"], p)),
    )


def unreference_effect(I: Interp, st: SpecState, p: Val) -> dict[str, Val]:
    """The page loses its execution reference (the engine's cache keeps it; a revision may still
    certify it, the engine may evict it). ``coordinated_closure`` holds by the engine's word."""
    return {"page_held": I.store(st["page_held"], p, I.lit(False))}


def receipt_guard(I: Interp, st: SpecState, q: Val) -> Val:
    return _running(I, st, q)


def receipt_effect(I: Interp, st: SpecState, q: Val) -> dict[str, Val]:
    return {"part_closed": I.store(st["part_closed"], q, I.lit(True))}


def emit_guard(I: Interp, st: SpecState, f: Val, q: Val, k: Val) -> Val:
    return I.and_(I.eq(I.get(st["frame_state"], f), I.lit(NO_FRAME)), _running(I, st, q))


def emit_effect(I: Interp, st: SpecState, f: Val, q: Val, k: Val) -> dict[str, Val]:
    return {
        "frame_state": I.store(st["frame_state"], f, I.lit(IN_FLIGHT)),
        "frame_scope": I.store(st["frame_scope"], f, I.get(st["part_scope"], q)),
        "frame_ver": I.store(st["frame_ver"], f, I.get(st["part_ver"], q)),
        "frame_kind": I.store(st["frame_kind"], f, k),
    }


def allocate_guard(I: Interp, st: SpecState, p: Val, q: Val, i: Val) -> Val:
    """The engine hands a free page to a running participant (of any version: a step racing a
    revision can still allocate for retired work, whose pages can then never be inherited)."""
    return I.and_(I.not_(I.get(st["page_alloc"], p)), _running(I, st, q), I.le(I.lit(0), i))


def _current_and_admitted(I: Interp, st: SpecState, s: Val, v: Val) -> Val:
    return I.and_(
        I.eq(v, I.get(st["scope_epoch"], s)),
        I.get(st["scope_admitted"], s),
        _mode_is(I, st, s, ACTIVE, PAUSED),
    )


def _past_context(I: Interp, st: SpecState, s: Val, i: Val) -> Val:
    """Position ``i`` lies past scope ``s``'s current context (its version's own output)."""
    return I.eq(I.get(I.get(st["scope_want"], s), i), I.lit(BEYOND))


def allocate_effect(I: Interp, st: SpecState, p: Val, q: Val, i: Val) -> dict[str, Val]:
    s, v = I.get(st["part_scope"], q), I.get(st["part_ver"], q)
    tok = I.ite(
        I.and_(_current_and_admitted(I, st, s, v), I.not_(_past_context(I, st, s, i))),
        I.get(I.get(st["scope_want"], s), i),
        I.lit(NO_MATCH),
    )
    return {
        "page_alloc": I.store(st["page_alloc"], p, I.lit(True)),
        "page_owner": I.store(st["page_owner"], p, s),
        "page_over": I.store(st["page_over"], p, v),
        "page_gen": I.store(st["page_gen"], p, I.add(I.get(st["page_gen"], p), I.lit(1))),
        "page_writer": I.store(st["page_writer"], p, I.lit(True)),
        "page_full": I.store(st["page_full"], p, I.lit(False)),
        "page_draft": I.store(st["page_draft"], p, I.lit(False)),
        "page_pos": I.store(st["page_pos"], p, i),
        "page_tok": I.store(st["page_tok"], p, tok),
        "page_fp": I.store(st["page_fp"], p, I.get(st["scope_fp"], s)),
        "page_data": I.store(st["page_data"], p, I.lit(GARBAGE)),
        "page_held": I.store(st["page_held"], p, I.lit(True)),
        "page_pinned": I.store(st["page_pinned"], p, I.lit(False)),
    }


def _write_allowed(I: Interp, st: SpecState, p: Val, q: Val) -> Val:
    return I.and_(
        _running(I, st, q),
        I.get(st["page_alloc"], p),
        I.eq(I.get(st["page_owner"], p), I.get(st["part_scope"], q)),
        I.eq(I.get(st["page_over"], p), I.get(st["part_ver"], q)),
        I.get(st["page_writer"], p),
    )


def write_guard(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> Val:
    return _write_allowed(I, st, p, q)


def write_effect(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> dict[str, Val]:
    """A write lands; ``done`` when it completes the block (its bytes are then the honest
    content of the page's prefix, abstracted as equal to ``page_tok``). A verified write
    replaces whatever drafts the page held."""
    ok = rules.retired_state_isolation(I, st, p, q)
    return {
        "page_data": I.store(
            st["page_data"], p, I.ite(done, I.get(st["page_tok"], p), I.lit(GARBAGE))
        ),
        "page_full": I.store(st["page_full"], p, done),
        "page_draft": I.store(st["page_draft"], p, I.lit(False)),
        "page_write_ok": I.store(st["page_write_ok"], p, I.and_(I.get(st["page_write_ok"], p), ok)),
    }


def write_draft_guard(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> Val:
    """Speculative decoding: the step that verifies draft tokens writes their KV first. The
    isolation gate decides it exactly as it decides a verified write."""
    return _write_allowed(I, st, p, q)


def write_draft_effect(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> dict[str, Val]:
    """A write of unverified draft tokens lands; ``done`` when the drafts would fill the block.
    Its bytes are not the prefix's honest content until verified (``DRAFT``), so the page
    counts as complete only provisionally: ``verify_drafts`` or ``close_writer`` settles it."""
    ok = rules.retired_state_isolation(I, st, p, q)
    return {
        "page_data": I.store(st["page_data"], p, I.ite(done, I.lit(DRAFT), I.lit(GARBAGE))),
        "page_full": I.store(st["page_full"], p, done),
        "page_draft": I.store(st["page_draft"], p, I.lit(True)),
        "page_write_ok": I.store(st["page_write_ok"], p, I.and_(I.get(st["page_write_ok"], p), ok)),
    }


def verify_drafts_guard(I: Interp, st: SpecState, p: Val, done: Val) -> Val:
    """The target model verified the drafts of a page whose writer is still open."""
    return I.and_(
        I.get(st["page_alloc"], p), I.get(st["page_draft"], p), I.get(st["page_writer"], p)
    )


def verify_drafts_effect(I: Interp, st: SpecState, p: Val, done: Val) -> dict[str, Val]:
    """``done``: the accepted tokens fill the block, whose bytes are then its prefix's honest
    content; rejected drafts leave it incomplete (their slots are rewritten later)."""
    return {
        "page_draft": I.store(st["page_draft"], p, I.lit(False)),
        "page_full": I.store(st["page_full"], p, done),
        "page_data": I.store(
            st["page_data"], p, I.ite(done, I.get(st["page_tok"], p), I.lit(GARBAGE))
        ),
    }


def fence_write_guard(I: Interp, st: SpecState, p: Val, q: Val, done: Val) -> Val:
    """A write attempt the isolation gate rejects: nothing changes, the attempt is logged."""
    return I.and_(_running(I, st, q), I.not_(_write_allowed(I, st, p, q)))


def _no_change(I: Interp, st: SpecState, *args: Val) -> dict[str, Val]:
    return {}


def close_writer_guard(I: Interp, st: SpecState, p: Val, t: Val) -> Val:
    return I.and_(I.get(st["page_alloc"], p), I.get(st["page_writer"], p))


def close_writer_effect(I: Interp, st: SpecState, p: Val, t: Val) -> dict[str, Val]:
    """The writer closes; drafts still unverified are rolled back (the page is then not a
    completed block), so speculative bytes are never certified. ``t``: the prefix identity the
    engine names for the block (``NO_MATCH``: none). It counts only for a completed block past
    its version's context written under authority, as ``allocate`` gives a context block its
    identity; the honest bytes of the version's output are then those of that identity."""
    draft = I.get(st["page_draft"], p)
    full = I.and_(I.get(st["page_full"], p), I.not_(draft))
    s, tok, data = I.get(st["page_owner"], p), I.get(st["page_tok"], p), I.get(st["page_data"], p)
    named = I.and_(
        I.not_(I.eq(t, I.lit(NO_MATCH))),
        full,
        I.eq(tok, I.lit(NO_MATCH)),
        _current_and_admitted(I, st, s, I.get(st["page_over"], p)),
        _past_context(I, st, s, I.get(st["page_pos"], p)),
    )
    data = I.ite(I.and_(named, I.eq(data, tok)), t, data)
    return {
        "page_writer": I.store(st["page_writer"], p, I.lit(False)),
        "page_full": I.store(st["page_full"], p, full),
        "page_draft": I.store(st["page_draft"], p, I.lit(False)),
        "page_tok": I.store(st["page_tok"], p, I.ite(named, t, tok)),
        "page_data": I.store(st["page_data"], p, data),
        "page_digest": I.store(st["page_digest"], p, data),
    }


def _retained(I: Interp, st: SpecState, p: Val) -> Val:
    """A completed page no live execution references: what faults and co-tenants can touch."""
    return I.and_(
        I.get(st["page_alloc"], p),
        I.not_(I.get(st["page_held"], p)),
        I.not_(I.get(st["page_writer"], p)),
        I.get(st["page_full"], p),
    )


def corrupt_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """Fault: a retained page's bytes change while its block id and counts stay the same."""
    return I.and_(_retained(I, st, p), I.eq(I.get(st["page_data"], p), I.get(st["page_tok"], p)))


def corrupt_effect(I: Interp, st: SpecState, p: Val) -> dict[str, Val]:
    return {"page_data": I.store(st["page_data"], p, I.add(I.get(st["page_tok"], p), I.lit(1)))}


def reuse_id_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """Fault: the engine recycles a retained block id underneath us (same bytes, new owner)."""
    return _retained(I, st, p)


def reuse_id_effect(I: Interp, st: SpecState, p: Val) -> dict[str, Val]:
    return {"page_gen": I.store(st["page_gen"], p, I.add(I.get(st["page_gen"], p), I.lit(1)))}


# --- the protocol's own decisions ----------------------------------------------------------------


def publish_guard(I: Interp, st: SpecState, f: Val) -> Val:
    s = I.get(st["frame_scope"], f)
    return I.and_(
        I.eq(I.get(st["frame_state"], f), I.lit(IN_FLIGHT)),
        I.eq(I.get(st["frame_ver"], f), I.get(st["scope_epoch"], s)),
        _mode_is(I, st, s, ACTIVE, PAUSED),
    )


def publish_effect(I: Interp, st: SpecState, f: Val) -> dict[str, Val]:
    ok = rules.current_version_publication(I, st, f)
    return {
        "frame_state": I.store(st["frame_state"], f, I.lit(PUBLISHED)),
        "frame_pub_ok": I.store(st["frame_pub_ok"], f, I.and_(I.get(st["frame_pub_ok"], f), ok)),
    }


def drop_guard(I: Interp, st: SpecState, f: Val) -> Val:
    s = I.get(st["frame_scope"], f)
    return I.and_(
        I.eq(I.get(st["frame_state"], f), I.lit(IN_FLIGHT)),
        I.not_(
            I.and_(
                I.eq(I.get(st["frame_ver"], f), I.get(st["scope_epoch"], s)),
                _mode_is(I, st, s, ACTIVE, PAUSED),
            )
        ),
    )


def drop_effect(I: Interp, st: SpecState, f: Val) -> dict[str, Val]:
    ok = I.not_(rules.current_version_publication(I, st, f))
    return {
        "frame_state": I.store(st["frame_state"], f, I.lit(DROPPED)),
        "frame_drop_ok": I.store(st["frame_drop_ok"], f, I.and_(I.get(st["frame_drop_ok"], f), ok)),
    }


def certify_guard(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
    """ALIGN: a completed, writer-closed page of a retired version of ``s`` that matches the
    pending successor's prefix and configuration is certified and pinned."""
    pos = I.get(st["page_pos"], p)
    return I.and_(
        _mode_is(I, st, s, ACTIVE),
        I.not_(I.get(st["scope_admitted"], s)),
        I.get(st["scope_reuse"], s),
        I.get(st["page_alloc"], p),
        I.eq(I.get(st["page_owner"], p), s),
        I.lt(I.get(st["page_over"], p), I.get(st["scope_epoch"], s)),
        I.not_(I.get(st["page_writer"], p)),
        I.get(st["page_full"], p),
        I.not_(I.get(st["page_pinned"], p)),
        I.eq(I.get(st["page_tok"], p), I.get(I.get(st["scope_want"], s), pos)),
        I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
    )


def certify_effect(I: Interp, st: SpecState, s: Val, p: Val) -> dict[str, Val]:
    return {
        "page_pinned": I.store(st["page_pinned"], p, I.lit(True)),
        "page_cert_scope": I.store(st["page_cert_scope"], p, s),
        "page_cert_ver": I.store(st["page_cert_ver"], p, I.get(st["scope_epoch"], s)),
        "page_cert_gen": I.store(st["page_cert_gen"], p, I.get(st["page_gen"], p)),
        "page_cert_digest": I.store(st["page_cert_digest"], p, I.get(st["page_digest"], p)),
    }


def adopt_guard(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
    """RESUME: install a certified page whose generation and bytes still match the certificate."""
    pos = I.get(st["page_pos"], p)
    return I.and_(
        _mode_is(I, st, s, ACTIVE),
        I.not_(I.get(st["scope_admitted"], s)),
        I.get(st["page_pinned"], p),
        I.eq(I.get(st["page_cert_scope"], p), s),
        I.eq(I.get(st["page_cert_ver"], p), I.get(st["scope_epoch"], s)),
        I.eq(I.get(st["page_owner"], p), s),
        I.get(st["page_alloc"], p),
        I.not_(I.get(st["page_writer"], p)),
        I.get(st["page_full"], p),
        I.eq(I.get(st["page_gen"], p), I.get(st["page_cert_gen"], p)),
        I.eq(I.get(st["page_data"], p), I.get(st["page_cert_digest"], p)),
        I.eq(I.get(st["page_tok"], p), I.get(I.get(st["scope_want"], s), pos)),
        I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], s)),
    )


def adopt_effect(I: Interp, st: SpecState, s: Val, p: Val) -> dict[str, Val]:
    ok = rules.versioned_handoff(I, st, s, p)
    return {
        "page_over": I.store(st["page_over"], p, I.get(st["scope_epoch"], s)),
        "page_held": I.store(st["page_held"], p, I.lit(True)),
        "page_pinned": I.store(st["page_pinned"], p, I.lit(False)),
        "page_adopt_ok": I.store(st["page_adopt_ok"], p, I.and_(I.get(st["page_adopt_ok"], p), ok)),
    }


def release_guard(I: Interp, st: SpecState, s: Val, p: Val) -> Val:
    """A certified page that failed its check at adoption is unpinned and recomputed instead."""
    return I.and_(I.get(st["page_pinned"], p), I.eq(I.get(st["page_cert_scope"], p), s))


def release_effect(I: Interp, st: SpecState, s: Val, p: Val) -> dict[str, Val]:
    return {"page_pinned": I.store(st["page_pinned"], p, I.lit(False))}


def resume_guard(I: Interp, st: SpecState, s: Val) -> Val:
    cert_scope, pinned = st["page_cert_scope"], st["page_pinned"]
    return I.and_(
        _mode_is(I, st, s, ACTIVE),
        I.not_(I.get(st["scope_admitted"], s)),
        I.forall(
            "Page",
            lambda p: I.not_(I.and_(I.get(pinned, p), I.eq(I.get(cert_scope, p), s))),
        ),
    )


def resume_effect(I: Interp, st: SpecState, s: Val) -> dict[str, Val]:
    return {"scope_admitted": I.store(st["scope_admitted"], s, I.lit(True))}


def _part_of(I: Interp, st: SpecState, q: Val, s: Val, v: Val) -> Val:
    """Participant ``q`` started for version ``v`` of ``s``."""
    return I.and_(
        I.get(st["part_used"], q),
        I.eq(I.get(st["part_scope"], q), s),
        I.eq(I.get(st["part_ver"], q), v),
    )


def _version_drained(I: Interp, st: SpecState, s: Val, v: Val) -> Val:
    """Every participant of version ``v`` of ``s`` has delivered its receipt."""
    closed = st["part_closed"]
    return I.forall("Part", lambda q: I.implies(_part_of(I, st, q, s, v), I.get(closed, q)))


def evict_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """The engine evicts a page from its prefix cache: one no execution references and no
    handoff pins (a finished version's page the core gave back to the cache)."""
    return I.and_(
        I.get(st["page_alloc"], p),
        I.not_(I.get(st["page_held"], p)),
        I.not_(I.get(st["page_pinned"], p)),
    )


def unhold_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """RECLAIM, first half: a retired version's reference goes once all its receipts are in."""
    s, v = I.get(st["page_owner"], p), I.get(st["page_over"], p)
    return I.and_(
        I.get(st["page_alloc"], p),
        I.get(st["page_held"], p),
        I.not_(I.get(st["page_writer"], p)),
        I.or_(I.lt(v, I.get(st["scope_epoch"], s)), _mode_is(I, st, s, CANCELLED, FINISHED)),
        _version_drained(I, st, s, v),
    )


def unhold_effect(I: Interp, st: SpecState, p: Val) -> dict[str, Val]:
    ok = rules.coordinated_closure(I, st, p)
    return {
        "page_held": I.store(st["page_held"], p, I.lit(False)),
        "page_release_ok": I.store(
            st["page_release_ok"], p, I.and_(I.get(st["page_release_ok"], p), ok)
        ),
    }


def free_guard(I: Interp, st: SpecState, p: Val) -> Val:
    """RECLAIM, second half: a page no one references and no handoff pins goes back."""
    return I.and_(
        I.get(st["page_alloc"], p),
        I.not_(I.get(st["page_held"], p)),
        I.not_(I.get(st["page_pinned"], p)),
    )


def free_effect(I: Interp, st: SpecState, p: Val) -> dict[str, Val]:
    return {"page_alloc": I.store(st["page_alloc"], p, I.lit(False))}


def _a(name: str, actor: str, params: str, guard: Guard, effect: Effect) -> Action:
    parsed = tuple((part.split(":")[0], part.split(":")[1]) for part in params.split() if part)
    return Action(name, actor, parsed, guard, effect)


ACTIONS: tuple[Action, ...] = (
    _a("open", "user", "s:Scope ctx:Ctx reuse:Bool", open_guard, open_effect),
    _a("supersede", "user", "s:Scope ctx:Ctx reuse:Bool", supersede_guard, supersede_effect),
    _a("pause", "user", "s:Scope", pause_guard, pause_effect),
    _a("unpause", "user", "s:Scope", unpause_guard, unpause_effect),
    _a("cancel", "user", "s:Scope", cancel_guard, cancel_effect),
    _a("forget", "user", "s:Scope", forget_guard, forget_effect),
    _a("launch", "engine", "q:Part s:Scope v:Ver", launch_guard, launch_effect),
    _a("receipt", "engine", "q:Part", receipt_guard, receipt_effect),
    _a("finish", "engine", "s:Scope", finish_guard, finish_effect),
    _a("preempt", "engine", "s:Scope", preempt_guard, preempt_effect),
    _a("unreference", "engine", "p:Page", unreference_guard, unreference_effect),
    _a("emit", "engine", "f:Frame q:Part k:FrameKind", emit_guard, emit_effect),
    _a("allocate", "engine", "p:Page q:Part i:Pos", allocate_guard, allocate_effect),
    _a("write", "engine", "p:Page q:Part done:Bool", write_guard, write_effect),
    _a("write_draft", "engine", "p:Page q:Part done:Bool", write_draft_guard, write_draft_effect),
    _a("verify_drafts", "engine", "p:Page done:Bool", verify_drafts_guard, verify_drafts_effect),
    _a("fence_write", "core", "p:Page q:Part done:Bool", fence_write_guard, _no_change),
    _a("close_writer", "engine", "p:Page t:Name", close_writer_guard, close_writer_effect),
    _a("corrupt", "engine", "p:Page", corrupt_guard, corrupt_effect),
    _a("evict", "engine", "p:Page", evict_guard, free_effect),
    _a("reuse_id", "engine", "p:Page", reuse_id_guard, reuse_id_effect),
    _a("publish", "core", "f:Frame", publish_guard, publish_effect),
    _a("drop", "core", "f:Frame", drop_guard, drop_effect),
    _a("certify", "core", "s:Scope p:Page", certify_guard, certify_effect),
    _a("adopt", "core", "s:Scope p:Page", adopt_guard, adopt_effect),
    _a("release", "core", "s:Scope p:Page", release_guard, release_effect),
    _a("resume", "core", "s:Scope", resume_guard, resume_effect),
    _a("unhold", "core", "p:Page", unhold_guard, unhold_effect),
    _a("free", "core", "p:Page", free_guard, free_effect),
)
ACTION_BY_NAME: dict[str, Action] = {a.name: a for a in ACTIONS}


class SpecStepError(Exception):
    """An action instance whose guard is false in the given state."""


def concrete(bounds: Bounds) -> Concrete:
    return Concrete(bounds.sizes())


def apply_action(
    st: SpecState, inst: ActionInstance, bounds: Bounds, actions: dict[str, Action] | None = None
) -> SpecState:
    """Take one step; raises ``SpecStepError`` if the guard does not hold."""
    action = (actions or ACTION_BY_NAME)[inst.name]
    I = concrete(bounds)
    if not action.guard(I, st, *inst.args):
        raise SpecStepError(f"guard of {inst} is false")
    return st.replace(action.effect(I, st, *inst.args))


def param_domain(ptype: str, bounds: Bounds) -> tuple[Any, ...]:
    sizes = bounds.sizes()
    if ptype in sizes:
        return tuple(range(sizes[ptype]))
    return {
        "Pos": tuple(range(bounds.positions)),
        "Ctx": bounds.contexts,
        "Bool": (False, True),
        "FrameKind": FRAME_KINDS,
        "Ver": tuple(range(bounds.max_epoch + 1)),
        "Name": (NO_MATCH, *bounds.names),
    }[ptype]


def instances(action: Action, bounds: Bounds) -> Iterator[ActionInstance]:
    domains = [param_domain(t, bounds) for _, t in action.params]
    for args in itertools.product(*domains):
        yield ActionInstance(action.name, tuple(args))


def enabled(
    st: SpecState, bounds: Bounds, actions: tuple[Action, ...] = ACTIONS
) -> Iterator[tuple[ActionInstance, SpecState]]:
    """Every enabled action instance and its successor, within the bounds (epochs capped)."""
    I = concrete(bounds)
    for action in actions:
        for inst in instances(action, bounds):
            if not action.guard(I, st, *inst.args):
                continue
            nxt = st.replace(action.effect(I, st, *inst.args))
            if any(e > bounds.max_epoch for e in nxt["scope_epoch"]):
                continue
            yield inst, nxt


__all__ = [
    "ACTIONS",
    "ACTION_BY_NAME",
    "PARAM_TYPES",
    "Action",
    "ActionInstance",
    "SpecStepError",
    "apply_action",
    "enabled",
    "instances",
    "param_domain",
]
