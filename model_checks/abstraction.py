"""The abstraction function: which spec state a core state (plus the engine's world) stands for.

``Universe`` fixes the bounded world a check runs in: which scope, participant, page and frame ids
fill the spec's slots, and how prefix identities, fingerprints and digests (ints in checks) map to
spec values. ``abstract_control`` rebuilds every *control* column of the spec from a ``CoreState``;
the world columns (frames in queues, page bytes) come from the harness that simulates the engine.
Refinement is then: after every core step, the control columns equal those the spec's own actions
produce.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from retire_core import (
    Contract,
    CoreState,
    ReusePolicy,
    ScopeState,
)
from retire_spec.schema import (
    ACTIVE,
    BEYOND,
    CANCELLED,
    COLUMN_INDEX,
    COLUMNS,
    CONTROL_COLUMNS,
    FINISHED,
    GARBAGE,
    NO_FRAME,
    NO_MATCH,
    PAUSED,
    UNOPENED,
    Bounds,
    Role,
    SpecState,
    initial_state,
)


@attrs.frozen(slots=True)
class Universe:
    bounds: Bounds
    scopes: tuple[str, ...]
    parts: tuple[str, ...]
    tenants: tuple[str, ...]
    # The engine's KV cache groups (``Contract.kv_windows``) and the group of each page slot
    # (empty: all in group 0). A page's group is fixed by its slot: the spec's rules are per
    # page and never read it; the core's cut and the engine's books do.
    kv_windows: tuple[int, ...] = (0,)
    page_groups: tuple[int, ...] = ()

    @classmethod
    def of(
        cls, bounds: Bounds, kv_windows: tuple[int, ...] = (0,), page_groups: tuple[int, ...] = ()
    ) -> Universe:
        if page_groups and len(page_groups) != bounds.pages:
            raise ValueError("one group per page slot is required")
        if any(g >= len(kv_windows) for g in page_groups):
            raise ValueError(f"page groups {page_groups} name a group kv_windows lacks")
        return cls(
            bounds,
            tuple(f"s{i}" for i in range(bounds.scopes)),
            tuple(f"q{i}" for i in range(bounds.parts)),
            tuple(f"t{fp}" for fp in bounds.fingerprints),
            kv_windows,
            page_groups,
        )

    def group(self, page: int) -> int:
        return self.page_groups[page] if self.page_groups else 0

    def contract(self, reuse: bool) -> Contract:
        """The contract of a version opened with (``reuse``) or without handoff."""
        policy = ReusePolicy.AUTO if reuse else ReusePolicy.NEVER
        return Contract(reuse=policy, kv_windows=self.kv_windows)

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
    ScopeState.FINISHED: FINISHED,
}


def _digest(d: str | None) -> int:
    return GARBAGE if d is None else int(d)


def abstract_control(
    core: CoreState, uni: Universe, launched: dict[int, tuple[int, int]]
) -> dict[str, tuple[Any, ...]]:
    """The spec's control columns for ``core``. ``launched`` maps participant slots the engine
    started to (scope slot, version): a participant the core has forgotten (its version drained
    into the ledger) is, by construction, closed."""
    return dict(zip(CONTROL_COLUMNS, abstract_control_cells(core, uni, launched), strict=True))


# ``abstract_control_cells`` builds the columns in this order, which must be ``CONTROL_COLUMNS``.
_CONTROL_ORDER = (
    "scope_mode",
    "scope_epoch",
    "scope_admitted",
    "scope_reuse",
    "scope_want",
    "part_used",
    "part_scope",
    "part_ver",
    "part_closed",
    "page_alloc",
    "page_owner",
    "page_over",
    "page_gen",
    "page_writer",
    "page_full",
    "page_draft",
    "page_pos",
    "page_tok",
    "page_fp",
    "page_digest",
    "page_held",
    "page_pinned",
    "page_cert_scope",
    "page_cert_ver",
    "page_cert_gen",
    "page_cert_digest",
)
if _CONTROL_ORDER != CONTROL_COLUMNS:
    raise AssertionError("teach abstract_control_cells the spec's new control columns")


def spec_context(context: Sequence[Any], positions: int) -> tuple[int, ...]:
    """The spec's context for a core context: padded with ``BEYOND`` to ``positions``."""
    return tuple(int(k) for k in context) + (BEYOND,) * (positions - len(context))


