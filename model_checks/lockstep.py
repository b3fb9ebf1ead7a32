"""The lock-step harness: the real core and the spec, driven side by side by one environment.

``Lockstep`` holds a core state, the spec state it should stand for, and the universe. The
environment (Hypothesis rules, the explorer, a test) calls ``env(...)`` with a spec action of an
engine or user: world-only actions (a frame emitted into a queue, a page's bytes corrupted) change
the spec alone; every other action is turned into the core event the engine would report, the core
steps, and each transition it reports is replayed as a spec action whose guard must hold (the
translations both ways, and the checks of what the core said, are ``correspondence``'s).
Afterwards the core's abstraction must equal the spec's control columns, the commands must agree
with the transitions, and every invariant must hold. Any disagreement raises ``RefinementError``
with the step that caused it. The engine's answers to commands (the byte check after
``PinCertified``) are produced by ``report``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import attrs

import retire_core as rc
from retire_checks.abstraction import (
    Universe,
    abstract_control,
    abstract_control_cells,
    fast_canonical,
)
from retire_checks.correspondence import (
    closing_data,
    command_mismatch,
    core_event,
    misreported,
    spec_instance,
)
from retire_checks.engine import CommandViolation, books_of, launchable_after, obey
from retire_checks.step_memo import StepMemo
from retire_spec.actions import ACTION_BY_NAME, Action, ActionInstance
from retire_spec.codegen import Predicate, Successor, compiler
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import (
    CANCELLED,
    COLUMN_INDEX,
    CONTROL_COLUMNS,
    FINISHED,
    IN_FLIGHT,
    NO_MATCH,
    SpecState,
    initial_state,
)

WORLD_ONLY = frozenset({"emit", "corrupt"})
FAULTS = frozenset({"corrupt", "reuse_id"})


class RefinementError(AssertionError):
    """The core did something the spec does not allow, or its state drifted from the spec's.
    ``invariants`` names the violated invariants when that is what failed (empty for a
    refinement failure proper)."""

    def __init__(self, message: str, invariants: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.invariants = invariants


@attrs.frozen(slots=True)
class Outcome:
    commands: tuple[rc.Command, ...]
    transitions: tuple[rc.Transition, ...]
    spec_steps: tuple[ActionInstance, ...]


class _Lines:
    """A logger that keeps every ``info`` line (so ``Retire.handle_batch`` logs per event)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def info(self, event: str, **fields: Any) -> None:
        self.lines.append((event, fields))


class _Quiet:
    """A logger with INFO off (``Retire.handle_batch`` then takes its unlogged path)."""

    def is_enabled_for(self, level: int) -> bool:
        return False

    def info(self, event: str, **fields: Any) -> None:  # pragma: no cover - never called
        raise AssertionError("INFO is off")


_REJECTED = object()
_MISSING: Any = object()
_NOTHING = Outcome((), (), ())
# ``Lockstep.plan``'s kinds of move (the core moves first, ordered as the explorer tests them).
BY_MOVE, BY_LAUNCH, BY_FRAME, BY_PAGE_DATA, BY_NAMED_CLOSE, WORLD, OTHER = range(7)
_FRAME_SCOPE, _FRAME_VER, _FRAME_KIND, _PAGE_DATA = (
    COLUMN_INDEX[name] for name in ("frame_scope", "frame_ver", "frame_kind", "page_data")
)
_USED, _CLOSED = COLUMN_INDEX["part_used"], COLUMN_INDEX["part_closed"]
_control_cells = operator.itemgetter(*(COLUMN_INDEX[name] for name in CONTROL_COLUMNS))


def launched_after(
    launched: dict[int, tuple[int, int]], launches: Any
) -> dict[int, tuple[int, int]]:
    """The participants the harness knows launched, after a core step's ``launches``: ``(q,
    (s, v))`` for a launch, ``(None, s)`` for a forgotten scope (its participants' slots are
    free again)."""
    out = dict(launched)
    for q, sv in launches:
        if q is None:
            out = {k: v for k, v in out.items() if v[0] != sv}
        else:
            out[q] = sv
    return out


