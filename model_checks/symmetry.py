"""Symmetry reduction: one fingerprint per orbit of joint states under renaming of identities.

The explorer's joint state is (core state, spec state, pending byte checks, faults used, the
versions the engine may launch for). Scope
slots of the same tenant class are interchangeable, tenants are interchangeable (fingerprint
values are only ever compared for equality, by the spec and by the core), and so are participant
and frame slots. ``Symmetry.fingerprint`` picks a renaming of the state — a scope permutation
that maps the bounds' fingerprint assignment onto itself (renaming fingerprint values and tenant
names along), then a sorting of participant and frame slots — and hashes a *complete* encoding
of the renamed state. Equal fingerprints therefore mean (up to a 64-bit hash collision) states
in the same orbit, which is what makes the reduction sound; ties in the sorting only cost
reduction, never soundness. Page slots are *not* permuted: the core breaks ties between equally
good pages by page id, so pages are not interchangeable. The encoder names every field of every
core record it walks and refuses records with fields it does not know (a new core field must be
added here, not silently dropped from the key). ``core_class`` hashes the part of a core state
no renaming changes (the parallel search's owner of a state). What does not live here: the
search itself (``shard``, ``parallel``).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe
from retire_spec.schema import COLUMN_INDEX, COLUMNS, NO_FRAME, SpecState

# Every field of every record the core state is made of, and how the encoder treats it. A core
# change that adds a field makes ``check_encoder_covers_core`` fail loudly.
CORE_FIELDS: dict[type, tuple[str, ...]] = {
    rc.CoreState: ("scopes", "pages", "generations", "ledger", "ledger_size"),
    rc.ScopeRecord: (
        "tenant",
        "fingerprint",
        "state",
        "epoch",
        "admitted",
        "context",
        "contract",
        "participants",
        "certificate",
    ),
    rc.ParticipantRecord: ("version", "closed"),
    rc.PageRecord: (
        "owner",
        "version",
        "participant",
        "generation",
        "position",
        "prefix",
        "fingerprint",
        "writer_open",
        "full",
        "draft",
        "digest",
        "held",
        "pinned",
        "group",
    ),
    rc.Certificate: ("scope", "version", "entries"),
    rc.CertEntry: ("page", "position", "generation", "prefix", "fingerprint", "digest", "group"),
}


def check_encoder_covers_core() -> None:
    for cls, names in CORE_FIELDS.items():
        # the fields that make up a record's value (a derived field, like ``CoreState``'s page
        # index, takes no part in equality and needs no encoding)
        named = getattr(cls, "_fields", None)  # a named tuple (``PageRecord``): all its value
        if named is not None:
            actual = tuple(named)
        else:
            actual = tuple(f.name for f in attrs.fields(cls) if f.eq)
        if actual != names:
            raise AssertionError(
                f"{cls.__name__} has fields {actual}; the symmetry encoder knows {names}: "
                "teach retire_checks.symmetry the new field before exploring"
            )


_C = COLUMN_INDEX
_SCOPE_COLS = tuple(i for i, c in enumerate(COLUMNS) if c.sort == "Scope")
_PART_COLS = tuple(i for i, c in enumerate(COLUMNS) if c.sort == "Part")
_FRAME_COLS = tuple(i for i, c in enumerate(COLUMNS) if c.sort == "Frame")
_PART_SCOPE, _PART_USED = _C["part_scope"], _C["part_used"]
_FRAME_SCOPE, _FRAME_STATE = _C["frame_scope"], _C["frame_state"]
_PAGE_OWNER, _PAGE_ALLOC = _C["page_owner"], _C["page_alloc"]
_CERT_SCOPE, _PAGE_PINNED = _C["page_cert_scope"], _C["page_pinned"]
_PAGE_FP, _SCOPE_FP = _C["page_fp"], _C["scope_fp"]


@attrs.frozen(slots=True)
class Renaming:
    """One scope permutation with the fingerprint renaming it induces."""

    slots: tuple[int, ...]  # old scope slot -> new scope slot
    fps: Mapping[int, int]  # fingerprint value -> fingerprint value
    scope_names: Mapping[str, str]
    tenant_names: Mapping[str, str]
    fp_names: Mapping[str, str]
    identity: bool


def scope_renamings(uni: Universe) -> tuple[Renaming, ...]:
    """Every scope permutation that maps the fingerprint assignment onto itself up to a
    renaming of fingerprint values (tenants of equal size may be swapped)."""
    fps = uni.bounds.fingerprints
    out = []
    for perm in itertools.permutations(range(len(fps))):
        phi: dict[int, int] = {}
        ok = True
        for s, t in enumerate(perm):
            if phi.setdefault(fps[s], fps[t]) != fps[t]:
                ok = False
        if not ok or len(set(phi.values())) != len(phi):
            continue
        out.append(
            Renaming(
                tuple(perm),
                phi,
                {uni.scopes[s]: uni.scopes[t] for s, t in enumerate(perm)},
                {f"t{a}": f"t{b}" for a, b in phi.items()},
                {str(a): str(b) for a, b in phi.items()},
                perm == tuple(range(len(fps))),
            )
        )
    return tuple(out)


class Symmetry:
    """Fingerprints of joint states modulo the symmetry group (or plain, when disabled).

    Both halves of the encoding are memoized (the explorer meets the same canonical spec state
    and the same core state in many joint states): the renamed spec encodings per canonical spec
    state, and the hash of the renamed core encoding per (core state, renaming, participant
    renaming). Memo entries are pure functions of their keys; ``limit`` bounds each memo."""

    def __init__(self, uni: Universe, enabled: bool = True, limit: int = 300_000) -> None:
        check_encoder_covers_core()
        self.uni = uni
        self.enabled = enabled
        self.renamings = scope_renamings(uni) if enabled else scope_renamings(uni)[:1]
        sizes = uni.bounds.sizes()
        self._renamers = {ren.slots: _scope_renamer(ren, sizes) for ren in self.renamings}
        self.part_names = uni.parts
        self.limit = limit
        # per canonical spec state: (hash of the renamed spec encoding, renaming, participant
        # renaming) for each scope renaming (the encoding is a tuple, whose hash Python does
        # not cache, so it is hashed once here; the fingerprint hashes that hash with the rest)
        self._specs: dict[SpecState, list[tuple[int, int, tuple[str, ...]]]] = {}
        self._cores: dict[tuple[Any, ...], tuple[rc.CoreState, int]] = {}
        # per raw spec state (by identity): (the state, its canonical form, its renamed list)
        self._raw: dict[int, tuple[SpecState, SpecState, Any]] = {}

    def fingerprint(
        self,
        core: rc.CoreState,
        spec: SpecState,
        pending: Mapping[int, int],
        faults: int,
        launchable: frozenset[tuple[int, int]] = frozenset(),
    ) -> int:
        """``spec`` must be in canonical form (``abstraction.fast_canonical``). ``launchable``:
        the (scope slot, version) pairs the engine may launch for (``Lockstep.launchable``)."""
        if not self.enabled:
            return hash(
                (
                    core,
                    spec.cells,
                    tuple(sorted(pending.items())),
                    faults,
                    tuple(sorted(launchable)),
                )
            )
        return self._combine(self._renamed(spec), core, pending, faults, launchable)

    def fingerprint_raw(
        self,
        core: rc.CoreState,
        spec: SpecState,
        pending: Mapping[int, int],
        faults: int,
        canonical: Callable[[SpecState], SpecState],
        launchable: frozenset[tuple[int, int]] = frozenset(),
    ) -> tuple[int, SpecState]:
        """``fingerprint(core, canonical(spec), pending, faults)`` and ``canonical(spec)``, for a
        spec state that is not (necessarily) canonical. Its half is memoized by the identity of
        ``spec`` (the explorer interns spec states, so equal states meet the same entry; each
        entry holds ``spec``, so its id is not reused while the entry exists, and a miss on an
        equal but distinct object only recomputes): ``canonical`` is a pure function and the
        renamed encodings a pure function of its result."""
        found = self._raw.get(id(spec))
        if found is None:
            if len(self._raw) >= self.limit:
                self._raw.clear()
            canon = canonical(spec)
            found = self._raw[id(spec)] = (
                spec,
                canon,
                None if not self.enabled else self._renamed(canon),
            )
        canon = found[1]
        renamed = found[2]
        if renamed is None:
            return self.fingerprint(core, canon, pending, faults, launchable), canon
        return self._combine(renamed, core, pending, faults, launchable), canon

    def _renamed(self, spec: SpecState) -> list[tuple[int, int, tuple[str, ...]]]:
        renamed = self._specs.get(spec)
        if renamed is None:
            if len(self._specs) >= self.limit:
                self._specs.clear()
            renamed = []
            for r, ren in enumerate(self.renamings):
                spec_enc, part_map = self._rename_spec(spec.cells, ren)
                renamed.append((hash(spec_enc), r, tuple(part_map[q] for q in self.part_names)))
            self._specs[spec] = renamed
        return renamed

    def _combine(
        self,
        renamed: list[tuple[int, int, tuple[str, ...]]],
        core: rc.CoreState,
        pending: Mapping[int, int],
        faults: int,
        launchable: frozenset[tuple[int, int]] = frozenset(),
    ) -> int:
        if len(renamed) == 1:
            spec_hash, r, parts = renamed[0]
            if pending or launchable:
                slots = self.renamings[r].slots
                pend = tuple(sorted((slots[s], v) for s, v in pending.items()))
                eng = tuple(sorted((slots[s], v) for s, v in launchable))
            else:
                pend = eng = ()
            return hash((hash((spec_hash, pend, faults, eng)), self._core_hash(core, r, parts)))
        candidates = []
        for spec_hash, r, parts in renamed:
            slots = self.renamings[r].slots
            pend = tuple(sorted((slots[s], v) for s, v in pending.items()))
            eng = tuple(sorted((slots[s], v) for s, v in launchable))
            candidates.append((hash((spec_hash, pend, faults, eng)), r, parts))
        best = min(c[0] for c in candidates)
        return min(
            hash((h, self._core_hash(core, r, parts))) for h, r, parts in candidates if h == best
        )

    def _core_hash(self, core: rc.CoreState, r: int, parts: tuple[str, ...]) -> int:
        # keyed by the core state's identity; each entry holds the state, so the id is not
        # reused while the entry exists (an equal state that is another object only misses)
        key = (id(core), r, parts)
        found = self._cores.get(key)
        if found is None:
            if len(self._cores) >= self.limit:
                self._cores.clear()
            part_map = dict(zip(self.part_names, parts, strict=True))
            h = hash(encode_core(core, self.renamings[r], part_map))
            found = self._cores[key] = (core, h)
        return found[1]

    # --- the spec side ----------------------------------------------------------------------
    def _rename_spec(
        self, cells: tuple[Any, ...], ren: Renaming
    ) -> tuple[tuple[Any, ...], dict[str, str]]:
        out = list(cells) if ren.identity else self._renamers[ren.slots](cells)
        # Participants: used ones first, ordered by everything the spec knows about them.
        n_parts = len(cells[_PART_USED])
        rows = zip(*[out[i] for i in _PART_COLS], strict=True) if _PART_COLS else [()] * n_parts
        keyed = sorted(zip([not u for u in cells[_PART_USED]], rows, range(n_parts), strict=True))
        order = [q for _, _, q in keyed]
        if order != list(range(n_parts)):
            for i in _PART_COLS:
                col = out[i]
                out[i] = tuple([col[q] for q in order])
        names = self.part_names
        part_map = {names[q]: names[new] for new, q in enumerate(order)}
        # Frames: the core never sees frame slots, so any order is a renaming; sort fully.
        n_frames = len(cells[_FRAME_STATE])
        if n_frames > 1:
            frows = sorted(zip(*[out[i] for i in _FRAME_COLS], strict=True))
            for i, column in zip(_FRAME_COLS, zip(*frows, strict=True), strict=True):
                out[i] = column
        return tuple(out), part_map


def _scope_renamer(
    ren: Renaming, sizes: Mapping[str, int]
) -> Callable[[tuple[Any, ...]], list[Any]]:
    """The scope renaming of a spec state's cells (every scope-indexed column permuted,
    fingerprint values renamed, scope-valued cells of used slots renamed), as straight-line
    code for one renaming and one set of sizes: a list of the renamed columns."""
    slots = ren.slots
    inv = [0] * len(slots)
    for s, t in enumerate(slots):
        inv[t] = s

    def tup(items: list[str]) -> str:
        return "(" + "".join(f"{x}, " for x in items) + ")"

    n_s, n_q, n_f, n_p = (sizes[k] for k in ("Scope", "Part", "Frame", "Page"))
    lines = ["def rename(c):", "    out = list(c)"]
    for i in _SCOPE_COLS:
        lines.append(f"    col = c[{i}]")
        lines.append(f"    out[{i}] = {tup([f'col[{inv[t]}]' for t in range(n_s)])}")
    lines.append(f"    col = out[{_SCOPE_FP}]")
    lines.append(f"    out[{_SCOPE_FP}] = {tup([f'PHI[col[{t}]]' for t in range(n_s)])}")
    lines.append(f"    u, v = c[{_PART_USED}], c[{_PART_SCOPE}]")
    parts = [f"(S[v[{q}]] if u[{q}] else v[{q}])" for q in range(n_q)]
    lines.append(f"    out[{_PART_SCOPE}] = {tup(parts)}")
    lines.append(f"    fs, v = c[{_FRAME_STATE}], c[{_FRAME_SCOPE}]")
    frames = [f"(S[v[{f}]] if fs[{f}] != {NO_FRAME} else v[{f}])" for f in range(n_f)]
    lines.append(f"    out[{_FRAME_SCOPE}] = {tup(frames)}")
    lines.append(f"    a, pn, v = c[{_PAGE_ALLOC}], c[{_PAGE_PINNED}], c[{_PAGE_OWNER}]")
    owners = [f"(S[v[{p}]] if a[{p}] else v[{p}])" for p in range(n_p)]
    lines.append(f"    out[{_PAGE_OWNER}] = {tup(owners)}")
    lines.append(f"    v = c[{_CERT_SCOPE}]")
    certs = [f"(S[v[{p}]] if a[{p}] and pn[{p}] else v[{p}])" for p in range(n_p)]
    lines.append(f"    out[{_CERT_SCOPE}] = {tup(certs)}")
    lines.append(f"    v = c[{_PAGE_FP}]")
    fps = [f"(PHI.get(v[{p}], v[{p}]) if a[{p}] else v[{p}])" for p in range(n_p)]
    lines.append(f"    out[{_PAGE_FP}] = {tup(fps)}")
    lines.append("    return out")
    namespace: dict[str, Any] = {"S": tuple(slots), "PHI": dict(ren.fps)}
    exec(compile("\n".join(lines) + "\n", "<retire_checks scope renaming>", "exec"), namespace)
    fn: Callable[[tuple[Any, ...]], list[Any]] = namespace["rename"]
    return fn


def encode_core(core: rc.CoreState, ren: Renaming, parts: Mapping[str, str]) -> tuple[Any, ...]:
    """A complete encoding of ``core`` with scope, tenant, fingerprint and participant names
    renamed (page ids, versions, generations, prefixes and digests are kept as they are)."""
    sn, tn, fn = ren.scope_names, ren.tenant_names, ren.fp_names
    scopes = []
    for sid, rec in core.scopes.items():
        cert = rec.certificate
        cert_enc = (
            None
            if cert is None
            else (
                sn[cert.scope],
                cert.version,
                tuple(
                    (
                        e.page,
                        e.position,
                        e.generation,
                        e.prefix,
                        fn.get(e.fingerprint, e.fingerprint),
                        e.digest,
                        e.group,
                    )
                    for e in cert.entries
                ),
            )
        )
        scopes.append(
            (
                sn[sid],
                tn.get(rec.tenant, rec.tenant),
                fn.get(rec.fingerprint, rec.fingerprint),
                rec.state,
                rec.epoch,
                rec.admitted,
                rec.context,
                rec.contract,
                tuple(sorted((parts[q], r) for q, r in rec.participants.items())),
                cert_enc,
            )
        )
    scopes.sort(key=lambda row: row[0])
    pages = tuple(
        (
            p,
            sn[r.owner],
            r.version,
            parts[r.participant],
            r.generation,
            r.position,
            r.prefix,
            fn.get(r.fingerprint, r.fingerprint),
            r.writer_open,
            r.full,
            r.draft,
            r.digest,
            r.held,
            r.pinned,
            r.group,
        )
        for p, r in sorted(core.pages.items())
    )
    return (
        tuple(scopes),
        pages,
        tuple(sorted(core.generations.items())),
        tuple((sn[s], v) for s, v in core.ledger),
        core.ledger_size,
    )


def core_class(core: rc.CoreState) -> int:
    """A hash of part of what ``encode_core`` keeps under *every* renaming: the scope records as
    a multiset, without their ids, tenants, fingerprints and contracts, and the pages (their ids
    are not renamed) without owner, participant and fingerprint. States of one orbit therefore have
    cores of one class, and the parallel search (``shard``) hands every state to the worker its
    core's class maps to. Cheaper than a renamed encoding, and computed without the spec state,
    so a worker finds a successor's owner before it fingerprints it."""
    scopes = []
    for rec in core.scopes.values():
        cert = rec.certificate
        scopes.append(
            hash(
                (
                    rec.state.value,  # (an enum member hashes in Python, its value in C)
                    rec.epoch,
                    rec.admitted,
                    rec.context,
                    tuple(sorted((r.version, r.closed) for r in rec.participants.values())),
                    None
                    if cert is None
                    else (
                        cert.version,
                        tuple(
                            (e.page, e.position, e.generation, e.prefix, e.digest, e.group)
                            for e in cert.entries
                        ),
                    ),
                )
            )
        )
    scopes.sort()
    pages = tuple(
        (
            p,
            r.version,
            r.generation,
            r.position,
            r.prefix,
            r.writer_open,
            r.full,
            r.draft,
            r.digest,
            r.held,
            r.pinned,
            r.group,
        )
        for p, r in sorted(core.pages.items())
    )
    return hash(
        (
            tuple(scopes),
            pages,
            tuple(sorted(core.generations.items())),
            tuple(v for _, v in core.ledger),
        )
    )
