"""Z3 proofs of the spec's invariants: induction over unbounded sorts, and bounded model checking.

``prove`` discharges, for every invariant of ``retire_spec.invariants.INVARIANTS`` and every
auxiliary invariant of ``AUX``: *initiation* (the initial state satisfies it) and *consecution*
(for every action of ``ACTIONS``, existentially over the action's parameters: a state satisfying
all invariants and all auxiliary invariants, in which the action's guard holds, steps to a state
that satisfies it again). The sorts are uninterpreted, so a proof holds for any number of scopes,
participants, frames and pages, any versions and any contexts. The auxiliary invariants are
strengthenings the main invariants need to be inductive; they are written in the spec's
vocabulary and proved alongside (``docs/verification.md`` lists them). A failed consecution
check yields a counterexample to induction (CTI), which ``bmc`` then tries to confirm from the
initial state. ``bmc`` unrolls the transition relation to a given depth and looks for a state
violating an invariant; a trace it finds is turned into concrete action instances and replayed
through ``retire_core`` (``replay_on_core``) so the report says whether the core itself
misbehaves. Every query runs under a timeout; a timeout is reported as ``unknown``, and a
consecution query left unknown is asked again over two elements per sort (``_bounded_cti``). The
symbolic interpretation lives in ``z3_interp``; nothing here restates a guard or an effect.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import attrs
import z3  # type: ignore[import-untyped]

from retire_checks.z3_interp import FiniteSymbolic, Symbolic
from retire_spec.actions import ACTIONS, Action, ActionInstance
from retire_spec.expr import Concrete, Interp, Val
from retire_spec.invariants import INVARIANTS, Invariant
from retire_spec.schema import COLUMNS, DROPPED, GARBAGE, PUBLISHED, Kind, SpecState

PROVED, VIOLATED, UNKNOWN = "proved", "violated", "unknown"

# --- auxiliary invariants (strengthenings), in the spec's vocabulary ------------------------------


def _open_full_pages_honest(I: Interp, st: SpecState) -> Val:
    """A completed block whose writer is still open and that holds no unverified drafts holds
    its own prefix's bytes."""
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.and_(
                I.get(st["page_alloc"], p),
                I.get(st["page_writer"], p),
                I.get(st["page_full"], p),
                I.not_(I.get(st["page_draft"], p)),
            ),
            I.eq(I.get(st["page_data"], p), I.get(st["page_tok"], p)),
        ),
    )


def _closed_full_digest_honest(I: Interp, st: SpecState) -> Val:
    """The digest recorded when a completed block's writer closed is its prefix's bytes."""
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.and_(
                I.get(st["page_alloc"], p),
                I.not_(I.get(st["page_writer"], p)),
                I.get(st["page_full"], p),
            ),
            I.eq(I.get(st["page_digest"], p), I.get(st["page_tok"], p)),
        ),
    )


def _page_fp_is_owner_fp(I: Interp, st: SpecState) -> Val:
    """An allocated page carries its owner scope's configuration fingerprint."""
    return I.forall(
        "Page",
        lambda p: I.implies(
            I.get(st["page_alloc"], p),
            I.eq(I.get(st["page_fp"], p), I.get(st["scope_fp"], I.get(st["page_owner"], p))),
        ),
    )


def _unpublished_frames_clean(I: Interp, st: SpecState) -> Val:
    """The publication record of a frame is only ever spoiled by publishing it."""
    return I.forall(
        "Frame",
        lambda f: I.implies(
            I.not_(I.eq(I.get(st["frame_state"], f), I.lit(PUBLISHED))),
            I.get(st["frame_pub_ok"], f),
        ),
    )


def _undropped_frames_clean(I: Interp, st: SpecState) -> Val:
    """The drop record of a frame is only ever spoiled by dropping it."""
    return I.forall(
        "Frame",
        lambda f: I.implies(
            I.not_(I.eq(I.get(st["frame_state"], f), I.lit(DROPPED))),
            I.get(st["frame_drop_ok"], f),
        ),
    )


