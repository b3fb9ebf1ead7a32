"""The abstract state of the Retire protocol: sorts, columns and the initial state.

The state is a set of tables, one per *sort* (``Scope``, ``Part`` for participants, ``Frame``,
``Page``); every table is a set of *columns*, each a total map from the sort's elements to an
int, a bool, a reference to another sort's element, or a context (a map from block position to
the identity of the token prefix ending at that block). Concretely a column is a tuple; in Z3 it
is an array over an uninterpreted sort, which is what makes the proofs hold for any number of
scopes, participants, frames and pages. Each column has a *role*: ``control`` columns are what
``retire_core`` decides (the abstraction function reproduces them from core state), ``world``
columns are the engine's physical state (frames in queues, page bytes), and ``history`` columns
record facts at the moment an action ran so that rules about moments ("at the moment of
publication") become state invariants. This module holds data definitions only; the actions and
invariants live beside it.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from typing import Any

import attrs


class Kind(enum.Enum):
    BOOL = "bool"
    INT = "int"
    CTX = "ctx"
    SCOPE = "Scope"


class Role(enum.Enum):
    CONTROL = "control"
    WORLD = "world"
    HISTORY = "history"


# Scope modes. UNOPENED scopes exist in the bounded universe but have not been submitted yet.
UNOPENED, ACTIVE, PAUSED, CANCELLED = 0, 1, 2, 3
# The current version ran to its end: it has no authority; its pages are reclaimed; a
# supersede starts the next version, a cancel ends the scope.
FINISHED = 4
# Frame kinds (DESIGN.md: token output, scheduler commit, state install).
TOKEN, COMMIT, INSTALL = 0, 1, 2
FRAME_KINDS = (TOKEN, COMMIT, INSTALL)
# Frame states.
NO_FRAME, IN_FLIGHT, PUBLISHED, DROPPED = 0, 1, 2, 3
# Page content that no honest write produces: a freshly allocated, unwritten page.
GARBAGE = -1
# Prefix identity of a page allocated for work without authority: it matches no context.
NO_MATCH = -2
# A context position past the version's context: the block the version's own output fills
# there has no identity from the context (only the engine's name at its writer's close gives it
# one). Contexts are fixed-length tuples here, so a shorter context ends in these.
BEYOND = -4
# Page content written from speculative (draft) tokens the target model has not verified yet:
# honest only once verified (``verify_drafts`` then turns it into the prefix's bytes, or into
# garbage for rejected drafts, whose slots are rewritten later).
DRAFT = -3


@attrs.frozen(slots=True)
class Column:
    name: str
    sort: str
    kind: Kind
    role: Role
    initial: Any


def _c(name: str, sort: str, kind: Kind, role: Role, initial: Any) -> Column:
    return Column(name, sort, kind, role, initial)


C, W, H = Role.CONTROL, Role.WORLD, Role.HISTORY
B, I, R, X = Kind.BOOL, Kind.INT, Kind.SCOPE, Kind.CTX

COLUMNS: tuple[Column, ...] = (
    # --- scopes -------------------------------------------------------------------------
    _c("scope_mode", "Scope", I, C, UNOPENED),
    _c("scope_epoch", "Scope", I, C, 0),  # current version: holds publication authority
    _c("scope_admitted", "Scope", B, C, False),  # current version may launch work
    _c("scope_reuse", "Scope", B, C, False),  # the current version's contract allows reuse
    _c("scope_want", "Scope", X, C, None),  # prefix identity per block of current context
    _c("scope_fp", "Scope", I, W, 0),  # configuration fingerprint (model, tenant, mode...)
    _c("scope_pause_epoch", "Scope", I, H, 0),
    _c("scope_cancel_epoch", "Scope", I, H, 0),
    # --- participants (a request, a cache group, a worker rank) --------------------------
    _c("part_used", "Part", B, C, False),
    _c("part_scope", "Part", R, C, 0),
    _c("part_ver", "Part", I, C, 0),
    _c("part_closed", "Part", B, C, False),  # its receipt has been collected
    _c("part_launch_ok", "Part", B, H, True),
    # --- frames: output crossing a queue, stamped (scope, version) ---------------------
    _c("frame_state", "Frame", I, W, NO_FRAME),
    _c("frame_scope", "Frame", R, W, 0),
    _c("frame_ver", "Frame", I, W, 0),
    _c("frame_kind", "Frame", I, W, TOKEN),
    _c("frame_pub_ok", "Frame", B, H, True),  # at publication its version was current
    _c("frame_drop_ok", "Frame", B, H, True),  # at a drop its version was not current
    # --- pages (KV cache blocks) --------------------------------------------------------
    _c("page_alloc", "Page", B, C, False),
    _c("page_owner", "Page", R, C, 0),
    _c("page_over", "Page", I, C, 0),  # owner version
    _c("page_gen", "Page", I, C, 0),  # ownership generation, bumped on every allocation
    _c("page_writer", "Page", B, C, False),  # writer open
    _c("page_full", "Page", B, C, False),  # completed full block
    _c("page_draft", "Page", B, C, False),  # holds speculative tokens not yet verified
    _c("page_pos", "Page", I, C, 0),
    _c("page_tok", "Page", I, C, 0),  # identity of the token prefix the page covers
    _c("page_fp", "Page", I, C, 0),
    _c("page_digest", "Page", I, C, 0),  # digest recorded when the writer closed
    _c("page_held", "Page", B, C, False),  # referenced by its owner version's execution
    _c("page_pinned", "Page", B, C, False),  # handoff pin: certified, not yet adopted
    _c("page_cert_scope", "Page", R, C, 0),
    _c("page_cert_ver", "Page", I, C, 0),
    _c("page_cert_gen", "Page", I, C, 0),
    _c("page_cert_digest", "Page", I, C, 0),
    _c("page_data", "Page", I, W, GARBAGE),  # the bytes, abstracted: honest iff == page_tok
    _c("page_adopt_ok", "Page", B, H, True),  # every adoption met the handoff rule
    _c("page_write_ok", "Page", B, H, True),  # every write came from the owning writer
    # every loss of its execution reference came after every receipt of its version
    _c("page_release_ok", "Page", B, H, True),
)

COLUMN_INDEX: dict[str, int] = {c.name: i for i, c in enumerate(COLUMNS)}
COLUMN_BY_NAME: dict[str, Column] = {c.name: c for c in COLUMNS}
CONTROL_COLUMNS = tuple(c.name for c in COLUMNS if c.role is Role.CONTROL)


@attrs.frozen(slots=True)
class Bounds:
    """The bounded universe of a concrete check and the choices offered to actions.

    ``contexts`` are the revised contexts a SUPERSEDE may carry (tuples of prefix identities,
    one per block position, all of length ``positions``; a shorter context ends in ``BEYOND``);
    ``fingerprints`` gives each scope's configuration fingerprint (scopes of different tenants
    differ); ``names`` are the prefix identities an engine may name for a block of a version's
    own output when its writer closes (none: the engine names none).
    """

    scopes: int = 2
    parts: int = 2
    frames: int = 2
    pages: int = 2
    positions: int = 2
    max_epoch: int = 2
    contexts: tuple[tuple[int, ...], ...] = ((1, 2), (1, 3))
    fingerprints: tuple[int, ...] = (0, 0)
    names: tuple[int, ...] = ()

    def sizes(self) -> dict[str, int]:
        return {"Scope": self.scopes, "Part": self.parts, "Frame": self.frames, "Page": self.pages}

    def __attrs_post_init__(self) -> None:
        if len(self.fingerprints) != self.scopes:
            raise ValueError("one fingerprint per scope is required")
        if any(len(c) != self.positions for c in self.contexts):
            raise ValueError("every context needs one prefix identity per block position")
        for c in self.contexts:
            n = c.index(BEYOND) if BEYOND in c else len(c)
            if any(k != BEYOND for k in c[n:]):
                raise ValueError(f"context {c}: BEYOND may only end a context")
        if any(k < 0 for k in self.names):
            raise ValueError("a named prefix identity is >= 0")


@attrs.frozen(slots=True, cache_hash=True)
class SpecState(Mapping[str, Any]):
    """One abstract state: the tuple of column values in ``COLUMNS`` order."""

    cells: tuple[Any, ...]

    def __getitem__(self, name: str) -> Any:
        return self.cells[COLUMN_INDEX[name]]

    def __iter__(self) -> Iterator[str]:
        return iter(COLUMN_INDEX)

    def __len__(self) -> int:
        return len(self.cells)

    def replace(self, updates: Mapping[str, Any]) -> SpecState:
        values = list(self.cells)
        for name, value in updates.items():
            values[COLUMN_INDEX[name]] = value
        return SpecState(tuple(values))

    def project(self, names: tuple[str, ...]) -> dict[str, Any]:
        return {n: self[n] for n in names}


def initial_state(bounds: Bounds) -> SpecState:
    sizes = bounds.sizes()
    empty_ctx = tuple(-100 - i for i in range(bounds.positions))
    values: list[Any] = []
    for col in COLUMNS:
        n = sizes[col.sort]
        if col.name == "scope_fp":
            values.append(tuple(bounds.fingerprints))
        elif col.kind is Kind.CTX:
            values.append(tuple(empty_ctx for _ in range(n)))
        else:
            values.append(tuple(col.initial for _ in range(n)))
    return SpecState(tuple(values))


# A free page keeps its generation (the next allocation bumps it) and its ``pinned``/``held``
# flags: the invariant ``no_free_while_pinned_or_referenced`` reads exactly those two cells of
# free pages, so resetting them would let a state that violates it collapse into one that does
# not (an explorer deduplicating on the canonical form would then miss the violation).
_PAGE_SLOT_COLUMNS = tuple(
    c.name
    for c in COLUMNS
    if c.sort == "Page"
    and c.role is not Role.HISTORY
    and c.name not in ("page_gen", "page_pinned", "page_held")
)
_CERT_COLUMNS = ("page_cert_scope", "page_cert_ver", "page_cert_gen", "page_cert_digest")
_PART_COLUMNS = tuple(c.name for c in COLUMNS if c.sort == "Part" and c.role is not Role.HISTORY)
_FRAME_COLUMNS = tuple(c.name for c in COLUMNS if c.sort == "Frame" and c.role is not Role.HISTORY)
# An unopened scope's epoch and admission are read by invariants (through the participants and
# pages that name it), so they are kept; no action can change them before ``open`` anyway.
_SCOPE_COLUMNS = tuple(
    c.name
    for c in COLUMNS
    if c.sort == "Scope"
    and c.role is Role.CONTROL
    and c.name not in ("scope_epoch", "scope_admitted")
)


def canonical(st: SpecState, bounds: Bounds) -> SpecState:
    """The normal form of a concrete state: cells no guard, effect or invariant can read are reset
    to their initial values (a free page's old owner, a released certificate, an unused slot),
    so that states which behave identically compare and hash equal."""
    init = initial_state(bounds)
    cols = {name: list(st[name]) for name in COLUMN_INDEX}
    for p, alloc in enumerate(st["page_alloc"]):
        if not alloc:
            for name in _PAGE_SLOT_COLUMNS:
                cols[name][p] = init[name][p]
            continue
        if not st["page_pinned"][p]:
            for name in _CERT_COLUMNS:
                cols[name][p] = init[name][p]
        if st["page_writer"][p]:
            cols["page_digest"][p] = init["page_digest"][p]
    for q, used in enumerate(st["part_used"]):
        if not used:
            for name in _PART_COLUMNS:
                cols[name][q] = init[name][q]
    for f, state in enumerate(st["frame_state"]):
        if state == NO_FRAME:
            for name in _FRAME_COLUMNS:
                cols[name][f] = init[name][f]
    for s, mode in enumerate(st["scope_mode"]):
        if mode == UNOPENED:
            for name in _SCOPE_COLUMNS:
                cols[name][s] = init[name][s]
        if mode != PAUSED:
            cols["scope_pause_epoch"][s] = 0
        if mode != CANCELLED:
            cols["scope_cancel_epoch"][s] = 0
    return SpecState(tuple(tuple(cols[c.name]) for c in COLUMNS))
