"""Trace validation: is a recorded ``retire.transition`` log a behaviour of the spec?

``validate_lines`` (and ``validate_file``) read the JSON lines that ``retire_core.Retire`` writes
through structlog (one object per transition: ``seq``, ``trigger``, ``transition``, ``stage``,
``scope``, ``version`` and the transition's arguments) and replay them as spec actions, a
transition over several pages (its ``pages`` list) as one spec step per page. The universe
is sized from the trace itself (a first pass counts scopes, participants and pages; ids are mapped
to slots on first sight), so traces of real engines with arbitrary ids and any number of versions
are accepted; block keys, fingerprints and digests are interned to integers. What a log never shows
is searched for: the spec's *world* actions. A frame's ``emit`` is placed by commutation: it only
touches that frame's columns, so it can be moved to any moment a participant of the frame's version
was running, and the validator checks that such a moment existed; after delivery a frame's slot is
recycled (its columns are never read again). A ``corrupt`` of page bytes is explored as a branch
whenever a byte check failed with ``digest_mismatch`` (the set of candidate spec states is kept,
deduplicated). Each logged transition must be allowed by the spec's guard in at least one candidate
state, every invariant must hold afterwards, and the logged fields the spec determines (generations,
versions, the certified digest, inheritability) must agree with it, and an adopted page's reported
digest must be the one its writer closed with; stutters (the core's ``transitions.STUTTERS``)
must concern a version without authority, and a ``stale_verify`` a tracked page holding no drafts
under an open writer. The first line at which no candidate survives is reported with the reason.
What does not live here: the structlog configuration (the caller's) and the CLI (``cli_checks``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from retire_checks.abstraction import fast_canonical
from retire_core.reasons import ReleaseReason
from retire_core.transitions import STUTTERS
from retire_spec.actions import ACTION_BY_NAME, ActionInstance
from retire_spec.codegen import Compiler
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS
from retire_spec.schema import (
    ACTIVE,
    BEYOND,
    CANCELLED,
    COLUMN_INDEX,
    COLUMNS,
    FINISHED,
    FRAME_KINDS,
    GARBAGE,
    NO_FRAME,
    NO_MATCH,
    PAUSED,
    Bounds,
    SpecState,
    initial_state,
)

EVENT = "retire.transition"
KINDS = {"token": FRAME_KINDS[0], "commit": FRAME_KINDS[1], "install": FRAME_KINDS[2]}
KNOWN = frozenset(ACTION_BY_NAME) - {"emit", "corrupt"} | STUTTERS


class TraceError(Exception):
    """The trace is not a behaviour of the spec; ``line`` is the first offending line (1-based
    line number in the file)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.message = message


@attrs.frozen(slots=True)
class Record:
    line: int  # 1-based line number in the input
    data: dict[str, Any]
    # a line over several pages is read as one record per page: True on the last of them
    last: bool = True

    def need(self, key: str) -> Any:
        if key not in self.data:
            raise TraceError(self.line, f"{self.data.get('transition')!r} lacks field {key!r}")
        return self.data[key]


@attrs.frozen(slots=True)
class Report:
    lines: int  # lines read
    transitions: int  # transitions replayed
    sizes: dict[str, int]
    hidden: dict[str, int]  # world actions the validator placed (emit, corrupt)
    candidates: int  # candidate spec states at the end


def read_records(lines: Iterable[str]) -> Iterator[Record]:
    """The ``retire.transition`` records of a JSON-lines log (other lines are skipped; a line
    that is not JSON is an error)."""
    for n, raw in enumerate(lines, 1):
        text = raw.strip()
        if not text:
            continue
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise TraceError(n, f"not a JSON object ({err.msg})") from None
        if not isinstance(data, dict):
            raise TraceError(n, "not a JSON object")
        if data.get("event") != EVENT:
            continue
        if "pages" in data:
            yield from _per_page(n, data)
        else:
            yield Record(n, data)