AUX: tuple[Invariant, ...] = (
    Invariant(
        "aux_unpublished_frames_clean",
        "state(f) ≠ PUBLISHED ⇒ pub_ok(f)",
        _unpublished_frames_clean,
    ),
    Invariant(
        "aux_undropped_frames_clean",
        "state(f) ≠ DROPPED ⇒ drop_ok(f)",
        _undropped_frames_clean,
    ),
    Invariant(
        "aux_open_full_pages_honest",
        "alloc(p) ∧ writer(p) ∧ full(p) ∧ ¬draft(p) ⇒ data(p) = tok(p)",
        _open_full_pages_honest,
    ),
    Invariant(
        "aux_closed_full_digest_honest",
        "alloc(p) ∧ ¬writer(p) ∧ full(p) ⇒ digest(p) = tok(p)",
        _closed_full_digest_honest,
    ),
    Invariant(
        "aux_page_fp_is_owner_fp",
        "alloc(p) ⇒ page_fp(p) = scope_fp(owner(p))",
        _page_fp_is_owner_fp,
    ),
)


# --- results ----------------------------------------------------------------------------------


@attrs.frozen(slots=True)
class Check:
    """One solver query: what was asked and what Z3 answered."""

    name: str  # e.g. "publication_token: init", "publication_token: supersede"
    status: str  # proved | violated | unknown
    seconds: float
    detail: str = ""


@attrs.frozen(slots=True)
class BmcTrace:
    depth: int
    violated: tuple[str, ...]
    steps: tuple[ActionInstance, ...]  # concrete instances over the model's universe
    sizes: dict[str, int]
    replay: str  # what happened when the trace was replayed through retire_core


@attrs.frozen(slots=True)
class ProofReport:
    results: dict[str, str]  # invariant or aux name -> proved | violated | unknown
    checks: tuple[Check, ...]
    bmc: BmcTrace | None
    bmc_depth: int
    bmc_status: str  # "clean" (no violation up to depth), "violated", "unknown"
    seconds: float
    # Non-vacuity: the initial state is satisfiable, and so is every action's guard together
    # with every induction hypothesis (else a consecution check is unsat for nothing). ``None``
    # when ``prove`` was asked not to check it; ``False`` if any query was unsat *or* unknown.
    vacuity: bool | None = None
    vacuity_checks: tuple[Check, ...] = ()

    @property
    def all_proved(self) -> bool:
        return (
            all(v == PROVED for v in self.results.values())
            and self.bmc_status == "clean"
            and self.vacuity is not False
        )

    @property
    def refuted(self) -> tuple[str, ...]:
        """The queries Z3 answered with a model that breaks a property: an initiation failure,
        a counterexample to induction, or a BMC trace from the initial state. Only these refute
        the spec; a timeout (``unknown``) refutes nothing."""
        found = [c.name for c in self.checks if c.status == VIOLATED]
        if self.bmc_status == VIOLATED:
            found.append(f"bmc to depth {self.bmc_depth}")
        return tuple(found)

    def summary(self) -> str:
        lines = [f"z3 ({self.seconds:.1f} s, {len(self.checks)} queries):"]
        for name, status in self.results.items():
            lines.append(f"  {status:<8} {name}")
        lines.append(f"  bmc to depth {self.bmc_depth}: {self.bmc_status}")
        if self.vacuity is not None:
            lines.append(
                f"  vacuity: {'not vacuous' if self.vacuity else 'VACUOUS OR UNDECIDED'} "
                f"({len(self.vacuity_checks)} satisfiability queries)"
            )
            for c in self.vacuity_checks:
                if c.status != "sat":
                    lines.append(f"    [{c.status}] {c.name}: {c.detail}")
        if self.bmc is not None:
            lines.append(f"    violates {list(self.bmc.violated)} after:")
            lines.extend(f"      {n}. {s}" for n, s in enumerate(self.bmc.steps, 1))
            lines.append(f"    replayed through retire_core: {self.bmc.replay}")
        for c in self.checks:
            if c.status != PROVED:
                lines.append(f"  [{c.status}] {c.name}: {c.detail}")
        return "\n".join(lines)