def abstract_control_cells(
    core: CoreState, uni: Universe, launched: dict[int, tuple[int, int]]
) -> tuple[tuple[Any, ...], ...]:
    """``abstract_control`` as a tuple of columns in ``CONTROL_COLUMNS`` order."""
    (
        mode,
        epoch,
        admitted,
        reuse,
        want,
        used,
        part_scope,
        part_ver,
        part_closed,
        alloc,
        owner,
        over,
        gen,
        writer,
        full,
        draft,
        pos,
        tok,
        fp,
        digest,
        held,
        pinned,
        cert_scope,
        cert_ver,
        cert_gen,
        cert_digest,
    ) = cols = [list(column) for column in _initial_control_cells(uni.bounds)]
    scopes = core.scopes
    for s, sid in enumerate(uni.scopes):
        rec = scopes.get(sid)
        if rec is None:
            continue
        mode[s] = _MODE[rec.state]
        epoch[s] = rec.epoch
        admitted[s] = rec.admitted
        reuse[s] = rec.contract.allows_reuse
        want[s] = spec_context(rec.context, uni.bounds.positions)
    for q, (s, v) in launched.items():
        used[q] = True
        part_scope[q] = s
        part_ver[q] = v
        rec = scopes.get(uni.scopes[s])
        part = rec.participants.get(uni.parts[q]) if rec is not None else None
        part_closed[q] = True if part is None else part.closed
    pages, generations = core.pages, core.generations
    for p in range(uni.bounds.pages):
        gen[p] = generations.get(p, 0)
        page = pages.get(p)
        if page is None:
            continue
        alloc[p] = True
        owner[p] = uni.scope_slot(page.owner)
        over[p] = page.version
        writer[p] = page.writer_open
        full[p] = page.full
        draft[p] = page.draft
        pos[p] = page.position
        tok[p] = NO_MATCH if page.prefix is None else int(page.prefix)
        fp[p] = int(page.fingerprint)
        if not page.writer_open:
            digest[p] = _digest(page.digest)
        held[p] = page.held
        pinned[p] = page.pinned
    for sid, rec in scopes.items():
        cert = rec.certificate
        if cert is None:
            continue
        for entry in cert.entries:
            page = pages.get(entry.page)
            if page is None or not page.pinned:
                continue
            e = entry.page
            cert_scope[e] = uni.scope_slot(sid)
            cert_ver[e] = cert.version
            cert_gen[e] = entry.generation
            cert_digest[e] = _digest(entry.digest)
    return tuple([tuple(column) for column in cols])


def control_view(st: SpecState, bounds: Bounds) -> dict[str, tuple[Any, ...]]:
    """The control columns of a spec state in canonical form (what ``abstract_control`` must
    equal)."""
    return fast_canonical(st, bounds).project(CONTROL_COLUMNS)


@functools.cache
def _initial_control_cells(bounds: Bounds) -> tuple[tuple[Any, ...], ...]:
    init = initial_state(bounds)
    return tuple(init[name] for name in CONTROL_COLUMNS)


# --- the canonical form, fast ------------------------------------------------------------------
# ``retire_spec.schema.canonical`` states which cells no guard, effect or invariant can read; it
# rebuilds the initial state and every column on each call, which dominated the explorer's
# profile. ``fast_canonical`` computes the same function (tests compare the two on random
# reachable states) column by column, touching only columns that have a cell to reset.


def _index(*names: str) -> tuple[int, ...]:
    return tuple(COLUMN_INDEX[n] for n in names)


