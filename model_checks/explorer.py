"""The explicit-state explorer: every interleaving of the environment, over the real core.

``explore(config)`` runs a breadth-first search over the joint states of a ``Lockstep`` (the real
``retire_core`` and the spec side by side) whose successors are all the moves ``env_moves``
offers in a bounded world (``Config``: the spec ``Bounds``, the environment ``Budget`` and the
core's ledger size). Each transition is checked by the lock-step harness (every core transition
must be a step the spec allows, commands must agree with transitions), each *new* state once
(the core's abstraction equals the spec's control columns, every invariant holds), and every
state in which the engine has nothing left to complete (no receipt, writer closure, frame
delivery or byte check pending) against ``QUIESCENCE`` — progress once revisions stop, and no
leak. States are stored as 64-bit fingerprints modulo symmetry (``symmetry``) in a map to their
parent, so the first violation found comes with a shortest path, which ``Counterexample``
replays with a recording harness, prints as numbered steps and writes as a pytest file.
Reachability probes (``probes``) count how often each stage, transition, late-event
classification and protocol path was taken; a profile whose run misses a required probe is
vacuous and fails. ``explore_spec`` runs the same search over the spec alone (every action of
``ACTIONS``, the engine's and the core's alike), which is how spec-level mutants are judged.
Profiles (``PROFILES``) are lists of configurations; ``run_profile`` runs them with a progress
line on stderr and returns a ``ProfileResult``. The CLI lives in ``cli_checks``.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TextIO

import attrs

import retire_core as rc
from retire_checks.abstraction import Universe, canonical_function, fast_canonical
from retire_checks.engine import COMMANDS_CHECKED, launchable_after
from retire_checks.environment import Budget, Offers, apply_move, env_moves
from retire_checks.lockstep import (
    _NOTHING,
    _REJECTED,
    BY_FRAME,
    BY_LAUNCH,
    BY_MOVE,
    WORLD,
    Lockstep,
    Outcome,
    RefinementError,
    StepMemo,
    launched_after,
)
from retire_checks.symmetry import Symmetry
from retire_spec.actions import ACTION_BY_NAME, ACTIONS, Action, ActionInstance
from retire_spec.codegen import compiler
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS, QUIESCENCE, Invariant
from retire_spec.schema import COLUMN_INDEX, FINISHED, PAUSED, Bounds, SpecState, initial_state

StepFn = Callable[[rc.CoreState, Any], rc.Step]

_FRAME_SCOPE, _FRAME_VER, _FRAME_KIND, _PAGE_DATA = (
    COLUMN_INDEX[name] for name in ("frame_scope", "frame_ver", "frame_kind", "page_data")
)

# Moves by which the engine completes what was started; a state offering none is quiescent.
COMPLETION = frozenset({"receipt", "deliver", "close_writer", "report"})


@attrs.frozen(slots=True)
class Config:
    """One bounded world: spec bounds, environment budget, core ledger size."""

    name: str
    bounds: Bounds
    budget: Budget = attrs.field(factory=Budget)
    ledger_size: int = 1024
    max_states: int | None = None  # a cap; a capped run is reported as not exhaustive
    symmetry: bool = True
    cost: float = 1.0  # expected CPU seconds (only used to schedule worker processes)


@attrs.frozen(slots=True)
class Profile:
    name: str
    configs: tuple[Config, ...]
    required_probes: tuple[str, ...]


# --- probes -------------------------------------------------------------------------------------

STAGES = tuple(f"stage:{s.value}" for s in rc.Stage)
# (``forget`` is left to the Hypothesis machine: see ``environment.Budget.forget``)
CORE_TRANSITIONS = (
    *(f"transition:{a.name}" for a in ACTIONS if a.name not in ("emit", "corrupt", "forget")),
    "transition:fence",
    "transition:late_report",
    "transition:late_finish",
)
ENV_MOVES = tuple(
    f"move:{m}"
    for m in (
        "open",
        "supersede",
        "pause",
        "unpause",
        "cancel",
        "finish",
        "launch",
        "receipt",
        "emit",
        "deliver",
        "allocate",
        "attempt_write",
        "close_writer",
        "evict",
        "corrupt",
        "reuse_id",
        "report",
    )
)
_D, _F, _R = rc.DropReason, rc.FenceReason, rc.ReleaseReason
REASONS = (
    f"drop:{_D.SCOPE_CANCELLED}",
    f"drop:{_D.RETIRED_DRAINING}",
    f"drop:{_D.RETIRED_DRAINED}",
    f"drop:{_D.RETIRED_EXPIRED}",
    f"fence:{_D.SCOPE_CANCELLED}",
    f"fence:{_D.RETIRED_DRAINING}",
    *(f"fence_write:{reason}" for reason in _F),
    f"release:{_R.DIGEST_MISMATCH}",
    f"release:{_R.GENERATION_CHANGED}",
    # (``late_report:retired_draining`` is not among them: a byte check's version was never
    # admitted, so once the engine launches only admitted versions it has no participant, and
    # no page either, since adoption comes after the report: the classification is unreachable)
    f"late_report:{_D.RETIRED_EXPIRED}",
    f"late_report:{_D.SCOPE_CANCELLED}",
    f"drop:{_D.VERSION_FINISHED}",
    f"fence:{_D.VERSION_FINISHED}",
    f"late_finish:{_D.VERSION_FINISHED}",
    f"late_finish:{_D.RETIRED_DRAINING}",
)
PATHS = (
    "path:cold_resume",  # a successor admitted cold (no reuse, or nothing certifiable)
    "path:warm_resume",  # a successor admitted after a byte check of certified pages
    "path:partial_adoption",  # part of a certificate adopted, the rest released (recompute)
    "path:chain_collapse",  # a revision while the previous successor's certificate is pending
    "path:cancel_releases_pins",  # a cancel while a certificate is pending
    "path:publish_while_paused",  # pause keeps authority
    "path:cross_tenant_write_fenced",  # a write into another tenant's page is fenced
    "path:drop_two_versions_back",  # a frame arrives after two revisions
    # a revision (ALIGN) while another scope of the same fingerprint holds a completed,
    # writer-closed page with the revised context's prefix: only the owner check refuses it
    "path:same_model_page_not_inherited",
    "path:quiescent",  # a state with nothing left to complete (checked against QUIESCENCE)
    "path:finish_frees_pages",  # a version's end frees what no revision could inherit
    "path:finish_caches_pages",  # ... and gives its completed pages back to the engine's cache
    "path:revise_after_finish",  # a finished scope revised: the next version starts
)
# every command class the core can emit, met by the engine's checks (``engine.obey``)
COMMANDS = tuple(f"command:{name}" for name in COMMANDS_CHECKED)
ALL_PROBES = STAGES + CORE_TRANSITIONS + ENV_MOVES + REASONS + PATHS + COMMANDS


def probe_hits(move: ActionInstance, out: Outcome, before: SpecState, bounds: Bounds) -> list[str]:
    """The probes one explored transition hits (``before``: the spec state it started in)."""
    return static_hits(move, out) + dynamic_hits(out, before, bounds)


def static_hits(move: ActionInstance, out: Outcome) -> list[str]:
    """The probes of a transition that depend on the move's name and the outcome alone."""
    hits = [f"move:{move.name}"]
    actions = set()
    for t in out.transitions:
        a = t.action
        actions.add(a)
        # a transition's hits depend on these four values alone (memoized on them)
        sig = (a, t.stage, t.reason, (bool(t.version), t.arg("cold")) if a == "resume" else None)
        found = _TRANSITION_HITS.get(sig)
        if found is None:
            found = _TRANSITION_HITS[sig] = _transition_hits(t)
        hits.extend(found)
    if "adopt" in actions and "release" in actions:
        hits.append("path:partial_adoption")
    if "finish" in actions and "free" in actions:
        hits.append("path:finish_frees_pages")
    if "finish" in actions and any(isinstance(c, rc.ReleaseToCache) for c in out.commands):
        hits.append("path:finish_caches_pages")
    for c in out.commands:
        hits.append(f"command:{type(c).__name__}")
        if isinstance(c, rc.Unpin):
            if c.reason == rc.UnpinReason.SUPERSEDED_BEFORE_ADOPTION:
                hits.append("path:chain_collapse")
            elif c.reason == rc.UnpinReason.CANCELLED:
                hits.append("path:cancel_releases_pins")
    return hits