# --- induction ---------------------------------------------------------------------------------


#: The bounded universe of ``prove``'s last search for a trace to a property a CTI left unknown:
#: two of each sort (two scopes, as a cross-tenant bug needs).
FALLBACK_SIZES = {"Scope": 2, "Part": 2, "Frame": 2, "Page": 2}


def _solver(timeout_ms: int) -> z3.Solver:
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    return s


def _check(solver: z3.Solver) -> tuple[str, z3.ModelRef | None, str]:
    r = solver.check()
    if r == z3.unsat:
        return PROVED, None, ""
    if r == z3.sat:
        return VIOLATED, solver.model(), ""
    return UNKNOWN, None, solver.reason_unknown()


def prove(
    invariants: Sequence[Invariant] = INVARIANTS,
    aux: Sequence[Invariant] = AUX,
    actions: Iterable[Action] = ACTIONS,
    timeout_ms: int = 20_000,
    bmc_depth: int = 3,
    replay: bool = True,
    check_vacuity: bool = True,
) -> ProofReport:
    """Initiation and consecution of every invariant and auxiliary invariant, then BMC; with
    ``check_vacuity``, first that none of it holds vacuously (``vacuity``)."""
    t0 = time.perf_counter()
    I = Symbolic()
    actions = tuple(actions)
    props = list(invariants) + list(aux)
    status: dict[str, str] = {p.name: PROVED for p in props}
    checks: list[Check] = []
    vacuity: bool | None = None
    vacuity_checks: tuple[Check, ...] = ()
    if check_vacuity:
        vacuity_checks = non_vacuity(props, actions, timeout_ms)
        vacuity = all(c.status == "sat" for c in vacuity_checks)

    def worsen(name: str, new: str) -> None:
        if status[name] == VIOLATED or new == PROVED:
            return
        status[name] = new

    # initiation
    st0 = I.symbolic_state("init")
    init = I.initial_constraint(st0)
    for p in props:
        s = _solver(timeout_ms)
        s.add(init, z3.Not(p.holds(I, st0)))
        t = time.perf_counter()
        res, _, why = _check(s)
        checks.append(Check(f"{p.name}: init", res, time.perf_counter() - t, why))
        worsen(p.name, res)

    # consecution, one action at a time: first all properties at once, then one by one
    pre = I.symbolic_state("pre")
    hypothesis = [p.holds(I, pre) for p in props]
    for action in actions:
        params = I.action_params(action, "step")
        guard = action.guard(I, pre, *params)
        post = I.successor(pre, action, params)
        goals = [p.holds(I, post) for p in props]
        s = _solver(timeout_ms)
        s.add(*hypothesis, I._b(guard), z3.Not(z3.And(*goals)))
        t = time.perf_counter()
        res, _, why = _check(s)
        if res == PROVED:
            checks.append(Check(f"all: {action.name}", res, time.perf_counter() - t))
            continue
        for p, goal in zip(props, goals, strict=True):
            s = _solver(timeout_ms)
            s.add(*hypothesis, I._b(guard), z3.Not(goal))
            t = time.perf_counter()
            res, model, why = _check(s)
            detail = why
            if model is not None:
                detail = "counterexample to induction: " + describe_cti(
                    I, model, pre, action, params
                )
            elif res == UNKNOWN:
                res, detail = _bounded_cti(props, p, action, timeout_ms, why)
            checks.append(Check(f"{p.name}: {action.name}", res, time.perf_counter() - t, detail))
            # A CTI alone does not show a reachable violation: it stays unknown unless BMC
            # finds a trace from the initial state.
            worsen(p.name, UNKNOWN if res == VIOLATED else res)

    trace, bmc_status = bmc(props, actions, bmc_depth, timeout_ms, replay=replay)
    if trace is not None:
        for name in trace.violated:
            status[name] = VIOLATED
    else:
        # A query over every property at once can come back unknown where one over a single
        # property decides: look for a trace to each property a CTI left unknown, alone; and
        # since model finding with quantifiers can give up ("unknown", well before the timeout,
        # depending on the names of its variables), then in a bounded universe, where the
        # queries are quantifier-free and decided (a trace found there is a real trace).
        for p in props:
            if status[p.name] != UNKNOWN:
                continue
            found, _ = bmc([p], actions, bmc_depth, timeout_ms, replay=replay)
            if found is None:
                found, _ = bmc(
                    [p], actions, bmc_depth, timeout_ms, replay=replay, sizes=FALLBACK_SIZES
                )
            if found is not None:
                status[p.name] = VIOLATED
                trace, bmc_status = trace or found, "violated"
    return ProofReport(
        status,
        tuple(checks),
        trace,
        bmc_depth,
        bmc_status,
        time.perf_counter() - t0,
        vacuity,
        vacuity_checks,
    )