def _per_page(n: int, data: dict[str, Any]) -> Iterator[Record]:
    """A transition over several pages (``retire_core.transitions.pages_transition``) as the
    records of its per-page steps, in order: each with ``page`` and that page's entry of every
    list-valued field (a ``null`` entry: the page has no such fact), the other fields as they
    are (``retire_core.transitions.per_page``, for a log line)."""
    pages = data["pages"]
    if not isinstance(pages, list) or len(pages) < 2:
        raise TraceError(n, "'pages' must list two or more page ids")
    columns = {k: v for k, v in data.items() if isinstance(v, list) and k != "pages"}
    for k, column in columns.items():
        if len(column) != len(pages):
            raise TraceError(n, f"{k!r} has {len(column)} entries for {len(pages)} pages")
    common = {k: v for k, v in data.items() if k not in columns and k != "pages"}
    for i, page in enumerate(pages):
        each = dict(common, page=page)
        for k, column in columns.items():
            if column[i] is not None:
                each[k] = column[i]
        yield Record(n, each, i == len(pages) - 1)


# --- interning ---------------------------------------------------------------------------------


class Interner:
    """Maps trace values (scope ids, participant ids, page ids, block keys, fingerprints,
    digests) to small integers on first sight."""

    def __init__(self, start: int = 0) -> None:
        self.table: dict[Any, int] = {}
        self.start = start

    def __call__(self, value: Any) -> int:
        key = json.dumps(value, sort_keys=True)
        if key not in self.table:
            self.table[key] = self.start + len(self.table)
        return self.table[key]

    def __len__(self) -> int:
        return len(self.table)

    def known(self, value: Any) -> bool:
        return json.dumps(value, sort_keys=True) in self.table


# --- the validator -------------------------------------------------------------------------------