def _transition_hits(t: rc.Transition) -> tuple[str, ...]:
    hits = [f"stage:{t.stage.value}", f"transition:{t.action}"]
    if t.reason is not None:
        hits.append(f"{t.action}:{t.reason}")
    if t.action == "resume" and t.version:
        hits.append("path:cold_resume" if t.arg("cold") else "path:warm_resume")
    return tuple(hits)


_TRANSITION_HITS: dict[tuple[Any, ...], tuple[str, ...]] = {}


def dynamic_hits(out: Outcome, before: SpecState, bounds: Bounds) -> list[str]:
    """The probes of a transition that read the spec state it started in (publish while
    paused, a drop two versions back, a write fenced across tenants)."""
    hits = []
    for t in out.transitions:
        a = t.action
        if a == "publish" and before["scope_mode"][_slot(t.scope)] == PAUSED:
            hits.append("path:publish_while_paused")
        elif a == "drop" and t.version is not None:
            if before["scope_epoch"][_slot(t.scope)] - t.version >= 2:
                hits.append("path:drop_two_versions_back")
        elif a == "fence_write" and t.reason == rc.FenceReason.PAGE_OF_ANOTHER_SCOPE:
            s = _slot(t.scope)
            if before["page_fp"][t.arg("page")] != bounds.fingerprints[s]:
                hits.append("path:cross_tenant_write_fenced")
        elif a == "supersede":
            if before["scope_mode"][_slot(t.scope)] == FINISHED:
                hits.append("path:revise_after_finish")
            if twin_page(t, before, bounds):
                hits.append("path:same_model_page_not_inherited")
    return hits