def _bounded_cti(
    props: Sequence[Invariant], prop: Invariant, action: Action, timeout_ms: int, why: str
) -> tuple[str, str]:
    """A consecution query Z3 left unknown (model finding with quantifiers gives up depending on
    the names of its variables, and a loaded machine can time it out), asked again over two
    elements per sort, where it is quantifier-free. A model there is a model of the query (the
    sorts are uninterpreted), so a counterexample to induction found there stands; anything
    else leaves the query unknown (no counterexample over two elements proves nothing)."""
    F = FiniteSymbolic(FALLBACK_SIZES)
    pre = F.symbolic_state("pre")
    params = F.action_params(action, "step")
    post = F.successor(pre, action, params)
    s = _solver(timeout_ms)
    s.add(*[p.holds(F, pre) for p in props], F._b(action.guard(F, pre, *params)))
    s.add(z3.Not(prop.holds(F, post)))
    res, model, finite_why = _check(s)
    if res == VIOLATED and model is not None:
        cti = describe_cti(F, model, pre, action, params)
        return VIOLATED, f"counterexample to induction (two elements per sort): {cti}"
    return UNKNOWN, f"{why}; over two elements per sort: {finite_why or 'no counterexample'}"


def non_vacuity(
    props: Sequence[Invariant], actions: Iterable[Action] = ACTIONS, timeout_ms: int = 20_000
) -> tuple[Check, ...]:
    """The satisfiability queries that make the proofs non-vacuous: the initial state (an
    unsatisfiable one would make every initiation check unsat), and for every action its guard
    together with every property as induction hypothesis (a contradiction among them would
    make that action's consecution check unsat whatever the effect). Each check's status is
    ``sat``, ``unsat`` or ``unknown``; only ``sat`` counts as non-vacuous. Each query is asked
    first over a universe of two elements per sort, where the quantifiers expand: a model there
    is a model (the sorts are uninterpreted), so its ``sat`` stands, and Z3 finds it in
    milliseconds where model finding with quantifiers takes seconds (about 0.5 s for all the
    queries against about 35 s, 2026-12-07). Only a query with no model there is asked over the
    unbounded sorts (a model may need more elements), and that answer stands."""
    out: list[Check] = []
    finite = FiniteSymbolic(FALLBACK_SIZES)

    def ask(name: str, build: Callable[[Symbolic], list[Any]]) -> None:
        t = time.perf_counter()
        status, why = _satisfiable(build(finite), timeout_ms)
        if status == "sat":
            why = "sat over two elements per sort"
        else:
            status, why = _satisfiable(build(Symbolic()), timeout_ms)
        out.append(Check(name, status, time.perf_counter() - t, why))

    ask("initial state", lambda I: [I.initial_constraint(I.symbolic_state("vac_init"))])
    for action in actions:

        def guarded(I: Symbolic, action: Action = action) -> list[Any]:
            pre = I.symbolic_state("vac_pre")
            params = I.action_params(action, "vac")
            hypotheses = [p.holds(I, pre) for p in props]
            return [*hypotheses, I._b(action.guard(I, pre, *params))]

        ask(f"hypotheses ∧ guard: {action.name}", guarded)
    return tuple(out)


