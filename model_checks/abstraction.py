"""The abstraction function: which spec state a core state (plus the engine's world) stands for.

``Universe`` fixes the bounded world a check runs in: which scope, participant, page and frame ids
fill the spec's slots, and how prefix identities, fingerprints and digests (ints in checks) map to
spec values. ``abstract_control`` rebuilds every *control* column of the spec from a ``CoreState``;
the world columns (frames in queues, page bytes) come from the harness that simulates the engine.
Refinement is then: after every core step, the control columns equal those the spec's own actions
produce.
"""

from __future__ import annotations

from typing import Any

import attrs

from retire_core import CoreState, ScopeState
from retire_spec.schema import (
    ACTIVE,
    CANCELLED,
    CONTROL_COLUMNS,
    GARBAGE,
    NO_MATCH,
    PAUSED,
    Bounds,
    SpecState,
    canonical,
    initial_state,
)


@attrs.frozen(slots=True)
class Universe:
    bounds: Bounds
    scopes: tuple[str, ...]
    parts: tuple[str, ...]
    tenants: tuple[str, ...]

    @classmethod
    def of(cls, bounds: Bounds) -> Universe:
        return cls(
            bounds,
            tuple(f"s{i}" for i in range(bounds.scopes)),
            tuple(f"q{i}" for i in range(bounds.parts)),
            tuple(f"t{fp}" for fp in bounds.fingerprints),
        )

    def scope_slot(self, scope: str) -> int:
        return self.scopes.index(scope)

    def part_slot(self, part: str) -> int:
        return self.parts.index(part)

    def fingerprint(self, slot: int) -> str:
        return str(self.bounds.fingerprints[slot])


_MODE = {
    ScopeState.ACTIVE: ACTIVE,
    ScopeState.ALIGNING: ACTIVE,
    ScopeState.PAUSED: PAUSED,
    ScopeState.CANCELLED: CANCELLED,
}


def _digest(d: str | None) -> int:
    return GARBAGE if d is None else int(d)


def abstract_control(
    core: CoreState, uni: Universe, launched: dict[int, tuple[int, int]]
) -> dict[str, tuple[Any, ...]]:
    """The spec's control columns for ``core``. ``launched`` maps participant slots the engine
    started to (scope slot, version): a participant the core has forgotten (its version drained
    into the ledger) is, by construction, closed."""
    init = initial_state(uni.bounds)
    cols: dict[str, list[Any]] = {name: list(init[name]) for name in CONTROL_COLUMNS}
    for s, sid in enumerate(uni.scopes):
        rec = core.scopes.get(sid)
        if rec is None:
            continue
        cols["scope_mode"][s] = _MODE[rec.state]
        cols["scope_epoch"][s] = rec.epoch
        cols["scope_admitted"][s] = rec.admitted
        cols["scope_reuse"][s] = rec.contract.allows_reuse
        cols["scope_want"][s] = tuple(int(k) for k in rec.context)  # type: ignore[arg-type]
    for q, (s, v) in launched.items():
        cols["part_used"][q] = True
        cols["part_scope"][q] = s
        cols["part_ver"][q] = v
        rec = core.scopes.get(uni.scopes[s])
        part = rec.participants.get(uni.parts[q]) if rec is not None else None
        cols["part_closed"][q] = True if part is None else part.closed
    for p in range(uni.bounds.pages):
        cols["page_gen"][p] = core.generations.get(p, 0)
        page = core.pages.get(p)
        if page is None:
            continue
        cols["page_alloc"][p] = True
        cols["page_owner"][p] = uni.scope_slot(page.owner)
        cols["page_over"][p] = page.version
        cols["page_writer"][p] = page.writer_open
        cols["page_full"][p] = page.full
        cols["page_pos"][p] = page.position
        cols["page_tok"][p] = NO_MATCH if page.prefix is None else int(page.prefix)  # type: ignore[arg-type]
        cols["page_fp"][p] = int(page.fingerprint)
        if not page.writer_open:
            cols["page_digest"][p] = _digest(page.digest)
        cols["page_held"][p] = page.held
        cols["page_pinned"][p] = page.pinned
    for sid, rec in core.scopes.items():
        if rec.certificate is None:
            continue
        for entry in rec.certificate.entries:
            page = core.pages.get(entry.page)
            if page is None or not page.pinned:
                continue
            cols["page_cert_scope"][entry.page] = uni.scope_slot(sid)
            cols["page_cert_ver"][entry.page] = rec.certificate.version
            cols["page_cert_gen"][entry.page] = entry.generation
            cols["page_cert_digest"][entry.page] = _digest(entry.digest)
    return {name: tuple(v) for name, v in cols.items()}


def control_view(st: SpecState, bounds: Bounds) -> dict[str, tuple[Any, ...]]:
    """The control columns of a spec state in canonical form (what ``abstract_control`` must equal)."""
    return canonical(st, bounds).project(CONTROL_COLUMNS)


def with_control(st: SpecState, control: dict[str, tuple[Any, ...]], bounds: Bounds) -> SpecState:
    return canonical(st.replace(control), bounds)