class Validator:
    """Replays the records of one Retire instance against the spec."""

    def __init__(self, records: list[Record]) -> None:
        self.records = records
        self.scopes = Interner()
        self.parts = Interner()
        self.pages = Interner()
        self.keys = Interner(start=1000)  # block keys: far from GARBAGE, NO_MATCH, empty ctx
        self.fps = Interner()
        self.digests = Interner(start=1000)
        self._size()
        self.I = Concrete(self.bounds.sizes())
        # every invariant in one compiled body (a logged state is checked after every line);
        # which one broke is then asked of the interpreter
        self.invariants_hold = Compiler(self.bounds).conjunction(
            tuple(inv.holds for inv in INVARIANTS)
        )
        self.hidden = {"emit": 0, "corrupt": 0}
        self.launched: dict[tuple[int, int], int] = {}  # (scope, version) -> participants
        self.closed_digest: dict[int, int] = {}  # page slot -> digest logged at writer close
        self.transitions = 0

    def _size(self) -> None:
        """First pass: the universe the trace needs."""
        fps: dict[int, int] = {}
        positions = 1
        for r in self.records:
            d = r.data
            t = d.get("transition")
            scope = d.get("scope")
            if t == "open":
                s = self.scopes(scope)
                fps[s] = self.fps(d.get("fingerprint"))
            if t in ("open", "supersede") and isinstance(d.get("context"), list):
                positions = max(positions, len(d["context"]))
            if t == "launch":
                self.parts((scope, d.get("participant")))
            if "page" in d and t not in STUTTERS:
                self.pages(d["page"])
            if isinstance(d.get("position"), int):
                positions = max(positions, d["position"] + 1)
        n_scopes = max(1, len(self.scopes))
        self.bounds = Bounds(
            scopes=n_scopes,
            parts=max(1, len(self.parts)),
            frames=1,  # one slot, recycled after every delivery
            pages=max(1, len(self.pages)),
            positions=positions,
            max_epoch=0,
            contexts=(),
            fingerprints=tuple(fps.get(s, -1) for s in range(n_scopes)),
        )

    # --- helpers --------------------------------------------------------------------------
    def _scope(self, r: Record) -> int:
        scope = r.need("scope")
        if not self.scopes.known(scope):
            raise TraceError(r.line, f"scope {scope!r} was never opened in this trace")
        return self.scopes(scope)

    def _part(self, r: Record) -> int:
        key = (r.need("scope"), r.need("participant"))
        if not self.parts.known(key):
            raise TraceError(r.line, f"participant {key[1]!r} of {key[0]!r} never launched")
        return self.parts(key)

    def _page(self, r: Record) -> int:
        page = r.need("page")
        if not self.pages.known(page):
            raise TraceError(r.line, f"page {page!r} is unknown")
        return self.pages(page)

    def _ctx(self, r: Record) -> tuple[int, ...]:
        ctx = r.need("context")
        if not isinstance(ctx, list):
            raise TraceError(r.line, "context must be a list of block keys")
        # fixed length, as the spec's contexts are: the positions past it are the version's own
        return tuple(self.keys(k) for k in ctx) + (BEYOND,) * (self.bounds.positions - len(ctx))

    def _instances(self, r: Record) -> list[ActionInstance]:
        """The spec action instance a logged transition stands for."""
        d = r.data
        t = d.get("transition")
        A = ActionInstance
        if t in ("open", "supersede"):
            return [A(t, (self._scope(r), self._ctx(r), bool(r.need("reuse"))))]
        if t in ("pause", "unpause", "cancel", "resume", "finish", "preempt", "forget"):
            return [A(t, (self._scope(r),))]
        if t == "launch":
            return [A(t, (self._part(r), self._scope(r), int(r.need("version"))))]
        if t == "receipt":
            return [A(t, (self._part(r),))]
        if t in ("publish", "drop"):
            return [A(t, (0,))]
        if t == "allocate":
            return [A(t, (self._page(r), self._part(r), int(r.need("position"))))]
        if t in ("write", "write_draft", "fence_write"):
            return [A(t, (self._page(r), self._part(r), bool(r.need("completes"))))]
        if t == "verify_drafts":
            return [A(t, (self._page(r), bool(r.need("completes"))))]
        if t == "close_writer":
            named = d.get("named")
            return [A(t, (self._page(r), NO_MATCH if named is None else self.keys(named)))]
        if t in ("reuse_id", "unhold", "free", "evict", "unreference"):
            return [A(t, (self._page(r),))]
        if t in ("certify", "adopt", "release"):
            return [A(t, (self._scope(r), self._page(r)))]
        raise TraceError(r.line, f"unknown transition {t!r}")

    # --- one line -------------------------------------------------------------------------
    def step(self, r: Record, candidates: list[SpecState]) -> list[SpecState]:
        d = r.data
        t = d.get("transition")
        if t not in KNOWN:
            raise TraceError(r.line, f"unknown transition {t!r}")
        if t in STUTTERS:
            self._stutter(r, candidates)
            self.transitions += r.last
            return candidates
        insts = self._instances(r)
        if t in ("publish", "drop"):
            candidates = [self._emit(r, st) for st in candidates]
        if t == "release" and d.get("reason") == ReleaseReason.DIGEST_MISMATCH:
            candidates = candidates + [
                c for c in (self._corrupt(st, insts[0].args[1]) for st in candidates) if c
            ]
        survivors: list[SpecState] = []
        why = ""
        for st in candidates:
            try:
                survivors.append(self._apply(r, st, insts))
            except TraceError as err:
                why = why or err.message
        if not survivors:
            raise TraceError(r.line, why)
        self._record_facts(r, insts)
        self.transitions += r.last
        if len(survivors) == 1:  # the usual case: nothing to deduplicate
            return survivors
        unique: dict[SpecState, SpecState] = {}
        for st in survivors:
            unique.setdefault(fast_canonical(st, self.bounds), st)
        return list(unique.values())

    def _apply(self, r: Record, st: SpecState, insts: list[ActionInstance]) -> SpecState:
        I = self.I
        for inst in insts:
            action = ACTION_BY_NAME[inst.name]
            if not action.guard(I, st, *inst.args):
                raise TraceError(r.line, self._explain(r, st, inst))
            st = st.replace(action.effect(I, st, *inst.args))
        self._check_fields(r, st, insts[-1])
        if not self.invariants_hold(st):
            broken = [inv.name for inv in INVARIANTS if not inv.holds(I, st)]
            raise TraceError(r.line, f"{insts[-1]} leads to a state violating {broken}")
        return st

    def _emit(self, r: Record, st: SpecState) -> SpecState:
        """Place the frame's emit: recycle the frame slot, then emit from a participant of the
        frame's version that was running at some point (emit commutes with every action that
        does not touch this frame's columns, so that moment can be any)."""
        s = self._scope(r)
        v = int(r.need("version"))
        kind = r.need("kind")
        if kind not in KINDS:
            raise TraceError(r.line, f"unknown frame kind {kind!r}")
        if (s, v) not in self.launched:
            raise TraceError(
                r.line,
                f"a frame of {r.data['scope']}@{v} arrived, but no participant of that version "
                "was ever running to emit it",
            )
        self.hidden["emit"] += 1
        init = _initial(self.bounds)
        cells = list(st.cells)
        for name in _FRAME_COLUMNS:
            cells[COLUMN_INDEX[name]] = init[name]
        fresh = SpecState(tuple(cells))
        return fresh.replace(
            {
                "frame_state": (1,),  # IN_FLIGHT
                "frame_scope": (s,),
                "frame_ver": (v,),
                "frame_kind": (KINDS[kind],),
            }
        )

    def _corrupt(self, st: SpecState, p: int) -> SpecState | None:
        action = ACTION_BY_NAME["corrupt"]
        if not action.guard(self.I, st, p):
            return None
        self.hidden["corrupt"] += 1
        return st.replace(action.effect(self.I, st, p))

    def _stutter(self, r: Record, candidates: list[SpecState]) -> None:
        if r.data["transition"] == "stale_verify":
            self._stale_verify(r, candidates)
            return
        s = self._scope(r)
        v = int(r.need("version"))
        st = candidates[0]  # control columns agree across candidates (only world differs)
        epoch, mode = st["scope_epoch"][s], st["scope_mode"][s]
        retired = v < epoch or (v == epoch and mode in (CANCELLED, FINISHED))
        if not retired:
            raise TraceError(
                r.line,
                f"{r.data['transition']} for {r.data['scope']}@{v}, which still holds "
                f"authority (current version {epoch}, mode {_MODE_NAMES.get(mode, mode)})",
            )

    def _stale_verify(self, r: Record, candidates: list[SpecState]) -> None:
        """A verification of drafts that changes nothing: the page must be tracked and hold no
        drafts, or its writer must have closed (a repeated or late verification)."""
        page = r.need("page")
        if not self.pages.known(page):
            raise TraceError(r.line, f"stale_verify of page {page!r}, which is unknown")
        p = self.pages(page)
        st = candidates[0]  # control columns agree across candidates (only world differs)
        if not st["page_alloc"][p]:
            raise TraceError(r.line, f"stale_verify of page {page!r}, which is not allocated")
        if st["page_draft"][p] and st["page_writer"][p]:
            raise TraceError(
                r.line,
                f"stale_verify of page {page!r}, which holds drafts under an open writer: "
                "the verification should have settled them",
            )

    def _record_facts(self, r: Record, insts: list[ActionInstance]) -> None:
        d = r.data
        t = d["transition"]
        if t == "launch":
            key = (insts[0].args[1], insts[0].args[2])
            self.launched[key] = self.launched.get(key, 0) + 1
        elif t == "close_writer" and "digest" in d:
            self.closed_digest[insts[0].args[0]] = self.digests(d["digest"])

    def _check_fields(self, r: Record, st: SpecState, inst: ActionInstance) -> None:
        """The logged fields the spec determines must agree with it."""
        d = r.data
        t = inst.name
        s_of = d.get("scope")
        if t in (
            "open",
            "supersede",
            "pause",
            "unpause",
            "cancel",
            "resume",
            "finish",
            "preempt",
            "certify",
            "adopt",
        ):
            s = self.scopes(s_of)
            if d.get("version") != st["scope_epoch"][s]:
                raise TraceError(
                    r.line,
                    f"{t} logged version {d.get('version')}, but the spec's current version of "
                    f"{s_of!r} is {st['scope_epoch'][s]}",
                )
        if t == "allocate":
            p = inst.args[0]
            gen = (d.get("changed") or {}).get("generation")
            if gen is not None and gen != st["page_gen"][p]:
                raise TraceError(
                    r.line, f"allocate logged generation {gen}, spec has {st['page_gen'][p]}"
                )
            tok = st["page_tok"][p]
            inheritable = tok != NO_MATCH and tok >= 0
            if "inheritable" in d and bool(d["inheritable"]) != inheritable:
                raise TraceError(
                    r.line,
                    f"allocate logged inheritable={d['inheritable']}, but the page "
                    f"{'does' if inheritable else 'does not'} hold a block of the current, "
                    "admitted version's context",
                )
        if t == "close_writer" and "inheritable" in d:
            tok = st["page_tok"][inst.args[0]]
            inheritable = tok != NO_MATCH and tok >= 0
            if bool(d["inheritable"]) != inheritable:
                raise TraceError(
                    r.line,
                    f"close_writer logged inheritable={d['inheritable']} after the name "
                    f"{d.get('named')!r}, but in the spec the page "
                    f"{'has' if inheritable else 'has no'} prefix identity (a name counts only "
                    "for a completed block past the context of a current, admitted version)",
                )
        if t == "reuse_id":
            gen = (d.get("changed") or {}).get("generation")
            p = inst.args[0]
            if gen is not None and gen != st["page_gen"][p]:
                raise TraceError(
                    r.line, f"reuse_id logged generation {gen}, spec has {st['page_gen'][p]}"
                )
        if t == "adopt" and "digest" in d:
            p = inst.args[1]
            if self.closed_digest.get(p) != self.digests(d["digest"]):
                raise TraceError(
                    r.line,
                    f"adopt of page {d.get('page')!r}: the engine reported digest "
                    f"{d['digest']!r}, not the one its writer closed with (and the certificate "
                    "carries): a page whose bytes changed was adopted",
                )
        if t == "certify":
            p = inst.args[1]
            if "generation" in d and d["generation"] != st["page_gen"][p]:
                raise TraceError(
                    r.line,
                    f"certify logged generation {d['generation']}, spec has {st['page_gen'][p]}",
                )
            if "digest" in d and self.closed_digest.get(p) != self.digests(d["digest"]):
                raise TraceError(
                    r.line,
                    f"certify logged digest {d['digest']!r}, not the digest recorded when "
                    f"page {d.get('page')!r}'s writer closed",
                )

    def _explain(self, r: Record, st: SpecState, inst: ActionInstance) -> str:
        """Why the spec refuses ``inst`` here, in the trace's own names."""
        d = r.data
        t = inst.name
        scope = d.get("scope")
        what = f"{t} ({_brief(d)})"
        if t in ("publish", "drop"):
            s = self.scopes(scope)
            v = d.get("version")
            e, m = st["scope_epoch"][s], _MODE_NAMES.get(st["scope_mode"][s])
            if t == "publish":
                return (
                    f"{what}: a frame of {scope}@{v} was published, but {scope}'s current "
                    f"version is {e} (mode {m}): only the current version may publish"
                )
            return f"{what}: a frame of {scope}@{v} was dropped while {v} is current (mode {m})"
        if t in ("certify", "adopt"):
            p = self.pages(d.get("page"))
            facts = []
            if not st["page_alloc"][p]:
                facts.append("the page is not allocated")
            if st["page_writer"][p]:
                facts.append("its writer is still open")
            if not st["page_full"][p]:
                facts.append("it is not a completed block")
            if t == "adopt" and not st["page_pinned"][p]:
                facts.append("it was never certified and pinned for this successor")
            if t == "adopt" and st["page_gen"][p] != st["page_cert_gen"][p]:
                facts.append("its generation changed since certification")
            return f"{what}: the spec does not allow it" + (
                f" ({'; '.join(facts)})" if facts else ""
            )
        if t in ("write", "write_draft"):
            return f"{what}: the writer does not own an open page of its own version"
        if t == "verify_drafts":
            return f"{what}: the page holds no drafts under an open writer"
        if t in ("unhold", "free"):
            return f"{what}: the page is still referenced, pinned or of a live version"
        if t == "unreference":
            return f"{what}: not a completed, writer-closed, referenced page of a running version"
        return f"{what}: the spec does not allow it here"