def twin_page(t: rc.Transition, before: SpecState, bounds: Bounds) -> bool:
    """Whether another scope of the revised scope's fingerprint has an allocated, completed,
    writer-closed page whose prefix is the revised context's block at its position."""
    s = _slot(t.scope)
    context = t.arg("context") or ()
    fp = bounds.fingerprints[s]
    for p in range(bounds.pages):
        pos = before["page_pos"][p]
        if (
            before["page_alloc"][p]
            and before["page_owner"][p] != s
            and before["page_fp"][p] == fp
            and before["page_full"][p]
            and not before["page_writer"][p]
            and 0 <= pos < len(context)
            and before["page_tok"][p] == context[pos]
        ):
            return True
    return False


class ProbeTally:
    """Probe counts of a search. The step memo hands out shared ``Outcome`` objects, and most
    hits depend on the move's name and the outcome alone: those are computed once per shared
    outcome (for an outcome without transitions or commands, once per move name) and counted,
    then multiplied out by ``flush``; the hits that read the state before (publish, drop and
    cross-scope write fences) are computed every time by ``dynamic_hits``. An outcome's entry
    keeps the outcome, so its id is not reused while the entry exists."""

    def __init__(self, bounds: Bounds, limit: int = 200_000) -> None:
        self.bounds = bounds
        self.limit = limit
        self.counts: Counter[str] = Counter()
        # key -> [outcome, static hits, count, whether the outcome has dynamic hits]
        self._seen: dict[Any, list[Any]] = {}
        self._hits: dict[tuple[str, ...], tuple[str, ...]] = {}

    def key(self, move: ActionInstance, out: Outcome) -> Any:
        return id(out) if out.transitions or out.commands else move.name

    def entry(self, key: Any, move: ActionInstance, out: Outcome) -> list[Any]:
        if len(self._seen) >= self.limit:
            self.flush()
        dynamic = any(_reads_before(t) for t in out.transitions)
        hits = tuple(static_hits(move, out))
        hits = self._hits.setdefault(hits, hits)  # one tuple per distinct list of hits
        entry = self._seen[key] = [out, hits, 0, dynamic]
        return entry

    def add(self, move: ActionInstance, out: Outcome, before: SpecState) -> None:
        key = self.key(move, out)
        entry = self._seen.get(key)
        if entry is None:
            entry = self.entry(key, move, out)
        entry[2] += 1
        if entry[3]:
            self.counts.update(dynamic_hits(out, before, self.bounds))

    def flush(self) -> Counter[str]:
        for _, hits, n, _ in self._seen.values():
            for hit in hits:
                self.counts[hit] += n
        self._seen.clear()
        return self.counts


def _reads_before(t: rc.Transition) -> bool:
    return t.action in ("publish", "drop", "supersede") or (
        t.action == "fence_write" and t.reason == rc.FenceReason.PAGE_OF_ANOTHER_SCOPE
    )


def _slot(scope: str | None) -> int:
    return int((scope or "s0")[1:])


# --- results ------------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Counterexample:
    """A shortest path from the initial state to a violation, replayable through the core."""

    config: Config
    moves: tuple[ActionInstance, ...]
    error: str
    quiescence: bool = False  # the violation is a QUIESCENCE failure in the last state
    violated: tuple[str, ...] = ()  # invariant / quiescence names; empty: refinement failure

    def steps(self, step_fn: StepFn = rc.step, actions: dict[str, Action] | None = None) -> str:
        """The numbered step list, from a recording replay (core transitions indented)."""
        lines = replay_lines(self, step_fn, actions)
        return "\n".join(lines)

    def to_pytest(self, mutant: str | None = None) -> str:
        """A self-contained pytest module that replays this path and fails while the violation
        is present (with ``mutant``, inside that mutant of the catalogue)."""
        return render_pytest(self, mutant)


@attrs.frozen(slots=True)
class ExploreResult:
    config: Config
    states: int
    transitions: int
    max_depth: int
    seconds: float
    quiescent: int
    exhaustive: bool
    probes: Counter[str]
    violation: Counterexample | None
    cpu_seconds: float = 0.0  # CPU time of the exploring process (wall time can include waits)

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0


# --- the search ---------------------------------------------------------------------------------


