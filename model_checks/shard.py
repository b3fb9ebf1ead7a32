"""One worker's part of the explorer's search: the states it owns.

The search is breadth-first and level-synchronous. A ``Shard`` owns the states whose core state's
class (``symmetry.core_class``: a hash of what no renaming changes, so the same for every state
of an orbit) maps to it, ``class % workers == index`` (all of them with one worker): every step
of one core state is computed, and memoized, by one worker. It keeps their parent links
(fingerprint -> parent fingerprint and move), expands the frontier it owns one level at a time
(every move ``env_moves`` offers, through the memoized lock-step harness: each transition checked
for refinement and command agreement) and hands every successor it does not own to the owner,
unfingerprinted, in one batch per level (``take``/``receive``: a core state, spec state or move
travels once per channel and then as a small integer; records are pickled as their field values).
The owner fingerprints what it receives, so each state is fingerprinted where its memo tables
are, and at the end of the level admits the new states (``admit``): each is checked once
(abstraction against the spec's control columns, every invariant) and joins the next frontier.

Every event of a level carries a *key*: the digits (base ``RADIX``) of a state's key are the
indices of the moves on the path that discovered it, so keys order a level exactly as a
one-process breadth-first search meets it. Of several ways to reach a new state the one with the
smallest key wins (so each state keeps the parent and the representative of its orbit that a
single process would keep), and of a level's violations the one with the smallest key is
reported. A level is always expanded to its end, also after a violation, so the counts, probes
and counterexample do not depend on how states were split among workers. What does not live
here: driving the levels and the worker processes (``parallel``), the probes' definitions
(``probes``), the harness (``lockstep``).
"""

from __future__ import annotations

import contextlib
import copyreg
import gc
import io
import operator
import pickle
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import canonical_function
from retire_checks.config import COMPLETION, Config, StepFn, new_lockstep
from retire_checks.correspondence import closing_data
from retire_checks.engine import launchable_after
from retire_checks.environment import Offers
from retire_checks.lockstep import (
    _NOTHING,
    _REJECTED,
    BY_FRAME,
    BY_LAUNCH,
    BY_MOVE,
    BY_PAGE_DATA,
    WORLD,
    RefinementError,
    launched_after,
)
from retire_checks.probes import ProbeTally, dynamic_hits
from retire_checks.step_memo import StepMemo
from retire_checks.symmetry import Symmetry, core_class
from retire_core.frozen import FrozenMap
from retire_spec.actions import Action, ActionInstance
from retire_spec.invariants import QUIESCENCE, Invariant
from retire_spec.schema import COLUMN_INDEX, SpecState

_FRAME_SCOPE, _FRAME_VER, _FRAME_KIND, _PAGE_DATA = (
    COLUMN_INDEX[name] for name in ("frame_scope", "frame_ver", "frame_kind", "page_data")
)

# A key's digit 0 is a state's quiescence check, digit i + 1 its i-th move.
RADIX = 1 << 16
# Objects a channel remembers having sent before it starts afresh (bounds both ends' tables).
CHANNEL_LIMIT = 200_000
# During a level, every POLL states a worker sends each outbox holding FLUSH successors or more
# and takes in what has arrived.
POLL = 256
FLUSH = 2_000

# A joint state: core, spec, launched participants, pending byte checks, faults, launchable.
State = tuple[Any, ...]
# A new state of a level: key, parent fingerprint, move, state, canonical spec.
Candidate = tuple[int, int, ActionInstance, State, Any]


@attrs.frozen(slots=True)
class Found:
    """A violation met in a level. ``fp``: the state whose expansion met it, ``move`` the move
    that broke (``None`` for a quiescence failure of ``fp`` itself); for a new state that fails
    its check, its parent and the move that reached it."""

    key: int
    fp: int
    move: ActionInstance | None
    error: str
    quiescence: bool = False
    violated: tuple[str, ...] = ()