def _brief(d: dict[str, Any]) -> str:
    keys = ("scope", "version", "page", "participant", "frame", "kind")
    return ", ".join(f"{k}={d[k]}" for k in keys if k in d)


_MODE_NAMES = {
    0: "unopened",
    ACTIVE: "active",
    PAUSED: "paused",
    CANCELLED: "cancelled",
    FINISHED: "finished",
}
_FRAME_COLUMNS = tuple(c.name for c in COLUMNS if c.sort == "Frame")
_INITIAL: dict[Bounds, SpecState] = {}


def _initial(bounds: Bounds) -> SpecState:
    if bounds not in _INITIAL:
        _INITIAL[bounds] = initial_state(bounds)
    return _INITIAL[bounds]


# --- entry points --------------------------------------------------------------------------------


def _segments(records: list[Record]) -> Iterator[list[Record]]:
    """Split on ``seq`` restarting at 1 (a new Retire instance); a gap in ``seq`` is an error."""
    current: list[Record] = []
    last: int | None = None
    line = 0
    for r in records:
        seq = r.data.get("seq")
        if r.line == line:  # another page of the line before: the same transition, same seq
            current.append(r)
            continue
        line = r.line
        if isinstance(seq, int):
            if seq == 1 and current:
                yield current
                current, last = [], None
            elif last is not None and seq != last + 1:
                raise TraceError(
                    r.line, f"seq jumps from {last} to {seq}: lines are missing or out of order"
                )
            last = seq
        current.append(r)
    if current:
        yield current


