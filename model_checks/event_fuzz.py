"""Hostile core events shaped like real traces: a refused event raises and changes nothing.

``run_trace`` drives one ``retire_core.Retire`` through an engine trace synthesized from the core's
own state, step by step: what an engine would plausibly report next (submits, launches, page
allocations and writes (of verified or of speculative draft tokens), the verification of drafts
(also repeated or late), writer closures, frames of current and retired versions, revisions in
bursts, receipts, byte-check reports, finishes, preemptions, evictions, passed pages
(``PageUnreferenced``), cancels and forgets). With the plan's probability each event is mutated
instead (a wrong scope, version, participant, page or digest; a version from the future or the past;
a replay of an earlier event, duplicated or out of order; an unknown scope; an empty, over-long or
non-ASCII id; a value of the wrong type; a report that misses, repeats or invents a page; a request
its scope's state refuses; an object that is no event at all; odd values the validators pass), or a
batch is sent with one such event in the middle. Every event is checked: it is accepted, or it
raises a ``RetireError`` (a non-event: the core's own ``TypeError``) and the core's state is the
same object with the same contents (pickled before and after), with no transition or log line; an
event the validators refuse at construction must fail with a ``RetireError`` or attrs'
``TypeError``. A batch must end exactly where its events one by one (``retire_core.step``) end, or
raise the same error as the first refused one and change nothing. A violation raises
``FuzzFailure``. ``Plan`` is what Hypothesis draws for one trace
(``tests/test_core_event_fuzz.py``); ``Tally`` counts events and outcomes.
"""

from __future__ import annotations

import pickle
import random
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import attrs

import retire_core as rc
from retire_core.events import PAGE_EVENTS, SCOPE_EVENTS
from retire_core.state import CoreState, ScopeState

FAMILIES = (
    "scope",
    "version",
    "participant",
    "page",
    "digest",
    "replay",
    "ids",
    "types",
    "report",
    "table",
    "alien",
)
SCOPES = ("s0", "s1", "s2", "s3")
BAD_NAMES = ("", "x" * 129, "scope-é", "ψ", "a b", "s0\n", "\x00", "s0;drop", "🙂" * 3)
ODD_NAMES = ("x" * 128, "@#+-./:_", "0", "tenant/a@b#1+2-3.4:5")
WRONG_NUMBERS: tuple[object, ...] = (-1, 1.0, True, False, "1", None, b"1", 2**70 * -1)
HUGE_NUMBERS = (2**31, 2**63, 2**64 + 5, 10**30)


class _Int(int):
    pass


class _Str(str):
    __slots__ = ()


# Values the validators let through although they are odd: subclasses of int and str, block keys
# that are empty, non-ASCII or huge, a context of thousands of blocks.
ODD_VALUES: tuple[object, ...] = (
    _Int(1),
    _Str("s0"),
    ("", "é", b"", 10**40, -(2**70)),
    tuple(range(3000)),
)
CONTRACTS = (
    rc.DEFAULT_CONTRACT,
    rc.COLD_CONTRACT,
    rc.Contract(reuse=rc.ReusePolicy.ALWAYS),
    rc.Contract(min_reuse_blocks=2),
    rc.Contract(min_reuse_blocks=0),
    rc.Contract(kv_windows=(0, 2)),  # two KV cache groups: full attention, a sliding window
)
KINDS = tuple(rc.FrameKind)


class FuzzFailure(AssertionError):
    """The core broke the invariant on an event (or batch) of a fuzzed trace."""


@attrs.frozen(slots=True)
class Plan:
    """One trace: its seed, length, world size, mutation and batch rates, and the mutation
    families it may use (swarm testing: each trace leaves some out)."""

    seed: int
    length: int = 2000
    scopes: int = 3
    pages: int = 12
    mutate: float = 0.3
    batch: float = 0.1
    logged: bool = False
    ledger: int = 8
    families: frozenset[str] = frozenset(FAMILIES)


@attrs.define(slots=True)
class Tally:
    events: int = 0
    accepted: int = 0
    refused: Counter[str] = attrs.field(factory=Counter)
    accepted_types: Counter[str] = attrs.field(factory=Counter)
    commands: Counter[str] = attrs.field(factory=Counter)
    batches: int = 0
    refused_batches: int = 0
    traces: int = 0


