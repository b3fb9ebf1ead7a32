"""Spec mutants: one guard or effect of ``retire_spec.actions`` weakened.

Each is an alternative action table written in the spec's own vocabulary, so the spec explorer
runs it and Z3 reads it: both must fail on every one. What does not live here: the ``Mutant``
record and the worlds (``mutant_kind``), core mutants (``mutants_core``) and judging (``mutants``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from retire_checks.mutant_kind import (
    SPEC_CHAIN,
    SPEC_ONE,
    SPEC_TENANTS,
    SPEC_TENANTS_REVISED,
    SPEC_TWO_PARTS,
    Mutant,
)
from retire_spec import actions as A
from retire_spec.expr import Interp, Val
from retire_spec.schema import ACTIVE, CANCELLED, FINISHED, IN_FLIGHT, SpecState

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


def _unhold_before_receipts(I: Interp, st: SpecState, p: Val) -> Val:
    """RECLAIM's unhold without waiting for the version's receipts (``_version_drained``)."""
    s, v = I.get(st["page_owner"], p), I.get(st["page_over"], p)
    return I.and_(
        I.get(st["page_alloc"], p),
        I.get(st["page_held"], p),
        I.not_(I.get(st["page_writer"], p)),
        I.or_(I.lt(v, I.get(st["scope_epoch"], s)), A._mode_is(I, st, s, CANCELLED, FINISHED)),
    )


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


def _close_keeping_drafts(I: Interp, st: SpecState, p: Val, t: Val) -> dict[str, Val]:
    effect = A.close_writer_effect(I, st, p, t)
    del effect["page_full"]  # a page full of unverified drafts stays a completed block
    return effect


def _verify_ignoring_rejection(I: Interp, st: SpecState, p: Val, done: Val) -> dict[str, Val]:
    effect = A.verify_drafts_effect(I, st, p, done)
    effect["page_full"] = I.store(st["page_full"], p, I.lit(True))  # rejected drafts: complete
    return effect


SPEC_MUTANTS: tuple[Mutant, ...] = (
    Mutant(
        "spec_unhold_before_receipts",
        "closing a version on a partial set of receipts",
        "spec",
        "RECLAIM's unhold no longer waits for every receipt of the page's version",
        (SPEC_ONE,),
        actions=_replace("unhold", guard=_unhold_before_receipts),
    ),
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
    Mutant(
        "spec_unverified_drafts_certified",
        "certifying unverified drafts",
        "spec",
        "a writer closing over unverified drafts keeps the page a completed block",
        (SPEC_ONE,),
        actions=_replace("close_writer", effect=_close_keeping_drafts),
    ),
    Mutant(
        "spec_rejected_drafts_complete",
        "certifying rejected drafts",
        "spec",
        "a verification that rejects a page's drafts still marks the page complete",
        (SPEC_ONE,),
        actions=_replace("verify_drafts", effect=_verify_ignoring_rejection),
    ),
)