def validate_lines(lines: Iterable[str]) -> Report:
    """Validate a log; raises ``TraceError`` at the first offending line."""
    records = list(read_records(lines))
    total = Report(0, 0, {}, {"emit": 0, "corrupt": 0}, 0)
    if not records:
        raise TraceError(1, f"no {EVENT!r} records in the trace")
    sizes: dict[str, int] = {}
    hidden = {"emit": 0, "corrupt": 0}
    transitions = 0
    candidates_left = 0
    for segment in _segments(records):
        v = Validator(segment)
        candidates = [_initial(v.bounds)]
        for r in segment:
            candidates = v.step(r, candidates)
        transitions += v.transitions
        for k, n in v.bounds.sizes().items():
            sizes[k] = max(sizes.get(k, 0), n)
        for k, n in v.hidden.items():
            hidden[k] += n
        candidates_left = len(candidates)
    lines_read = records[-1].line
    return attrs.evolve(
        total,
        lines=lines_read,
        transitions=transitions,
        sizes=sizes,
        hidden=hidden,
        candidates=candidates_left,
    )


def validate_file(path: str | Path) -> Report:
    with open(path, encoding="utf-8") as fh:
        return validate_lines(fh)


__all__ = ["GARBAGE", "NO_FRAME", "Report", "TraceError", "validate_file", "validate_lines"]