class _Quiet:
    def is_enabled_for(self, level: int) -> bool:
        return False

    def info(self, event: str, **fields: Any) -> None:  # pragma: no cover - never called
        raise AssertionError("a quiet logger got a line")


class _Counting:
    def __init__(self) -> None:
        self.lines = 0

    def info(self, event: str, **fields: Any) -> None:
        self.lines += 1


def contents(state: CoreState) -> bytes:
    """The state's value, byte for byte (not its derived page index)."""
    return pickle.dumps(
        (state.scopes, state.pages, state.generations, state.ledger, state.ledger_size)
    )


class _Trace:
    def __init__(self, plan: Plan, tally: Tally) -> None:
        self.plan = plan
        self.tally = tally
        self.rng = random.Random(plan.seed)
        self.log = _Counting() if plan.logged else _Quiet()
        self.core = rc.Retire(ledger_size=plan.ledger, logger=self.log)
        self.scopes = SCOPES[: plan.scopes]
        self.families = tuple(f for f in FAMILIES if f in plan.families)
        self.history: list[Any] = []
        self.frame = 0
        self.serial = 0
        self.burst: list[str] = []
        self._state: CoreState | None = None
        self._blob = b""
        self.step = 0

    # --- what an engine would report next ------------------------------------------------
    def _context(self, scope: str, keep: tuple[Any, ...] = ()) -> tuple[Any, ...]:
        rng = self.rng
        cut = rng.randint(0, len(keep))
        fresh = tuple(
            rng.choice((rng.randint(0, 9), f"h{rng.randint(0, 9)}", b"k"))
            for _ in range(rng.randint(0, 3))
        )
        return keep[:cut] + fresh

    def _part(self, scope: str, version: int) -> str:
        self.serial += 1
        return f"{scope if scope in SCOPES else 'q'}.v{version % 1000}.r{self.serial}"

    def plausible(self) -> Any:
        rng, state = self.rng, self.core.snapshot()
        scopes = state.scopes
        if self.burst:
            s = self.burst.pop()
            if s in scopes and scopes[s].state is not ScopeState.CANCELLED:
                return rc.Supersede(s, self._context(s, scopes[s].context), rng.choice(CONTRACTS))
        for _ in range(8):
            kind = rng.choices(_MOVES, _WEIGHTS)[0]
            event = kind(self, state)
            if event is not None:
                return event
        return self._frame(state) or rc.Submit(rng.choice(self.scopes), "t", "fp0", ())

    def _submit(self, state: CoreState) -> Any:
        fresh = [s for s in self.scopes if s not in state.scopes]
        if not fresh:
            return None
        s = self.rng.choice(fresh)
        return rc.Submit(
            s,
            f"t{s[-1]}",
            f"fp{self.rng.randint(0, 1)}",
            self._context(s),
            self.rng.choice(CONTRACTS),
        )

    def _live(self, state: CoreState, *states: ScopeState) -> list[str]:
        return [s for s, r in state.scopes.items() if r.state in states]

    def _supersede(self, state: CoreState) -> Any:
        live = self._live(state, *_REVISABLE)
        if not live:
            return None
        s = self.rng.choice(live)
        self.burst.extend([s] * self.rng.choice((0, 0, 1, 3)))
        return rc.Supersede(
            s, self._context(s, state.scopes[s].context), self.rng.choice(CONTRACTS)
        )

    def _control(self, state: CoreState) -> Any:
        rng = self.rng
        if not state.scopes:
            return None
        s = rng.choice(list(state.scopes))
        st = state.scopes[s].state
        if st is ScopeState.ACTIVE:
            return rng.choice((rc.Pause(s), rc.Pause(s), rc.Cancel(s)))
        if st is ScopeState.PAUSED:
            return rng.choice((rc.Unpause(s), rc.Unpause(s), rc.Cancel(s)))
        if st is ScopeState.CANCELLED:
            return rc.Forget(s)
        return rc.Cancel(s) if rng.random() < 0.3 else None

    def _launch(self, state: CoreState) -> Any:
        ok = [s for s, r in state.scopes.items() if r.admitted and r.has_authority(r.epoch)]
        if not ok:
            return None
        s = self.rng.choice(ok)
        v = state.scopes[s].epoch
        return rc.ParticipantStarted(s, v, self._part(s, v))

    def _running(self, state: CoreState) -> list[tuple[str, str, int]]:
        return [
            (s, q, p.version)
            for s, r in state.scopes.items()
            for q, p in r.participants.items()
            if not p.closed
        ]

    def _receipt(self, state: CoreState) -> Any:
        running = self._running(state)
        if not running:
            return None
        s, q, v = self.rng.choice(running)
        return rc.Receipt(s, v, q)

    def _frame(self, state: CoreState) -> Any:
        if not state.scopes:
            return None
        rng = self.rng
        s = rng.choice(list(state.scopes))
        epoch = state.scopes[s].epoch
        v = epoch if rng.random() < 0.75 else rng.randint(0, epoch)
        self.frame += 1
        return rc.FrameArrived(s, v, self.frame, rng.choice(KINDS))

    def _allocate(self, state: CoreState) -> Any:
        running = self._running(state)
        free = [p for p in range(self.plan.pages) if p not in state.pages]
        if not running or not free:
            return None
        s, q, v = self.rng.choice(running)
        groups = len(state.scopes[s].contract.kv_windows)
        group = self.rng.randrange(groups) if groups > 1 else 0
        if self.rng.random() < 0.02:
            group = groups  # a group the contract does not name: refused
        # an engine fills a request's blocks in order, in each group
        held = {r.position for r in state.pages.values() if r.participant == q and r.group == group}
        position = min(set(range(len(held) + 1)) - held)
        if self.rng.random() < 0.15:
            position = self.rng.randint(0, len(state.scopes[s].context))
        return rc.PageAllocated(s, v, q, self.rng.choice(free), position, group)

    def _write(self, state: CoreState) -> Any:
        open_pages = [(p, r) for p, r in state.pages.items() if r.writer_open]
        if not open_pages:
            return None
        p, r = self.rng.choice(open_pages)
        rng = self.rng
        # a speculative step writes draft tokens first (verified later, or rolled back)
        return rc.WriteAttempted(
            r.owner, r.version, r.participant, p, rng.random() < 0.7, draft=rng.random() < 0.3
        )

    def _verify(self, state: CoreState) -> Any:
        """The target's verification of a page's drafts: usually of a page holding some, now
        and then a repeated or late one (no drafts left, or the writer closed)."""
        if not state.pages:
            return None
        rng = self.rng
        drafted = [p for p, r in state.pages.items() if r.draft]
        pages = drafted if drafted and rng.random() < 0.8 else list(state.pages)
        return rc.DraftsVerified(rng.choice(pages), rng.random() < 0.6)

    def _close(self, state: CoreState) -> Any:
        open_pages = [p for p, r in state.pages.items() if r.writer_open]
        if not open_pages:
            return None
        p = self.rng.choice(open_pages)
        return rc.WriterClosed(p, self._digest(state, p))

    def _digest(self, state: CoreState, page: int) -> str:
        return f"{page:x}:{state.generations.get(page, 0)}"

    def _report(self, state: CoreState) -> Any:
        pending = [r.certificate for r in state.scopes.values() if r.certificate is not None]
        if not pending:
            return None
        cert = self.rng.choice(pending)
        corrupt = self.rng.random() < 0.1
        digests = tuple(
            rc.PageDigest(e.page, e.digest + ("!" if corrupt else "")) for e in cert.entries
        )
        return rc.AdoptionReport(cert.scope, cert.version, digests)

    def _finish(self, state: CoreState) -> Any:
        ok = [s for s, r in state.scopes.items() if r.has_authority(r.epoch)]
        if not ok:
            return None
        s = self.rng.choice(ok)
        return rc.VersionFinished(s, state.scopes[s].epoch)

    def _preempt(self, state: CoreState) -> Any:
        """A preemption report for a current version whose participants all delivered their
        receipts (refused while one of its pages' writers is still open)."""
        ok = [
            s
            for s, r in state.scopes.items()
            if r.has_authority(r.epoch)
            and any(q.version == r.epoch for q in r.participants.values())
            and not r.running(r.epoch)
        ]
        if not ok:
            return None
        s = self.rng.choice(ok)
        return rc.VersionPreempted(s, state.scopes[s].epoch)

    def _evict(self, state: CoreState) -> Any:
        cached = [p for p, r in state.pages.items() if not r.held and not r.pinned]
        if not cached:
            return None
        p = self.rng.choice(cached)
        return rc.PageReused(p) if self.rng.random() < 0.15 else rc.PageEvicted(p)

    def _unreference(self, state: CoreState) -> Any:
        """The engine stopped referencing a completed, writer-closed page (a sliding window
        passed it): mostly one of a version with authority, else a late one."""
        closed = [p for p, r in state.pages.items() if r.held and r.full and not r.writer_open]
        if not closed:
            return None
        return rc.PageUnreferenced(self.rng.choice(closed))

    # --- mutations -----------------------------------------------------------------------
    def mutated(self) -> Callable[[], Any]:
        """A thunk building a mutated event (building it may already be refused)."""
        family = self.rng.choice(self.families)
        return lambda: _MUTATIONS[family](self, self.core.snapshot())

    def _some(self, state: CoreState, want: str) -> Any:
        """A plausible event with field ``want``, or None."""
        for _ in range(6):
            event = self.plausible()
            if hasattr(event, want):
                return event
        return None

    def _m_scope(self, state: CoreState) -> Any:
        event = self._some(state, "scope")
        if event is None:
            return None
        other = self.rng.choice((*SCOPES, "ghost", f"g{self.rng.randint(0, 999)}", *ODD_NAMES))
        return attrs.evolve(event, scope=other)

    def _m_version(self, state: CoreState) -> Any:
        event = self._some(state, "version")
        if event is None:
            return None
        v = event.version
        new = self.rng.choice((v + 1, v + 2, v - 1, 0, *HUGE_NUMBERS))
        return attrs.evolve(event, version=new)

    def _m_participant(self, state: CoreState) -> Any:
        event = self._some(state, "participant")
        if event is None:
            return None
        others = [q for r in state.scopes.values() for q in r.participants] or ["nobody"]
        q = self.rng.choice((*others, "nobody", *ODD_NAMES))
        return attrs.evolve(event, participant=q)

    def _m_page(self, state: CoreState) -> Any:
        rng = self.rng
        page = rng.choice(
            (*state.pages.keys(), *state.generations.keys(), rng.randint(0, 40), *HUGE_NUMBERS)
        )
        event = self._some(state, "page")
        if event is None or rng.random() < 0.4:
            cls = rng.choice((rc.PageEvicted, rc.PageReused, rc.PageUnreferenced))
            if rng.random() < 0.15:
                return rc.DraftsVerified(page, rng.random() < 0.5)
            return cls(page) if rng.random() < 0.7 else rc.WriterClosed(page, "d")
        return attrs.evolve(event, page=page)

    def _m_digest(self, state: CoreState) -> Any:
        digest = self.rng.choice(("", "δ" * 5, "x" * 10_000, "0:0", "\x00"))
        if state.pages and self.rng.random() < 0.5:
            return rc.WriterClosed(self.rng.choice(list(state.pages.keys())), digest)
        event = self._report(state)
        if event is None:
            return rc.WriterClosed(self.rng.randint(0, self.plan.pages), digest)
        digests = tuple(rc.PageDigest(d.page, digest) for d in event.digests)
        return attrs.evolve(event, digests=digests)

    def _m_replay(self, state: CoreState) -> Any:
        if not self.history:
            return None
        return self.rng.choice(self.history[-200:])

    def _m_ids(self, state: CoreState) -> Any:
        rng = self.rng
        name = rng.choice(BAD_NAMES + ODD_NAMES)
        field = rng.choice(("scope", "participant", "tenant"))
        event = self._some(state, field) if field != "tenant" else None
        if event is None:
            field, event = "tenant", rc.Submit(rng.choice(self.scopes), "t", "fp", (1,))
        built = attrs.evolve(event, **{field: name})
        if name in BAD_NAMES:
            raise self._fail(f"the validators accepted {field} {name!r}", built)
        return built

    def _m_types(self, state: CoreState) -> Any:
        rng = self.rng
        bad: Any = rng.choice(
            (*WRONG_NUMBERS, *ODD_VALUES, [1, 2], (1.5,), (True,), (None,), {"a": 1}, object())
        )
        event = self.plausible()
        if rng.random() < 0.2:
            return rng.choice(
                (
                    lambda: rc.Contract(min_reuse_blocks=bad),
                    lambda: rc.Supersede(rng.choice(self.scopes), (1,), bad),
                    lambda: rc.Contract(reuse=bad),  # not validated: reaches the core
                    lambda: rc.AdoptionReport(rng.choice(self.scopes), 0, (bad,)),
                    lambda: rc.PageDigest(0, bad),
                )
            )()
        names = [a.name for a in attrs.fields(type(event))]
        field = rng.choice(names)
        return attrs.evolve(event, **{field: bad})

    def _m_report(self, state: CoreState) -> Any:
        rng = self.rng
        event = self._report(state)
        if event is None:
            s = rng.choice(self.scopes)
            return rc.AdoptionReport(s, rng.randint(0, 3), (rc.PageDigest(rng.randint(0, 9), "d"),))
        digests = list(event.digests)
        how = rng.randrange(4)
        if how == 0 and digests:
            digests.pop(rng.randrange(len(digests)))
        elif how == 1 and digests:
            digests.append(rng.choice(digests))
        elif how == 2:
            digests.append(rc.PageDigest(rng.randint(0, 40), "d"))
        else:
            return attrs.evolve(event, version=event.version + rng.choice((-1, 1)))
        return attrs.evolve(event, digests=tuple(digests))

    def _m_table(self, state: CoreState) -> Any:
        rng = self.rng
        s = rng.choice(self.scopes)
        return rng.choice(
            (
                lambda: rc.Submit(s, "t", "fp0", (1,)),
                lambda: rc.Supersede(s, (1, 2)),
                lambda: rc.Pause(s),
                lambda: rc.Unpause(s),
                lambda: rc.Cancel(s),
                lambda: rc.Forget(s),
                lambda: rc.VersionFinished(s, state.scopes[s].epoch if s in state.scopes else 0),
            )
        )()

    def _m_alien(self, state: CoreState) -> Any:
        return self.rng.choice(
            (
                None,
                42,
                "FrameArrived",
                rc.Admit("s0", 0, 0, True),
                rc.PageDigest(0, "d"),
                (rc.Pause("s0"),),
            )
        )

    # --- the invariant ---------------------------------------------------------------------
    def _fail(self, what: str, event: Any) -> FuzzFailure:
        return FuzzFailure(f"{what}: {event!r} (plan {self.plan}, step {self.step})")

    def _blob_of(self, state: CoreState) -> bytes:
        if state is not self._state:
            self._state, self._blob = state, contents(state)
        return self._blob

    def _lines(self) -> int:
        return self.log.lines if isinstance(self.log, _Counting) else 0

    def _unchanged(self, before: CoreState, blob: bytes, last: Any, lines: int, event: Any) -> None:
        after = self.core.snapshot()
        if after is not before and after != before:
            raise self._fail("a refused event changed the state", event)
        if contents(after) != blob:
            raise self._fail("a refused event changed the state in place", event)
        if self.core.last_transitions is not last or self._lines() != lines:
            raise self._fail("a refused event left transitions or log lines", event)

    def _allowed(self, err: BaseException, events: Sequence[Any]) -> bool:
        if isinstance(err, rc.RetireError):
            return True
        alien = any(not isinstance(e, _EVENT_TYPES) for e in events)
        return alien and type(err) is TypeError and str(err).startswith("not a Retire event")

    def offer(self, event: Any) -> None:
        tally = self.tally
        tally.events += 1
        before = self.core.snapshot()
        blob, last, lines = self._blob_of(before), self.core.last_transitions, self._lines()
        try:
            commands = self.core.handle(event)
        except Exception as err:
            if not self._allowed(err, (event,)):
                raise self._fail(f"untyped {type(err).__name__}({err})", event) from err
            self._unchanged(before, blob, last, lines, event)
            tally.refused[type(err).__name__] += 1
            return
        tally.accepted += 1
        tally.accepted_types[type(event).__name__] += 1
        tally.commands.update(type(c).__name__ for c in commands)
        self.history.append(event)

    def offer_batch(self, events: list[Any]) -> None:
        tally = self.tally
        tally.events += len(events)
        tally.batches += 1
        before = self.core.snapshot()
        blob, last, lines = self._blob_of(before), self.core.last_transitions, self._lines()
        expected: CoreState = before
        first: BaseException | None = None
        for e in events:
            try:
                expected = rc.step(expected, e).state
            except Exception as err:
                if not self._allowed(err, (e,)):
                    raise self._fail(f"untyped {type(err).__name__}({err})", e) from err
                first = err
                break
        shape: Callable[[list[Any]], Any] = self.rng.choice((list, tuple, iter))
        try:
            self.core.handle_batch(shape(events))
        except Exception as err:
            if not self._allowed(err, events):
                raise self._fail(f"untyped {type(err).__name__}({err}) in a batch", events) from err
            if first is None or type(err) is not type(first):
                raise self._fail(f"the batch raised {err!r}, one by one {first!r}", events) from err
            self._unchanged(before, blob, last, lines, events)
            tally.refused_batches += 1
            tally.refused[type(err).__name__] += 1
            return
        if first is not None:
            raise self._fail(f"a batch was accepted although {first!r} refuses an event", events)
        if self.core.snapshot() != expected:
            raise self._fail("a batch ended elsewhere than its events one by one", events)
        tally.accepted += len(events)
        self.history.extend(events)

    def _mutant(self) -> tuple[bool, Any]:
        """(built, event): a mutated event, or (False, None) when its construction was refused."""
        try:
            event = self.mutated()()
        except FuzzFailure:
            raise
        except Exception as err:
            if not isinstance(err, rc.RetireError | TypeError):
                raise self._fail(f"construction raised {type(err).__name__}({err})", None) from err
            self.tally.events += 1
            self.tally.refused[f"build:{type(err).__name__}"] += 1
            return False, None
        return event is not None, event

    def run(self) -> None:
        plan, rng = self.plan, self.rng
        while self.step < plan.length:
            self.step += 1
            if self.families and rng.random() < plan.batch:
                events = [self.plausible() for _ in range(rng.randint(1, 6))]
                built, bad = self._mutant()
                if built:
                    events.insert(rng.randint(0, len(events)), bad)
                self.offer_batch(events)
                continue
            if self.families and rng.random() < plan.mutate:
                built, event = self._mutant()
                if built:
                    self.offer(event)
                continue
            self.offer(self.plausible())
        self.tally.traces += 1