class Progress:
    """A plain progress line on stderr: rewritten in place on a terminal, else every 5 s."""

    def __init__(self, label: str, stream: TextIO | None = None, enabled: bool = True) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        self.tty = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.start = time.perf_counter()
        self.last = self.start
        self.period = 0.25 if self.tty else 5.0

    def update(self, states: int, transitions: int, depth: int, queue: int) -> None:
        now = time.perf_counter()
        if not self.enabled or now - self.last < self.period:
            return
        self.last = now
        rate = states / max(now - self.start, 1e-9)
        line = (
            f"[{self.label}] {states:>9,} states  {transitions:>10,} transitions  "
            f"depth {depth:>3}  queue {queue:>8,}  {rate:>8,.0f} states/s"
        )
        if self.tty:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


def new_lockstep(
    config: Config,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    *,
    record: bool = False,
    memo: StepMemo | None = None,
) -> Lockstep:
    return Lockstep(
        Universe.of(config.bounds),
        step_fn=step_fn,
        invariants=invariants,
        actions=actions,
        ledger_size=config.ledger_size,
        record=record,
        check_each_step=record,
        memo=memo,
    )


@contextlib.contextmanager
def _without_cyclic_gc() -> Iterator[None]:
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


def explore(
    config: Config,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    progress: Progress | None = None,
) -> ExploreResult:
    """Breadth-first search of the joint core/spec system of ``config``; stops at the first
    violation (refinement, invariant or quiescence) with a shortest counterexample."""
    with _without_cyclic_gc():
        return _explore(config, step_fn, actions, invariants, progress)


def _explore(
    config: Config,
    step_fn: StepFn,
    actions: dict[str, Action] | None,
    invariants: tuple[Invariant, ...],
    progress: Progress | None,
) -> ExploreResult:
    t0 = time.perf_counter()
    c0 = time.process_time()
    memo = StepMemo()
    ls = new_lockstep(config, step_fn, actions, invariants, memo=memo)
    bounds, budget = config.bounds, config.budget
    sym = Symmetry(ls.uni, config.symmetry)
    quiescence = [(q.name, ls.compiled.predicate(q.holds)) for q in QUIESCENCE]
    tally = ProbeTally(bounds)
    probes = tally.counts
    seen = tally._seen
    canonical = canonical_function(bounds)
    # fingerprint and canonical spec of a raw joint state (see the loop)
    fps: dict[tuple[Any, ...], tuple[Any, ...]] = {}
    offer = Offers(budget, COMPLETION)  # ``env_moves``, memoized on what it reads
    # parent map: fingerprint -> (parent fingerprint, move); the root maps to None.
    parents: dict[int, tuple[int, ActionInstance] | None] = {}
    root = sym.fingerprint_raw(
        ls.core, ls.spec, ls.pending_reports, ls.faults, canonical, ls.launchable
    )[0]
    parents[root] = None
    transitions = 0
    max_depth = 0
    quiescent = 0
    violation: Counterexample | None = None
    exhaustive = True

    def path_to(fp: int) -> list[ActionInstance]:
        moves: list[ActionInstance] = []
        link = parents[fp]
        while link is not None:
            fp, move = link
            moves.append(move)
            link = parents[fp]
        moves.reverse()
        return moves

    try:
        ls.check_state()
    except RefinementError as err:
        cex = Counterexample(config, (), str(err), violated=err.invariants)
        return ExploreResult(config, 1, 0, 0, 0.0, 0, True, probes, cex)
    queue: deque[tuple[tuple[Any, ...], int, int]] = deque([(ls.snapshot(), root, 0)])
    cap = config.max_states
    # the hot loop's bindings: the harness's step (new core steps, byte-check reports), the
    # legality judgement of a refused move, the memo's event tables and spec interning
    step = ls.move
    new_step = ls.new_core_step
    check_commands = ls._check_commands
    legal = ls._legal
    fingerprint_raw = sym.fingerprint_raw
    events = memo.events
    intern = memo.specs.setdefault
    # per move (by identity; each entry holds its move): how its core-step table is found
    plans: dict[int, tuple[Any, ...]] = {}
    while queue:
        snap, fp, depth = queue.popleft()
        ls.restore(snap)
        moves, completes = offer(ls)
        if not completes:
            quiescent += 1
            probes["path:quiescent"] += 1
            broken = [name for name, holds in quiescence if not holds(ls.spec)]
            if broken:
                violation = Counterexample(
                    config,
                    tuple(path_to(fp)),
                    f"quiescence property(ies) {broken} violated",
                    quiescence=True,
                    violated=tuple(broken),
                )
                break
        spec0 = ls.spec
        core0, launched0, pending0, faults0 = ls.core, ls.launched, ls.pending_reports, ls.faults
        engine0 = ls.launchable
        cid0 = id(core0)
        for move in moves:
            transitions += 1
            plan = plans.get(id(move))
            if plan is None or plan[0] is not move:
                plan = plans[id(move)] = ls.plan(move)
            kind = plan[1]
            try:
                if kind < WORLD:
                    # ``Lockstep.move``, inlined. The event's core-step table is found exactly
                    # as ``Lockstep._event`` finds it (the same keys, the same memo).
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
                    else:
                        ek = (plan[3], spec0.cells[_PAGE_DATA][plan[4]])
                    hit = events.get(ek)
                    if hit is None or hit[0] is not move:
                        ls.spec, ls.launched = spec0, launched0
                        event, table = ls._event(move)
                        assert table is not None  # the explorer's harness has a memo
                    else:
                        event, table = hit[1], hit[2]
                    found = table.get(cid0)
                    if found is None:  # a new core step: computed, interned and recorded
                        ls.core = core0
                        entry = new_step(event, table)
                        fresh = True
                    else:
                        entry = found[1]
                        fresh = False
                    faults = faults0 + plan[2]
                    if entry is _REJECTED:
                        # a typed refusal changes neither side (a fault move is still spent)
                        ls.spec = spec0
                        if legal(move):
                            raise RefinementError(f"the core refused {move}, which the spec allows")
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
                        if fresh:  # commands against transitions, once per core step
                            check_commands(out)
                        launched = launched_after(launched0, launches) if launches else launched0
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
                violation = Counterexample(
                    config, (*path_to(fp), move), str(err), violated=err.invariants
                )
                break
            except Exception as err:
                violation = Counterexample(
                    config,
                    (*path_to(fp), move),
                    f"the core raised {type(err).__name__} (not a RetireError): {err}",
                )
                break
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
                continue  # back in the state being expanded: already in ``parents``
            # raw joint states are keyed by the identities of their (interned) core and spec;
            # each entry holds both objects, so neither id is reused while it exists
            raw = (id(core), id(spec), tuple(pending.items()) if pending else (), faults, engine)
            fhit = fps.get(raw)
            if fhit is None:
                if len(fps) >= memo.limit:
                    fps.clear()
                fhit = fps[raw] = (
                    core,
                    spec,
                    *fingerprint_raw(core, spec, pending, faults, canonical, engine),
                )
            child = fhit[2]
            if child in parents:
                continue
            parents[child] = (fp, move)
            ls.core, ls.spec, ls.launched, ls.pending_reports, ls.faults = (
                core,
                spec,
                launched,
                pending,
                faults,
            )
            ls.launchable = engine
            try:
                ls.check_state(fhit[3])
            except RefinementError as err:
                violation = Counterexample(
                    config, (*path_to(fp), move), str(err), violated=err.invariants
                )
                break
            if depth + 1 > max_depth:
                max_depth = depth + 1
            # ``launched`` and ``pending`` are copied on write by the harness: shared safely
            queue.append(((core, spec, launched, pending, faults, engine), child, depth + 1))
        if violation is not None:
            break
        memo.trim()
        if progress is not None:
            progress.update(len(parents), transitions, depth, len(queue))
        if cap is not None and len(parents) >= cap:
            exhaustive = False
            break
    seconds = time.perf_counter() - t0
    return ExploreResult(
        config,
        len(parents),
        transitions,
        max_depth,
        seconds,
        quiescent,
        exhaustive and violation is None,
        tally.flush(),
        violation,
        time.process_time() - c0,
    )