@attrs.frozen(slots=True)
class LevelReport:
    """A shard's answer after a level: its totals so far, the size of its next frontier and
    the smallest-key violation it met in the level."""

    states: int
    transitions: int
    quiescent: int
    frontier: int
    found: Found | None


@attrs.frozen(slots=True)
class ShardTotals:
    probes: Counter[str]
    cpu_seconds: float


class Outbox:
    """The sending end of a channel to one other shard: the successors it owns, raw (its owner
    fingerprints them), each sent once. A core state, spec state or move is sent once and then
    named by its number (the receiving end keeps them in lists in the same order)."""

    def __init__(self) -> None:
        self.refs: tuple[dict[int, tuple[int, Any]], ...] = ({}, {}, {})
        self.new: tuple[list[Any], list[Any], list[Any]] = ([], [], [])
        self.items: list[tuple[Any, ...]] = []
        # raw successors sent, by the numbers of their core and spec states: a state sent once
        # is known to its owner from then on (with the smallest key, since keys only grow)
        self.sent: set[tuple[Any, ...]] = set()
        self.reset = False

    def ref(self, kind: int, obj: Any) -> int:
        # each entry holds its object, so the id is not reused while the entry exists
        table = self.refs[kind]
        found = table.get(id(obj))
        if found is None:
            found = table[id(obj)] = (len(table), obj)
            self.new[kind].append(obj)
        return found[0]

    def add(self, key: int, parent: int, move: ActionInstance, state: State) -> None:
        core, spec, launched, pending, faults, engine = state
        c, s = self.ref(0, core), self.ref(1, spec)
        raw = (c, s, tuple(pending.items()) if pending else (), faults, engine)
        if raw in self.sent:
            return
        self.sent.add(raw)
        self.items.append((key, parent, self.ref(2, move), c, s, launched, pending, faults, engine))

    def take(self) -> bytes:
        cores, specs, moves = self.new
        # a spec state travels as its cells (a plain tuple pickles in half the time)
        batch = dump_batch((self.reset, cores, [s.cells for s in specs], moves, self.items))
        self.new = ([], [], [])
        self.items = []
        self.reset = False
        if any(len(table) >= CHANNEL_LIMIT for table in self.refs):
            for table in self.refs:
                table.clear()
            self.sent.clear()
            self.reset = True
        return batch


def _by_fields(cls: type) -> Callable[[Any], tuple[Any, ...]]:
    """Pickle an attrs record as its class and the values of the fields that make up its value
    (attrs' own pickling goes through a dict of every slot: about ten times slower to load for
    a core state, and it carries the core's derived page index, which a step rebuilds)."""
    fields = [a for a in attrs.fields(cls) if a.eq]
    assert all(a.init and not a.kw_only for a in fields), cls
    get = operator.attrgetter(*(a.name for a in fields))
    if len(fields) == 1:
        return lambda obj: (cls, (get(obj),))
    return lambda obj: (cls, get(obj))


_BATCH_PICKLING: dict[Any, Any] = {
    **copyreg.dispatch_table,
    **{
        cls: _by_fields(cls)
        for cls in (
            rc.CoreState,
            rc.ScopeRecord,
            rc.ParticipantRecord,
            rc.Certificate,
            rc.CertEntry,
            rc.Contract,
        )
    },
    FrozenMap: lambda m: (FrozenMap, (dict(m.items()),)),
}


def dump_batch(batch: tuple[Any, ...]) -> bytes:
    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.dispatch_table = _BATCH_PICKLING
    pickler.dump(batch)
    return buf.getvalue()