def _satisfiable(constraints: list[Any], timeout_ms: int) -> tuple[str, str]:
    s = _solver(timeout_ms)
    s.add(*constraints)
    r = s.check()
    if r == z3.sat:
        return "sat", ""
    return ("unsat", "") if r == z3.unsat else ("unknown", s.reason_unknown())


# --- bounded model checking --------------------------------------------------------------------


def bmc(
    props: Sequence[Invariant],
    actions: Iterable[Action] = ACTIONS,
    depth: int = 3,
    timeout_ms: int = 20_000,
    replay: bool = True,
    sizes: dict[str, int] | None = None,
) -> tuple[BmcTrace | None, str]:
    """Look for a run of at most ``depth`` actions from the initial state that ends in a state
    violating one of ``props``. The universe is unbounded (uninterpreted sorts) unless
    ``sizes`` bounds each sort (``FiniteSymbolic``: quantifier-free, sometimes faster at
    finding a violation, slower at ruling one out). Returns the trace (or ``None``) and
    "clean", "violated" or "unknown" (a query timed out)."""
    I: Symbolic = FiniteSymbolic(sizes) if sizes else Symbolic()
    actions = tuple(actions)
    states = [I.symbolic_state("s0")]
    s = _solver(timeout_ms)
    s.add(I.initial_constraint(states[0]))
    choice: list[tuple[Any, list[tuple[Action, list[Any]]]]] = []
    outcome = "clean"
    for k in range(depth + 1):
        cur = states[-1]
        s.push()
        s.add(z3.Not(z3.And(*[p.holds(I, cur) for p in props])))
        res, model, _ = _check(s)
        if res == VIOLATED and model is not None:
            trace = _bmc_trace(I, model, states, choice, props, k, replay)
            s.pop()
            return trace, "violated"
        if res == UNKNOWN:
            outcome = "unknown"
        s.pop()
        if k == depth:
            break
        # one more step: which action, with which parameters. Each column of the next state
        # is the effect of the chosen action on it (or unchanged): a chain of ifs over only
        # the actions that write that column.
        nxt = I.symbolic_state(f"s{k + 1}")
        which = z3.Int(f"action@{k}")
        per_action = []
        guards = []
        writes: dict[str, list[tuple[int, Any]]] = {}
        for n, action in enumerate(actions):
            params = I.action_params(action, f"{k}")
            guard = action.guard(I, cur, *params)
            domain = I.param_domains(action, params)
            guards.append(z3.Implies(which == n, z3.And(I._b(guard), *domain)))
            for column, value in action.effect(I, cur, *params).items():
                writes.setdefault(column, []).append((n, value))
            per_action.append((action, params))
        s.add(which >= 0, which < len(actions), *guards)
        for col, now, then in zip(COLUMNS, cur.cells, nxt.cells, strict=True):
            value = now
            for n, written in writes.get(col.name, []):
                value = z3.If(which == n, written, value)
            s.add(then == value)
        choice.append((which, per_action))
        states.append(nxt)
    return None, outcome