def explore_spec(
    config: Config,
    actions: dict[str, Action] | None = None,
    invariants: tuple[Invariant, ...] = INVARIANTS,
    max_states: int | None = None,
    max_generation: int = 3,
) -> ExploreResult:
    """Breadth-first search of the spec alone: every instance of every action (the engine's,
    the user's and the core's decisions), every invariant in every state. No symmetry. Like
    epochs in ``enabled``, ownership generations are capped at ``max_generation`` (recycled
    block ids would otherwise make the world infinite)."""
    with _without_cyclic_gc():
        return _explore_spec(config, actions, invariants, max_states, max_generation)


def _explore_spec(
    config: Config,
    actions: dict[str, Action] | None,
    invariants: tuple[Invariant, ...],
    max_states: int | None,
    max_generation: int,
) -> ExploreResult:
    t0 = time.perf_counter()
    bounds = config.bounds
    table = tuple((actions or ACTION_BY_NAME).values())
    compiled = compiler(bounds)
    checks = [(inv.name, compiled.predicate(inv.holds)) for inv in invariants]
    init = initial_state(bounds)
    parents: dict[SpecState, tuple[SpecState, ActionInstance] | None] = {
        fast_canonical(init, bounds): None
    }
    queue: deque[tuple[SpecState, int]] = deque([(init, 0)])
    transitions = max_depth = 0
    hits: Counter[str] = Counter()
    violation = None
    cap = max_states if max_states is not None else config.max_states
    while queue and violation is None:
        st, depth = queue.popleft()
        key = fast_canonical(st, bounds)
        for inst, nxt in compiled.enabled(st, table):
            if any(g > max_generation for g in nxt["page_gen"]):
                continue
            transitions += 1
            hits[f"transition:{inst.name}"] += 1
            nkey = fast_canonical(nxt, bounds)
            if nkey in parents:
                continue
            parents[nkey] = (key, inst)
            max_depth = max(max_depth, depth + 1)
            broken = [name for name, holds in checks if not holds(nxt)]
            if broken:
                moves = [inst]
                link = parents[key]
                while link is not None:
                    key_, move = link
                    moves.append(move)
                    link = parents[key_]
                moves.reverse()
                violation = Counterexample(
                    config,
                    tuple(moves),
                    f"spec invariant(s) {broken} violated",
                    violated=tuple(broken),
                )
                break
            queue.append((nxt, depth + 1))
        if cap is not None and len(parents) >= cap:
            break
    return ExploreResult(
        config,
        len(parents),
        transitions,
        max_depth,
        time.perf_counter() - t0,
        0,
        violation is None and not queue,
        hits,
        violation,
    )