_REVISABLE = (ScopeState.ACTIVE, ScopeState.ALIGNING, ScopeState.PAUSED, ScopeState.FINISHED)
_EVENT_TYPES = (*SCOPE_EVENTS, *PAGE_EVENTS)
_MOVES: tuple[Callable[[_Trace, CoreState], Any], ...] = (
    _Trace._submit,
    _Trace._supersede,
    _Trace._control,
    _Trace._launch,
    _Trace._receipt,
    _Trace._frame,
    _Trace._allocate,
    _Trace._write,
    _Trace._verify,
    _Trace._close,
    _Trace._report,
    _Trace._finish,
    _Trace._evict,
    _Trace._preempt,
    _Trace._unreference,
)
# Frames and writes dominate real traces; revisions come in bursts.
_WEIGHTS = (4, 3, 2, 7, 10, 25, 10, 14, 5, 10, 10, 4, 8, 4, 3)
_MUTATIONS: dict[str, Callable[[_Trace, CoreState], Any]] = {
    name: getattr(_Trace, f"_m_{name}") for name in FAMILIES
}


def run_trace(plan: Plan, tally: Tally | None = None) -> Tally:
    """Run one fuzzed trace; raise ``FuzzFailure`` on the first violation."""
    tally = tally if tally is not None else Tally()
    _Trace(plan, tally).run()
    return tally