_PAGE_SLOT = _index(
    *(
        c.name
        for c in COLUMNS
        if c.sort == "Page"
        and c.role is not Role.HISTORY
        and c.name not in ("page_gen", "page_pinned", "page_held")
    )
)
_CERT = _index("page_cert_scope", "page_cert_ver", "page_cert_gen", "page_cert_digest")
_PART = _index(*(c.name for c in COLUMNS if c.sort == "Part" and c.role is not Role.HISTORY))
_FRAME = _index(*(c.name for c in COLUMNS if c.sort == "Frame" and c.role is not Role.HISTORY))
_SCOPE = _index(
    *(
        c.name
        for c in COLUMNS
        if c.sort == "Scope"
        and c.role is Role.CONTROL
        and c.name not in ("scope_epoch", "scope_admitted")
    )
)
(
    _ALLOC,
    _PINNED,
    _WRITER,
    _DIGEST,
    _USED,
    _FSTATE,
    _MODE_I,
    _PAUSE_AT,
    _CANCEL_AT,
) = _index(
    "page_alloc",
    "page_pinned",
    "page_writer",
    "page_digest",
    "part_used",
    "frame_state",
    "scope_mode",
    "scope_pause_epoch",
    "scope_cancel_epoch",
)


@functools.cache
def _reset_values(bounds: Bounds) -> tuple[Any, ...]:
    """The value each column is reset to (the initial value of its slot 0; initial columns are
    uniform across slots except ``scope_fp``, which is world state and never reset)."""
    init = initial_state(bounds)
    return tuple(column[0] if column else None for column in init.cells)


def fast_canonical(st: SpecState, bounds: Bounds) -> SpecState:
    """``retire_spec.schema.canonical(st, bounds)``, computed without rebuilding every column."""
    return canonical_function(bounds)(st)


@functools.cache
def canonical_function(bounds: Bounds) -> Callable[[SpecState], SpecState]:
    """``fast_canonical`` for one ``Bounds``, as straight-line code: for each group of columns
    sharing a rule (a free page's slot, a released certificate, an unused participant ...), if
    some slot is not kept, every column of the group is rebuilt with that slot reset."""
    sizes = bounds.sizes()
    init = _reset_values(bounds)
    page_only = tuple(i for i in _PAGE_SLOT if i not in _CERT and i != _DIGEST)
    groups: list[tuple[tuple[int, ...], str, Callable[[int], str], Any]] = [
        (page_only, "Page", lambda p: f"a[{p}]", None),
        (_CERT, "Page", lambda p: f"(a[{p}] and pn[{p}])", None),
        ((_DIGEST,), "Page", lambda p: f"(a[{p}] and not w[{p}])", None),
        (_PART, "Part", lambda q: f"u[{q}]", None),
        (_FRAME, "Frame", lambda f: f"fs[{f}] != {NO_FRAME}", None),
        (_SCOPE, "Scope", lambda s: f"m[{s}] != {UNOPENED}", None),
        ((_PAUSE_AT,), "Scope", lambda s: f"m[{s}] == {PAUSED}", 0),
        ((_CANCEL_AT,), "Scope", lambda s: f"m[{s}] == {CANCELLED}", 0),
    ]
    lines = [
        "def canonical(st):",
        "    c = st.cells",
        f"    a, pn, w = c[{_ALLOC}], c[{_PINNED}], c[{_WRITER}]",
        f"    u, fs, m = c[{_USED}], c[{_FSTATE}], c[{_MODE_I}]",
        "    out = None",
    ]
    for columns, sort, keep, reset in groups:
        n = sizes[sort]
        if not columns or n == 0:
            continue
        kept = " and ".join(f"({keep(j)})" for j in range(n))
        lines.append(f"    if not ({kept}):")
        lines.append("        if out is None:")
        lines.append("            out = list(c)")
        for i in columns:
            value = init[i] if reset is None else reset
            slots = ", ".join(f"(c[{i}][{j}] if {keep(j)} else {value!r})" for j in range(n))
            lines.append(f"        out[{i}] = ({slots},)")
    lines.append("    return st if out is None else SpecState(tuple(out))")
    namespace: dict[str, Any] = {"SpecState": SpecState}
    exec(compile("\n".join(lines) + "\n", "<retire_checks canonical>", "exec"), namespace)
    fn: Callable[[SpecState], SpecState] = namespace["canonical"]
    return fn