class Lockstep:
    """One run. ``step_fn`` is the core's step function (a mutant can be swapped in)."""

    def __init__(
        self,
        uni: Universe,
        step_fn: Callable[[rc.CoreState, Any], rc.Step] = rc.step,
        invariants: tuple[Invariant, ...] = INVARIANTS,
        actions: dict[str, Action] | None = None,
        *,
        ledger_size: int = 1024,
        record: bool = True,
        check_each_step: bool = True,
        memo: StepMemo | None = None,
    ) -> None:
        self.uni = uni
        self.step_fn = step_fn
        self.invariants = invariants
        self.actions = actions or ACTION_BY_NAME
        self.I = Concrete(uni.bounds.sizes())
        # Guards, effects and invariants compiled from the same spec functions (``codegen``).
        self.compiled = compiler(uni.bounds)
        self._guards: dict[int, tuple[ActionInstance, Predicate]] = {}
        self._steps: dict[ActionInstance, Successor] = {}
        self._instances: dict[tuple[Any, ...], tuple[ActionInstance, Successor] | None] = {}
        self._holds = tuple(self.compiled.predicate(inv.holds) for inv in invariants)
        self._all_hold = self.compiled.conjunction(tuple(inv.holds for inv in invariants))
        self.core = rc.CoreState(ledger_size=ledger_size)
        self.spec = initial_state(uni.bounds)
        self.launched: dict[int, tuple[int, int]] = {}
        self.pending_reports: dict[int, int] = {}  # scope slot -> version awaiting a byte check
        self.faults = 0  # corrupt and reuse_id moves so far (the environment's fault budget)
        # (scope slot, version) pairs the engine may launch participants for: admitted by an
        # ``Admit`` and not fenced since (``engine.obey``); replaced, never changed in place
        self.launchable: frozenset[tuple[int, int]] = frozenset()
        # ``record``: keep the human-readable ``trace`` (the explorer turns it off and keeps a
        # parent map instead). ``check_each_step``: check refinement of the state and every
        # invariant after each step (the explorer turns it off and calls ``check_state`` once
        # per distinct state; the per-transition checks of ``feed`` always run).
        self.record = record
        self.check_each_step = check_each_step
        self.memo = memo
        self.trace: list[str] = []
        self._current_event: Any = None

    # --- snapshots ------------------------------------------------------------------------
    # ``launched`` and ``pending_reports`` are copied on write (the harness replaces them, it
    # never changes them in place), so a snapshot's own copies can be restored without copying.
    def snapshot(self) -> tuple[Any, ...]:
        return (
            self.core,
            self.spec,
            dict(self.launched),
            dict(self.pending_reports),
            self.faults,
            self.launchable,
        )

    def restore(self, snap: tuple[Any, ...]) -> None:
        (
            self.core,
            self.spec,
            self.launched,
            self.pending_reports,
            self.faults,
            self.launchable,
        ) = snap

    def key(self) -> tuple[Any, ...]:
        """Canonical identity of the joint state (the spec side in normal form)."""
        return (
            self.core,
            fast_canonical(self.spec, self.uni.bounds),
            tuple(sorted(self.launched.items())),
            tuple(sorted(self.pending_reports.items())),
            self.faults,
            tuple(sorted(self.launchable)),
        )

    # --- guards -------------------------------------------------------------------------
    def spec_enabled(self, inst: ActionInstance) -> bool:
        # keyed by the instance's identity (moves are shared objects); each entry holds it
        found = self._guards.get(id(inst))
        if found is None or found[0] is not inst:
            if len(self._guards) >= 100_000:
                self._guards.clear()
            guard = self.compiled.guard(self.actions[inst.name], inst.args)
            found = self._guards[id(inst)] = (inst, guard)
        return found[1](self.spec)

    def _spec_apply(self, inst: ActionInstance) -> None:
        memo = self.memo
        if memo is not None:
            key = (self.spec, inst)
            nxt = memo.spec.get(key, _MISSING)
            if nxt is _MISSING:
                nxt = self._spec_next(inst)
                if nxt is not None:
                    nxt = memo.specs.setdefault(nxt.cells, nxt)
                memo.spec[key] = nxt
        else:
            nxt = self._spec_next(inst)
        if nxt is None:
            raise RefinementError(f"the spec does not allow {inst} here (after {self._last()})")
        self.spec = nxt

    def _spec_next(self, inst: ActionInstance) -> SpecState | None:
        return self._step_of(inst)(self.spec)

    def _step_of(self, inst: ActionInstance) -> Successor:
        """The compiled successor function of ``inst`` (``None`` where its guard is false)."""
        step = self._steps.get(inst)
        if step is None:
            step = self._steps[inst] = self.compiled.step(self.actions[inst.name], inst.args)
        return step

    def _last(self) -> str:
        if not self.record:
            return "this step"
        return self.trace[-1] if self.trace else "the initial state"

    # --- the environment's moves -----------------------------------------------------------
    def env(self, inst: ActionInstance) -> Outcome:
        """Perform an engine/user action and return the outcome of the core step (empty if the
        core rejected the event with a typed error: then neither side changes)."""
        if self.record:
            self.trace.append(str(inst))
        if inst.name == "receipt_again":
            return self.receipt_again(inst)
        if inst.name in FAULTS:
            self.faults += 1
        if inst.name in WORLD_ONLY:
            self._spec_apply(inst)
            if self.check_each_step:
                self.check_state()
            return Outcome((), (), (inst,))
        event, table = self._event(inst)
        before = self.core
        out = self.feed(event, inst, table)
        # A refused event changes neither side, so legality is judged in the same spec state
        # after the step as before it (and only when the core refused). Without a memo no
        # state is interned: an event the core ignored (a step that logs, commands and
        # changes nothing) returns an equal state, not the same one, and counts as refused.
        rejected = (
            not out.transitions
            and not out.commands
            and (self.core is before or self.core == before)
        )
        if rejected and self._legal(inst):
            raise RefinementError(f"the core refused {inst}, which the spec allows")
        return out

    def move(self, inst: ActionInstance) -> Outcome:
        """A move of the environment (``environment.apply_move``: ``env``, or ``report`` for a
        byte-check answer). For a harness with a memo that neither records nor checks each step
        (the explorer's), a core step already in the memo is taken here directly, with the same
        checks as ``env`` and ``feed`` on a memo hit: each spec instance's guard, legality of
        a refused event; anything else goes through ``env``/``feed``."""
        name = inst.name
        memo = self.memo
        if name == "report":
            return self.report(inst.args[0])
        if name == "receipt_again":
            return self.receipt_again(inst)
        if memo is None or self.record or self.check_each_step or name in WORLD_ONLY:
            return self.env(inst)
        if name in FAULTS:
            self.faults += 1
        event, table = self._event(inst)
        assert table is not None  # a harness with a memo
        core = self.core
        found = table.get(id(core))
        if found is None:  # a new core step: ``feed`` computes, checks and records it
            out = self.feed(event, inst, table)
            rejected = self.core is core and not out.transitions and not out.commands
            if rejected and self._legal(inst):
                raise RefinementError(f"the core refused {inst}, which the spec allows")
            return out
        entry = found[1]
        if entry is _REJECTED:
            if self._legal(inst):
                raise RefinementError(f"the core refused {inst}, which the spec allows")
            return _NOTHING
        self._current_event = event
        outcome: Outcome
        state, outcome, launches, pins, spec_steps, ops = entry
        self._follow(spec_steps, launches, memo)
        self.core = state
        if pins:
            self._add_pins(pins)
        if ops:
            self.launchable = launchable_after(self.launchable, ops)
        rejected = state is core and not outcome.transitions and not outcome.commands
        if rejected and self._legal(inst):
            raise RefinementError(f"the core refused {inst}, which the spec allows")
        return outcome

    def _legal(self, inst: ActionInstance) -> bool:
        """Whether the spec lets the engine/user do this (the core must then accept it)."""
        if inst.name == "deliver":
            return bool(self.spec["frame_state"][inst.args[0]] == IN_FLIGHT)
        if inst.name == "attempt_write" or inst.name == "attempt_draft":
            q = inst.args[1]
            return bool(self.spec["part_used"][q] and not self.spec["part_closed"][q])
        if inst.name == "finish" or inst.name == "preempt":
            # a report for a version without authority is legal (logged as late); one for the
            # current version is legal when the spec's action is
            s, v = inst.args
            retired = v < self.spec["scope_epoch"][s]
            ended = self.spec["scope_mode"][s] in (CANCELLED, FINISHED)
            return retired or ended or self.spec_enabled(ActionInstance(inst.name, (s,)))
        return self.spec_enabled(inst)

    def receipt_again(self, inst: ActionInstance) -> Outcome:
        """A receipt delivered again (lost acknowledgement, retry, replay) for participant
        ``q``, which has already delivered it. The core must refuse it with its typed error,
        ``DuplicateReceiptError`` (also once the version drained into the ledger), or
        ``UnknownParticipantError`` once the version left the ledger window and the core no
        longer knows the participant; a refusal changes nothing, on either side. Accepting
        it in any way (a step, even one changing nothing), or refusing it with another error,
        is a refinement failure."""
        (q,) = inst.args
        if not (self.spec.cells[_USED][q] and self.spec.cells[_CLOSED][q]):
            raise RefinementError(f"{inst}: participant {q} has not delivered its receipt")
        event, table = self._event(inst)
        core = self.core
        if table is not None:
            known = table.get(id(core))
            if known is not None:
                return _NOTHING  # only refusals are recorded in this table
        try:
            result = self.step_fn(core, event)
        except rc.DuplicateReceiptError:
            pass
        except rc.UnknownParticipantError as err:
            s, v = self.launched[q]
            sid = self.uni.scopes[s]
            rec = core.scopes.get(sid)
            known_part = rec is not None and event.participant in rec.participants
            if known_part or (sid, v) in core.ledger:
                raise RefinementError(
                    f"the core refused the duplicated {inst} with {err!r}, not "
                    f"DuplicateReceiptError (after {self._last()})"
                ) from err
        except rc.RetireError as err:
            raise RefinementError(
                f"the core refused the duplicated {inst} with {err!r}, not "
                f"DuplicateReceiptError (after {self._last()})"
            ) from err
        else:
            raise RefinementError(
                f"the core accepted the duplicated {inst}: transitions "
                f"{[t.action for t in result.transitions]}, commands {list(result.commands)}, "
                f"state {'unchanged' if result.state == core else 'changed'} "
                f"(after {self._last()})"
            )
        if table is not None:
            table[id(core)] = (core, _REJECTED)
            if self.memo is not None:
                self.memo.size += 1
        if self.record:
            self.trace.append("  -> rejected Receipt (duplicate)")
        return _NOTHING

    def report(self, s: int) -> Outcome:
        """The engine answers a ``PinCertified`` with the current digests of the pinned pages."""
        pending = dict(self.pending_reports)
        version = pending.pop(s)
        self.pending_reports = pending
        sid = self.uni.scopes[s]
        rec = self.core.scopes.get(sid)  # None: the user forgot the scope before the answer
        cert = rec.certificate if rec is not None else None
        pages = cert.pages if cert is not None and cert.version == version else ()
        data = self.spec["page_data"]
        digests = tuple(rc.PageDigest(p, str(data[p])) for p in pages)
        if self.record:
            self.trace.append(f"report({s}, v{version})")
        return self.feed(rc.AdoptionReport(sid, version, digests), None)

    def _event(self, inst: ActionInstance) -> tuple[Any, dict[int, Any] | None]:
        """``_event_for``, memoized on exactly what the event is built from (building an event
        runs its validators), with the core-step table of that event (``None`` without a
        memo). Keys name the move by identity; each entry holds the move itself."""
        memo = self.memo
        if memo is None:
            return self._event_for(inst), None
        key = self._event_key(inst)
        hit = memo.events.get(key)
        if hit is None or hit[0] is not inst:
            hit = memo.events[key] = (inst, self._event_for(inst), {})
        return hit[1], hit[2]

    def _follow(self, spec_steps: Any, launches: Any, memo: StepMemo | None) -> None:
        """Take the spec steps a core step refines to (each guard checked now, in this spec
        state) and record the participants it launched."""
        if spec_steps:
            spec = self.spec
            for si, step in spec_steps:
                nxt = step(spec)
                if nxt is None:
                    raise RefinementError(
                        f"the spec does not allow {si} here (after {self._last()})"
                    )
                spec = nxt
            self.spec = memo.specs.setdefault(spec.cells, spec) if memo is not None else spec
        if launches:
            self.launched = launched_after(self.launched, launches)

    def _add_pins(self, pins: Any) -> None:
        pending = dict(self.pending_reports)
        for s, v in pins:
            pending[s] = v
        self.pending_reports = pending

    def plan(self, inst: ActionInstance) -> tuple[Any, ...]:
        """How the explorer's loop takes ``inst`` (``shard.Shard.expand``, which inlines ``move``
        on a memo hit): ``(inst, kind, fault, a, b)``. For a core move, ``kind`` says what
        ``_event_key`` adds to the move's identity ``a`` (``BY_LAUNCH``: the launch of
        participant ``b``; ``BY_FRAME``: frame ``b``'s scope, version and kind; ``BY_PAGE_DATA``:
        page ``b``'s bytes; ``BY_NAMED_CLOSE``: the bytes a writer's close naming page ``b``
        leaves) so that the loop builds the very same key; ``WORLD``: a world-only move, ``a``
        its compiled successor and ``b`` its outcome; ``OTHER``: a byte-check report.
        ``fault``: 1 if the move spends the fault budget."""
        n, a = inst.name, inst.args
        fault = 1 if n in FAULTS else 0
        if n == "report" or n == "receipt_again":
            return (inst, OTHER, 0, None, None)
        if n in WORLD_ONLY:
            return (inst, WORLD, fault, self._step_of(inst), Outcome((), (), (inst,)))
        key = id(inst)
        if n == "receipt":
            return (inst, BY_LAUNCH, fault, key, a[0])
        if n == "allocate" or n == "attempt_write" or n == "attempt_draft":
            return (inst, BY_LAUNCH, fault, key, a[1])
        if n == "deliver":
            return (inst, BY_FRAME, fault, key, a[0])
        if n == "close_writer":
            return (inst, BY_PAGE_DATA if a[1] == NO_MATCH else BY_NAMED_CLOSE, fault, key, a[0])
        return (inst, BY_MOVE, fault, key, None)

    def _event_key(self, inst: ActionInstance) -> Any:
        """The move by identity, plus exactly what else its core event is built from."""
        n, a = inst.name, inst.args
        key: Any = id(inst)
        if n == "receipt" or n == "receipt_again":
            return (key, self.launched.get(a[0]))
        if n == "allocate" or n == "attempt_write" or n == "attempt_draft":
            return (key, self.launched.get(a[1]))
        if n == "deliver":
            f = a[0]
            cells = self.spec.cells
            return (key, cells[_FRAME_SCOPE][f], cells[_FRAME_VER][f], cells[_FRAME_KIND][f])
        if n == "close_writer":
            if a[1] == NO_MATCH:
                return (key, self.spec.cells[_PAGE_DATA][a[0]])
            return (key, closing_data(self.spec, inst, self.uni.bounds))
        return key

    def _event_for(self, inst: ActionInstance) -> Any:
        return core_event(inst, self.uni, self.spec, self.launched)

    # --- one core step ------------------------------------------------------------------------
    def feed(
        self, event: Any, inst: ActionInstance | None, table: dict[int, Any] | None = None
    ) -> Outcome:
        """One core step on ``event``, replayed on the spec side and checked. With a memo, the
        step is looked up in ``table`` (the event's core-step table; found by the event when
        not given) by the identity of the core state, and
        the spec instances are applied by their compiled successor functions kept in the entry
        (each guard checked every time) and the resulting spec state is interned. The commands
        are checked against the transitions once per core step."""
        self._current_event = event
        memo = self.memo
        core = self.core
        if memo is not None and table is None:
            table = memo.tables.get(event)
            if table is None:
                table = memo.tables[event] = {}
        hit = table.get(id(core)) if table is not None else None
        fresh = hit is None
        entry = self._core_step(event) if hit is None else hit[1]
        if entry is _REJECTED:
            if fresh:
                if self.record:
                    self.trace.append(f"  -> rejected {type(event).__name__}")
                if table is not None and memo is not None:
                    table[id(core)] = (core, _REJECTED)
                    memo.size += 1
            return _NOTHING
        outcome: Outcome
        state, outcome, launches, pins, spec_steps, ops = entry
        self._follow(spec_steps, launches, memo)
        if fresh:
            self._check_commands(outcome)
            if table is not None and memo is not None:
                table[id(core)] = (core, entry)
                memo.size += 1
        self.core = state
        if pins:
            self._add_pins(pins)
        if ops:
            self.launchable = launchable_after(self.launchable, ops)
        if self.check_each_step:
            self.check_state()
        if self.record:
            steps_text = ", ".join(str(s) for s in outcome.spec_steps)
            self.trace.append("  -> " + (steps_text or "(no spec step)"))
        return outcome

    def new_core_step(self, event: Any, table: dict[int, Any]) -> Any:
        """For the explorer's inlined ``move``: the core's step on ``event`` from the current
        core state, not yet in ``table`` (the event's core-step table), computed by
        ``_core_step`` and recorded there. The caller takes the spec steps (checking each
        guard) and then checks the commands against the transitions (``_check_commands``),
        as ``feed`` does for a new core step."""
        self._current_event = event
        core = self.core
        entry = self._core_step(event)
        table[id(core)] = (core, entry)
        memo = self.memo
        if memo is not None:
            memo.size += 1
        return entry

    def _core_step(self, event: Any) -> Any:
        """The core's step on ``event`` from the current core state, as a memo entry: the
        (interned) next state, the outcome, the participants launched, the byte checks
        requested and the spec instances its transitions stand for with their compiled
        successor functions, and what its ``Admit``/``Fence`` commands change in the versions the
        engine may launch for; ``_REJECTED`` for a typed refusal. Raises ``RefinementError``
        when the engine could not obey the commands (``engine.obey``)."""
        try:
            result = self.step_fn(self.core, event)
        except rc.RetireError:
            return _REJECTED
        compiled = []
        launches = []
        transitions = tuple(rc.per_page(result.transitions))  # the spec steps, page by page
        for t in transitions:
            found = self._instance_of(t)
            if found is not None:
                compiled.append(found)
                si = found[0]
                if si.name == "launch":
                    launches.append((si.args[0], si.args[1:]))
                elif si.name == "forget":
                    launches.append((None, si.args[0]))
        pins = tuple(
            (self.uni.scope_slot(c.certificate.scope), c.certificate.version)
            for c in result.commands
            if isinstance(c, rc.PinCertified)
        )
        state = result.state
        memo = self.memo
        if memo is not None:
            state = memo.cores.setdefault(state, state)  # equal core states: one object
        # The modelled engine carries the commands out (``engine.obey``): each must be one it
        # can obey, none it needs may be missing; Admit and Fence change what it may launch.
        try:
            ops = obey(
                self.core,
                event,
                state,
                result.commands,
                transitions,
                self.uni.scope_slot,
                books_of if memo is None else memo.books_of,
                self.uni.kv_windows,
                self.uni.group,
            )
        except CommandViolation as err:
            raise RefinementError(
                f"the engine cannot obey the commands: {err} (after {self._last()})"
            ) from err
        wrong = misreported(event, transitions)
        if wrong:
            raise RefinementError(f"{wrong} (after {self._last()})")
        steps = tuple([si for si, _ in compiled])
        outcome = Outcome(result.commands, transitions, steps)
        return (state, outcome, tuple(launches), pins, tuple(compiled), ops)

    def _instance_of(self, t: rc.Transition) -> tuple[ActionInstance, Successor] | None:
        """``_spec_instance`` with its compiled successor function (``None`` for a stutter),
        memoized on what it reads of the transition (except for ``open``/``supersede``, whose
        instance carries the current event's request)."""
        n = t.action
        if n == "open" or n == "supersede":
            si = self._spec_instance(t)
            return None if si is None else (si, self._step_of(si))
        key = (n, t.scope, t.version, t.args)
        found = self._instances.get(key, _MISSING)
        if found is _MISSING:
            si = self._spec_instance(t)
            found = self._instances[key] = None if si is None else (si, self._step_of(si))
        return found  # type: ignore[no-any-return]

    def _spec_instance(self, t: rc.Transition) -> ActionInstance | None:
        try:
            return spec_instance(t, self.uni, self._current_event)
        except ValueError as err:
            raise RefinementError(str(err)) from err

    def _check_commands(self, result: rc.Step | Outcome) -> None:
        """Each kind of command names exactly the frames or pages its transitions name."""
        wrong = command_mismatch(result.commands, result.transitions)
        if wrong:
            raise RefinementError(f"{wrong} (after {self._last()})")

    def check_state(self, canon: SpecState | None = None) -> None:
        """Refinement of the current state (core abstraction == spec control columns) and every
        invariant; raises ``RefinementError``. ``canon``: the spec state's canonical form, if
        the caller has it. Every invariant is evaluated in every state checked (compiled, all of
        them cost less than working out which columns changed since the parent state)."""
        view = canon if canon is not None else fast_canonical(self.spec, self.uni.bounds)
        cells = view.cells
        if _control_cells(cells) != self._abstract():
            abstract = abstract_control(self.core, self.uni, self.launched)
            expected = view.project(CONTROL_COLUMNS)
            diff = [k for k in expected if abstract[k] != expected[k]]
            detail = {k: (abstract[k], expected[k]) for k in diff}
            raise RefinementError(f"core and spec disagree on {detail} (after {self._last()})")
        spec = self.spec
        if self._all_hold(spec):
            return
        checks = zip(self.invariants, self._holds, strict=True)
        broken = [inv.name for inv, holds in checks if not holds(spec)]
        if broken:
            raise RefinementError(
                f"invariant(s) {broken} violated (after {self._last()})", tuple(broken)
            )

    def _abstract(self) -> tuple[Any, ...]:
        """``abstract_control`` of the current core, as a tuple in ``CONTROL_COLUMNS`` order
        (memoized by the identity of the core state, which each entry holds, and the launched
        participants)."""
        memo = self.memo
        if memo is None:
            return abstract_control_cells(self.core, self.uni, self.launched)
        core = self.core
        key = (id(core), tuple(self.launched.items()))
        hit = memo.abstract.get(key)
        if hit is None:
            values = abstract_control_cells(core, self.uni, self.launched)
            hit = memo.abstract[key] = (core, values)
        return hit[1]

    _check = check_state

    # --- step-grouped batches (``Retire.handle_batch``) -----------------------------------------
    def batch(self, moves: Sequence[ActionInstance], *, logged: bool = True) -> Outcome:
        """What one engine hook observed, handed to the core at once as the vLLM facade does:
        the moves' events (built from the state before the batch, as the engine observes them)
        go through ``Retire.handle_batch`` on a ``Retire`` holding the current core state, and
        the same moves go one at a time through the checked lock-step path (refinement, the
        engine's command checks, invariants). The batch must end in the same core state with the
        same commands and transitions in the same order; if it refuses (a typed error: nothing
        of it takes effect), some event must be one the core refuses on its own, and then the
        harness is put back to where it was before the batch. ``logged``: through a logger that
        records every line (``handle_batch`` then counts each event's transitions) or one with
        INFO off (its unlogged path). Moves must be engine observations whose events do not
        depend on the others' effects: frames delivered, allocations, write attempts (not
        writer closures, whose digest is read when the event is built)."""
        before = self.snapshot()
        events = [self._event_for(m) for m in moves]
        log = _Lines() if logged else _Quiet()
        retire = rc.Retire(state=self.core, logger=log)
        refused: rc.RetireError | None = None
        commands: list[rc.Command] = []
        try:
            commands = retire.handle_batch(events)
        except rc.RetireError as err:
            refused = err
        if self.record:
            self.trace.append(f"batch of {len(moves)} ({'logged' if logged else 'unlogged'})")
        outcomes = []
        rejected = None
        for m in moves:
            core = self.core
            out = self.env(m)
            if self.core is core and not out.transitions and not out.commands:
                rejected = rejected or m
            outcomes.append(out)
        want_commands = [c for o in outcomes for c in o.commands]
        want_transitions = tuple(t for o in outcomes for t in o.transitions)
        if refused is not None:
            if rejected is None:
                raise RefinementError(
                    f"handle_batch refused the batch ({refused}), but the core accepts its "
                    f"events one at a time (after {self._last()})"
                )
            self.restore(before)  # all or nothing: the batch took no effect
            return _NOTHING
        if rejected is not None:
            raise RefinementError(
                f"handle_batch accepted a batch with {rejected}, which the core refuses on its own"
            )
        problems = []
        if retire.state != self.core:
            problems.append("the final core state differs")
        if commands != want_commands:
            problems.append(f"commands {commands} != {want_commands} one at a time")
        if retire.last_transitions != want_transitions:
            problems.append("the transitions differ")
        if isinstance(log, _Lines) and [line[1]["seq"] for line in log.lines] != list(
            range(1, len(want_transitions) + 1)
        ):
            problems.append("the log lines are not one per transition, in order")
        if problems:
            raise RefinementError(
                f"handle_batch of {[str(m) for m in moves]} is not the same as one at a time: "
                f"{'; '.join(problems)}"
            )
        if self.memo is None:
            self.core = retire.state  # the run goes on from the batch's own state (equal)
        steps = tuple(si for o in outcomes for si in o.spec_steps)
        return Outcome(tuple(commands), want_transitions, steps)


__all__ = [
    "Lockstep",
    "Outcome",
    "RefinementError",
    "SpecState",
]