@contextlib.contextmanager
def without_cyclic_gc() -> Iterator[None]:
    """The searches allocate millions of small acyclic objects while their memo and parent maps
    grow; the cyclic collector's passes over those maps took about 40% of the time and found
    nothing to collect (reference counting frees everything), so it is paused during a search."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class Shard:
    """The states of one worker (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        step_fn: StepFn,
        actions: dict[str, Action] | None,
        invariants: tuple[Invariant, ...],
        index: int = 0,
        workers: int = 1,
    ) -> None:
        self.c0 = time.process_time()
        self.config = config
        self.index = index
        self.workers = workers
        self.memo = StepMemo()
        self.ls = new_lockstep(config, step_fn, actions, invariants, memo=self.memo)
        self.sym = Symmetry(self.ls.uni, config.symmetry)
        self.quiescence = [(q.name, self.ls.compiled.predicate(q.holds)) for q in QUIESCENCE]
        self.tally = ProbeTally(config.bounds)
        self.canonical = canonical_function(config.bounds)
        self.offer = Offers(config.budget, COMPLETION)  # ``env_moves``, memoized
        # parent links of the states owned: fingerprint -> (parent fingerprint, move); the
        # root maps to None
        self.parents: dict[int, tuple[int, ActionInstance] | None] = {}
        self.frontier: list[tuple[int, int, State]] = []  # (key, fingerprint, state)
        self.fresh: dict[int, Candidate] = {}  # this level's new states, by fingerprint
        # with one worker: this level's new states, admitted already (see ``admit``)
        self.found_states: list[tuple[int, int, State]] = []
        self.outboxes = [Outbox() for _ in range(workers)]
        self.inboxes: list[tuple[list[Any], list[Any], list[Any]]] = [
            ([], [], []) for _ in range(workers)
        ]
        self.owners: dict[int, tuple[Any, int]] = {}  # see ``owner``
        self.transitions = 0
        self.quiescent = 0
        self.found: Found | None = None
        # raw joint state (by the identities of its interned core and spec) -> (core, spec,
        # fingerprint, canonical spec)
        self.fps: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        # per move (by identity; each entry holds its move): how its core-step table is found
        self.plans: dict[int, tuple[Any, ...]] = {}

    # --- the level protocol -----------------------------------------------------------------
    def start(self) -> LevelReport:
        """Level 0: the initial state (owned, checked and expanded by one shard)."""
        ls = self.ls
        root = self.sym.fingerprint_raw(
            ls.core, ls.spec, ls.pending_reports, ls.faults, self.canonical, ls.launchable
        )[0]
        found = None
        if self.owner(ls.core) == self.index:
            self.parents[root] = None
            self.frontier = [(0, root, ls.snapshot())]
            try:
                ls.check_state()
            except RefinementError as err:
                found = Found(0, root, None, str(err), violated=err.invariants)
        return LevelReport(len(self.parents), 0, 0, len(self.frontier), found)

    def admit(self) -> LevelReport:
        """Check this level's new states in key order; they make up the next frontier. (With
        one worker, ``expand`` has done so as it found them, in key order too.)"""
        fresh = self.fresh
        ls = self.ls
        parents = self.parents
        frontier = self.found_states
        self.found_states = []
        found = None
        for fp, (key, parent, move, state, canon) in sorted(fresh.items(), key=_candidate_key):
            parents[fp] = (parent, move)
            ls.restore(state)
            try:
                ls.check_state(canon)
            except RefinementError as err:
                if found is None:
                    found = Found(key, parent, move, str(err), violated=err.invariants)
            frontier.append((key, fp, state))
        fresh.clear()
        self.frontier = frontier
        if found is not None and (self.found is None or found.key < self.found.key):
            self.found = found
        report = LevelReport(
            len(parents), self.transitions, self.quiescent, len(frontier), self.found
        )
        self.found = None
        return report

    def take(self, dest: int) -> bytes:
        """The batch of this level's successors owned by shard ``dest``."""
        return self.outboxes[dest].take()

    def receive(self, source: int, data: bytes) -> None:
        """Successors found by shard ``source``, fingerprinted here: each one not known yet, or
        reached with a smaller key than before, becomes a new state of this level."""
        reset, cores, specs, moves, items = pickle.loads(data)
        tables = self.inboxes[source]
        if reset:
            for table in tables:
                table.clear()
        memo = self.memo
        intern_core = memo.cores.setdefault
        intern_spec = memo.specs.setdefault
        core_table, spec_table, move_table = tables
        core_table.extend([intern_core(c, c) for c in cores])
        known_spec = memo.specs.get
        spec_table.extend([known_spec(c) or intern_spec(c, SpecState(c)) for c in specs])
        move_table.extend(moves)
        parents, fresh = self.parents, self.fresh
        fingerprinted = self.fingerprinted
        for key, parent, m, c, s, launched, pending, faults, engine in items:
            core, spec = core_table[c], spec_table[s]
            fhit = fingerprinted(core, spec, pending, faults, engine)
            fp = fhit[2]
            if fp in parents:
                continue
            known = fresh.get(fp)
            if known is not None and known[0] < key:
                continue
            state = (core, spec, launched, pending, faults, engine)
            fresh[fp] = (key, parent, move_table[m], state, fhit[3])

    def fingerprinted(
        self, core: Any, spec: Any, pending: Any, faults: Any, engine: Any
    ) -> tuple[Any, ...]:
        """``(core, spec, *fingerprint_raw(...))`` of a joint state, memoized on its raw form:
        keyed by the identities of its (interned) core and spec; each entry holds both objects,
        so neither id is reused while it exists."""
        fps = self.fps
        raw = (id(core), id(spec), tuple(pending.items()) if pending else (), faults, engine)
        fhit = fps.get(raw)
        if fhit is None:
            if len(fps) >= self.memo.limit:
                fps.clear()
            fhit = fps[raw] = (
                core,
                spec,
                *self.sym.fingerprint_raw(core, spec, pending, faults, self.canonical, engine),
            )
        return fhit

    def owner(self, core: Any) -> int:
        """The shard that owns the states of ``core`` (``symmetry.core_class``), memoized by the
        identity of the core state (each entry holds it)."""
        found = self.owners.get(id(core))
        if found is None:
            if len(self.owners) >= self.memo.limit:
                self.owners.clear()
            found = self.owners[id(core)] = (core, core_class(core) % self.workers)
        return found[1]

    def totals(self) -> ShardTotals:
        return ShardTotals(self.tally.flush(), time.process_time() - self.c0)

    # --- expanding a level --------------------------------------------------------------------
    def expand(
        self,
        post: Callable[[int, bytes], None] | None = None,
        poll: Callable[[], None] | None = None,
    ) -> None:
        """Every move from every state of the frontier, in key order. Successors owned here
        are collected in ``fresh`` (the first, smallest key wins), the others in the outboxes
        (each raw state once). Violations are recorded (the first one: the smallest key) and
        the level goes on. Every ``POLL`` states, ``post`` gets each outbox holding
        ``FLUSH`` successors or more (``take``) and ``poll`` may ``receive`` what has arrived:
        a worker that is through with its frontier works on the others' batches while they
        finish theirs."""
        config = self.config
        ls = self.ls
        memo = self.memo
        bounds = config.bounds
        quiescence = self.quiescence
        tally = self.tally
        probes = tally.counts
        seen = tally._seen
        offer = self.offer
        parents = self.parents
        fresh = self.fresh
        owners = self.owners
        owner_of = self.owner
        outboxes = self.outboxes
        workers = self.workers
        me = self.index
        transitions = self.transitions
        quiescent = self.quiescent
        found = self.found
        # the hot loop's bindings: the harness's step (new core steps, byte-check reports), the
        # legality judgement of a refused move, the memo's event tables and spec interning
        step = ls.move
        new_step = ls.new_core_step
        check_commands = ls._check_commands
        check_state = ls.check_state
        single = workers == 1
        found_states = self.found_states
        legal = ls._legal
        fingerprinted = self.fingerprinted
        events = memo.events
        intern = memo.specs.setdefault
        plans = self.plans
        countdown = POLL
        for key, fp, snap in self.frontier:
            if post is not None and poll is not None:
                countdown -= 1
                if not countdown:
                    countdown = POLL
                    for dest, box in enumerate(outboxes):
                        if len(box.items) >= FLUSH:
                            post(dest, box.take())
                    poll()
            ls.restore(snap)
            moves, completes = offer(ls)
            base = key * RADIX + 1  # the key of the first move's event
            if not completes:
                quiescent += 1
                probes["path:quiescent"] += 1
                broken = [name for name, holds in quiescence if not holds(ls.spec)]
                if broken and found is None:
                    found = Found(
                        base - 1,
                        fp,
                        None,
                        f"quiescence property(ies) {broken} violated",
                        quiescence=True,
                        violated=tuple(broken),
                    )
            spec0 = ls.spec
            core0, launched0, pending0, faults0 = (
                ls.core,
                ls.launched,
                ls.pending_reports,
                ls.faults,
            )
            engine0 = ls.launchable
            cid0 = id(core0)
            for i, move in enumerate(moves):
                transitions += 1
                plan = plans.get(id(move))
                if plan is None or plan[0] is not move:
                    plan = plans[id(move)] = ls.plan(move)
                kind = plan[1]
                try:
                    if kind < WORLD:
                        # ``Lockstep.move``, inlined. The event's core-step table is found
                        # exactly as ``Lockstep._event`` finds it (the same keys, the same memo).
                        if kind == BY_MOVE:
                            ek: Any = plan[3]
                        elif kind == BY_LAUNCH:
                            ek = (plan[3], launched0.get(plan[4]))
                        elif kind == BY_FRAME:
                            f = plan[4]
                            cells = spec0.cells
                            ek = (
                                plan[3],
                                cells[_FRAME_SCOPE][f],
                                cells[_FRAME_VER][f],
                                cells[_FRAME_KIND][f],
                            )
                        elif kind == BY_PAGE_DATA:
                            ek = (plan[3], spec0.cells[_PAGE_DATA][plan[4]])
                        else:  # BY_NAMED_CLOSE
                            ek = (plan[3], closing_data(spec0, move, ls.uni.bounds))
                        hit = events.get(ek)
                        if hit is None or hit[0] is not move:
                            ls.spec, ls.launched = spec0, launched0
                            event, table = ls._event(move)
                            assert table is not None  # the explorer's harness has a memo
                        else:
                            event, table = hit[1], hit[2]
                        known = table.get(cid0)
                        if known is None:  # a new core step: computed, interned and recorded
                            ls.core = core0
                            entry = new_step(event, table)
                            fresh_step = True
                        else:
                            entry = known[1]
                            fresh_step = False
                        faults = faults0 + plan[2]
                        if entry is _REJECTED:
                            # a typed refusal changes neither side (a fault move is still spent)
                            ls.spec = spec0
                            if legal(move):
                                raise RefinementError(
                                    f"the core refused {move}, which the spec allows"
                                )
                            core, spec, launched, pending = core0, spec0, launched0, pending0
                            engine = engine0
                            out = _NOTHING
                        else:
                            # each spec step's guard is checked now, in the spec state it is
                            # taken in
                            core, out, launches, pins, spec_steps, ops = entry
                            spec = spec0
                            if spec_steps:
                                for si, fn in spec_steps:
                                    nxt = fn(spec)
                                    if nxt is None:
                                        raise RefinementError(
                                            f"the spec does not allow {si} here (after this step)"
                                        )
                                    spec = nxt
                                spec = intern(spec.cells, spec)
                            if fresh_step:  # commands against transitions, once per core step
                                try:
                                    check_commands(out)
                                except RefinementError:
                                    # not recorded as checked: a later visit fails again
                                    del table[cid0]
                                    raise
                            launched = (
                                launched_after(launched0, launches) if launches else launched0
                            )
                            if pins:
                                pending = dict(pending0)
                                for s, v in pins:
                                    pending[s] = v
                            else:
                                pending = pending0
                            engine = launchable_after(engine0, ops) if ops else engine0
                            if core is core0 and not out.transitions and not out.commands:
                                ls.spec = spec0
                                if legal(move):
                                    raise RefinementError(
                                        f"the core refused {move}, which the spec allows"
                                    )
                    elif kind == WORLD:
                        # a world-only move changes the spec alone (``Lockstep.env``)
                        nxt = plan[3](spec0)
                        if nxt is None:
                            raise RefinementError(
                                f"the spec does not allow {move} here (after this step)"
                            )
                        core, launched, pending, engine = core0, launched0, pending0, engine0
                        spec = intern(nxt.cells, nxt)
                        faults = faults0 + plan[2]
                        out = plan[4]
                    else:  # a byte-check report: through the harness
                        ls.core, ls.spec, ls.launched = core0, spec0, launched0
                        ls.pending_reports, ls.faults, ls.launchable = pending0, faults0, engine0
                        out = step(move)
                        core, spec, launched = ls.core, ls.spec, ls.launched
                        pending, faults, engine = ls.pending_reports, ls.faults, ls.launchable
                except RefinementError as err:
                    if found is None:
                        found = Found(base + i, fp, move, str(err), violated=err.invariants)
                    continue
                except Exception as err:
                    if found is None:
                        found = Found(
                            base + i,
                            fp,
                            move,
                            f"the core raised {type(err).__name__} (not a RetireError): {err}",
                        )
                    continue
                # probes: per shared outcome (or per move name for an outcome without effect)
                tkey: Any = id(out) if out.transitions or out.commands else move.name
                counted = seen.get(tkey)
                if counted is None:
                    counted = tally.entry(tkey, move, out)
                counted[2] += 1
                if counted[3]:
                    probes.update(dynamic_hits(out, spec0, bounds))
                if (
                    core is core0
                    and spec is spec0
                    and pending is pending0
                    and faults == faults0
                    and launched is launched0
                    and engine == engine0
                ):
                    continue  # back in the state being expanded
                # ``launched`` and ``pending`` are copied on write by the harness: shared safely
                if workers > 1:
                    known_owner = owners.get(id(core))
                    owner = owner_of(core) if known_owner is None else known_owner[1]
                    if owner != me:
                        state = (core, spec, launched, pending, faults, engine)
                        outboxes[owner].add(base + i, fp, move, state)
                        continue
                fhit = fingerprinted(core, spec, pending, faults, engine)
                child = fhit[2]
                if child in parents:
                    continue
                if single:
                    # alone, the first path to a state is the one with the smallest key: the
                    # state is admitted at once (as ``admit`` would), while it is at hand
                    parents[child] = (fp, move)
                    ls.core, ls.spec, ls.launched = core, spec, launched
                    ls.pending_reports, ls.faults, ls.launchable = pending, faults, engine
                    try:
                        check_state(fhit[3])
                    except RefinementError as err:
                        if found is None:
                            found = Found(base + i, fp, move, str(err), violated=err.invariants)
                    found_states.append(
                        (base + i, child, (core, spec, launched, pending, faults, engine))
                    )
                    continue
                # (a successor received from another worker may already be here, with a
                # larger key or a smaller one)
                known = fresh.get(child)
                if known is not None and known[0] < base + i:
                    continue
                fresh[child] = (
                    base + i,
                    fp,
                    move,
                    (core, spec, launched, pending, faults, engine),
                    fhit[3],
                )
            memo.trim()
        self.transitions = transitions
        self.quiescent = quiescent
        self.found = found


def _candidate_key(item: tuple[int, Candidate]) -> int:
    return item[1][0]


__all__ = [
    "FLUSH",
    "POLL",
    "RADIX",
    "Found",
    "LevelReport",
    "Outbox",
    "Shard",
    "ShardTotals",
    "without_cyclic_gc",
]