def _bmc_trace(
    I: Symbolic,
    model: z3.ModelRef,
    states: list[SpecState],
    choice: list[tuple[Any, list[tuple[Action, list[Any]]]]],
    props: Sequence[Invariant],
    k: int,
    replay: bool,
) -> BmcTrace:
    conc = Concretizer(I, model)
    steps = []
    for which, per_action in choice[:k]:
        n = model.eval(which, model_completion=True).as_long()
        action, params = per_action[n]
        steps.append(ActionInstance(action.name, tuple(conc.value(p) for p in params)))
    last = conc.state(states[k])
    violated = tuple(p.name for p in props if not p.holds(Concrete(conc.sizes()), last))
    if not violated:  # the witness is an element no step mentions: take the whole model
        conc.include_universe()
        last = conc.state(states[k])
        violated = tuple(p.name for p in props if not p.holds(Concrete(conc.sizes()), last))
    text = replay_on_core(conc, steps) if replay else "not replayed"
    return BmcTrace(k, violated, tuple(steps), conc.sizes(), text)


# --- from a model to concrete values ------------------------------------------------------------


class Concretizer:
    """Reads a Z3 model back as concrete spec values. Elements of each sort get slots 0, 1, ...
    in the order they are first met (so a trace's elements come first); contexts become tuples
    over the first ``positions`` block positions."""

    def __init__(self, I: Symbolic, model: z3.ModelRef, positions: int = 2) -> None:
        self.I = I
        self.model = model
        self.seen: dict[str, list[Any]] = {name: [] for name in I.sorts}
        self.positions = positions

    def sizes(self) -> dict[str, int]:
        return {name: max(1, len(u)) for name, u in self.seen.items()}

    def _slot(self, sort: str, value: Any) -> int:
        for n, e in enumerate(self.seen[sort]):
            if z3.eq(e, value):
                return n
        self.seen[sort].append(value)
        return len(self.seen[sort]) - 1

    def value(self, term: Any) -> Any:
        v = self.model.eval(term, model_completion=True)
        srt = term.sort()
        if srt == z3.BoolSort(srt.ctx):
            return z3.is_true(v)
        if srt == z3.IntSort(srt.ctx):
            return v.as_long()
        for name, sort in self.I.sorts.items():
            if srt == sort:
                return self._slot(name, v)
        if srt == self.I.ctx_sort:
            return tuple(
                self.model.eval(z3.Select(term, i), model_completion=True).as_long()
                for i in range(self.positions)
            )
        raise ValueError(f"no concrete value for sort {srt}")

    def include_universe(self) -> None:
        """Give a slot to every element of the model's universes (after the trace's own)."""
        for name, sort in self.I.sorts.items():
            for e in self.model.get_universe(sort) or ():
                self._slot(name, e)

    def state(self, st: SpecState) -> SpecState:
        """The concrete state over the elements met so far (references to elements not met yet
        are given new slots, so call it until the sizes stop growing)."""
        while True:
            before = self.sizes()
            cells = []
            for col, cell in zip(COLUMNS, st.cells, strict=True):
                elems = list(self.seen[col.sort])
                column = [self.value(z3.Select(cell, e)) for e in elems]
                if not elems:  # an empty sort: one slot in its initial state
                    column = [col.initial if col.kind is not Kind.CTX else ()]
                cells.append(tuple(column))
            if self.sizes() == before:
                return SpecState(tuple(cells))


def describe_cti(
    I: Symbolic, model: z3.ModelRef, pre: SpecState, action: Action, params: Sequence[Any]
) -> str:
    """A CTI as a concrete state: the action instance (elements numbered in order of first
    use, the action's own first) and the cells of the pre-state that differ from the initial
    state, restricted to those elements."""
    conc = Concretizer(I, model)
    args = tuple(conc.value(p) for p in params)
    st = conc.state(pre)
    cells = []
    for col, column in zip(COLUMNS, st.cells, strict=True):
        for n, value in enumerate(column):
            if col.kind is not Kind.CTX and value != col.initial:
                cells.append(f"{col.name}[{n}]={value}")
    text = f"{action.name}{args} from the concrete state {{{', '.join(cells)}}}"
    return text if len(text) < 900 else text[:900] + "...}"


# --- replaying a BMC trace through the core ------------------------------------------------------

