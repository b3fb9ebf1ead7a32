"""The compiled interpretation (``retire_spec.codegen``) against ``Concrete``: guards,
successors, invariants and quiescence properties agree on reachable states (for the spec and for
every spec mutant's action table) and on arbitrary ones, including block positions outside the
contexts; generators that miscompile ``le`` or drop ``get``'s range check are caught."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from retire_checks import mutant_kind, mutants
from retire_checks.explorer import QUICK
from retire_spec.actions import ACTION_BY_NAME, Action, enabled, instances
from retire_spec.codegen import Codegen, Compiler, Src
from retire_spec.expr import Concrete
from retire_spec.invariants import INVARIANTS, QUIESCENCE
from retire_spec.schema import ACTIVE, COLUMN_INDEX, Bounds, SpecState, initial_state
from tests.helpers import arbitrary_spec_state

BOUNDS = (
    *(c.bounds for c in QUICK.configs),
    mutant_kind.SPEC_ONE.bounds,
    mutant_kind.SPEC_TENANTS.bounds,
    Bounds(2, 2, 1, 2, 2, 2, ((1, 2), (1, 3)), (0, 1)),
)


def _reachable(bounds: Bounds, limit: int) -> list[SpecState]:
    """Up to ``limit`` reachable states in breadth-first order (a list, not a set's order, so
    that which states a test samples does not depend on the hash seed)."""
    init = initial_state(bounds)
    seen = {init}
    order = [init]
    queue = deque([init])
    while queue and len(seen) < limit:
        for _, nxt in enabled(queue.popleft(), bounds):
            if nxt not in seen:
                seen.add(nxt)
                order.append(nxt)
                queue.append(nxt)
    return order


def _disagreements(
    compiler: Compiler, states: list[SpecState], table: dict[str, Action]
) -> list[str]:
    """Every (function, state) on which the compiled and the concrete readings differ (an
    exception in compiled code counts as a difference)."""
    bounds = compiler.bounds
    I = Concrete(bounds.sizes())
    out: list[str] = []

    def differs(what: str, compiled: Callable[[SpecState], Any], st: SpecState, want: Any) -> None:
        try:
            got = compiled(st)
        except Exception as err:
            out.append(f"{what} in {st}: {type(err).__name__}")
            return
        if got != want or type(got) is not type(want):
            out.append(f"{what} in {st}")
        elif isinstance(got, SpecState) and _types(got) != _types(want):
            out.append(f"{what} in {st} (cell types)")

    for st in states:
        for action in table.values():
            for inst in instances(action, bounds):
                guard = bool(action.guard(I, st, *inst.args))
                expected = st.replace(action.effect(I, st, *inst.args)) if guard else None
                differs(f"guard of {inst}", compiler.guard(action, inst.args), st, guard)
                differs(f"effect of {inst}", compiler.step(action, inst.args), st, expected)
        for inv in INVARIANTS + QUIESCENCE:
            differs(inv.name, compiler.predicate(inv.holds), st, bool(inv.holds(I, st)))
        every = all(bool(inv.holds(I, st)) for inv in INVARIANTS)
        differs("all invariants", compiler.conjunction(_HOLDS), st, every)
    return out


_HOLDS = tuple(inv.holds for inv in INVARIANTS)


def _out_of_range_positions(states: list[SpecState], bounds: Bounds) -> list[SpecState]:
    """The states with one page's block position moved outside the contexts (negative, or one
    past the end): ``get`` must then yield ``Concrete``'s outside value, not wrap or raise."""
    pos = COLUMN_INDEX["page_pos"]
    out = []
    for st in states:
        for p in range(bounds.pages):
            for bad in (-1, bounds.positions):
                cells = list(st.cells)
                cells[pos] = tuple(bad if q == p else v for q, v in enumerate(cells[pos]))
                out.append(SpecState(tuple(cells)))
    return out


def _types(st: SpecState | None) -> Any:
    assert st is not None
    return [[type(v) for v in column] for column in st.cells]


def test_compiled_spec_agrees_with_concrete_on_reachable_states() -> None:
    for bounds in BOUNDS:
        compiler = Compiler(bounds)
        states = _reachable(bounds, 600)
        assert len(states) > 100
        assert _disagreements(compiler, states, ACTION_BY_NAME) == []
        assert compiler.fallbacks == []
        for st in states[:100]:
            assert list(compiler.enabled(st, tuple(ACTION_BY_NAME.values()))) == list(
                enabled(st, bounds)
            )


def test_spec_mutants_are_compiled_from_their_own_functions() -> None:
    for mutant in mutants.MUTANTS.values():
        if mutant.actions is None:
            continue
        for config in mutant.configs:
            compiler = Compiler(config.bounds)
            compiler.step(ACTION_BY_NAME["publish"], (0,))  # the unmutated table first
            states = _reachable(config.bounds, 150)
            assert _disagreements(compiler, states, mutant.actions) == [], mutant.name


def test_compiled_spec_agrees_with_concrete_on_arbitrary_states() -> None:
    rng = random.Random(5)
    for bounds in BOUNDS:
        states = [arbitrary_spec_state(rng, bounds, range(-3, 5)) for _ in range(150)]
        states += _out_of_range_positions(_reachable(bounds, 150), bounds)
        assert _disagreements(Compiler(bounds), states, ACTION_BY_NAME) == []


def test_a_generator_without_the_range_check_is_caught() -> None:
    class Unchecked(Codegen):
        def get(self, column: Any, key: Any) -> Any:
            col, k = self._src(column), self._src(key)
            return Src(f"{col.text}[{k.text}]")

    bounds = QUICK.configs[1].bounds  # two-block handoffs: certify and adopt read contexts
    pending = [  # a successor awaiting its handoff, with a completed page: certify reads contexts
        st
        for st in _reachable(bounds, 5000)
        if st["scope_mode"][0] == ACTIVE
        and not st["scope_admitted"][0]
        and any(a and f for a, f in zip(st["page_alloc"], st["page_full"], strict=True))
    ]
    assert len(pending) > 100
    states = _out_of_range_positions(pending, bounds)  # only a few of them reach an unchecked get
    assert _disagreements(Compiler(bounds, Unchecked), states, ACTION_BY_NAME)


def test_a_miscompiling_generator_is_caught() -> None:
    class OffByOne(Codegen):
        def le(self, a: Any, b: Any) -> Any:
            return self.lt(a, b)

    bounds = QUICK.configs[0].bounds
    states = _reachable(bounds, 300)
    assert _disagreements(Compiler(bounds, OffByOne), states, ACTION_BY_NAME)


def test_python_control_flow_falls_back_to_concrete() -> None:
    def branching_guard(I: Any, st: Any, s: Any) -> Any:
        if I.eq(I.get(st["scope_mode"], s), I.lit(0)):  # not allowed in spec code
            return I.lit(True)
        return I.lit(False)

    action: Action = attrs.evolve(ACTION_BY_NAME["pause"], guard=branching_guard)
    bounds = QUICK.configs[0].bounds
    compiler = Compiler(bounds)
    fn: Callable[[SpecState], bool] = compiler.guard(action, (0,))
    assert fn(initial_state(bounds)) is True
    assert compiler.fallbacks == ["pause guard"]