# --- profiles -----------------------------------------------------------------------------------

TOKEN_ONLY = (0,)
ALL_KINDS = (0, 1, 2)

_NO_CONTROL: dict[str, Any] = {"pause": False, "cancel": False, "finish": False}

QUICK = Profile(
    "quick",
    (
        # Revision chains e -> e+1 -> e+2 of one scope: late frames of every classification
        # (a one-entry ledger lets drained versions expire), chain collapse, byte-check faults.
        Config(
            "chain",
            Bounds(1, 2, 1, 1, 1, 2, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            cost=8,
        ),
        # Certified handoff of a two-block prefix: partial adoption after a fault, recompute.
        Config(
            "handoff",
            Bounds(1, 2, 0, 2, 2, 1, ((1, 2),), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=5,
        ),
        # Pause and cancel against frames of every kind, cancel during a pending handoff.
        Config(
            "control",
            Bounds(1, 2, 1, 1, 1, 1, ((1,),), (0,)),
            Budget(faults=0, frame_kinds=ALL_KINDS),
            cost=5,
        ),
        # Two tenants side by side: cross-scope and cross-tenant write attempts.
        Config(
            "tenants",
            Bounds(2, 2, 0, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            cost=0.5,
        ),
        # Two scopes of the same tenant and model (equal fingerprints) with the same context:
        # only ALIGN's page-owner check keeps one scope's pages from the other's successor.
        Config(
            "twins",
            Bounds(2, 2, 0, 1, 1, 1, ((1,),), (0, 0)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            cost=1,
        ),
    ),
    ALL_PROBES,
)

FULL = Profile(
    "full",
    (
        # one scope, three participants, chains of two revisions
        Config(
            "chain",
            Bounds(1, 3, 1, 1, 1, 2, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            cost=55,
        ),
        # chains of three revisions e -> e+1 -> e+2 -> e+3
        Config(
            "deep",
            Bounds(1, 2, 1, 1, 1, 3, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            cost=30,
        ),
        # chains of three revisions with two late frames in flight
        Config(
            "deep-frames",
            Bounds(1, 2, 2, 1, 1, 3, ((1,), (2,)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            ledger_size=1,
            cost=20,
        ),
        # two-block handoffs across two revisions with two revised contexts
        Config(
            "handoff",
            Bounds(1, 2, 0, 2, 2, 2, ((1, 2), (1, 3)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=110,
        ),
        # three-block handoffs: certification and adoption cut at every position
        Config(
            "handoff-long",
            Bounds(1, 2, 0, 3, 3, 1, ((1, 2, 3),), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=140,
        ),
        # two tenants, each with a two-block handoff and one of two revised contexts, a fault
        Config(
            "tenants-handoff",
            Bounds(2, 2, 0, 2, 2, 1, ((1, 2), (1, 3)), (0, 1)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=50,
        ),
        # two-block handoffs with a late frame in flight
        Config(
            "handoff-frames",
            Bounds(1, 2, 1, 2, 2, 1, ((1, 2), (1, 3)), (0,)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=40,
        ),
        # pause, unpause and cancel against two frames of every kind, with a fault
        Config(
            "control",
            Bounds(1, 2, 2, 1, 1, 1, ((1,),), (0,)),
            Budget(faults=1, frame_kinds=ALL_KINDS),
            cost=40,
        ),
        # two tenants, two pages each way, a late frame
        Config(
            "tenants",
            Bounds(2, 2, 1, 2, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            cost=90,
        ),
        # two tenants with pause, unpause and cancel, a late frame
        Config(
            "tenants-control",
            Bounds(2, 2, 1, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY),
            cost=85,
        ),
        # two tenants, three participants
        Config(
            "tenants-parts",
            Bounds(2, 3, 1, 1, 1, 1, ((1,),), (0, 1)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY, **_NO_CONTROL),
            cost=50,
        ),
        # two scopes of one tenant and model, each with a two-block handoff and one of two
        # revised contexts, a fault: the page-owner check of ALIGN and adoption under load
        Config(
            "twins-handoff",
            Bounds(2, 2, 0, 2, 2, 1, ((1, 2), (1, 3)), (0, 0)),
            Budget(faults=1, frame_kinds=TOKEN_ONLY, reuse_choices=(True,), **_NO_CONTROL),
            ledger_size=1,
            cost=40,
        ),
        # two scopes of one tenant and model with pause, unpause and cancel, a late frame (one
        # page: with two, 2.9 million states and 16 CPU minutes)
        Config(
            "twins-control",
            Bounds(2, 2, 1, 1, 1, 1, ((1,),), (0, 0)),
            Budget(faults=0, frame_kinds=TOKEN_ONLY),
            cost=40,
        ),
    ),
    ALL_PROBES,
)
PROFILES: dict[str, Profile] = {p.name: p for p in (QUICK, FULL)}


@attrs.frozen(slots=True)
class ProfileResult:
    profile: Profile
    results: tuple[ExploreResult, ...]

    @property
    def states(self) -> int:
        return sum(r.states for r in self.results)

    @property
    def transitions(self) -> int:
        return sum(r.transitions for r in self.results)

    @property
    def max_depth(self) -> int:
        return max((r.max_depth for r in self.results), default=0)

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.results)

    @property
    def states_per_second(self) -> float:
        return self.states / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds for r in self.results)

    @property
    def cpu_states_per_second(self) -> float:
        return self.states / self.cpu_seconds if self.cpu_seconds > 0 else 0.0

    @property
    def probes(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.probes)
        return total

    @property
    def missing_probes(self) -> tuple[str, ...]:
        probes = self.probes
        return tuple(p for p in self.profile.required_probes if not probes[p])

    @property
    def violation(self) -> Counterexample | None:
        return next((r.violation for r in self.results if r.violation is not None), None)

    @property
    def exhaustive(self) -> bool:
        return all(r.exhaustive for r in self.results) and len(self.results) == len(
            self.profile.configs
        )

    @property
    def ok(self) -> bool:
        return self.violation is None and self.exhaustive and not self.missing_probes

    def invariants(self) -> dict[str, bool]:
        """Each invariant and quiescence property: true iff every configuration was explored
        exhaustively and no state violated it."""
        cex = self.violation
        bad = set(cex.violated) if cex is not None else set()
        done = self.exhaustive
        return {inv.name: done and inv.name not in bad for inv in INVARIANTS + QUIESCENCE}

    def refinement(self) -> bool:
        cex = self.violation
        return self.exhaustive and (cex is None or bool(cex.violated))

    def summary(self) -> str:
        lines = [f"explorer, profile {self.profile.name}:"]
        for r in self.results:
            b = r.config.bounds
            lines.append(
                f"  {r.config.name:<9} scopes={b.scopes} parts={b.parts} frames={b.frames} "
                f"pages={b.pages} positions={b.positions} max_epoch={b.max_epoch} "
                f"ledger={r.config.ledger_size}: {r.states:,} states, {r.transitions:,} "
                f"transitions, depth {r.max_depth}, {r.quiescent:,} quiescent, "
                f"{r.seconds:.1f} s ({r.states_per_second:,.0f} states/s; "
                f"{r.states / max(r.cpu_seconds, 1e-9):,.0f} per CPU second)"
                + ("" if r.exhaustive or r.violation else "  [NOT EXHAUSTIVE: capped]")
            )
        lines.append(
            f"  total: {self.states:,} distinct states, {self.transitions:,} transitions, "
            f"max depth {self.max_depth}, {self.seconds:.1f} s, "
            f"{self.states_per_second:,.0f} states/s ({self.cpu_states_per_second:,.0f} per CPU "
            "second)"
        )
        probes = self.probes
        moves = sorted((k[5:], v) for k, v in probes.items() if k.startswith("move:"))
        acts = sorted((k[11:], v) for k, v in probes.items() if k.startswith("transition:"))
        lines.append("  hits per environment move: " + ", ".join(f"{k} {v:,}" for k, v in moves))
        lines.append("  hits per core transition: " + ", ".join(f"{k} {v:,}" for k, v in acts))
        missing = self.missing_probes
        lines.append(
            f"  probes: {len(self.profile.required_probes) - len(missing)}/"
            f"{len(self.profile.required_probes)} hit"
            + (f"; NEVER HIT (vacuous): {', '.join(missing)}" if missing else "")
        )
        cex = self.violation
        if cex is not None:
            lines.append(f"  VIOLATION in {cex.config.name}: {cex.error}")
        return "\n".join(lines)


def run_profile(
    profile: Profile,
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    progress: bool = True,
    stream: TextIO | None = None,
) -> ProfileResult:
    """Explore every configuration of ``profile`` in this process (stopping at the first
    violation). ``explore_job`` is the same for one configuration, in a worker process."""
    results = []
    for config in profile.configs:
        bar = Progress(f"{profile.name}/{config.name}", stream, enabled=progress)
        result = explore(config, step_fn, actions, progress=bar)
        bar.done()
        results.append(result)
        if result.violation is not None:
            break
    return ProfileResult(profile, tuple(results))


def explore_job(config: Config, label: str, progress: bool) -> ExploreResult:
    """One configuration with the real core, for a worker process (progress as plain lines,
    since several processes share the terminal)."""
    bar = Progress(label, sys.stderr, enabled=progress)
    bar.tty = False
    bar.period = 5.0
    return explore(config, progress=bar)


# --- replay and rendering ---------------------------------------------------------------------


def replay(
    config: Config,
    moves: Iterable[ActionInstance],
    step_fn: StepFn = rc.step,
    actions: dict[str, Action] | None = None,
    check_quiescence: bool = False,
) -> Lockstep:
    """Replay ``moves`` through the real core and the spec with every check on; raises
    ``RefinementError`` at the first violation (including quiescence at the end, if asked).
    A move the environment can no longer make (the core now decides differently, so the path
    no longer exists) ends the replay without error."""
    ls = new_lockstep(config, step_fn, actions, record=True)
    ls.check_state()
    for move in moves:
        if move not in env_moves(ls, config.budget):
            return ls
        apply_move(ls, move)
    if check_quiescence:
        I = Concrete(config.bounds.sizes())
        broken = [q.name for q in QUIESCENCE if not q.holds(I, ls.spec)]
        if broken:
            raise RefinementError(f"quiescence property(ies) {broken} violated at the end")
    return ls


def replay_lines(
    cex: Counterexample, step_fn: StepFn = rc.step, actions: dict[str, Action] | None = None
) -> list[str]:
    ls = new_lockstep(cex.config, step_fn, actions, record=True)
    lines = []
    error = None
    for n, move in enumerate(cex.moves, 1):
        before = len(ls.trace)
        try:
            apply_move(ls, move)
        except RefinementError as err:
            error = str(err)
        new = ls.trace[before:]
        lines.append(f"{n:>3}. {move}")
        lines.extend(f"       {line.strip()}" for line in new[1:])
        if error is not None:
            break
    if error is None and cex.quiescence:
        I = Concrete(cex.config.bounds.sizes())
        broken = [q.name for q in QUIESCENCE if not q.holds(I, ls.spec)]
        error = f"quiescent state violates {broken}" if broken else None
    lines.append(f"  => {error or 'no violation on replay (' + cex.error + ')'}")
    return lines


def render_pytest(cex: Counterexample, mutant: str | None = None) -> str:
    b = cex.config.bounds
    budget = cex.config.budget
    moves = ",\n".join(f"    A({m.name!r}, {m.args!r})" for m in cex.moves)
    ctx = f"MUTANTS[{mutant!r}].active()" if mutant is not None else "contextlib.nullcontext()"
    mutant_import = "from retire_checks.mutants import MUTANTS\n" if mutant is not None else ""
    return f'''"""Counterexample found by the Retire explorer ({cex.config.name}).

Violation: {cex.error}
The test replays the shortest path through the real core and the spec with every check on; it
fails while the violation is present{" (inside mutant " + repr(mutant) + ")" if mutant else ""}.
"""

import contextlib

from retire_checks.environment import Budget
from retire_checks.explorer import Config, replay
{mutant_import}from retire_spec.actions import ActionInstance as A
from retire_spec.schema import Bounds

CONFIG = Config(
    {cex.config.name!r},
    Bounds(
        scopes={b.scopes},
        parts={b.parts},
        frames={b.frames},
        pages={b.pages},
        positions={b.positions},
        max_epoch={b.max_epoch},
        contexts={b.contexts!r},
        fingerprints={b.fingerprints!r},
    ),
    Budget(
        faults={budget.faults},
        frame_kinds={budget.frame_kinds!r},
        partial_writes={budget.partial_writes!r},
        reuse_choices={budget.reuse_choices!r},
        pause={budget.pause!r},
        cancel={budget.cancel!r},
    ),
    ledger_size={cex.config.ledger_size},
)
MOVES = (
{moves},
)
CHECK_QUIESCENCE = {cex.quiescence!r}


def test_counterexample_replays_cleanly() -> None:
    with {ctx}:
        replay(CONFIG, MOVES, check_quiescence=CHECK_QUIESCENCE)
'''


__all__ = [
    "ALL_PROBES",
    "FULL",
    "PROFILES",
    "QUICK",
    "Config",
    "Counterexample",
    "ExploreResult",
    "Profile",
    "ProfileResult",
    "Progress",
    "explore",
    "explore_spec",
    "probe_hits",
    "replay",
    "run_profile",
]