# Spec actions the trace hands to the core unchanged: what users and the engine do (a write is
# replayed as a write attempt, a draft write as a draft write attempt, so that the core's write
# gate decides it).
_ENV = frozenset(a.name for a in ACTIONS if a.actor != "core") - {"write", "write_draft"}


def replay_on_core(conc: Concretizer, steps: Sequence[ActionInstance]) -> str:
    """Feed the trace's engine and user moves to the real core in lock-step with the real spec
    (the core makes its own decisions: a frame in the trace is delivered, a write is attempted,
    a pending byte check is answered). Says whether the core misbehaves on this run."""
    from retire_checks.abstraction import Universe
    from retire_checks.environment import apply_move
    from retire_checks.lockstep import Lockstep, RefinementError
    from retire_spec.schema import Bounds

    contexts = sorted({a for s in steps for a in s.args if isinstance(a, tuple)})
    positions = max((len(c) for c in contexts), default=1)
    sizes = conc.sizes()
    try:
        bounds = Bounds(
            scopes=sizes["Scope"],
            parts=sizes["Part"],
            frames=sizes["Frame"],
            pages=sizes["Page"],
            positions=positions,
            max_epoch=len(steps) + 1,
            contexts=tuple(contexts) or ((GARBAGE - 10,) * positions,),
            fingerprints=tuple(range(sizes["Scope"])),
        )
    except ValueError as err:
        return f"not replayable ({err})"
    ls = Lockstep(Universe.of(bounds))
    fed = 0
    try:
        for step in steps:
            move: ActionInstance | None = None
            if step.name == "finish":  # the engine reports the version it finished
                scope = step.args[0]
                move = ActionInstance("finish", (scope, ls.spec["scope_epoch"][scope]))
            elif step.name in _ENV:
                move = step
            elif step.name in ("publish", "drop"):
                move = ActionInstance("deliver", step.args)
            elif step.name in ("write", "fence_write"):
                move = ActionInstance("attempt_write", step.args)
            elif step.name == "write_draft":
                move = ActionInstance("attempt_draft", step.args)
            elif step.name in ("adopt", "release", "resume") and step.args[0] in (
                ls.pending_reports
            ):
                move = ActionInstance("report", (step.args[0],))
            if move is None or not _legal_env(ls, move):
                continue
            apply_move(ls, move)
            fed += 1
    except RefinementError as err:
        return f"the core MISBEHAVES after {fed} moves: {err}"
    except (KeyError, IndexError, ValueError) as err:
        return f"not replayable after {fed} moves ({type(err).__name__}: {err})"
    return (
        f"the core stays safe: {fed} engine/user moves of the trace replayed, refinement and "
        "every invariant held (the violating step is one the core never takes)"
    )


def _legal_env(ls: Any, move: ActionInstance) -> bool:
    """Skip moves the environment could not make here (the core decides differently from the
    trace, so the trace's later engine moves may no longer apply)."""
    from retire_spec.schema import IN_FLIGHT

    if move.name == "report":
        return move.args[0] in ls.pending_reports
    if move.name == "deliver":
        return bool(ls.spec["frame_state"][move.args[0]] == IN_FLIGHT)
    if move.name == "attempt_write" or move.name == "attempt_draft":
        q = move.args[1]
        return bool(ls.spec["part_used"][q] and not ls.spec["part_closed"][q])
    if move.name == "finish":  # the env's move names the version, the spec's action does not
        return bool(ls.spec_enabled(ActionInstance("finish", move.args[:1])))
    if move.name == "receipt" and move.args[0] not in ls.launched:
        return False
    if move.name == "launch" and (move.args[1], move.args[2]) not in ls.launchable:
        return False  # the engine launches only admitted, unfenced versions
    return bool(ls.spec_enabled(move))


__all__ = [
    "AUX",
    "PROVED",
    "UNKNOWN",
    "VIOLATED",
    "ProofReport",
    "bmc",
    "non_vacuity",
    "prove",
]
